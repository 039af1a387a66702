// The steady-state allocation harness: counts every operator new in the process over a
// loader's epochs after warming it up. The binary must include support/counting_new.h in
// exactly one source file (and is not built with sanitizers, whose runtimes replace it).
#pragma once

#include <cstddef>

#include "stoker/loader.h"
#include "support/alloc_count.h"

namespace stoker::testing {

struct SteadyState {
  std::size_t allocations = 0;  // operator new calls over the counted epochs
  std::size_t batches = 0;      // batches seen in them
  std::size_t rows = 0;
};

// Runs `warm` epochs (every buffer reaches its size; epoch boundaries included), then counts
// over `counted` epochs.
inline SteadyState steady_state_allocations(Loader& loader, int warm, int counted) {
  for (int e = 0; e < warm; ++e) {
    while (loader.next()) {
    }
  }
  SteadyState s;
  alloc_count::allocations = 0;
  alloc_count::counting = true;
  for (int e = 0; e < counted; ++e) {
    while (auto batch = loader.next()) {
      ++s.batches;
      s.rows += batch->size();
    }
  }
  alloc_count::counting = false;
  s.allocations = alloc_count::allocations.load();
  return s;
}

}  // namespace stoker::testing
