#include "image_commands.h"

#include <fmt/core.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "interrupt.h"
#include "progress.h"
#include "stoker/encoded.h"
#include "stoker/frontend/files.h"
#include "stoker/image.h"

namespace stoker::tools {
namespace {

struct PackArgs {
  std::string src;
  std::string dest;
  double shard_mb = 1024;
  bool force = false;
};

int run_pack(const PackArgs& a) {
  PackOptions o;
  o.shard_bytes = static_cast<std::uint64_t>(a.shard_mb * 1024 * 1024);
  o.overwrite = a.force;
  std::optional<ProgressBar> bar;  // erased before the summary
  const auto start = std::chrono::steady_clock::now();
  o.progress = [&](std::size_t done, std::size_t total, std::uint64_t bytes) {
    tools::throw_if_interrupted();  // pack_records then removes its temporary directory
    if (!bar) bar.emplace("pack", total);
    if (!bar->shown()) return;
    const std::chrono::duration<double> s = std::chrono::steady_clock::now() - start;
    bar->update(done, fmt::format("files, {:.1f} MB, {:.1f} MB/s", bytes / 1e6,
                                  s.count() > 0 ? bytes / 1e6 / s.count() : 0.0));
  };
  const auto r = pack_image_folder(a.src, a.dest, o);
  bar.reset();
  fmt::print("packed {} records ({:.1f} MB, {} classes) into {} shard(s) in {}\n", r.records,
             r.bytes / 1e6, r.classes, r.shards, a.dest);
  return 0;
}

struct DecodeArgs {
  std::string file;
  std::string pipeline = "val";
  std::uint64_t seed = 0;
  std::vector<int> crop;
  std::string dtype = "u8";
  std::string layout = "hwc";
  int size = 224;
  int resize = 256;
  bool exact = false;
  int repeat = 0;         // times the decode is repeated for a speed figure
  std::string transform;  // an ImageTransform spec; replaces the options above
  std::string out;
};

// Writes a C-contiguous array as .npy (format version 1.0).
void write_npy(const std::string& path, const std::string& descr, const std::vector<long>& shape,
               std::span<const std::byte> data) {
  std::string dims;
  for (long d : shape) dims += std::to_string(d) + ", ";
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot create");
  f.write("\x93NUMPY\x01\x00", 8);
  const auto len = static_cast<std::uint16_t>(header.size());
  const char le[2] = {static_cast<char>(len & 0xFF), static_cast<char>(len >> 8)};
  f.write(le, 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  if (!f) throw std::runtime_error(path + ": cannot write");
}

int run_decode(const DecodeArgs& a) {
  ImageTransform t =
      a.pipeline == "train" ? ImageTransform::train(a.size) : ImageTransform::val(a.resize, a.size);
  t.dtype = a.dtype == "f32" ? DType::f32 : DType::u8;
  t.layout = a.layout == "chw" ? ImageLayout::chw : ImageLayout::hwc;
  t.exact = a.exact;
  if (!a.transform.empty()) t = ImageTransform::parse(a.transform);
  const bool random_resized = t.crop == ImageTransform::Crop::random_resized;
  std::vector<std::byte> bytes;
  detail::read_whole_file(a.file, bytes);
  const auto [w, h] = image_size(bytes, a.file);
  CropBox box;
  bool flip = false;
  const CropBox* crop = nullptr;
  if (random_resized) {
    if (a.crop.size() == 4) {
      box = {a.crop[0], a.crop[1], a.crop[2], a.crop[3]};
      crop = &box;
    } else {
      const auto d = draw_random_crop(t, w, h, a.seed);
      box = d.box;
      flip = d.flip;
    }
  }
  std::vector<std::byte> out(t.output_bytes());
  decode_image(bytes, a.file, t, a.seed, out, crop);
  double per_second = 0;
  if (a.repeat > 0) {  // one thread, file in memory, after the warm-up decode above
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < a.repeat; ++i) decode_image(bytes, a.file, t, a.seed, out, crop);
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    per_second = a.repeat / took.count();
  }
  if (!a.out.empty()) {
    const auto dims = t.shape();
    const std::vector<long> shape(dims.begin(), dims.end());
    write_npy(a.out, t.dtype == DType::f32 ? "<f4" : "|u1", shape, out);
  }
  fmt::print(
      "{{\"width\": {}, \"height\": {}, \"crop\": [{}, {}, {}, {}], \"flip\": {}, "
      "\"images_per_second\": {}}}\n",
      w, h, box.x, box.y, box.width, box.height, flip ? "true" : "false", per_second);
  return 0;
}

}  // namespace

std::function<int()> add_image_commands(CLI::App& app) {
  auto pack = std::make_shared<PackArgs>();
  auto* p = app.add_subcommand(
      "pack", "Pack an image folder (class subfolders) into record shards (docs/record_format.md)");
  p->add_option("src", pack->src, "Image folder: one subfolder per class")->required();
  p->add_option("dest", pack->dest, "Directory to create with the shards")->required();
  p->add_option("--shard-mb", pack->shard_mb, "Start a new shard past this many MiB");
  p->add_flag("--force", pack->force, "Replace dest if it exists");

  auto decode = std::make_shared<DecodeArgs>();
  auto* d = app.add_subcommand("decode", "Decode one image through a pipeline (for tests)");
  d->group("");  // hidden
  d->add_option("file", decode->file)->required();
  d->add_option("--pipeline", decode->pipeline)->check(CLI::IsMember({"train", "val"}));
  d->add_option("--seed", decode->seed);
  d->add_option("--crop", decode->crop, "x y width height (train)")->expected(4);
  d->add_option("--dtype", decode->dtype)->check(CLI::IsMember({"u8", "f32"}));
  d->add_option("--layout", decode->layout)->check(CLI::IsMember({"chw", "hwc"}));
  d->add_option("--size", decode->size);
  d->add_option("--resize", decode->resize);
  d->add_flag("--exact", decode->exact, "No DCT-domain scaling");
  d->add_option("--repeat", decode->repeat, "Decode this many more times, timed (images/s)");
  d->add_option("--transform", decode->transform,
                "An ImageTransform spec (include/stoker/image.h), instead of the options above");
  d->add_option("--out", decode->out, ".npy file to write");

  return [=]() -> int {
    if (p->parsed()) return run_pack(*pack);
    if (d->parsed()) return run_decode(*decode);
    return -1;
  };
}

}  // namespace stoker::tools
