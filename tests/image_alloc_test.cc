// Decoding images allocates nothing per sample on stoker's side in steady state: every
// operator new in the process is counted while the switch is on. (libjpeg's own per-image
// working memory comes from malloc and is not counted: it is the library's.)
#include <gtest/gtest.h>

#include "image_fixtures.h"
#include "stoker/encoded.h"
#include "stoker/image.h"
#include "stoker/loader.h"
#include "support/counting_new.h"
#include "support/steady_state.h"

namespace stoker {
namespace {

std::size_t steady_state_allocations(const std::shared_ptr<EncodedSource>& source,
                                     ImageTransform transform, std::size_t workers) {
  ImageDatasetOptions io;
  io.source = source;
  io.transform = transform;
  LoaderOptions o;
  o.dataset = std::make_shared<ImageDataset>(io);
  o.batch_size = 8;
  o.shuffle = true;
  o.workers = workers;
  Loader loader(o);
  // Warm up over two epochs: every file has been seen, so the reading thread's buffers are at
  // their size.
  const auto s = testing::steady_state_allocations(loader, 2, 3);
  EXPECT_EQ(s.rows, 3 * source->size());
  return s.allocations;
}

TEST(ImageSteadyState, NoHeapAllocationPerSample) {
  testing::TempDir dir;
  for (int i = 0; i < 24; ++i) {
    std::string cls = "c", file = "i";  // appended, not operator+ (GCC 12 -Wrestrict)
    cls.append(std::to_string(i % 3));
    file.append(std::to_string(i)).append(".jpg");
    testing::write_file(dir / cls / file, testing::make_jpeg(90 + 7 * i, 80 + 5 * (i % 5), 3,
                                                             static_cast<std::uint32_t>(i)));
  }
  auto folder = open_image_folder(dir.path().string());
  pack_records(*folder, (dir / "packed").string());
  auto small = ImageTransform::train(48);
  auto val = ImageTransform::val(56, 48);
  val.dtype = DType::u8;
  // Per-thread buffers grow to the largest image (and crop bound) their thread has seen; with
  // one reading thread, the warm-up shows it every image, so the count after it must be zero.
  for (std::size_t workers : {0, 1}) {
    EXPECT_EQ(steady_state_allocations(folder, small, workers), 0u) << workers;
    EXPECT_EQ(steady_state_allocations(cache_in_ram(folder, 1 << 22), val, workers), 0u);
    EXPECT_EQ(steady_state_allocations(open_records((dir / "packed").string()), small, workers),
              0u);
  }
}

}  // namespace
}  // namespace stoker
