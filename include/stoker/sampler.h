// The sampler: which samples an epoch visits, in which order, for which rank. Pure functions
// of (data set size, shuffle, seed, shard, epoch), with the rules of PyTorch's
// SequentialSampler, RandomSampler and DistributedSampler; nothing keeps state between calls,
// so a loader's position can be saved and resumed exactly, and anyone (the Python package's
// DistributedSampler, a test) can ask for an epoch's order without running a loader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stoker {

// Which ranks see which samples, with the rules of torch.utils.data.DistributedSampler:
// the epoch's order is padded by repetition to a multiple of world_size (or, with drop_last,
// cut to one), and rank r takes positions r, r + world_size, r + 2 * world_size, ...
struct Shard {
  std::size_t rank = 0;
  std::size_t world_size = 1;
  bool drop_last = false;  // cut the tail instead of padding (DistributedSampler's drop_last)
};

struct SampleOrder {
  std::size_t samples = 0;  // data set size
  bool shuffle = false;
  std::uint64_t seed = 0;  // the order of epoch e is a function of (seed + e), as in torch
  Shard shard;
};

// Samples one rank sees per epoch (DistributedSampler's num_samples).
std::size_t samples_per_rank(const SampleOrder& order);

// Batches in an epoch of `samples` samples.
std::size_t batch_count(std::size_t samples, std::size_t batch_size, bool drop_last);

// Writes this rank's sample indices for `epoch` into `out` (its capacity is reused): a
// permutation seeded by seed + epoch when shuffling, else 0..n-1; then padded by repetition
// (or cut, with shard.drop_last) to a multiple of world_size and strided by rank, exactly as
// torch.utils.data.DistributedSampler does.
void epoch_order(const SampleOrder& order, std::uint64_t epoch, std::vector<std::size_t>& out);
std::vector<std::size_t> epoch_order(const SampleOrder& order, std::uint64_t epoch);

}  // namespace stoker
