#include "tune_commands.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_jpeg.h"
#include "stoker/encoded.h"
#include "stoker/image.h"
#include "stoker/webdataset.h"
#ifdef STOKER_HAVE_PARQUET
#include "stoker/parquet.h"
#endif
#ifdef STOKER_HAVE_VIDEO
#include "stoker/video.h"
#endif
#include "tune.h"

namespace stoker::tools {
namespace {

// What to run: a built-in workload, or images through an ImageNet pipeline.
struct TargetArgs {
  std::string workload = "heavy";
  std::string folder;
  std::string records;
  std::string webdataset;
  std::string parquet;
  std::string video;
  std::vector<std::string> columns{"image", "label"};
  std::string pipeline = "train";
  int frames = 16;             // video: frames per clip
  std::size_t batch_size = 0;  // 0: 64 images, 8 clips
  double consumer_ms = -1;     // < 0: the workload's (0 for images)
  bool smoke = false;
  std::string data_dir;  // jpeg: where the generated images live
};

void add_target_options(CLI::App* cmd, TargetArgs& a) {
  cmd->add_option("-w,--workload", a.workload,
                  "heavy (latency-bound, default), tiny, tensor, overhead, or jpeg (generated "
                  "JPEGs through the ImageNet pipeline)")
      ->check(CLI::IsMember({"tensor", "tiny", "heavy", "overhead", "jpeg"}));
  cmd->add_option("--folder", a.folder, "An image folder (class subfolders) instead");
  cmd->add_option("--records", a.records, "Record shards (stoker pack) instead");
  cmd->add_option("--webdataset", a.webdataset,
                  "WebDataset tar shards instead (a directory of *.tar, or one shard): the "
                  "jpg/jpeg/png and cls fields");
  cmd->add_option("--parquet", a.parquet,
                  "Parquet files instead (one file, or a directory of *.parquet): the --columns "
                  "(needs a build with Arrow C++)");
  cmd->add_option("--video", a.video,
                  "Video clips instead (a video file, a directory of videos or of class "
                  "folders of videos, or a WebDataset shard of videos): random clips of "
                  "--frames frames at 224x224 (needs a build with FFmpeg's libraries)");
  cmd->add_option("--frames", a.frames, "Video: frames per clip (default 16)");
  cmd->add_option("--columns", a.columns,
                  "Parquet: the columns read (default: image label; binary or Hugging Face "
                  "image columns decoded by the pipeline)");
  cmd->add_option("--pipeline", a.pipeline, "Images: train (default) or val")
      ->check(CLI::IsMember({"train", "val"}));
  cmd->add_option("--batch-size", a.batch_size,
                  "Images and clips: batch size (default 64 images, 8 clips)");
  cmd->add_option("--consumer-ms", a.consumer_ms,
                  "The training loop's compute per batch (default: the workload's; 0 for "
                  "images)");
  cmd->add_flag("--smoke", a.smoke, "Small sizes: check that everything runs");
  cmd->add_option("--data-dir", a.data_dir, "jpeg: where the generated images live");
}

bench::WorkloadTarget make_target(const TargetArgs& a) {
  bench::BenchOptions bo;
  bo.smoke = a.smoke;
  bo.consumer_ms = a.consumer_ms;
  std::string folder = a.folder;
  const int given = !a.folder.empty() + !a.records.empty() + !a.webdataset.empty() +
                    !a.parquet.empty() + !a.video.empty();
  if (given > 1) {
    throw std::invalid_argument(
        "--folder, --records, --webdataset, --parquet, --video: one of them");
  }
  if (!a.video.empty()) {
#ifdef STOKER_HAVE_VIDEO
    VideoClipsOptions vo;
    vo.paths = {a.video};
    vo.frames = a.frames;
    vo.sampling = VideoClipsOptions::Sampling::random;
    vo.center_crop = true;
    bench::WorkloadTarget t;
    t.description = "video clips " + a.video + ", " + std::to_string(a.frames) + " frames";
    t.dataset = std::make_shared<VideoClips>(vo);
    t.batch_size = a.batch_size ? a.batch_size : 8;
    t.consumer_ms = std::max(0.0, a.consumer_ms);
    return t;
#else
    throw std::invalid_argument(
        "--video: this stoker was built without FFmpeg's libraries (cmake/video.cmake: "
        "install libavformat-dev and libavcodec-dev)");
#endif
  }
  const std::size_t batch_size = a.batch_size ? a.batch_size : 64;
  const ImageTransform transform =
      a.pipeline == "train" ? ImageTransform::train() : ImageTransform::val();
  if (!a.parquet.empty()) {
#ifdef STOKER_HAVE_PARQUET
    ParquetOptions po;
    po.files = {a.parquet};
    po.columns = a.columns;
    po.transform = transform;
    bench::WorkloadTarget t;
    t.description = "Parquet " + a.parquet + ", " + a.pipeline + " pipeline";
    t.dataset = std::make_shared<ParquetDataset>(po);
    t.batch_size = batch_size;
    t.consumer_ms = std::max(0.0, a.consumer_ms);
    return t;
#else
    throw std::invalid_argument(
        "--parquet: this stoker was built without Arrow C++ (cmake/parquet.cmake: install "
        "Arrow's libparquet-dev, or configure with -DSTOKER_ARROW_PYTHON=<a python with "
        "pyarrow>)");
#endif
  }
  if (!a.webdataset.empty()) {
    WebDatasetOptions wo;
    wo.shards = {a.webdataset};
    wo.transform = transform;
    bench::WorkloadTarget t;
    t.description = "WebDataset " + a.webdataset + ", " + a.pipeline + " pipeline";
    t.dataset = std::make_shared<WebDataset>(wo);
    t.batch_size = batch_size;
    t.consumer_ms = std::max(0.0, a.consumer_ms);
    return t;
  }
  if (a.folder.empty() && a.records.empty()) {
    if (a.workload != "jpeg") return bench::workload_target(a.workload, bo);
    bench::JpegBenchOptions jo;
    jo.data_dir = a.data_dir;
    folder = bench::jpeg_data(bo, jo)[0];
  }
  ImageDatasetOptions io;
  io.source = folder.empty() ? open_records(a.records) : open_image_folder(folder);
  io.transform = transform;
  bench::WorkloadTarget t;
  t.description = (folder.empty() ? "records " + a.records : "image folder " + folder) + ", " +
                  a.pipeline + " pipeline";
  t.dataset = std::make_shared<ImageDataset>(io);
  t.batch_size = batch_size;
  t.consumer_ms = std::max(0.0, a.consumer_ms);
  return t;
}

}  // namespace

std::function<int()> add_tune_commands(CLI::App& app) {
  auto target = std::make_shared<TargetArgs>();
  auto tune = std::make_shared<bench::TuneOptions>();
  auto* t = app.add_subcommand(
      "tune",
      "Run a pipeline briefly with the online tuner and print the configuration it chose and "
      "its throughput; --grid also measures every fixed configuration (much slower)");
  add_target_options(t, *target);
  t->add_option("--seconds", tune->seconds, "The tuner's run (default 5)");
  t->add_option("--measure", tune->measure_s,
                "Seconds measured after tuning, and per grid point (default 2)");
  t->add_option("--workers", tune->workers, "The tuner's starting workers (default: the cores)");
  t->add_option("--depth", tune->depth, "The tuner's starting depth (default 4)");
  t->add_option("--memory-budget-mb", tune->memory_budget,
                "Slab memory the tuner may use, in MB (default: a quarter of MemAvailable)")
      ->transform([](const std::string& mb) { return std::to_string(std::stoull(mb) << 20); });
  t->add_flag("--grid", tune->grid, "Also measure workers x pinning x depth");
  t->add_option("--repeat", tune->repeat,
                "Rounds of the tuner's run and the grid, alternated; figures are their medians "
                "(default 3 with --grid, else 1)");
  t->add_option("--grid-workers", tune->grid_workers, "Grid worker counts (default 1 2 4 8 16)");
  t->add_option("--grid-depth", tune->grid_depth, "Grid depths (default 2 4 8)");
  t->add_flag("--json", tune->json, "Print one JSON object instead");
  t->add_option("--plot", tune->plot,
                "Write a PNG or SVG chart of the grid: samples/s against workers, one line per "
                "pinning x depth, the tuner's choice marked (needs --grid, matplotlib)");
  t->add_option("--python", tune->python, "Python with matplotlib, for --plot");

  auto diagnose_target = std::make_shared<TargetArgs>();
  auto diagnose = std::make_shared<bench::DiagnoseOptions>();
  auto* d = app.add_subcommand(
      "diagnose",
      "Run a pipeline briefly and say what holds it back: input- or compute-bound, the busiest "
      "stage, whether more workers would help, what to try");
  add_target_options(d, *diagnose_target);
  d->add_option("--seconds", diagnose->seconds, "How long to run (default 5)");
  d->add_option("--workers", diagnose->workers, "Workers (default: the cores)");
  d->add_option("--depth", diagnose->depth, "Batches in flight (default 4)");
  d->add_flag("--tune", diagnose->tune, "Let the tuner run meanwhile");
  d->add_flag("--json", diagnose->json, "Print one JSON object instead");

  return [=]() -> int {
    if (t->parsed()) return bench::run_tune(make_target(*target), *tune);
    if (d->parsed()) return bench::run_diagnose(make_target(*diagnose_target), *diagnose);
    return -1;
  };
}

}  // namespace stoker::tools
