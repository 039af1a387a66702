// Which shuffle a loader gives (docs/storage.md, "Data larger than the cache"): a pure rule
// from the data set's size in storage and the object cache it is read through, so that it can
// be tested on made-up sizes (tests/window_shuffle_test.cc) and a report can name the evidence;
// the loader takes it (src/loader.cc), and so does stoker.shuffle_report().
//
// Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "stoker/dataset.h"
#include "stoker/options.h"
#include "stoker/sampler.h"

namespace stoker::detail {

struct ShuffleEvidence {
  ShuffleMode asked = ShuffleMode::automatic;
  std::size_t samples = 0;
  std::size_t blocks = 0;         // storage blocks (0: the data set did not say where it is)
  std::uint64_t data_bytes = 0;   // the blocks' bytes: what an epoch reads
  std::uint64_t cache_bytes = 0;  // the cache the blocks are read into whole (0: none)
  // Samples read ahead of the one being read (the batches the loader opens ahead of the
  // consumer, which the data set fetches into the cache before their reads): their blocks
  // share the cache with the window's.
  std::size_t lookahead_samples = 0;
  // The ranks of this node that read the same order through the same cache (LOCAL_WORLD_SIZE
  // when the order is sharded): their positions interleave, so each one's samples read ahead
  // are in the cache beside the others'.
  std::size_t node_ranks = 1;
  // The data set holds what it fetches ahead to a share of the cache of its own
  // (Dataset::StorageLayout::ahead_apart): the samples read ahead are not the window's, unless
  // the order is `sharded` over ranks (they count then, for the spread between the ranks).
  bool ahead_apart = false;
  bool sharded = false;
  // The cache's name and its option (Dataset::StorageLayout), for the explanation.
  const char* cache = "object cache";
  const char* cache_option = "object_cache_bytes";
};

// The samples whose blocks a loader brings into the cache ahead of the one being read
// (ShuffleEvidence::lookahead_samples). A data set that fetches what the loader hints
// (StorageLayout::fetches_ahead): those of the `depth` batches in flight, and as many again for
// the tuner's deeper queue. One that brings a block in only as a worker reads from it: those of
// the batches being read, the oldest open one and the next (each batch is cut into a chunk a
// worker, and idle workers take the oldest unclaimed chunk: src/exec/engine.h), whatever the
// depth; counting the depth there left a Parquet set of 100 kB images in 10 MB row groups, with
// batches of 256 through the default 256 MiB row-group cache, a window of one row group.
inline std::size_t lookahead_samples(std::size_t batch_size, std::size_t depth,
                                     bool fetches_ahead) {
  return fetches_ahead ? batch_size * 2 * (depth + 1) : batch_size * 2;
}

// The nodes a windowed order is laid out for (SampleOrder::nodes): `world` ranks in nodes of
// `local_ranks` (LOCAL_WORLD_SIZE) each, where that divides them, else one node (each rank
// then reads blocks from the whole data set, as before 2026-12-04: correct, only not local);
// one node too where LOCAL_WORLD_SIZE is not set (`local_ranks` 0), since the ranks may share
// one cache (whose window is sized for them all). The same on every rank wherever
// LOCAL_WORLD_SIZE is the same, so every rank builds the same order.
inline NodeLayout node_layout(std::size_t world, std::size_t local_ranks) {
  if (local_ranks == 0 || local_ranks >= world || world % local_ranks != 0) return {1, 1};
  return {world / local_ranks, local_ranks};
}

struct ShuffleChoice {
  std::size_t window = 0;  // blocks spread over (SampleOrder::window); 0: the global permutation
  std::string reason;      // the choice and its evidence, for Stats::shuffle and report()
};

// The share of the object cache a window may fill: the rest holds the blocks fetched ahead
// with the window (the samples read ahead, lookahead_samples) and blocks read to their end but
// not yet out.
inline constexpr double kWindowCacheShare = 0.5;
// The blocks a window aims to hold: a batch of B consecutive samples of a window of W blocks
// comes from about min(B, W) distinct blocks (window_order stratifies a block's samples over
// its span), so batches of up to a few hundred samples come from as many blocks (and, on a
// data set sorted by label, hold as many labels) as i.i.d. draws: batches of 256 of a
// label-sorted set, 228 labels against 226 i.i.d.; a window of 128 gives 156.
inline constexpr std::size_t kWindowBlocks = 512;
// A window of fewer blocks mixes too little to pass for a shuffle without being told.
inline constexpr std::size_t kSmallWindow = 64;
// Blocks are at least this long (a GET's round trip is worth its bytes: smaller ones cost more
// requests than the mixing they buy) and at most the aligned chunk of a data set that fits.
inline constexpr std::uint64_t kMinBlockBytes = 32u << 10;
inline constexpr std::uint64_t kMaxBlockBytes = 8u << 20;

// The length a data set read through an object cache of `cache_bytes` cuts its storage blocks
// to (between samples, so a block may be longer): what gives a window of kWindowBlocks in the
// cache's share, within [kMinBlockBytes, kMaxBlockBytes].
std::uint64_t storage_block_bytes(std::uint64_t cache_bytes);

// Automatic: the global permutation while the data set fits the object cache (each chunk
// fetched once in the first epoch, none later) or while every block holds one sample (each is
// fetched once in any order), else a window of as many blocks as half the cache holds beside
// the bytes of the samples read ahead (about a block enters the window every block's worth of
// samples, so the samples read ahead bring about their own bytes in new blocks; the node's
// ranks' samples read ahead, when they share the cache, count each; for an order not sharded,
// none where the data set holds its fetches ahead to a share of their own). Asked for:
// `global` always; `window` with a window of what half the cache holds (all blocks when that is
// more). Throws std::invalid_argument for `window` asked of a data set that has no storage blocks
// or no object cache, naming what to change.
ShuffleChoice choose_shuffle(const ShuffleEvidence& evidence);

// What a user trades (stoker shuffle-report, stoker.shuffle_report()): the shuffle a loader
// would choose for a data set, and the quality (shuffle_quality) of that order beside a full
// shuffle, the window (chosen, or as `window` would give it), a stream's shard shuffle with
// buffers, and reading in order. Pure: orders are computed, nothing is read.
struct ShuffleReportOptions {
  ShuffleMode asked = ShuffleMode::automatic;
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
  std::size_t batch_size = 64;
  std::size_t depth = LoaderOptions{}.depth;  // batches in flight (lookahead_samples)
  std::vector<std::int64_t> labels;           // per sample, optional: labels per batch
  std::vector<std::size_t> buffers{1000, 5000};
  // The object cache to judge against; the maximum: the data set's own.
  std::uint64_t cache_bytes = std::numeric_limits<std::uint64_t>::max();
};
struct ShuffleReport {
  std::size_t samples = 0, blocks = 0, shards = 0;
  std::uint64_t data_bytes = 0, cache_bytes = 0;
  ShuffleChoice choice;
  struct Row {
    std::string name;
    ShuffleQuality quality;
  };
  std::vector<Row> rows;  // the first is the choice's
};
// Throws std::invalid_argument for labels of another length than the data set's.
ShuffleReport shuffle_report(const Dataset::StorageLayout& layout, std::size_t samples,
                             const ShuffleReportOptions& options);
// The report as a table: each order's entropies as a share of a full shuffle's, and labels
// per batch against i.i.d. draws.
std::string to_string(const ShuffleReport& report);

}  // namespace stoker::detail
