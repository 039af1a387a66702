// The CUDA backend over a runtime it loaded with dlopen, on a machine without a GPU: the
// loader is pointed at a stand-in libcudart (fake_cudart.cc) whose one device is host memory,
// and batches go through the real copy path. One test in its own binary: the process-wide
// runtime is searched once, and this one must be the first search.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "stoker/info.h"
#include "stoker/loader.h"
#include "test_datasets.h"

// As fake_cudart.cc returns them.
struct FakeCudartCounters {
  long device_buffers, host_buffers, registered, streams, events, copies, waits;
};

namespace stoker {
namespace {

TEST(FakeCudaRuntime, BatchesGoThroughTheLoadedRuntimeAndEverythingIsGivenBack) {
  setenv("STOKER_CUDA_RUNTIME", STOKER_FAKE_CUDART, 1);
  const CudaInfo info = cuda_info();
  ASSERT_TRUE(info.available()) << info.why;
  EXPECT_EQ(info.library, STOKER_FAKE_CUDART);
  EXPECT_EQ(info.runtime_version, 12040);
  EXPECT_EQ(info.driver_version, 12080);
  EXPECT_EQ(info.devices, 1);

  void* fake = dlopen(STOKER_FAKE_CUDART, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(fake, nullptr) << "the runtime loaded is not the fake";
  const auto counters =
      reinterpret_cast<FakeCudartCounters (*)()>(dlsym(fake, "fake_cudart_counters"));
  ASSERT_NE(counters, nullptr);

  std::size_t batches = 0;
  {
    LoaderOptions o;
    o.dataset = std::make_shared<testing::IndexDataset<>>(1000, 256);
    o.batch_size = 32;
    o.shuffle = true;
    o.workers = 2;
    o.device = "cuda";
    Loader loader(o);
    while (auto b = loader.next()) {
      ASSERT_EQ(b->device(), "cuda:0");
      for (std::size_t f = 0; f < 2; ++f) {
        ASSERT_TRUE(b->on_device(f));
        ASSERT_NE(b->data(f), static_cast<void*>(b->bytes(f).data()));
        // The fake's device memory is host memory: the copy can be read back directly.
        EXPECT_EQ(std::memcmp(b->data(f), b->bytes(f).data(), b->bytes(f).size()), 0);
      }
      ++batches;
    }
    EXPECT_EQ(batches, 32u);
    EXPECT_GT(loader.stats().locked_slabs, 0u);  // cudaHostAlloc'ed slabs
    const FakeCudartCounters during = counters();
    // Two fields a batch, and up to device_depth batches of the next epoch copied ahead.
    EXPECT_GE(during.copies, static_cast<long>(2 * batches));
    EXPECT_LE(during.copies, static_cast<long>(2 * (batches + o.device_depth)));
    EXPECT_GE(during.waits, static_cast<long>(batches));  // the consumer's stream, at least
    EXPECT_EQ(during.streams, 1);                         // the side stream
  }
  const FakeCudartCounters after = counters();
  EXPECT_EQ(after.device_buffers, 0);
  EXPECT_EQ(after.host_buffers, 0);
  EXPECT_EQ(after.streams, 0);
  EXPECT_EQ(after.events, 0);
}

}  // namespace
}  // namespace stoker
