#include "bench_jpeg.h"

// clang-format off
#include <cstdio>  // jpeglib.h needs FILE and size_t first
#include <jpeglib.h>
// clang-format on
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <thread>

#include "bench_util.h"
#include "interrupt.h"
#include "progress.h"
#include "stoker/encoded.h"
#include "stoker/frontend/jpeg_encode.h"
#include "stoker/frontend/random.h"
#include "stoker/image.h"
#include "stoker/loader.h"

namespace stoker::bench {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kGeneratorVersion = 1;

// ------------------------------------------------------------------ the generated data set

using Rng = detail::SplitMix64;

// Adds amplitude * value noise with the given cell size to `plane` (w x h).
void add_value_noise(std::vector<float>& plane, int w, int h, double cell, double amplitude,
                     Rng& rng) {
  const int gw = static_cast<int>(w / cell) + 2, gh = static_cast<int>(h / cell) + 2;
  std::vector<float> grid(static_cast<std::size_t>(gw) * gh);
  for (auto& g : grid) g = static_cast<float>(rng.uniform(-1, 1) * amplitude);
  for (int y = 0; y < h; ++y) {
    const double gy = y / cell;
    const int iy = static_cast<int>(gy);
    double fy = gy - iy;
    fy = fy * fy * (3 - 2 * fy);
    const float* r0 = &grid[static_cast<std::size_t>(iy) * gw];
    const float* r1 = r0 + gw;
    float* out = &plane[static_cast<std::size_t>(y) * w];
    for (int x = 0; x < w; ++x) {
      const double gx = x / cell;
      const int ix = static_cast<int>(gx);
      double fx = gx - ix;
      fx = fx * fx * (3 - 2 * fx);
      const double top = r0[ix] + (r0[ix + 1] - r0[ix]) * fx;
      const double bottom = r1[ix] + (r1[ix + 1] - r1[ix]) * fx;
      out[x] += static_cast<float>(top + (bottom - top) * fy);
    }
  }
}

// A photo-like image: fractal luminance texture (octaves down to single pixels, as foliage,
// fur or gravel give), smooth chroma, and a few sharp-edged objects. Deterministic in `seed`.
void generate_image(std::uint64_t seed, int& w, int& h, std::vector<std::uint8_t>& rgb) {
  Rng rng(seed);
  w = 300 + rng.below(201);
  h = 300 + rng.below(201);
  const auto n = static_cast<std::size_t>(w) * h;
  std::vector<float> luma(n, static_cast<float>(rng.uniform(90, 160)));
  std::vector<float> cb(n, static_cast<float>(rng.uniform(-30, 30)));
  std::vector<float> cr(n, static_cast<float>(rng.uniform(-30, 30)));
  const double roughness = rng.uniform(0.9, 0.98);
  for (double cell = 160, amp = 60; cell >= 1.0; cell /= 2, amp *= roughness) {
    add_value_noise(luma, w, h, cell, amp, rng);
  }
  for (auto& v : luma) v += static_cast<float>(rng.uniform(-30, 30));  // sensor grain
  add_value_noise(cb, w, h, 120, 25, rng);
  add_value_noise(cr, w, h, 120, 25, rng);
  add_value_noise(cb, w, h, 12, 6, rng);
  add_value_noise(cr, w, h, 12, 6, rng);
  for (int k = 0; k < 6; ++k) {  // objects: ellipses with their own tone
    const double cx = rng.uniform(0, w), cy = rng.uniform(0, h);
    const double rx = rng.uniform(15, 120), ry = rng.uniform(15, 120);
    const auto dl = static_cast<float>(rng.uniform(-70, 70));
    const auto db = static_cast<float>(rng.uniform(-40, 40));
    const auto dr = static_cast<float>(rng.uniform(-40, 40));
    for (int y = std::max(0, int(cy - ry)); y < std::min(h, int(cy + ry) + 1); ++y) {
      for (int x = std::max(0, int(cx - rx)); x < std::min(w, int(cx + rx) + 1); ++x) {
        const double u = (x - cx) / rx, v = (y - cy) / ry;
        if (u * u + v * v <= 1) {
          const std::size_t i = static_cast<std::size_t>(y) * w + x;
          luma[i] += dl;
          cb[i] += db;
          cr[i] += dr;
        }
      }
    }
  }
  rgb.resize(n * 3);
  auto clip = [](double v) { return static_cast<std::uint8_t>(std::clamp(v, 0.0, 255.0)); };
  for (std::size_t i = 0; i < n; ++i) {
    rgb[i * 3] = clip(luma[i] + 1.402 * cr[i]);
    rgb[i * 3 + 1] = clip(luma[i] - 0.344 * cb[i] - 0.714 * cr[i]);
    rgb[i * 3 + 2] = clip(luma[i] + 1.772 * cb[i]);
  }
}

struct DataSet {
  fs::path folder;
  fs::path records;
  std::size_t images = 0;
  std::size_t classes = 0;
  double mean_bytes = 0;
  double mean_pixels = 0;
  double generate_s = 0;  // 0 when reused
};

// Makes (once) `images` JPEGs in `classes` class folders, and their record shards.
DataSet prepare(const fs::path& dir, std::size_t images, std::size_t classes, bool quiet) {
  DataSet d;
  d.folder = dir / "folder";
  d.records = dir / "records";
  d.images = images;
  d.classes = classes;
  const std::string stamp =
      fmt::format("generator {} images {} classes {}", kGeneratorVersion, images, classes);
  const fs::path marker = dir / "COMPLETE";
  std::string have;
  if (std::ifstream f(marker); f) std::getline(f, have);
  if (have != stamp) {
    if (!quiet) fmt::print(stderr, "generating {} JPEGs in {} ...\n", images, d.folder.string());
    const auto start = Clock::now();
    fs::remove_all(dir);
    for (std::size_t c = 0; c < classes; ++c) {
      fs::create_directories(d.folder / fmt::format("class_{:02}", c));
    }
    std::atomic<std::size_t> next{0};
    auto work = [&] {
      std::vector<std::uint8_t> rgb;
      for (std::size_t i; !tools::interrupted() && (i = next.fetch_add(1)) < images;) {
        int w = 0, h = 0;
        generate_image(0x5eed0000 + i, w, h, rgb);
        const auto jpeg = detail::encode_jpeg(rgb, w, h, 3, 90);
        std::ofstream f(
            d.folder / fmt::format("class_{:02}", i % classes) / fmt::format("img_{:05}.jpg", i),
            std::ios::binary);
        f.write(reinterpret_cast<const char*>(jpeg.data()),
                static_cast<std::streamsize>(jpeg.size()));
      }
    };
    try {
      std::thread other(work);
      work();
      other.join();
      tools::throw_if_interrupted();
      PackOptions pack;
      pack.progress = [](std::size_t, std::size_t, std::uint64_t) {
        tools::throw_if_interrupted();
      };
      pack_records(*open_image_folder(d.folder.string()), d.records.string(), pack);
    } catch (...) {
      fs::remove_all(dir);  // no half-made data set left behind
      throw;
    }
    std::ofstream(marker) << stamp << "\n";
    d.generate_s = seconds_since(start);
  }
  auto folder = open_image_folder(d.folder.string());
  EncodedBytes bytes;
  double total_bytes = 0, total_pixels = 0;
  for (std::size_t i = 0; i < folder->size(); ++i) {
    folder->read(i, bytes);
    total_bytes += static_cast<double>(bytes.bytes.size());
    const auto [w, h] = image_size(bytes.bytes, folder->name(i));
    total_pixels += static_cast<double>(w) * h;
  }
  d.mean_bytes = total_bytes / static_cast<double>(folder->size());
  d.mean_pixels = total_pixels / static_cast<double>(folder->size());
  return d;
}

// ------------------------------------------------------------------ the physical anchor

// Full-image decode to RGB with libjpeg-turbo (the default, accurate integer IDCT and fancy
// upsampling, as Pillow decodes), of every image, from memory, on `threads` threads.
double bare_decode_images_per_s(const std::vector<std::vector<std::byte>>& files,
                                std::size_t threads) {
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    jpeg_decompress_struct cinfo;
    jpeg_error_mgr jerr;
    cinfo.err = jpeg_std_error(&jerr);
    jpeg_create_decompress(&cinfo);
    std::vector<std::uint8_t> pixels;
    for (std::size_t i; !tools::interrupted() && (i = next.fetch_add(1)) < files.size();) {
      jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(files[i].data()),
                   files[i].size());
      jpeg_read_header(&cinfo, TRUE);
      cinfo.out_color_space = JCS_RGB;
      jpeg_start_decompress(&cinfo);
      const std::size_t stride = static_cast<std::size_t>(cinfo.output_width) * 3;
      pixels.resize(stride * cinfo.output_height);
      while (cinfo.output_scanline < cinfo.output_height) {
        JSAMPROW row = pixels.data() + cinfo.output_scanline * stride;
        jpeg_read_scanlines(&cinfo, &row, 1);
      }
      jpeg_finish_decompress(&cinfo);
    }
    jpeg_destroy_decompress(&cinfo);
  };
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  tools::throw_if_interrupted();
  return static_cast<double>(files.size()) / seconds_since(start);
}

