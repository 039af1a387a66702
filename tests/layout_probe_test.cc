// A data set whose layout is learned from its samples (Dataset::probe): the engine's first
// workers probe, the pool gets its layout then, and probed samples are not read again.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "stoker/loader.h"
#include "support/loader_checks.h"
#include "test_datasets.h"

namespace stoker {
namespace {

class ProbedDataset final : public testing::IndexDataset<> {
 public:
  ProbedDataset(std::size_t n, std::set<std::size_t> fail)
      : IndexDataset(n, 8), fail_(std::move(fail)) {}

  bool fields_known() const override { return known_.load(std::memory_order_acquire); }
  std::vector<FieldSpec> fields() const override {
    return fields_known() ? IndexDataset::fields() : std::vector<FieldSpec>{};
  }
  std::vector<FieldSpec> probe(std::size_t index, std::uint64_t seed,
                               std::exception_ptr& failure) const override {
    std::lock_guard lock(mu_);
    probes.emplace_back(index, seed);
    if (fail_.count(index)) {
      failure = std::make_exception_ptr(std::runtime_error("probe of a bad sample"));
      kept_[{index, seed}] = failure;
      return {};
    }
    kept_[{index, seed}] = nullptr;
    known_.store(true, std::memory_order_release);
    return IndexDataset::fields();
  }
  void read(std::size_t index, const SampleOut& out) const override {
    {
      std::lock_guard lock(mu_);
      if (auto it = kept_.find({index, out.seed()}); it != kept_.end()) {
        const std::exception_ptr failure = it->second;
        kept_.erase(it);
        if (failure) std::rethrow_exception(failure);
        out.as<std::int64_t>(0)[0] = static_cast<std::int64_t>(index);
        std::memset(out.bytes(1).data(), static_cast<int>(index & 255), 8);
        return;
      }
      reads_.emplace_back(index, out.seed());
    }
    if (fail_.count(index)) throw std::runtime_error("read of a bad sample");
    IndexDataset::read(index, out);
  }

  mutable std::mutex mu_;
  // (index, seed): probed, and read by read() itself (not from a probe; later epochs too)
  mutable std::vector<std::pair<std::size_t, std::uint64_t>> probes;
  mutable std::vector<std::pair<std::size_t, std::uint64_t>> reads_;

 private:
  std::set<std::size_t> fail_;
  mutable std::atomic<bool> known_{false};
  mutable std::map<std::pair<std::size_t, std::uint64_t>, std::exception_ptr> kept_;
};

LoaderOptions options(std::shared_ptr<const Dataset> ds, std::size_t workers) {
  return testing::loader_options(std::move(ds), 8, workers);
}

TEST(LayoutProbe, TheFirstSamplesTellTheLayoutAndAreReadOnce) {
  // On the simulated device, the copy stage makes its slots once the layout is known.
  for (const char* device : {"cpu", "sim"}) {
    for (std::size_t workers : {0, 1, 2}) {
      auto ds = std::make_shared<ProbedDataset>(24, std::set<std::size_t>{0});
      std::vector<std::size_t> seen;
      {
        auto o = options(ds, workers);
        o.device = device;
        Loader loader(o);
        // Sample 0 fails its probe: the failure comes with its batch, in its place.
        try {
          loader.next();
          FAIL() << "no error, workers " << workers;
        } catch (const SampleError& e) {
          EXPECT_EQ(e.index(), 0u);
          EXPECT_NE(std::string(e.what()).find("probe of a bad sample"), std::string::npos);
        }
        while (auto batch = loader.next()) {
          batch->synchronize();  // the simulated device's memory is host memory
          const auto* index = static_cast<const std::int64_t*>(batch->data(0));
          seen.insert(seen.end(), index, index + batch->size());
          EXPECT_EQ(batch->fields().size(), 2u);
        }
      }
      std::vector<std::size_t> rest(16);
      for (std::size_t i = 0; i < 16; ++i) rest[i] = 8 + i;
      EXPECT_EQ(seen, rest) << "workers " << workers;
      std::lock_guard lock(ds->mu_);
      ASSERT_FALSE(ds->probes.empty());
      // One reader probes in order from sample 0; two probe at once, in either order (the
      // other's probe of sample 1 came first once in 60 runs beside two busy loops).
      if (workers <= 1) {
        EXPECT_EQ(ds->probes[0].first, 0u);
      } else {
        EXPECT_EQ(std::count_if(ds->probes.begin(), ds->probes.end(),
                                [](const auto& p) { return p.first == 0; }),
                  1);
      }
      for (const auto& p : ds->probes) {
        EXPECT_LT(p.first, 8u);  // one probe at a time per worker: the first batch's samples
        EXPECT_EQ(std::count(ds->reads_.begin(), ds->reads_.end(), p), 0)
            << "sample " << p.first << " read again, workers " << workers;
      }
    }
  }
}

TEST(LayoutProbe, BatchesWhoseSamplesAllFailRaiseInTheirPlacesAndTheEpochEnds) {
  std::set<std::size_t> all;
  for (std::size_t i = 0; i < 20; ++i) all.insert(i);
  for (const char* device : {"cpu", "sim"}) {
    for (std::size_t workers : {0, 1, 2}) {
      auto ds = std::make_shared<ProbedDataset>(20, all);
      auto o = options(ds, workers);
      o.device = device;
      Loader loader(o);
      for (int epoch = 0; epoch < 2; ++epoch) {
        std::vector<std::size_t> failed;  // each batch's first sample
        for (std::size_t call = 0; call <= loader.batches_per_epoch(); ++call) {
          try {
            if (!loader.next()) break;
            ADD_FAILURE() << "a batch with no sample that reads, " << device << ", workers "
                          << workers;
          } catch (const SampleError& e) {
            failed.push_back(e.index());
            EXPECT_NE(std::string(e.what()).find("probe of a bad sample"), std::string::npos);
          }
        }
        EXPECT_EQ(failed, (std::vector<std::size_t>{0, 8, 16}))
            << device << ", workers " << workers;
      }
      EXPECT_EQ(loader.stats().slabs, 0u);  // nothing to hold
      std::lock_guard lock(ds->mu_);
      EXPECT_TRUE(ds->reads_.empty())
          << "a probed sample read again, " << device << ", workers " << workers;
    }
  }
}

TEST(LayoutProbe, UnderSkipNoSampleThatReadsIsTheConsumersError) {
  auto ds = std::make_shared<ProbedDataset>(6, std::set<std::size_t>{0, 1, 2, 3, 4, 5});
  auto o = options(ds, 2);
  o.on_error = ErrorPolicy::skip;
  Loader loader(o);
  EXPECT_THROW(loader.next(), SampleError);
  EXPECT_EQ(loader.stats().slabs, 0u);
}

}  // namespace
}  // namespace stoker
