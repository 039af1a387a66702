// Runs only where a CUDA device answers (CTest label "gpu"); skips elsewhere.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "stoker/loader.h"
#include "test_datasets.h"

namespace stoker {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(Cuda, BatchesArriveOnTheDeviceFromPinnedSlabs) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    LoaderOptions o;
    o.dataset = std::make_shared<testing::IndexDataset<>>(1000, 50000);
    o.batch_size = 32;
    o.shuffle = true;
    o.device = "cuda";
    o.stream = stream;
    Loader loader(o);
    std::size_t batches = 0;
    while (auto b = loader.next()) {
      ASSERT_EQ(b->device(), "cuda:0");
      for (std::size_t f = 0; f < 2; ++f) {
        std::vector<std::byte> back(b->bytes(f).size());
        // Ordered after the copy: next() made `stream` wait on it.
        ASSERT_EQ(
            cudaMemcpyAsync(back.data(), b->data(f), back.size(), cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        EXPECT_EQ(std::memcmp(back.data(), b->bytes(f).data(), back.size()), 0);
      }
      ++batches;
    }
    EXPECT_EQ(batches, 32u);
    EXPECT_GT(loader.stats().locked_slabs, 0u);
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace stoker
