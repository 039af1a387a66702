// Dataset::read_rows: the engine's chunk-level reads (__getitems__; other kinds of worker are
// executors, tests/executor_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <vector>

#include "stoker/loader.h"
#include "support/loader_checks.h"
#include "test_datasets.h"

namespace stoker {
namespace {

// Reads whole chunks, recording each call; rows in `fail_rows` fail through errors[], and
// read() (used for the replacements the skip policy makes) is IndexDataset's.
class ChunkDataset final : public testing::IndexDataset<> {
 public:
  ChunkDataset(std::size_t n, std::set<std::size_t> fail_rows)
      : IndexDataset(n, 8), fail_rows_(std::move(fail_rows)) {}

  bool reads_chunks() const override { return true; }
  void read_rows(std::span<const std::size_t> indices, std::span<const SampleOut> outs,
                 std::span<std::exception_ptr> errors) const override {
    {
      std::lock_guard lock(mu_);
      calls.emplace_back(indices.begin(), indices.end());
    }
    for (std::size_t k = 0; k < indices.size(); ++k) {
      EXPECT_FALSE(errors[k]);
      if (k > 0) {
        EXPECT_EQ(outs[k].row(), outs[k - 1].row() + 1);  // consecutive rows
      }
      if (fail_rows_.count(indices[k])) {
        errors[k] = std::make_exception_ptr(std::runtime_error("chunk row failed"));
      } else {
        read(indices[k], outs[k]);
      }
    }
  }

  mutable std::mutex mu_;
  mutable std::vector<std::vector<std::size_t>> calls;

 private:
  std::set<std::size_t> fail_rows_;
};

LoaderOptions options(std::shared_ptr<const Dataset> ds, std::size_t workers) {
  return testing::loader_options(std::move(ds), 8, workers);
}

TEST(ReadRows, OneCallPerChunkWhenTheDatasetAsks) {
  for (std::size_t workers : {0, 1, 2}) {
    auto ds = std::make_shared<ChunkDataset>(40, std::set<std::size_t>{});
    std::vector<std::size_t> seen;
    {
      Loader loader(options(ds, workers));
      while (auto batch = loader.next()) {
        auto index = batch->as<const std::int64_t>(0);
        seen.insert(seen.end(), index.begin(), index.end());
      }
    }  // the workers, maybe reading the next epoch, are joined: every call has finished
    std::vector<std::size_t> all(40);
    for (std::size_t i = 0; i < 40; ++i) all[i] = i;
    EXPECT_EQ(seen, all) << "workers " << workers;
    std::lock_guard lock(ds->mu_);
    std::size_t rows = 0;
    for (const auto& c : ds->calls) {
      EXPECT_EQ(c.size(), 8 / std::max<std::size_t>(workers, 1));
      rows += c.size();
    }
    EXPECT_GE(rows, 40u);               // the next epoch may have started
    EXPECT_EQ(ds->reads.load(), rows);  // no read() besides the chunks' own
  }
}

TEST(ReadRows, AFailedRowRaisesWithItsIndex) {
  auto ds = std::make_shared<ChunkDataset>(24, std::set<std::size_t>{13});
  Loader loader(options(ds, 2));
  EXPECT_TRUE(loader.next());
  testing::expect_failed_sample(loader, 13, "chunk row failed");
}

TEST(ReadRows, SkipReplacesFailedRowsThroughRead) {
  auto ds = std::make_shared<ChunkDataset>(24, std::set<std::size_t>{2, 9, 20});
  auto o = options(ds, 2);
  o.on_error = ErrorPolicy::skip;
  Loader loader(o);
  std::size_t rows = 0;
  std::set<std::size_t> skipped;
  while (auto batch = loader.next()) {
    rows += batch->size();
    for (const auto& s : batch->skipped()) skipped.insert(s.index);
    for (std::size_t r = 0; r < batch->size(); ++r) {
      const auto i = static_cast<std::size_t>(batch->as<const std::int64_t>(0)[r]);
      EXPECT_EQ(i, batch->indices()[r]);  // the replacement's index
    }
  }
  EXPECT_EQ(rows, 24u);
  EXPECT_EQ(skipped, (std::set<std::size_t>{2, 9, 20}));
  EXPECT_EQ(loader.stats().skipped, 3u);
}

// A data set whose read_rows throws (not tied to a row): every row of the chunk fails.
class ThrowingChunks final : public testing::IndexDataset<> {
 public:
  ThrowingChunks() : IndexDataset(16, 8) {}
  bool reads_chunks() const override { return true; }
  void read_rows(std::span<const std::size_t>, std::span<const SampleOut>,
                 std::span<std::exception_ptr>) const override {
    throw std::runtime_error("closing");
  }
};

TEST(ReadRows, AThrowingReadRowsFailsTheChunkWithoutKillingTheWorker) {
  Loader loader(options(std::make_shared<ThrowingChunks>(), 2));
  EXPECT_THROW(loader.next(), SampleError);
  EXPECT_THROW(loader.next(), SampleError);
}

}  // namespace
}  // namespace stoker
