#include "stoker/frontend/shuffle_choice.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "util/format.h"

namespace stoker::detail {
namespace {

std::string bytes(std::uint64_t n) {
  const double b = static_cast<double>(n);
  if (b >= 1e9) return format("%.3g GB", b / 1e9);
  if (b >= 1e6) return format("%.3g MB", b / 1e6);
  return format("%.3g kB", b / 1e3);
}

}  // namespace

std::uint64_t storage_block_bytes(std::uint64_t cache_bytes) {
  const auto share = static_cast<std::uint64_t>(static_cast<double>(cache_bytes) *
                                                kWindowCacheShare / kWindowBlocks);
  return std::clamp(share, kMinBlockBytes, kMaxBlockBytes);
}

ShuffleChoice choose_shuffle(const ShuffleEvidence& e) {
  if (e.asked == ShuffleMode::global) return {0, "global: asked for (shuffle='global')"};
  const bool window_asked = e.asked == ShuffleMode::window;
  if (e.blocks == 0) {
    if (window_asked) {
      throw std::invalid_argument(
          "stoker: shuffle='window' needs a data set read by blocks through a cache (WebDataset "
          "shards at s3:// or http(s):// URLs through the object cache, Parquet row groups "
          "through the row-group cache); this one does not say where its bytes are: use "
          "shuffle=True");
    }
    return {0, "global: the data set is not read by blocks through a cache"};
  }
  if (e.cache_bytes == 0) {
    if (window_asked) {
      throw std::invalid_argument(std::string("stoker: shuffle='window' reads each block once "
                                              "through the ") +
                                  e.cache + ", and " + e.cache_option +
                                  " is 0: give the cache room for a window (at least " +
                                  bytes(e.data_bytes / e.blocks * kSmallWindow * 2) + ")");
    }
    return {0, std::string("global: no ") + e.cache + " (" + e.cache_option + "=0)"};
  }
  const std::string evidence = "the data set's " + bytes(e.data_bytes) + " in " +
                               std::to_string(e.blocks) + " blocks, the " + e.cache + " of " +
                               bytes(e.cache_bytes);
  if (!window_asked && e.data_bytes <= e.cache_bytes) {
    return {0, "global: " + evidence +
                   " holds it all (each block fetched once, in the first "
                   "epoch)"};
  }
  if (!window_asked && e.samples <= e.blocks) {
    return {0, "global: " + evidence +
                   " cannot hold it, but each block is one sample, read once in any "
                   "order"};
  }
  const double mean_block = static_cast<double>(e.data_bytes) / static_cast<double>(e.blocks);
  // Ranks read at their own pace: the samples they read ahead keep room for the spread
  // between them even where the fetches ahead have a share of their own (without it, four
  // ranks through a tenth of the data set fetched 1.97x it).
  const double ahead = e.ahead_apart && !e.sharded
                           ? 0.0
                           : static_cast<double>(e.lookahead_samples) *
                                 static_cast<double>(std::max<std::size_t>(e.node_ranks, 1)) *
                                 static_cast<double>(e.data_bytes) / static_cast<double>(e.samples);
  const auto fits = static_cast<std::size_t>(std::max(
      0.0,
      std::floor((static_cast<double>(e.cache_bytes) * kWindowCacheShare - ahead) / mean_block)));
  const std::size_t window = std::clamp<std::size_t>(fits, 1, e.blocks);
  std::string reason = "window of " + std::to_string(window) + " blocks (" +
                       bytes(static_cast<std::uint64_t>(mean_block * static_cast<double>(window))) +
                       "): " + evidence + (window_asked ? " (asked for)" : " cannot hold it") +
                       "; each block read once an epoch, samples mixed across the window";
  if (e.node_ranks > 1) {
    reason += "; the window shared by the node's " + std::to_string(e.node_ranks) +
              " ranks, each reading ahead through the cache";
  }
  if (window < kSmallWindow && window < e.blocks) {
    reason += std::string("; a window this small mixes few blocks: ") + e.cache_option + "=" +
              bytes(static_cast<std::uint64_t>((mean_block * kWindowBlocks + ahead) /
                                               kWindowCacheShare)) +
              " would give a window of " + std::to_string(kWindowBlocks);
  }
  return {window, std::move(reason)};
}

ShuffleReport shuffle_report(const Dataset::StorageLayout& layout, std::size_t samples,
                             const ShuffleReportOptions& o) {
  if (!o.labels.empty() && o.labels.size() != samples) {
    throw std::invalid_argument("stoker: shuffle_report: " + std::to_string(o.labels.size()) +
                                " labels for a data set of " + std::to_string(samples) +
                                " samples");
  }
  ShuffleReport r;
  r.samples = samples;
  const StorageBlocks* blocks = layout.blocks.get();
  std::vector<std::size_t> shards{samples};  // without a layout: one shard
  if (blocks != nullptr) {
    r.blocks = blocks->ends.size();
    r.data_bytes = blocks->total_bytes();
    if (!blocks->object_ends.empty()) shards = blocks->object_ends;
  }
  r.shards = shards.size();
  r.cache_bytes = o.cache_bytes == std::numeric_limits<std::uint64_t>::max()
                      ? (layout.read_whole ? layout.cache_bytes : 0)
                      : o.cache_bytes;
  const bool judged = blocks != nullptr &&
                      (layout.read_whole || o.cache_bytes != ShuffleReportOptions{}.cache_bytes);
  ShuffleEvidence e;
  e.asked = o.asked;
  e.samples = samples;
  e.blocks = judged ? r.blocks : 0;
  e.data_bytes = r.data_bytes;
  e.cache_bytes = r.cache_bytes;
  e.lookahead_samples = lookahead_samples(o.batch_size, o.depth, layout.fetches_ahead);
  e.ahead_apart = layout.ahead_apart;
  e.cache = layout.cache;
  e.cache_option = layout.cache_option;
  r.choice = choose_shuffle(e);
  const auto row = [&](std::string name, const std::vector<std::size_t>& order) {
    r.rows.push_back({std::move(name), shuffle_quality(order, shards, o.labels, o.batch_size)});
  };
  SampleOrder global{samples, true, o.seed, {}};
  std::vector<std::size_t> order;
  if (r.choice.window > 0) {
    window_order(*blocks, r.choice.window, o.seed + o.epoch, order);
    row("window of " + std::to_string(r.choice.window) + " blocks (chosen)", order);
  } else {
    row("global (chosen)", epoch_order(global, o.epoch));
  }
  if (r.choice.window > 0) row("global", epoch_order(global, o.epoch));
  if (judged && r.choice.window == 0 && r.cache_bytes > 0) {
    e.asked = ShuffleMode::window;  // what shuffle='window' would give
    const ShuffleChoice w = choose_shuffle(e);
    window_order(*blocks, w.window, o.seed + o.epoch, order);
    row("window of " + std::to_string(w.window) + " blocks (shuffle='window')", order);
  }
  for (const std::size_t b : o.buffers) {
    stream_order(shards, b, o.seed + o.epoch, order);
    row("stream: shards shuffled, buffer of " + std::to_string(b), order);
  }
  row("in order", epoch_order(SampleOrder{samples, false, 0, {}}, 0));
  return r;
}

std::string to_string(const ShuffleReport& r) {
  std::string out = format("%zu samples in %zu shards", r.samples, r.shards);
  if (r.blocks > 0) out += format(" and %zu blocks (%s)", r.blocks, bytes(r.data_bytes).c_str());
  out += "; shuffle: " + r.choice.reason + "\n";
  // The full shuffle is the reference: the chosen row when global, else the next.
  const ShuffleQuality& full = r.rows[r.choice.window > 0 ? 1 : 0].quality;
  const auto share = [](double x, double of) { return of > 0 ? x / of : 0.0; };
  const bool labels = full.iid_labels_per_batch > 0;
  out += format("%-48s %16s %16s", "order", "sample entropy", "shard entropy");
  if (labels) out += format(" %18s", "labels/batch (iid)");
  out += "\n";
  for (const auto& row : r.rows) {
    const ShuffleQuality& q = row.quality;
    out += format("%-48s %8.2f (%4.2f) %8.2f (%4.2f)", row.name.c_str(), q.sample_entropy,
                  share(q.sample_entropy, full.sample_entropy), q.shard_entropy,
                  share(q.shard_entropy, full.shard_entropy));
    if (labels) out += format(" %8.1f (%6.1f)", q.labels_per_batch, q.iid_labels_per_batch);
    out += "\n";
  }
  return out;
}

}  // namespace stoker::detail
