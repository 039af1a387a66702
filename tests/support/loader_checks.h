// What the engine's tests share: a loader's options in a few words, and the check that a
// failed sample is named and the loader goes on.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "stoker/batch.h"
#include "stoker/dataset.h"
#include "stoker/loader.h"

namespace stoker::testing {

// `ds` in batches of `batch` on `workers` worker threads (0: in-line), the rest the defaults.
inline LoaderOptions loader_options(std::shared_ptr<const Dataset> ds, std::size_t batch,
                                    std::size_t workers) {
  LoaderOptions o;
  o.dataset = std::move(ds);
  o.batch_size = batch;
  o.workers = workers;
  return o;
}

// The loader's next batch throws a SampleError for sample `index` whose message holds `says`;
// the batch after it comes.
inline void expect_failed_sample(Loader& loader, std::size_t index, const std::string& says) {
  try {
    loader.next();
    ADD_FAILURE() << "no error";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.index(), index);
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
  EXPECT_TRUE(loader.next());
}

}  // namespace stoker::testing
