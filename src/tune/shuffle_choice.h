// Which shuffle a loader gives (docs/storage.md, "Data larger than the cache"): a pure rule
// from the data set's size in storage and the object cache it is read through, so that it can
// be tested on made-up sizes and a report can name the evidence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "stoker/options.h"

namespace stoker::detail {

struct ShuffleEvidence {
  ShuffleMode asked = ShuffleMode::automatic;
  std::size_t samples = 0;
  std::size_t blocks = 0;         // storage blocks (0: the data set did not say where it is)
  std::uint64_t data_bytes = 0;   // the blocks' bytes: what an epoch reads
  std::uint64_t cache_bytes = 0;  // the object cache the blocks are read through (0: none)
};

struct ShuffleChoice {
  std::size_t window = 0;  // blocks spread over (SampleOrder::window); 0: the global permutation
  std::string reason;      // the choice and its evidence, for Stats::shuffle and report()
};

// The share of the object cache a window may fill: the rest holds the blocks fetched ahead
// (at most a quarter of the cache, RemoteFiles) and blocks read to their end but not yet out.
inline constexpr double kWindowCacheShare = 0.5;
// The blocks a window aims to hold: a batch of B samples drawn from a window of W blocks holds
// about W (1 - e^(-B/W)) distinct blocks, so batches of up to 64 samples come from nearly as
// many blocks (and, on a data set sorted by label, hold nearly as many labels) as i.i.d. draws.
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
// fetched once in any order), else a window of as many blocks as half the cache holds. Asked for:
// `global` always; `window` with a window of what half the cache holds (all blocks when that is
// more). Throws std::invalid_argument for `window` asked of a data set that has no storage blocks
// or no object cache, naming what to change.
ShuffleChoice choose_shuffle(const ShuffleEvidence& evidence);

}  // namespace stoker::detail
