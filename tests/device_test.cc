// The device stage on the simulated device: ordering, slab and buffer reuse, overlap, the
// pinned-memory budget, and the fallback when CUDA is asked for and no GPU answers.
#include "stoker/device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "device/sim_backend.h"
#include "stoker/frontend/host_allocator.h"
#include "stoker/frontend/loader_internals.h"
#include "stoker/frontend/sim_step.h"
#include "stoker/loader.h"
#include "stoker/log.h"
#include "support/log_capture.h"
#include "test_datasets.h"

namespace stoker {
namespace {

using detail::SimStream;
using testing::IndexDataset;

using testing::LogCapture;

LoaderOptions sim_options(std::shared_ptr<const Dataset> ds, std::size_t batch, SimStream* s) {
  LoaderOptions o;
  o.dataset = std::move(ds);
  o.batch_size = batch;
  o.workers = 2;
  o.device = "sim";
  o.stream = s;
  return o;
}

// Checks, on the consumer's stream (where a kernel would read it), that the device copy of a
// batch holds exactly its samples.
struct DeviceCheck {
  std::atomic<int> bad_rows{0};
  std::atomic<int> checked{0};

  void enqueue(SimStream& stream, const Batch& b, double seconds) {
    std::vector<std::size_t> expected(b.indices().begin(), b.indices().end());
    const auto* index = static_cast<const std::int64_t*>(b.data(0));
    const auto* data = static_cast<const std::uint8_t*>(b.data(1));
    const std::size_t payload = b.bytes(1).size() / b.size();
    stream.compute(seconds, [=, this] {
      for (std::size_t r = 0; r < expected.size(); ++r) {
        const bool ok = index[r] == static_cast<std::int64_t>(expected[r]) &&
                        data[r * payload] == (expected[r] & 255) &&
                        data[(r + 1) * payload - 1] == (expected[r] & 255);
        if (!ok) ++bad_rows;
      }
      ++checked;
    });
  }
};

TEST(SimDevice, ConsumerNeverSeesABatchBeforeItsCopyAndNoBufferIsReusedEarly) {
  // Real time passes in the simulated copies (time_scale), so a slab recycled before its copy
  // ran, or a device buffer overwritten while a kernel still reads it, would show up as wrong
  // bytes in the check.
  SimStream stream(/*time_scale=*/1.0);
  auto o = sim_options(std::make_shared<IndexDataset<>>(600, 4096), 16, &stream);
  o.sim.bandwidth_gb_per_s = 0.2;  // ~0.3 ms per batch copy
  o.depth = 6;
  o.device_depth = 3;
  DeviceCheck check;
  std::vector<std::size_t> order;
  {
    Loader loader(o);
    for (int epoch = 0; epoch < 2; ++epoch) {
      while (auto b = loader.next()) {
        EXPECT_EQ(b->device(), "sim");
        EXPECT_TRUE(b->on_device(0));
        check.enqueue(stream, *b, 0.0002);
        order.insert(order.end(), b->indices().begin(), b->indices().end());
      }
    }
    // Two epochs' batches, plus what was copied ahead into the third.
    EXPECT_GE(loader.stats().copies, 2u * 38u);
    EXPECT_LE(loader.stats().copies, 2u * 38u + o.device_depth);
  }
  stream.synchronize();
  EXPECT_EQ(check.bad_rows.load(), 0);
  EXPECT_EQ(check.checked.load(), 2 * 38);
  std::vector<std::size_t> expected;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (std::size_t i = 0; i < 600; ++i) expected.push_back(i);
  }
  EXPECT_EQ(order, expected);
}

TEST(SimDevice, APinnedHostBatchIsNotRefilledUnderTheConsumersOwnCopy) {
  // torch's pin_memory=True idiom: the batch stays on the host, the training loop copies it
  // with x.to("cuda", non_blocking=True) and drops x at once. The copy runs later on the
  // consumer's stream (2 ms of real time each here); a slab refilled before it ran would
  // show up as another batch's bytes in the copy.
  SimStream stream(/*time_scale=*/1.0);
  detail::LoaderInternals internals;
  internals.host_device = detail::open_sim({});
  LoaderOptions o;
  o.dataset = std::make_shared<IndexDataset<>>(320, 4096);
  o.batch_size = 16;
  o.workers = 2;
  o.depth = 2;
  o.pin_memory = PinMemory::on;
  o.stream = &stream;
  struct Copy {
    std::vector<std::size_t> indices;
    std::vector<std::byte> index_field, payload_field;
  };
  std::vector<Copy> copies(20);
  {
    Loader loader(o, internals);
    std::size_t n = 0;
    while (auto b = loader.next()) {
      ASSERT_LT(n, copies.size());
      EXPECT_EQ(b->device(), "cpu");
      Copy& c = copies[n++];
      c.indices.assign(b->indices().begin(), b->indices().end());
      c.index_field.resize(b->bytes(0).size());
      c.payload_field.resize(b->bytes(1).size());
      stream.copy(c.index_field.data(), b->bytes(0).data(), c.index_field.size(), 0.002);
      stream.copy(c.payload_field.data(), b->bytes(1).data(), c.payload_field.size(), 0);
    }  // the batch is given back here, its copy still queued
    EXPECT_EQ(n, copies.size());
    EXPECT_EQ(loader.stats().locked_slabs, loader.stats().slabs);
    stream.synchronize();  // (without the fences: hundreds of wrong rows below)
  }
  for (const Copy& c : copies) {
    const auto* index = reinterpret_cast<const std::int64_t*>(c.index_field.data());
    for (std::size_t r = 0; r < c.indices.size(); ++r) {
      EXPECT_EQ(index[r], static_cast<std::int64_t>(c.indices[r]));
      EXPECT_EQ(static_cast<std::uint8_t>(c.payload_field[r * 4096]), c.indices[r] & 255);
      EXPECT_EQ(static_cast<std::uint8_t>(c.payload_field[(r + 1) * 4096 - 1]), c.indices[r] & 255);
    }
  }
}

// The simulated step of 24 batches of 8 rows (10 KB each).
double steady_step(double copy_s, double compute_s, std::size_t device_depth) {
  constexpr std::size_t kBatches = 24, kBatch = 8;
  const auto r = detail::sim_step(std::make_shared<IndexDataset<>>(kBatches * kBatch, 10000),
                                  kBatch, copy_s, compute_s, device_depth);
  EXPECT_EQ(r.batches, kBatches);
  return r.step_s;
}

TEST(SimDevice, CopiesOverlapComputeStepIsMaxNotSum) {
  const double c = 0.010, t = 0.004;
  for (std::size_t depth : {1, 2, 4}) {
    // Compute-bound and copy-bound: the step is the larger of the two, not their sum.
    EXPECT_NEAR(steady_step(t, c, depth), c, 1e-6) << "device_depth " << depth;
    EXPECT_NEAR(steady_step(c, t, depth), c, 1e-6) << "device_depth " << depth;
  }
}

TEST(SimDevice, PinnedBudgetIsNeverExceeded) {
  LogCapture log;
  SimStream stream;
  auto ds = std::make_shared<IndexDataset<>>(400, 100000);
  auto o = sim_options(ds, 10, &stream);
  const std::size_t slab = 10 * 100000 + 64 * 2;  // rows of both fields, each array aligned
  o.pin_budget = slab * 5 / 2;                    // room for two slabs
  o.depth = 4;
  ASSERT_EQ(detail::LockedBytes::in_use(), 0u);
  {
    Loader loader(o);
    std::size_t peak = 0;  // the budget's two slabs are locked as the first slabs are made
    while (auto b = loader.next()) {
      peak = std::max(peak, detail::LockedBytes::in_use());
      ASSERT_LE(detail::LockedBytes::in_use(), o.pin_budget);
    }
    EXPECT_EQ(peak, 2 * slab);
    // At the end, at most those two: a slow run (TSan, a busy machine) has the memory cap's
    // look trim free slabs beyond the window, a locked one among them.
    const Stats s = loader.stats();
    EXPECT_LE(s.locked_slabs, 2u);
    EXPECT_GT(s.slabs, 2u);
  }
  EXPECT_EQ(detail::LockedBytes::in_use(), 0u);  // given back with the slabs
  int said = 0;
  for (const auto& line : log.lines()) said += line.find("budget") != std::string::npos;
  EXPECT_EQ(said, 1) << "one clear line, once";
}

TEST(SimDevice, PinMemoryOffKeepsSlabsPageable) {
  SimStream stream;
  auto o = sim_options(std::make_shared<IndexDataset<>>(100), 10, &stream);
  o.pin_memory = PinMemory::off;
  Loader loader(o);
  while (loader.next()) {
  }
  EXPECT_EQ(loader.stats().locked_slabs, 0u);
  EXPECT_EQ(loader.stats().device, "sim");
}

TEST(SimDevice, HostOnlyFieldsStayOnTheHost) {
  class WithMeta : public IndexDataset<> {
   public:
    using IndexDataset<>::IndexDataset;
    std::vector<FieldSpec> fields() const override {
      auto f = IndexDataset<>::fields();
      f[0].host_only = true;
      return f;
    }
  };
  SimStream stream;
  auto o = sim_options(std::make_shared<WithMeta>(50, 32), 10, &stream);
  Loader loader(o);
  auto b = loader.next();
  ASSERT_TRUE(b);
  EXPECT_FALSE(b->on_device(0));
  EXPECT_EQ(b->data(0), b->bytes(0).data());
  EXPECT_TRUE(b->on_device(1));
  EXPECT_NE(b->data(1), static_cast<void*>(b->bytes(1).data()));
  EXPECT_EQ(b->as<const std::int64_t>(0)[3], 3);
  b->synchronize();
  EXPECT_EQ(std::memcmp(b->data(1), b->bytes(1).data(), b->bytes(1).size()), 0);
  // Only the device field was copied, for this batch and those copied ahead.
  EXPECT_EQ(loader.stats().copy_bytes, loader.stats().copies * 10u * 32u);
}

TEST(SimDevice, KeepOnHostNamesFieldsThatStayOnTheHost) {
  SimStream stream;
  auto ds = std::make_shared<IndexDataset<>>(50, 32);
  auto o = sim_options(ds, 10, &stream);
  o.keep_on_host = {ds->fields()[0].name};
  Loader loader(o);
  auto b = loader.next();
  ASSERT_TRUE(b);
  EXPECT_FALSE(b->on_device(0));
  EXPECT_EQ(b->as<const std::int64_t>(0)[3], 3);
  EXPECT_TRUE(b->on_device(1));

  o.keep_on_host = {"no such field"};
  try {
    Loader unknown(o);
    FAIL() << "a field the data set does not declare was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'no such field'"), std::string::npos) << e.what();
  }
}

