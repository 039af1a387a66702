// Finding the CUDA runtime at run time (src/device/cuda_runtime.h): nothing found, something
// found that is not a runtime, a runtime found with no device, and the order of the search.
// What the backend does with a device is tested on the simulated one (device_test.cc) and,
// where a GPU answers, on the real one (cuda_test.cc).
#include "device/cuda_runtime.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "device/backend.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "stoker-cudart-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(CudaRuntime, NoneFoundInAnEmptyDirectorySaysWhereItLooked) {
  TempDir empty;
  const auto rt = detail::load_cuda_runtime({empty.path()});
  EXPECT_FALSE(rt->loaded());
  EXPECT_EQ(rt->cudaGetDeviceCount, nullptr);
  EXPECT_FALSE(rt->info.available());
  EXPECT_EQ(rt->info.searched, std::vector<std::string>{empty.path()});
  EXPECT_TRUE(contains(rt->info.why, "no CUDA runtime (libcudart) found in " + empty.path()))
      << rt->info.why;

  std::string why;
  EXPECT_EQ(detail::open_cuda(rt, 0, why), nullptr);
  EXPECT_EQ(why, rt->info.why);
}

TEST(CudaRuntime, AFileThatIsNotARuntimeIsPassedOverWithItsReason) {
  TempDir dir;
  const std::string fake = dir.path() + "/libcudart.so.12";
  std::ofstream(fake) << "not a shared library";
  const auto rt = detail::load_cuda_runtime({dir.path()});
  EXPECT_FALSE(rt->loaded());
  // dlopen's own words about the file, after the places searched.
  EXPECT_TRUE(contains(rt->info.why, fake)) << rt->info.why;
}

TEST(CudaRuntime, ARuntimeWithoutADeviceLoadsAndSaysWhyNoDeviceAnswers) {
#ifndef STOKER_TEST_CUDART_DIR
  GTEST_SKIP() << "no CUDA toolkit was found at build time, so no libcudart to load";
#else
  const auto rt = detail::load_cuda_runtime({STOKER_TEST_CUDART_DIR});
  ASSERT_TRUE(rt->loaded()) << rt->info.why;
  EXPECT_TRUE(rt->info.library.starts_with(STOKER_TEST_CUDART_DIR)) << rt->info.library;
  EXPECT_GE(rt->info.runtime_version, 11000);
  if (rt->info.available()) GTEST_SKIP() << "a CUDA device answered";
  EXPECT_EQ(rt->info.devices, 0);
  EXPECT_FALSE(rt->info.why.empty());

  std::string why;
  EXPECT_EQ(detail::open_cuda(rt, 0, why), nullptr);
  EXPECT_EQ(why, rt->info.why);

  // Places with nothing in them are passed over, and listed.
  TempDir empty;
  const auto after = detail::load_cuda_runtime({empty.path(), STOKER_TEST_CUDART_DIR});
  EXPECT_EQ(after->info.library, rt->info.library);
  EXPECT_EQ(after->info.searched, (std::vector<std::string>{empty.path(), STOKER_TEST_CUDART_DIR}));
#endif
}

TEST(CudaRuntime, SearchOrderHintsThenTheSystemThenTheUsualToolkitPlaces) {
  unsetenv("STOKER_CUDA_RUNTIME");
  setenv("CUDA_HOME", "/opt/cuda-home", 1);
  unsetenv("CUDA_PATH");
  const auto places = detail::default_cuda_runtime_places({"/wheel/nvidia/cuda_runtime/lib"});
  EXPECT_EQ(places, (std::vector<std::string>{"/wheel/nvidia/cuda_runtime/lib", "",
                                              "/opt/cuda-home/lib64", "/usr/local/cuda/lib64"}));

  // STOKER_CUDA_RUNTIME names the one place to look.
  setenv("STOKER_CUDA_RUNTIME", "/my/libcudart.so.12", 1);
  EXPECT_EQ(detail::default_cuda_runtime_places({"/wheel/lib"}),
            std::vector<std::string>{"/my/libcudart.so.12"});
  unsetenv("STOKER_CUDA_RUNTIME");
  unsetenv("CUDA_HOME");
}

}  // namespace
}  // namespace stoker
