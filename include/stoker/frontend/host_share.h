// This process's share of the machine, one rule for the loader's tuner (src/loader.cc) and the
// Python front end (python/stoker/loader/host.py and plan.py read it back through the
// bindings): the cores it may run on, divided among the ranks torchrun started on this node,
// and the most worker threads `auto` may grow to on that share.
//
// Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <cstddef>

namespace stoker::detail {

struct HostShare {
  std::size_t cores = 1;        // the process's affinity
  std::size_t local_ranks = 1;  // LOCAL_WORLD_SIZE: the ranks sharing this node (and its caches)
  double cpu_share = 1;         // cores / local_ranks, at least one (tuner.h: cpu_share)
};
HostShare host_share();

// The most worker threads num_workers='auto' may grow to on `cpu_share` cores: for native reads
// max(16, 8 per core) (threads that wait cost little, and latency-bound reads may need many);
// for a Python data set's reads max(32, one per core) (a GIL-bound read gains nothing from
// more, a read that waits on I/O does).
std::size_t default_max_workers(double cpu_share, bool python_reads);

}  // namespace stoker::detail
