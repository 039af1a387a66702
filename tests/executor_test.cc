// Chunk executors (stoker/frontend/executor.h): the engine offers each chunk to its executors in
// Kind order and reads it on its own thread when none takes it; replacements go the same way;
// the executors' stats and bounds are the loader's.
#include "stoker/frontend/executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "stoker/frontend/loader_internals.h"
#include "stoker/loader.h"
#include "support/loader_checks.h"
#include "test_datasets.h"

namespace stoker {
namespace {

using detail::ChunkExecutor;
using detail::ChunkJob;
using detail::Executors;
using detail::ExecutorStats;

// Takes every `take_every`-th chunk offered (0: none) and writes its rows as the data set
// would, failing the rows in `fail`; records what it was offered and in what order.
class FakeExecutor final : public ChunkExecutor {
 public:
  FakeExecutor(Kind kind, std::shared_ptr<const Dataset> dataset, std::size_t take_every,
               std::vector<std::string>* log, std::mutex* log_mu, std::string name,
               std::set<std::size_t> fail = {})
      : kind_(kind),
        dataset_(std::move(dataset)),
        take_every_(take_every),
        log_(log),
        log_mu_(log_mu),
        name_(std::move(name)),
        fail_(std::move(fail)) {}

  Kind kind() const override { return kind_; }
  bool offer(const ChunkJob& job) override {
    const std::size_t n = offers.fetch_add(1) + 1;
    {
      std::lock_guard lock(*log_mu_);
      log_->push_back(name_);
    }
    if (take_every_ == 0 || n % take_every_ != 0) return false;
    for (std::size_t k = 0; k < job.indices.size(); ++k) {
      EXPECT_FALSE(job.errors[k]);
      rows.fetch_add(1);
      if (fail_.count(job.indices[k])) {
        failed.fetch_add(1);
        job.errors[k] = std::make_exception_ptr(std::runtime_error("executor row failed"));
      } else {
        dataset_->read(job.indices[k], job.outs[k]);
      }
    }
    return true;
  }
  std::size_t limit() const override { return limit_; }
  ExecutorStats stats() const override {
    ExecutorStats s;
    s.cpu = std::chrono::milliseconds(3);
    s.run_delay = std::chrono::milliseconds(2);
    s.lock_held = std::chrono::milliseconds(1);
    s.remote_units = 5;
    s.remote_bytes = 7;
    return s;
  }
  void stop() noexcept override { stopped = true; }

  std::size_t limit_ = 0;
  std::atomic<std::size_t> offers{0};
  std::atomic<std::size_t> rows{0};
  std::atomic<std::size_t> failed{0};
  std::atomic<bool> stopped{false};

 private:
  Kind kind_;
  std::shared_ptr<const Dataset> dataset_;
  std::size_t take_every_;
  std::vector<std::string>* log_;
  std::mutex* log_mu_;
  std::string name_;
  std::set<std::size_t> fail_;
};

LoaderOptions options(std::shared_ptr<const Dataset> ds, std::size_t workers) {
  LoaderOptions o = testing::loader_options(std::move(ds), 8, workers);
  o.tune_workers = false;
  return o;
}

std::vector<std::size_t> read_epoch(Loader& loader) {
  std::vector<std::size_t> seen;
  while (auto batch = loader.next()) {
    auto index = batch->as<const std::int64_t>(0);
    seen.insert(seen.end(), index.begin(), index.end());
  }
  return seen;
}

std::vector<std::size_t> iota(std::size_t n) {
  std::vector<std::size_t> all(n);
  for (std::size_t i = 0; i < n; ++i) all[i] = i;
  return all;
}

TEST(Executors, OfferedInKindOrderWhateverTheOrderAdded) {
  auto ds = std::make_shared<testing::IndexDataset<>>(8);
  std::vector<std::string> log;
  std::mutex mu;
  Executors executors;
  using Kind = ChunkExecutor::Kind;
  executors.add(std::make_shared<FakeExecutor>(Kind::thread, ds, 0, &log, &mu, "thread"));
  executors.add(std::make_shared<FakeExecutor>(Kind::process, ds, 0, &log, &mu, "process"));
  executors.add(std::make_shared<FakeExecutor>(Kind::remote, ds, 0, &log, &mu, "remote"));
  executors.add(std::make_shared<FakeExecutor>(Kind::process, ds, 0, &log, &mu, "process2"));
  std::vector<std::size_t> indices{1, 2};
  std::vector<std::exception_ptr> errors(2);
  EXPECT_FALSE(executors.offer({indices, {}, errors}));  // all declined
  EXPECT_EQ(log, (std::vector<std::string>{"remote", "process", "process2", "thread"}));
}

TEST(Executors, RemovedKindsAreOfferedNothingAndTheirStatsStay) {
  auto ds = std::make_shared<testing::IndexDataset<>>(8);
  std::vector<std::string> log;
  std::mutex mu;
  Executors executors;
  using Kind = ChunkExecutor::Kind;
  auto process = std::make_shared<FakeExecutor>(Kind::process, ds, 0, &log, &mu, "process");
  process->limit_ = 2;
  executors.add(std::make_shared<FakeExecutor>(Kind::thread, ds, 0, &log, &mu, "thread"));
  executors.add(process);
  const ExecutorStats before = executors.stats();
  const auto gone = executors.remove(Kind::process);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0], process);
  EXPECT_EQ(executors.limit(), 0u);  // the threads are bound by nothing again
  std::vector<std::size_t> indices{1, 2};
  std::vector<std::exception_ptr> errors(2);
  EXPECT_FALSE(executors.offer({indices, {}, errors}));
  EXPECT_EQ(log, (std::vector<std::string>{"thread"}));
  // The sums never go back: the removed executor's stay.
  const ExecutorStats after = executors.stats();
  EXPECT_EQ(after.cpu, before.cpu);
  EXPECT_EQ(after.lock_held, before.lock_held);
  EXPECT_EQ(after.remote_units, before.remote_units);
  EXPECT_TRUE(executors.remove(Kind::process).empty());
}

