// Decoding image datasets: encoded images (JPEG, PNG) from an EncodedSource, decoded and
// augmented straight into the batch slab with the ImageNet training pipelines of torchvision:
//
//   train: RandomResizedCrop(size) + RandomHorizontalFlip + ToTensor + Normalize
//   val:   Resize(resize) + CenterCrop(size) + ToTensor + Normalize
//
// Only the part of a JPEG that the crop needs is decoded (rows above and below are skipped,
// columns outside are not transformed), with DCT-domain scaling when the crop is large enough
// that the scaled decode stays at least twice the resize's output (unless `exact`); crop,
// resize (Pillow's antialiased bilinear filter), flip, normalize and layout change run as one
// pass over the decoded rows.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/dataset.h"
#include "stoker/encoded.h"

namespace stoker {

enum class ImageLayout : std::uint8_t { chw, hwc };

// A crop of an image: columns [x, x + width), rows [y, y + height).
struct CropBox {
  int x = 0;
  int y = 0;
  int width = 0;
  int height = 0;
  bool operator==(const CropBox&) const = default;
};

// What is done to each image. The defaults are the train pipeline at 224 with ImageNet's
// mean and std, float32 CHW output.
struct ImageTransform {
  enum class Crop : std::uint8_t {
    random_resized,  // RandomResizedCrop(size, scale, ratio), bilinear, antialiased
    resize_center,   // Resize(resize) of the shorter side, then CenterCrop(size)
  };
  Crop crop = Crop::random_resized;
  int size = 224;    // output height and width
  int resize = 256;  // resize_center: the shorter side after Resize; at least `size`
  std::array<double, 2> scale{0.08, 1.0};             // random_resized: area fraction range
  std::array<double, 2> ratio{3.0 / 4.0, 4.0 / 3.0};  // random_resized: aspect ratio range
  bool random_flip = true;                            // RandomHorizontalFlip(p = 0.5)

  // Output: DType::f32 is ToTensor + Normalize(mean, std) (x / 255 - mean) / std; DType::u8
  // is the resized pixels as they are (for normalizing on the GPU), mean and std unused.
  DType dtype = DType::f32;
  ImageLayout layout = ImageLayout::chw;  // chw: [3, size, size]; hwc: [size, size, 3]
  std::array<float, 3> mean{0.485f, 0.456f, 0.406f};
  std::array<float, 3> std{0.229f, 0.224f, 0.225f};

  // Fidelity: false lets a JPEG be decoded at 1/2, 1/4 or 1/8 scale (DCT-domain scaling)
  // while the scaled image stays at least kDctGap times the size the crop is resized to, which
  // keeps the output within 1/255 mean absolute difference of torchvision's on real photos
  // (docs/image.md) and is much faster on large ones; true never scales, and the output is
  // Pillow's bit for bit in almost every case.
  bool exact = false;
  static constexpr int kDctGap = 3;

  // torchvision's ImageNet train pipeline: RandomResizedCrop(size) + RandomHorizontalFlip.
  static ImageTransform train(int size = 224);
  // torchvision's ImageNet val pipeline: Resize(resize) + CenterCrop(size), no flip.
  static ImageTransform val(int resize = 256, int size = 224);

  // The output field's shape: {3, size, size} or {size, size, 3}.
  std::vector<std::int64_t> shape() const;
  std::size_t output_bytes() const;  // bytes of one output image
  // Throws std::invalid_argument naming the bad setting.
  void validate() const;

  // A transform as text, the form the Python package and `stoker decode --transform` pass:
  // whitespace-separated key=value settings applied over train(224), lists comma-separated:
  //   crop=random_resized|resize_center size=N resize=N scale=A,B ratio=A,B flip=0|1
  //   dtype=uint8|float32 layout=chw|hwc mean=A,B,C std=A,B,C exact=0|1
  // Throws std::invalid_argument naming the bad key or value (an unknown key, a malformed
  // number, a repeated key) or, through validate(), the bad setting.
  static ImageTransform parse(std::string_view spec);
  // The spec parse() reads back into an equal transform (numbers printed exactly).
  std::string spec() const;