TEST(SimDevice, ErrorsAndPositionKeepTheirPlaceThroughTheCopyStage) {
  SimStream stream;
  auto o =
      sim_options(std::make_shared<IndexDataset<>>(80, 8, std::set<std::size_t>{35}), 10, &stream);
  o.device_depth = 3;
  Loader loader(o);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(loader.next());
  EXPECT_THROW(loader.next(), SampleError);  // batch 3 holds sample 35
  EXPECT_EQ(loader.position().batch, 4u);
  auto b = loader.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->indices()[0], 40u);
  EXPECT_EQ(loader.position().batch, 5u);
  // Restoring discards the copies issued ahead and starts over from the position.
  loader.restore({0, 1});
  b = loader.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->indices()[0], 10u);
}

TEST(SimDevice, NextForTimesOutAndTheNextCallGetsThatBatch) {
  SimStream stream;
  auto ds = std::make_shared<testing::GatedDataset>(30);
  auto o = sim_options(ds, 10, &stream);
  Loader loader(o);
  EXPECT_EQ(loader.next_for(std::chrono::milliseconds(1)).status, NextResult::Status::timed_out);
  EXPECT_EQ(loader.position().batch, 0u);
  ds->open();
  for (std::size_t b = 0; b < 3; ++b) {
    auto r = loader.next_for(std::chrono::hours(1));
    ASSERT_EQ(r.status, NextResult::Status::batch);
    EXPECT_TRUE(r.batch->on_device(0));
    r.batch->synchronize();
    EXPECT_EQ(static_cast<const std::int64_t*>(r.batch->data(0))[0],
              static_cast<std::int64_t>(10 * b));
  }
  EXPECT_EQ(loader.next_for(std::chrono::hours(1)).status, NextResult::Status::end_of_epoch);
}

