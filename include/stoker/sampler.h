// The sampler: which samples an epoch visits, in which order, for which rank. Pure functions
// of (data set size, shuffle, seed, shard, epoch), with the rules of PyTorch's
// SequentialSampler, RandomSampler and DistributedSampler; nothing keeps state between calls,
// so a loader's position can be saved and resumed exactly, and anyone (the Python package's
// DistributedSampler, a test) can ask for an epoch's order without running a loader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
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

// --- Elastic resume: an epoch checkpointed on one topology, finished on another -------------
//
// The epoch's global order is its order for one rank (epoch_order with world_size 1); a
// position is an index into it. What the ranks have consumed is a set of positions, kept as
// sorted, disjoint, non-adjacent ranges [begin, end): ranks that stop at the same batch have
// together consumed one prefix, so the set stays a few ranges whatever the data set's size.
// An epoch resumed after `consumed` visits the remaining positions in their order, padded by
// repetition (or cut, with shard.drop_last) to a multiple of the new world size and strided by
// rank, exactly as a fresh epoch visits all of them; each remaining sample is read once over
// the new ranks (and the padding's repeats, as in a fresh epoch).
using PositionRanges = std::vector<std::pair<std::size_t, std::size_t>>;

// The positions consumed once rank r of `world` ranks (taken.size()) has taken taken[r] of its
// samples in an epoch of `samples` samples that started after `before` (empty: a fresh epoch).
// Throws std::invalid_argument if a rank took more samples than the epoch gives it.
PositionRanges consumed_positions(std::size_t samples, const PositionRanges& before,
                                  std::span<const std::size_t> taken, bool drop_last);

// The samples this rank (order.shard) reads in the rest of epoch `epoch` after `consumed`.
// With empty `consumed` it equals epoch_order(order, epoch). Throws std::invalid_argument for
// ranges that are unsorted, overlapping or past the data set.
void resumed_order(const SampleOrder& order, std::uint64_t epoch, const PositionRanges& consumed,
                   std::vector<std::size_t>& out);

}  // namespace stoker