// ------------------------------------------------------------------ stoker

struct Run {
  double images_per_s = 0;  // steady state: median over the epochs after the first
  double first_epoch_images_per_s = 0;
  std::vector<double> epoch_times;
  std::vector<std::uint64_t> storage_reads;       // source counter at the end of each epoch
  std::vector<std::uint64_t> read_syscall_bytes;  // /proc/self/io rchar growth per epoch
  std::uint64_t cached = 0;
  double wait_pct = 0;
};

std::uint64_t rchar() {
  std::ifstream f("/proc/self/io");
  std::string key;
  std::uint64_t value = 0;
  while (f >> key >> value) {
    if (key == "rchar:") return value;
  }
  return 0;
}

// `label` names the run on the progress line (none with --json) and its trace file (with
// --trace).
Run run_stoker(const std::shared_ptr<EncodedSource>& source, const ImageTransform& t,
               std::size_t workers, std::size_t epochs, const std::string& label,
               const BenchOptions& bench) {
  ImageDatasetOptions io;
  io.source = source;
  io.transform = t;
  LoaderOptions o;
  o.dataset = std::make_shared<ImageDataset>(io);
  o.batch_size = 64;
  o.shuffle = true;
  o.workers = workers;
  o.depth = 4;
  Loader loader(o);
  if (!bench.trace.empty()) loader.trace(with_name(bench.trace, "jpeg-" + label));
  tools::ProgressBar bar("jpeg: stoker, " + label + ", batches",
                         epochs * loader.batches_per_epoch(), bench.json);
  std::size_t taken = 0;
  Run r;
  std::size_t images = 0;
  std::vector<double> waits;
  for (std::size_t e = 0; e < epochs; ++e) {
    const auto io_before = rchar();
    const auto wait_before = loader.stats().consumer_wait;
    const auto start = Clock::now();
    images = 0;
    while (auto b = loader.next()) {
      tools::throw_if_interrupted();
      images += b->size();
      bar.update(++taken);
    }
    const double s = seconds_since(start);
    r.epoch_times.push_back(s);
    waits.push_back(100.0 * to_seconds(loader.stats().consumer_wait - wait_before) / s);
    r.storage_reads.push_back(source->counters().storage_reads);
    r.read_syscall_bytes.push_back(rchar() - io_before);
  }
  const std::vector<double> steady(r.epoch_times.begin() + (epochs > 1 ? 1 : 0),
                                   r.epoch_times.end());
  r.images_per_s = static_cast<double>(images) / median(steady);
  r.first_epoch_images_per_s = static_cast<double>(images) / r.epoch_times[0];
  r.wait_pct = median(std::vector<double>(waits.begin() + (epochs > 1 ? 1 : 0), waits.end()));
  r.cached = source->counters().cached;
  loader.stop_trace();  // written outside the timed epochs, a failure reported
  return r;
}