TEST(SimDevice, BatchOutlivesLoaderAndShutdownWithCopiesInFlight) {
  SimStream stream(/*time_scale=*/1.0);
  auto o = sim_options(std::make_shared<IndexDataset<>>(1000, 20000), 20, &stream);
  o.sim.bandwidth_gb_per_s = 0.5;  // ~1 ms per copy: copies are still running at destruction
  o.device_depth = 4;
  std::optional<Batch> kept;
  {
    Loader loader(o);
    kept = loader.next();
    ASSERT_TRUE(loader.next());
  }
  ASSERT_TRUE(kept);
  kept->synchronize();
  EXPECT_EQ(static_cast<const std::int64_t*>(kept->data(0))[5], 5);
  kept.reset();
}

TEST(Device, CudaWithoutAGpuFallsBackToTheCpuWithOneLogLine) {
  LogCapture log;
  LoaderOptions o;
  o.dataset = std::make_shared<IndexDataset<>>(20);
  o.batch_size = 5;
  o.device = "cuda";
  Loader loader(o);
  if (loader.stats().device != "cpu") GTEST_SKIP() << "a CUDA device answered";
  auto b = loader.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->device(), "cpu");
  EXPECT_FALSE(b->on_device(0));
  ASSERT_EQ(log.lines().size(), 1u);
  EXPECT_NE(log.lines()[0].find("no CUDA device answers"), std::string::npos) << log.lines()[0];
}

