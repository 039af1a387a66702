#include "shuffle_commands.h"

#include <fmt/core.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "stoker/frontend/shuffle_choice.h"
#include "stoker/webdataset.h"

namespace stoker::tools {
namespace {

struct ShuffleArgs {
  std::vector<std::string> webdataset;
  std::vector<std::string> fields = WebDatasetOptions{}.fields;
  std::string object_cache;
  std::uint64_t object_cache_bytes = ObjectStorageOptions{}.object_cache_bytes;
  std::string shuffle = "auto";
  std::string labels;  // an integer field to read labels from
  detail::ShuffleReportOptions report;
  bool json = false;
};

// The integer field `field` of every sample, read alone (over URLs without the object cache:
// each a range GET of its own bytes, fetched ahead a batch at a time).
std::vector<std::int64_t> read_labels(WebDatasetOptions o, const std::string& field) {
  o.fields = {field};
  o.storage.object_cache_bytes = 0;
  const WebDataset ds(o);
  if (ds.fields().at(0).dtype != DType::i64 || ds.fields()[0].elements() != 1) {
    throw std::invalid_argument("--labels " + field + ": not an integer field (cls, id, ...)");
  }
  std::vector<std::int64_t> labels(ds.size());
  const std::size_t bytes = sizeof(std::int64_t);
  constexpr std::size_t kAhead = 256;
  std::vector<std::size_t> rows;
  for (std::size_t i = 0; i < ds.size(); ++i) {
    if (i % kAhead == 0) {
      rows.clear();
      for (std::size_t j = i; j < std::min(ds.size(), i + kAhead); ++j) rows.push_back(j);
      ds.will_read(rows);
    }
    std::byte* base = reinterpret_cast<std::byte*>(labels.data());
    ds.read(i, SampleOut({&bytes, 1}, &base, i, 0));
  }
  return labels;
}

nlohmann::json to_json(const detail::ShuffleReport& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows) {
    rows.push_back({{"order", row.name},
                    {"sample_entropy", row.quality.sample_entropy},
                    {"shard_entropy", row.quality.shard_entropy},
                    {"labels_per_batch", row.quality.labels_per_batch},
                    {"iid_labels_per_batch", row.quality.iid_labels_per_batch}});
  }
  return {{"samples", r.samples},         {"shards", r.shards},
          {"blocks", r.blocks},           {"data_bytes", r.data_bytes},
          {"cache_bytes", r.cache_bytes}, {"window", r.choice.window},
          {"shuffle", r.choice.reason},   {"rows", rows}};
}

}  // namespace

std::function<int()> add_shuffle_commands(CLI::App& app) {
  auto args = std::make_shared<ShuffleArgs>();
  auto* cmd = app.add_subcommand(
      "shuffle-report",
      "The shuffle a loader gives a data set (global, or windowed over its storage blocks when "
      "it does not fit the object cache) and its quality beside a full shuffle, a stream's "
      "buffer and reading in order; reads only the shards' indexes");
  cmd->add_option("--webdataset", args->webdataset,
                  "WebDataset shards: tar files, directories of them, or s3:// / http(s):// URLs "
                  "(an s3:// prefix lists its *.tar)")
      ->required();
  cmd->add_option("--fields", args->fields,
                  "The fields a loader reads (their bytes make the blocks; default: "
                  "jpg;jpeg;png cls)");
  cmd->add_option("--object-cache", args->object_cache, "The object cache's directory");
  cmd->add_option("--object-cache-bytes", args->object_cache_bytes,
                  "The object cache's cap (default 10 GiB), which the choice is judged against");
  cmd->add_option("--shuffle", args->shuffle, "auto, global or window")
      ->check(CLI::IsMember({"auto", "global", "window"}));
  cmd->add_option("--batch-size", args->report.batch_size, "Batch size (default 64)");
  cmd->add_option("--seed", args->report.seed, "The loader's seed");
  cmd->add_option("--epoch", args->report.epoch, "The epoch");
  cmd->add_option("--buffer", args->report.buffers,
                  "A stream's shuffle buffers to compare (default 1000 5000)");
  cmd->add_option("--labels", args->labels,
                  "An integer field (cls) to read for each sample: batches' distinct labels "
                  "beside i.i.d. draws, for a data set sorted by label (reads that member of "
                  "every sample; over URLs a small range GET each)");
  cmd->add_flag("--json", args->json, "Print one JSON object instead of a table");
  return [cmd, args]() -> int {
    if (!cmd->parsed()) return -1;
    WebDatasetOptions o;
    o.shards = args->webdataset;
    o.fields = args->fields;
    o.storage.object_cache_dir = args->object_cache;
    o.storage.object_cache_bytes = args->object_cache_bytes;
    const WebDataset ds(o);
    auto& r = args->report;
    r.asked = args->shuffle == "global"   ? ShuffleMode::global
              : args->shuffle == "window" ? ShuffleMode::window
                                          : ShuffleMode::automatic;
    r.cache_bytes = args->object_cache_bytes;
    if (!args->labels.empty()) r.labels = read_labels(o, args->labels);
    const auto report = detail::shuffle_report(ds.storage_layout(), ds.size(), r);
    if (args->json) {
      fmt::print("{}\n", to_json(report).dump(2));
    } else {
      fmt::print("{}", detail::to_string(report));
    }
    return 0;
  };
}

}  // namespace stoker::tools