TEST(Executors, DeclinedChunksAreReadByTheEngineAndEverySampleOnce) {
  for (std::size_t workers : {0, 1, 3}) {
    auto ds = std::make_shared<testing::IndexDataset<>>(40);
    std::vector<std::string> log;
    std::mutex mu;
    auto executors = std::make_shared<Executors>();
    // Takes every second chunk offered; the others are the engine's threads'.
    auto half =
        std::make_shared<FakeExecutor>(ChunkExecutor::Kind::process, ds, 2, &log, &mu, "process");
    executors->add(half);
    detail::LoaderInternals internals;
    internals.executors = executors;
    std::vector<std::size_t> seen;
    {
      Loader loader(options(ds, workers), internals);
      seen = read_epoch(loader);
    }
    EXPECT_EQ(seen, iota(40)) << "workers " << workers;
    // Both read: the executor (through the data set's read()) and the engine's threads.
    EXPECT_GT(half->rows.load(), 0u);
    EXPECT_GT(ds->reads.load(), half->rows.load());
  }
}

TEST(Executors, FailedRowsRaiseInOrderAndReplacementsGoToTheExecutors) {
  auto ds = std::make_shared<testing::IndexDataset<>>(24);
  std::vector<std::string> log;
  std::mutex mu;
  auto executors = std::make_shared<Executors>();
  auto all = std::make_shared<FakeExecutor>(ChunkExecutor::Kind::process, ds, 1, &log, &mu,
                                            "process", std::set<std::size_t>{13});
  executors->add(all);
  detail::LoaderInternals internals;
  internals.executors = executors;
  {
    Loader loader(options(ds, 2), internals);
    EXPECT_TRUE(loader.next());
    testing::expect_failed_sample(loader, 13, "executor row failed");
  }
  // Every read was the executor's.
  EXPECT_EQ(ds->reads.load(), all->rows.load() - all->failed.load());

  // Skip: the failed row is replaced, through the executors too.
  auto skipping = std::make_shared<Executors>();
  auto again = std::make_shared<FakeExecutor>(ChunkExecutor::Kind::process, ds, 1, &log, &mu,
                                              "process", std::set<std::size_t>{13});
  skipping->add(again);
  internals.executors = skipping;
  auto o = options(ds, 2);
  o.on_error = ErrorPolicy::skip;
  o.max_skipped = 4;
  const std::size_t reads_before = ds->reads.load();
  std::size_t rows = 0;
  {
    Loader loader(o, internals);
    while (auto batch = loader.next()) {
      rows += batch->size();
      for (std::size_t r = 0; r < batch->size(); ++r) {
        EXPECT_NE(batch->indices()[r], 13u);
      }
    }
    EXPECT_EQ(loader.stats().skipped, 1u);
  }
  EXPECT_EQ(rows, 24u);
  EXPECT_EQ(ds->reads.load() - reads_before, again->rows.load() - again->failed.load());
}

TEST(Executors, StatsAndBoundsAreTheLoaders) {
  auto ds = std::make_shared<testing::IndexDataset<>>(16);
  std::vector<std::string> log;
  std::mutex mu;
  auto executors = std::make_shared<Executors>();
  auto a = std::make_shared<FakeExecutor>(ChunkExecutor::Kind::process, ds, 0, &log, &mu, "a");
  auto b = std::make_shared<FakeExecutor>(ChunkExecutor::Kind::remote, ds, 0, &log, &mu, "b");
  a->limit_ = 3;
  executors->add(a);
  executors->add(b);
  EXPECT_EQ(executors->limit(), 3u);
  detail::LoaderInternals internals;
  internals.executors = executors;
  Loader loader(options(ds, 1), internals);
  const Stats s = loader.stats();
  using std::chrono::milliseconds;
  EXPECT_GE(s.worker_cpu, milliseconds(6));
  EXPECT_GE(s.worker_run_delay, milliseconds(4));
  EXPECT_EQ(s.worker_lock_held, milliseconds(2));
  EXPECT_EQ(s.network_units, 10u);
  EXPECT_EQ(s.network_bytes, 14u);
  executors->stop();
  EXPECT_TRUE(a->stopped && b->stopped);
}

}  // namespace
}  // namespace stoker