TEST(Device, UnknownDeviceNamesAreRefused) {
  LoaderOptions o;
  o.dataset = std::make_shared<IndexDataset<>>(20);
  for (const char* name : {"gpu", "cuda:", "cuda:x", "tpu"}) {
    o.device = name;
    EXPECT_THROW(Loader{o}, std::invalid_argument) << name;
  }
  o.device = "sim";
  o.device_depth = 0;
  EXPECT_THROW(Loader{o}, std::invalid_argument);
}

TEST(Device, NamesAreParsedOnceAndPrintedBack) {
  EXPECT_EQ(parse_device("cpu"), (Device{DeviceKind::cpu, -1}));
  EXPECT_EQ(parse_device("sim"), (Device{DeviceKind::sim, -1}));
  EXPECT_EQ(parse_device("cuda"), (Device{DeviceKind::cuda, -1}));
  EXPECT_EQ(parse_device("cuda:3"), (Device{DeviceKind::cuda, 3}));
  for (const char* name : {"cpu", "sim", "cuda", "cuda:0", "cuda:12"}) {
    EXPECT_EQ(to_string(parse_device(name)), name);
  }
  EXPECT_TRUE(parse_device("cuda:1").is_cuda());
  EXPECT_FALSE(parse_device("sim").is_cuda());
  for (const char* bad : {"cuda:", "cuda:x", "cuda:-1", "cuda:12345678901"}) {
    EXPECT_THROW(
        {
          try {
            parse_device(bad);
          } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("expected cuda:N"), std::string::npos) << bad;
            throw;
          }
        },
        std::invalid_argument);
  }
  EXPECT_THROW(parse_device("mps"), std::invalid_argument);
  LoaderOptions o;
  o.dataset = std::make_shared<IndexDataset<>>(8);
  o.device = "gpu";
  try {
    Loader loader(o);
    ADD_FAILURE() << "device 'gpu' accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "stoker::LoaderOptions: device 'gpu' is not one of cpu, cuda, cuda:N, sim");
  }
}

}  // namespace
}  // namespace stoker
