#include "stoker/frontend/sim_step.h"

#include <chrono>
#include <limits>
#include <thread>
#include <vector>

#include "device/sim_backend.h"
#include "stoker/loader.h"

namespace stoker::detail {

SimSteps sim_step(const std::shared_ptr<const Dataset>& ds, std::size_t batch, double copy_s,
                  double compute_s, std::size_t device_depth) {
  detail::SimStream stream;
  LoaderOptions o;
  o.dataset = ds;
  o.batch_size = batch;
  o.workers = 2;
  o.device = "sim";
  o.stream = &stream;
  o.device_depth = device_depth;
  const std::size_t batches = ds->size() / batch;
  o.depth = batches;  // every host batch ready first: the timeline is the device stage's alone
  std::size_t batch_bytes = 0;
  for (const auto& f : ds->fields()) batch_bytes += f.bytes() * batch;
  o.sim.latency = std::chrono::microseconds(0);
  o.sim.bandwidth_gb_per_s = static_cast<double>(batch_bytes) / copy_s / 1e9;
  Loader loader(o);
  while (loader.stats().ready < batches) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::vector<double> ends(batches);
  std::size_t k = 0;
  while (auto b = loader.next()) {
    stream.compute(compute_s, [&, k] { ends[k] = stream.now() + compute_s; });
    ++k;
  }
  stream.synchronize();
  // Fewer than two batches measure no step (NaN, as the benchmark has always printed it).
  if (k < 2) return {std::numeric_limits<double>::quiet_NaN(), k};
  return {(ends[k - 1] - ends[0]) / static_cast<double>(k - 1), k};
}

}  // namespace stoker::detail