json to_json(const Run& r) {
  return {{"images_per_s", r.images_per_s},
          {"first_epoch_images_per_s", r.first_epoch_images_per_s},
          {"epoch_times_s", r.epoch_times},
          {"storage_reads_after_epoch", r.storage_reads},
          {"read_syscall_bytes_per_epoch", r.read_syscall_bytes},
          {"cached", r.cached},
          {"wait_pct", r.wait_pct}};
}

// ------------------------------------------------------------------ torchvision

std::optional<json> run_torchvision(const BenchOptions& o, const JpegBenchOptions& j,
                                    const DataSet& d, const std::string& pipeline,
                                    std::string& error) {
  const std::string script =
      j.baseline_script.empty() ? source_file("bench/torchvision_baseline.py") : j.baseline_script;
  const std::string cmd = fmt::format(
      "{} {} --root {} --pipeline {} --workers {} --epochs {} {}", shell_quote(o.python),
      shell_quote(script), shell_quote(d.folder.string()), pipeline, o.smoke ? "0,2" : "0,1,2,4",
      o.epochs ? o.epochs : 2, o.verbose ? "" : "2>/dev/null");
  std::string out;
  const int status = run_command(cmd, out);
  if (status != 0) {
    error = fmt::format(
        "the torchvision baseline failed (torch and torchvision for {}? "
        "scripts/bench_jpeg.sh sets up .venv-vision; -v shows its log)",
        o.python);
    return std::nullopt;
  }
  try {
    return json::parse(out);
  } catch (const json::exception& e) {
    error = std::string("unreadable output from the torchvision baseline: ") + e.what();
    return std::nullopt;
  }
}