  bool operator==(const ImageTransform&) const = default;
};

// Images larger than this many pixels are refused from their header, before anything is
// allocated for them (Pillow's MAX_IMAGE_PIXELS).
inline constexpr std::uint64_t kDefaultMaxPixels = 89'478'485;

// The crop RandomResizedCrop draws for an image of width x height, with torchvision's rule:
// up to 10 tries of an area fraction uniform in `scale` and a log-uniform aspect ratio in
// `ratio`, else the center crop clamped to the ratio range. The random numbers come from a
// generator seeded by `seed` (SampleOut::seed()), so the draw is a pure function of it.
struct RandomCropDraw {
  CropBox box;
  bool flip = false;
};
RandomCropDraw draw_random_crop(const ImageTransform& transform, int width, int height,
                                std::uint64_t seed);

// Decodes one encoded image (JPEG or PNG, found by its signature) and applies `transform`,
// writing the result into `out` (exactly transform.output_bytes() bytes). `seed` drives the
// random choices. `crop`, if given, replaces the random crop of random_resized (and no flip is
// made), for checking against a reference with a known box. Throws std::runtime_error whose
// message starts with `name` and gives the reason (empty, truncated, corrupt, not an image,
// over `max_pixels`). Thread safety: may be called from any thread; per-thread scratch buffers
// are reused, so steady-state calls allocate nothing themselves.
void decode_image(std::span<const std::byte> encoded, std::string_view name,
                  const ImageTransform& transform, std::uint64_t seed, std::span<std::byte> out,
                  const CropBox* crop = nullptr, std::uint64_t max_pixels = kDefaultMaxPixels);

// The width and height an encoded image's header states. Throws like decode_image.
std::array<int, 2> image_size(std::span<const std::byte> encoded, std::string_view name);

struct ImageDatasetOptions {
  std::shared_ptr<EncodedSource> source;
  ImageTransform transform;
  std::uint64_t max_pixels = kDefaultMaxPixels;
};

// Fields: "image" (transform.dtype, transform.shape()) and "label" (int64, the source's
// label). read() fetches the encoded bytes from the source and decodes them straight into the
// batch slot; a failure throws std::runtime_error naming the file (with ErrorPolicy::skip the
// loader replaces the sample and reports it in Batch::skipped()).
//
// Thread safety: immutable after construction; read() may be called from any thread.
// What makes reads that decode images cheaper, for a report whose reads fill the cores
// (Dataset::cheaper_reads of the data sets that decode them): `small_files`, they read one
// file an image (an image folder), so record shards would help.
std::vector<std::string> image_cheaper_reads(bool small_files);

class ImageDataset final : public Dataset {
 public:
  // Throws std::invalid_argument for a null source or a bad transform.
  explicit ImageDataset(ImageDatasetOptions options);

  std::size_t size() const override;
  std::vector<FieldSpec> fields() const override;
  void read(std::size_t index, const SampleOut& out) const override;
  std::string sample_name(std::size_t index) const override;
  std::vector<std::string> cheaper_reads() const override;
  // Passed on to the source (EncodedSource::will_read: a source over URLs fetches ahead).
  bool will_read(std::span<const std::size_t> rows) const noexcept override;
  // The source's RAM cache (cache_in_ram): the bytes it keeps.
  std::size_t resident_bytes() const override;
  // The source's (EncodedSource::object_storage: zero for local files).
  ObjectStorageCounters object_storage_counters() const override;

  const std::shared_ptr<EncodedSource>& source() const { return options_.source; }
  const ImageTransform& transform() const { return options_.transform; }

 private:
  ImageDatasetOptions options_;
};

}  // namespace stoker
