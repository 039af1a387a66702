// The sampler: which samples an epoch visits, in which order, for which rank. Pure functions
// of (data set size, shuffle, seed, shard, epoch), with the rules of PyTorch's
// SequentialSampler, RandomSampler and DistributedSampler; nothing keeps state between calls,
// so a loader's position can be saved and resumed exactly, and anyone (the Python package's
// DistributedSampler, a test) can ask for an epoch's order without running a loader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
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

// How a data set's samples lie in storage (Dataset::storage_layout): blocks of consecutive
// samples, each fetched whole by one range GET into the object cache. Block b holds samples
// [ends[b - 1], ends[b]) (ends[-1] is 0; ends.back() is the data set's size) and is bytes[b]
// long. Blocks do not cross objects (shards): the samples of object k end at object_ends[k].
struct StorageBlocks {
  std::vector<std::size_t> ends;
  std::vector<std::uint64_t> bytes;
  std::vector<std::size_t> object_ends;
  std::uint64_t total_bytes() const;
  // The block holding sample `index` (binary search).
  std::size_t block_of(std::size_t index) const;
};

// The nodes an order is laid out for (SampleOrder::nodes): `nodes` nodes of `ranks` ranks
// each, ranks numbered node by node (torchrun's RANK = node * LOCAL_WORLD_SIZE + LOCAL_RANK).
struct NodeLayout {
  std::size_t nodes = 1;
  std::size_t ranks = 1;
  bool operator==(const NodeLayout&) const = default;
};

struct SampleOrder {
  std::size_t samples = 0;  // data set size
  bool shuffle = false;
  std::uint64_t seed = 0;  // the order of epoch e is a function of (seed + e), as in torch
  Shard shard;
  // A shuffle that knows where the bytes are (docs/storage.md, "Data larger than the cache"):
  // with `blocks` and `window` >= 1, a shuffled epoch visits the blocks in a random order and
  // spreads each block's samples at random over the span of `window` blocks from its place (one
  // in each of as many equal parts of the span as it has samples), so
  // that about `window` blocks are being read at any time (the object cache holds them) and
  // each is fetched once an epoch; samples of neighbouring blocks interleave, so no sample's
  // neighbours are fixed by its block. Null or 0: the global permutation.
  std::shared_ptr<const StorageBlocks> blocks = nullptr;
  std::size_t window = 0;
  // A windowed order over several nodes: the blocks, in their random order, are cut into one
  // run per node, each spread over its own window, and the global order interleaves the runs
  // so that the positions strided to a node's ranks are its run: each node reads its own
  // blocks (a block where two runs meet is read by both), not every block. A pure function of
  // the layout too: a state records it (resumed_order needs the layout the epoch began on).
  NodeLayout nodes = {};
};

// The windowed shuffle's global order of an epoch into `out` (its positions, which ranks take
// strided): a pure function of (blocks, window, seed + epoch, nodes). Throws std::invalid_argument
// for blocks that do not cover `samples` or a window of 0.
void window_order(const StorageBlocks& blocks, std::size_t window, std::uint64_t seed,
                  std::vector<std::size_t>& out, NodeLayout nodes = {});

// A stream's order, for comparison (stoker shuffle-report): the objects (shards; the samples
// of object k end at object_ends[k]) in a random order, read in order each, through a buffer
// of `buffer` samples from which each next sample is drawn at random and replaced by the next
// one read, as webdataset's shuffle() and Hugging Face datasets' IterableDataset.shuffle() do.
void stream_order(std::span<const std::size_t> object_ends, std::size_t buffer, std::uint64_t seed,
                  std::vector<std::size_t>& out);

// The quality of a shuffle (stoker shuffle-report, stoker.shuffle_report): Mosaic Streaming's
// measure, the Shannon entropy (bits) of the steps |order[i+1] - order[i]| between neighbours
// in sample ids and in shard ids (group_ends: the samples of shard g end at group_ends[g], as
// StorageBlocks::ends; empty: no shards), and, given labels (labels[i] of sample i: on a data
// set sorted by label, how well batches mix), the mean number of distinct labels in a batch of
// `batch_size` beside what an i.i.d. draw (with replacement) from the same labels holds.
struct ShuffleQuality {
  double sample_entropy = 0;  // bits
  double shard_entropy = 0;   // bits; 0 without shards
  double labels_per_batch = 0;
  double iid_labels_per_batch = 0;  // expected, exact
};
ShuffleQuality shuffle_quality(std::span<const std::size_t> order,
                               std::span<const std::size_t> group_ends,
                               std::span<const std::int64_t> labels, std::size_t batch_size);

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