fs::path data_dir(const BenchOptions& o, const JpegBenchOptions& j) {
  return j.data_dir.empty()
             ? fs::temp_directory_path() /
                   fmt::format("stoker-bench-jpeg-v{}-{}", kGeneratorVersion, o.smoke ? 96 : 2000)
             : fs::path(j.data_dir);
}

DataSet prepare(const BenchOptions& o, const JpegBenchOptions& j) {
  return prepare(data_dir(o, j), o.smoke ? 96 : 2000, o.smoke ? 3 : 10, o.json);
}

}  // namespace

std::array<std::string, 2> jpeg_data(const BenchOptions& o, const JpegBenchOptions& j) {
  const DataSet d = prepare(o, j);
  return {d.folder.string(), d.records.string()};
}

int run_jpeg(const BenchOptions& o, const JpegBenchOptions& j) {
  const std::size_t epochs = o.epochs ? o.epochs : (o.smoke ? 2 : 3);
  const std::size_t workers = o.workers ? o.workers : 2;
  const fs::path dir = data_dir(o, j);
  const DataSet d = prepare(o, j);

  json result = {{"workload", "jpeg"},
                 {"smoke", o.smoke},
                 {"images", d.images},
                 {"classes", d.classes},
                 {"mean_jpeg_bytes", d.mean_bytes},
                 {"mean_pixels", d.mean_pixels},
                 {"data_dir", dir.string()},
                 {"batch_size", 64},
                 {"workers", workers},
                 {"epochs", epochs},
                 {"hardware_threads", std::thread::hardware_concurrency()}};
  if (!o.json) {
    fmt::print(
        "\njpeg: {} generated JPEGs in {} classes (mean {:.0f} KB, {:.0f}x{:.0f}-ish "
        "pixels), batch 64, stoker workers {}\n",
        d.images, d.classes, d.mean_bytes / 1e3, std::sqrt(d.mean_pixels), std::sqrt(d.mean_pixels),
        workers);
    std::fflush(stdout);
  }

  // The physical anchor: bare full-image decode, bytes already in memory. The machine is
  // shared, so it is measured three times, interleaved with the pipelines (before train,
  // before val, at the end), and the median is the reference.
  auto folder_files = open_image_folder(d.folder.string());
  std::vector<std::vector<std::byte>> files(folder_files->size());
  {
    EncodedBytes b;
    for (std::size_t i = 0; i < files.size(); ++i) {
      folder_files->read(i, b);
      files[i].assign(b.bytes.begin(), b.bytes.end());
    }
  }
  std::vector<double> bare1, bare2s;
  auto measure_anchor = [&] {
    bare1.push_back(bare_decode_images_per_s(files, 1));
    bare2s.push_back(bare_decode_images_per_s(files, 2));
    if (!o.json) {
      fmt::print("  bare libjpeg-turbo full decode: {:.0f} images/s on 1 thread, {:.0f} on 2\n",
                 bare1.back(), bare2s.back());
      std::fflush(stdout);
    }
  };
  measure_anchor();
  double bare2 = bare2s.back();

  for (const std::string pipeline : {"train", "val"}) {
    const ImageTransform t = pipeline == "train" ? ImageTransform::train() : ImageTransform::val();
    if (pipeline == "val") {
      measure_anchor();
      bare2 = bare2s.back();
    }
    json p;
    auto folder = open_image_folder(d.folder.string());
    const Run from_folder = run_stoker(folder, t, workers, epochs, pipeline + "-folder", o);
    const Run from_records =
        run_stoker(open_records(d.records.string()), t, workers, epochs, pipeline + "-records", o);
    const Run from_cache = run_stoker(cache_in_ram(folder, std::size_t{4} << 30), t, workers,
                                      epochs, pipeline + "-ram-cache", o);
    p["stoker"] = {{"folder", to_json(from_folder)},
                   {"records", to_json(from_records)},
                   {"ram_cache", to_json(from_cache)}};
    const double best_stoker =
        std::max({from_folder.images_per_s, from_records.images_per_s, from_cache.images_per_s});
    p["fraction_of_bare_decode_2t"] = {{"folder", from_folder.images_per_s / bare2},
                                       {"records", from_records.images_per_s / bare2},
                                       {"ram_cache", from_cache.images_per_s / bare2}};
    if (!o.json) {
      fmt::print("\n  {} pipeline{:<22} {:>10} {:>13} {:>8} {:>10}\n", pipeline, "", "images/s",
                 "first epoch", "wait %", "/ bare 2t");
      auto row = [&](const std::string& who, const Run& r) {
        fmt::print("  {:<36} {:>10.0f} {:>13.0f} {:>8.1f} {:>10.2f}\n", who, r.images_per_s,
                   r.first_epoch_images_per_s, r.wait_pct, r.images_per_s / bare2);
      };
      row("stoker, image folder", from_folder);
      row("stoker, record shards (pread)", from_records);
      row("stoker, RAM cache", from_cache);
      std::string reads;
      for (std::size_t e = 0; e < from_cache.storage_reads.size(); ++e) {
        reads +=
            fmt::format("{}{} reads / {} B read()", e ? "; " : "",
                        from_cache.storage_reads[e] - (e ? from_cache.storage_reads[e - 1] : 0),
                        from_cache.read_syscall_bytes[e]);
      }
      fmt::print("  RAM cache: {} images kept; file reads per epoch: {}\n", from_cache.cached,
                 reads);
      std::fflush(stdout);
    }
    if (o.baseline) {
      std::string error;
      if (auto torch = run_torchvision(o, j, d, pipeline, error)) {
        p["torch"] = (*torch)["best"];
        p["torch_runs"] = (*torch)["runs"];
        result["torch_version"] = (*torch)["torch_version"];
        result["torchvision_version"] = (*torch)["torchvision_version"];
        const double tv = (*torch)["best"]["images_per_s"].get<double>();
        p["ratio_vs_torch"] = {{"folder", from_folder.images_per_s / tv},
                               {"records", from_records.images_per_s / tv},
                               {"ram_cache", from_cache.images_per_s / tv},
                               {"best", best_stoker / tv}};
        if (!o.json) {
          fmt::print("  {:<36} {:>10.0f} {:>13.0f}\n",
                     fmt::format("torchvision {} (best: workers {})",
                                 (*torch)["torchvision_version"].get<std::string>(),
                                 (*torch)["best"]["num_workers"].get<int>()),
                     tv, (*torch)["best"]["first_epoch_images_per_s"].get<double>());
          fmt::print("  stoker / torchvision: folder {:.2f}x, records {:.2f}x, RAM cache {:.2f}x\n",
                     from_folder.images_per_s / tv, from_records.images_per_s / tv,
                     from_cache.images_per_s / tv);
        }
      } else {
        p["torch_error"] = error;
        if (!o.json) fmt::print("  torchvision: not measured: {}\n", error);
      }
    }
    result[pipeline] = p;
  }
  measure_anchor();
  bare2 = median(bare2s);
  result["bare_decode_images_per_s"] = {{"1", median(bare1)}, {"2", bare2}};
  result["bare_decode_runs"] = {{"1", bare1}, {"2", bare2s}};
  // Fractions against the median anchor (the per-pipeline tables above used the latest one).
  for (const std::string pipeline : {"train", "val"}) {
    for (const std::string src : {"folder", "records", "ram_cache"}) {
      result[pipeline]["fraction_of_bare_decode_2t"][src] =
          result[pipeline]["stoker"][src]["images_per_s"].get<double>() / bare2;
    }
  }
  if (!o.json) {
    fmt::print("\n  bare decode medians: {:.0f} images/s on 1 thread, {:.0f} on 2\n", median(bare1),
               bare2);
    for (const std::string pipeline : {"train", "val"}) {
      const auto& f = result[pipeline]["fraction_of_bare_decode_2t"];
      fmt::print("  {} / bare 2-thread decode: folder {:.2f}, records {:.2f}, RAM cache {:.2f}\n",
                 pipeline, f["folder"].get<double>(), f["records"].get<double>(),
                 f["ram_cache"].get<double>());
    }
  }
  if (o.json) fmt::print("{}\n", result.dump(2));
  return 0;
}

}  // namespace stoker::bench
