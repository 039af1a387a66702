#include "tune/shuffle_choice.h"

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
          "stoker: shuffle='window' needs a data set read from object storage through the "
          "object cache (WebDataset shards at s3:// or http(s):// URLs); this one does not say "
          "where its bytes are: use shuffle=True");
    }
    return {0, "global: the data set is not read from object storage"};
  }
  if (e.cache_bytes == 0) {
    if (window_asked) {
      throw std::invalid_argument(
          "stoker: shuffle='window' reads each block once through the object cache, and "
          "object_cache_bytes is 0: give the cache room for a window (at least " +
          bytes(e.data_bytes / e.blocks * kSmallWindow * 2) + ")");
    }
    return {0,
            "global: no object cache (object_cache_bytes=0), each sample fetched by its own "
            "range GET"};
  }
  const std::string evidence = "the data set's " + bytes(e.data_bytes) + " in " +
                               std::to_string(e.blocks) + " blocks, an object cache of " +
                               bytes(e.cache_bytes);
  if (!window_asked && e.data_bytes <= e.cache_bytes) {
    return {0, "global: " + evidence +
                   " holds it all (each block fetched once, in the first "
                   "epoch)"};
  }
  if (!window_asked && e.samples <= e.blocks) {
    return {0, "global: " + evidence +
                   " cannot hold it, but each block is one sample, fetched "
                   "once in any order (by a range GET of its own)"};
  }
  const double mean_block = static_cast<double>(e.data_bytes) / static_cast<double>(e.blocks);
  const auto fits = static_cast<std::size_t>(
      std::floor(static_cast<double>(e.cache_bytes) * kWindowCacheShare / mean_block));
  const std::size_t window = std::clamp<std::size_t>(fits, 1, e.blocks);
  std::string reason = "window of " + std::to_string(window) + " blocks (" +
                       bytes(static_cast<std::uint64_t>(mean_block * static_cast<double>(window))) +
                       "): " + evidence + (window_asked ? " (asked for)" : " cannot hold it") +
                       "; each block fetched once an epoch, samples mixed across the window";
  if (window < kSmallWindow && window < e.blocks) {
    reason += "; a window this small mixes few blocks: an object cache of " +
              bytes(static_cast<std::uint64_t>(mean_block * kWindowBlocks / kWindowCacheShare)) +
              " would give a window of " + std::to_string(kWindowBlocks);
  }
  return {window, std::move(reason)};
}

}  // namespace stoker::detail
