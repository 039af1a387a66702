// The simulated-device step harness: how long one training step takes when batches are copied
// to the simulated device while the consumer's kernel computes (`stoker bench --device sim`,
// tests/device_test.cc). Unstable: part of the front ends' seam (frontend/README.md).
#pragma once

#include <cstddef>
#include <memory>

#include "stoker/dataset.h"

namespace stoker::detail {

struct SimSteps {
  double step_s = 0;        // simulated seconds per batch after the first (NaN: one batch)
  std::size_t batches = 0;  // batches consumed
};

// Runs one epoch of `ds` in batches of `batch` whose copy takes `copy_s` and whose consumer
// kernel takes `compute_s` (simulated seconds), with every host batch ready before the first
// copy (so the timeline is the device stage's alone), and returns the simulated time from the
// first kernel's end to the last one's, per step.
SimSteps sim_step(const std::shared_ptr<const Dataset>& ds, std::size_t batch, double copy_s,
                  double compute_s, std::size_t device_depth);

}  // namespace stoker::detail
