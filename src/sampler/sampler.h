// Sample order: pure functions of (data set size, shuffle, seed, epoch, shard). Nothing here
// keeps state between calls, so a loader's position can be saved and resumed exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "stoker/loader.h"

namespace stoker::detail {

struct OrderSpec {
  std::size_t samples = 0;  // data set size
  bool shuffle = false;
  std::uint64_t seed = 0;
  Shard shard;
};

// Samples one rank sees per epoch (DistributedSampler's num_samples).
std::size_t samples_per_rank(const OrderSpec& spec);

// Batches in an epoch of `samples` samples.
std::size_t batch_count(std::size_t samples, std::size_t batch_size, bool drop_last);

// Writes this rank's sample indices for `epoch` into `out` (its capacity is reused): a
// permutation seeded by seed + epoch when shuffling, else 0..n-1; then padded by repetition
// (or cut, with shard.drop_last) to a multiple of world_size and strided by rank, exactly as
// torch.utils.data.DistributedSampler does.
void epoch_order(const OrderSpec& spec, std::uint64_t epoch, std::vector<std::size_t>& out);

// A uniformly random permutation of 0..n-1 from `seed` (Fisher-Yates over SplitMix64 with
// Lemire's unbiased bounded draw), identical on every platform.
void permutation(std::size_t n, std::uint64_t seed, std::vector<std::size_t>& out);

// Mixes words into a well-spread 64-bit value (SplitMix64 finalizer chain).
std::uint64_t mix(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0);

}  // namespace stoker::detail
