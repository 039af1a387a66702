#include "sampler/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "stoker/frontend/random.h"

namespace stoker::detail {
namespace {

__extension__ using u128 = unsigned __int128;

// Uniform in [0, bound) without modulo bias (Lemire, "Fast Random Integer Generation in an
// Interval", 2019).
std::uint64_t bounded(std::uint64_t& state, std::uint64_t bound) {
  u128 m = static_cast<u128>(splitmix64(state)) * bound;
  auto low = static_cast<std::uint64_t>(m);
  if (low < bound) {
    const std::uint64_t threshold = -bound % bound;
    while (low < threshold) {
      m = static_cast<u128>(splitmix64(state)) * bound;
      low = static_cast<std::uint64_t>(m);
    }
  }
  return static_cast<std::uint64_t>(m >> 64);
}

}  // namespace

void permutation(std::size_t n, std::uint64_t seed, std::vector<std::size_t>& out) {
  out.resize(n);
  std::iota(out.begin(), out.end(), std::size_t{0});
  std::uint64_t state = seed;
  for (std::size_t i = n; i > 1; --i) {
    std::swap(out[i - 1], out[bounded(state, i)]);
  }
}

std::uint64_t mix(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  std::uint64_t state = a;
  std::uint64_t h = splitmix64(state);
  state = h ^ b;
  h = splitmix64(state);
  state = h ^ c;
  return splitmix64(state);
}

}  // namespace stoker::detail

namespace stoker {

using detail::permutation;

std::uint64_t StorageBlocks::total_bytes() const {
  return std::accumulate(bytes.begin(), bytes.end(), std::uint64_t{0});
}

std::size_t StorageBlocks::block_of(std::size_t index) const {
  return static_cast<std::size_t>(std::upper_bound(ends.begin(), ends.end(), index) - ends.begin());
}

void window_order(const StorageBlocks& blocks, std::size_t window, std::uint64_t seed,
                  std::vector<std::size_t>& out, NodeLayout nodes) {
  if (window == 0) throw std::invalid_argument("stoker: a shuffle window of 0 blocks");
  if (nodes.nodes == 0 || nodes.ranks == 0) {
    throw std::invalid_argument("stoker: an order over 0 nodes or 0 ranks a node");
  }
  const std::size_t count = blocks.ends.size();
  for (std::size_t b = 0; b < count; ++b) {
    if (blocks.ends[b] <= (b > 0 ? blocks.ends[b - 1] : 0)) {
      throw std::invalid_argument("stoker: storage block " + std::to_string(b) +
                                  " holds no sample (block ends must increase)");
    }
  }
  const std::size_t n = count > 0 ? blocks.ends.back() : 0;
  // The blocks in a random order, cut into one run per node (a block may end one run and
  // begin the next); in its run a block starts at position `at` (the samples of the run's
  // blocks before it) and its samples take places in [at, at + span): a span of `window`
  // blocks of the mean size, so about `window` blocks are open at any position. The places are
  // stratified: a block's k samples, in a random order, take one each of the span's k equal
  // parts, uniform within it, so a block's samples lie about `window` places apart and a batch
  // draws its samples from as many distinct blocks as the window allows (uniform places
  // would put two of a block in a batch of 32 from a window of 143 blocks about 3 times a
  // batch; on a data set sorted by label that is 3 labels fewer).
  std::vector<std::size_t> visit;
  permutation(count, detail::mix(seed, 0x626c6f636b73ULL), visit);  // "blocks"
  const double span =
      count > 0 ? static_cast<double>(window) * static_cast<double>(n) / static_cast<double>(count)
                : 0.0;
  // Position p belongs to node (p / ranks) % nodes (rank p % world reads it, strided as
  // DistributedSampler strides): node v's run is as long as its positions.
  const std::size_t group = nodes.nodes * nodes.ranks;
  std::vector<std::vector<std::pair<double, std::size_t>>> runs(nodes.nodes);
  std::vector<std::size_t> run_length(nodes.nodes);
  for (std::size_t v = 0; v < nodes.nodes; ++v) {
    const std::size_t rest = n % group;
    run_length[v] = n / group * nodes.ranks +
                    std::min(nodes.ranks, rest > v * nodes.ranks ? rest - v * nodes.ranks : 0);
    runs[v].reserve(run_length[v]);
  }
  std::vector<std::size_t> strata;
  std::size_t v = 0;
  double at = 0;
  for (const std::size_t b : visit) {
    std::size_t begin = b > 0 ? blocks.ends[b - 1] : 0;
    for (std::uint64_t piece = 0; begin < blocks.ends[b]; ++piece) {
      while (runs[v].size() == run_length[v]) {  // the next node's run
        ++v;
        at = 0;
      }
      const std::size_t k = std::min(blocks.ends[b] - begin, run_length[v] - runs[v].size());
      permutation(k, detail::mix(seed, b, 0x7370726561640000ULL + piece), strata);     // "spread"
      detail::SplitMix64 spread(detail::mix(seed, b, 0x6a69747465720000ULL + piece));  // "jitter"
      const double part = span / static_cast<double>(k);
      for (std::size_t j = 0; j < k; ++j) {
        runs[v].emplace_back(at + part * (static_cast<double>(strata[j]) + spread.uniform()),
                             begin + j);
      }
      at += static_cast<double>(k);
      begin += k;
    }
  }
  for (auto& run : runs) std::sort(run.begin(), run.end());
  out.resize(n);
  for (std::size_t p = 0; p < n; ++p) {
    const std::size_t node = p / nodes.ranks % nodes.nodes;
    out[p] = runs[node][p / group * nodes.ranks + p % nodes.ranks].second;
  }
}

void stream_order(std::span<const std::size_t> object_ends, std::size_t buffer, std::uint64_t seed,
                  std::vector<std::size_t>& out) {
  std::vector<std::size_t> objects;
  permutation(object_ends.size(), detail::mix(seed, 0x7368617264730000ULL), objects);  // "shards"
  detail::SplitMix64 rng(detail::mix(seed, 0x6275666665720000ULL));                    // "buffer"
  std::vector<std::size_t> held;
  held.reserve(buffer);
  out.clear();
  for (const std::size_t k : objects) {
    for (std::size_t i = k > 0 ? object_ends[k - 1] : 0; i < object_ends[k]; ++i) {
      if (held.size() < std::max<std::size_t>(buffer, 1)) {
        held.push_back(i);
        continue;
      }
      const auto pick = static_cast<std::size_t>(rng.next() % held.size());
      out.push_back(held[pick]);
      held[pick] = i;
    }
  }
  while (!held.empty()) {  // the buffer drained at random
    const auto pick = static_cast<std::size_t>(rng.next() % held.size());
    out.push_back(held[pick]);
    held[pick] = held.back();
    held.pop_back();
  }
}

namespace {

// The epoch's global permutation: windowed over storage blocks, or uniform.
void shuffled(const SampleOrder& spec, std::uint64_t epoch, std::vector<std::size_t>& out) {
  if (spec.blocks != nullptr && spec.window > 0) {
    if (spec.blocks->ends.empty() ? spec.samples != 0 : spec.blocks->ends.back() != spec.samples) {
      throw std::invalid_argument(
          "stoker: the storage blocks cover " +
          std::to_string(spec.blocks->ends.empty() ? 0 : spec.blocks->ends.back()) +
          " samples of a data set of " + std::to_string(spec.samples));
    }
    window_order(*spec.blocks, spec.window, spec.seed + epoch, out, spec.nodes);
  } else {
    permutation(spec.samples, spec.seed + epoch, out);
  }
}

// Plug-in Shannon entropy (bits) of the values' distribution.
double entropy(const std::unordered_map<std::size_t, std::size_t>& counts, std::size_t total) {
  double h = 0;
  for (const auto& [value, c] : counts) {
    const double p = static_cast<double>(c) / static_cast<double>(total);
    h -= p * std::log2(p);
  }
  return h;
}

}  // namespace

ShuffleQuality shuffle_quality(std::span<const std::size_t> order,
                               std::span<const std::size_t> group_ends,
                               std::span<const std::int64_t> labels, std::size_t batch_size) {
  ShuffleQuality q;
  const auto group_of = [&](std::size_t i) {
    return static_cast<std::size_t>(std::upper_bound(group_ends.begin(), group_ends.end(), i) -
                                    group_ends.begin());
  };
  const auto step = [](std::size_t a, std::size_t b) { return a > b ? a - b : b - a; };
  if (order.size() >= 2) {
    std::unordered_map<std::size_t, std::size_t> samples, groups;
    for (std::size_t i = 1; i < order.size(); ++i) {
      ++samples[step(order[i - 1], order[i])];
      if (!group_ends.empty()) ++groups[step(group_of(order[i - 1]), group_of(order[i]))];
    }
    q.sample_entropy = entropy(samples, order.size() - 1);
    if (!group_ends.empty()) q.shard_entropy = entropy(groups, order.size() - 1);
  }
  if (labels.empty() || batch_size == 0) return q;
  for (const std::size_t i : order) {
    if (i >= labels.size()) {
      throw std::invalid_argument("stoker: shuffle_quality: sample " + std::to_string(i) +
                                  " has no label (" + std::to_string(labels.size()) + " given)");
    }
  }
  const std::size_t batches = order.size() / batch_size;
  std::unordered_map<std::int64_t, std::size_t> seen;
  std::size_t distinct = 0;
  for (std::size_t b = 0; b < batches; ++b) {
    seen.clear();
    for (std::size_t k = 0; k < batch_size; ++k) seen[labels[order[b * batch_size + k]]] = 1;
    distinct += seen.size();
  }
  q.labels_per_batch =
      batches > 0 ? static_cast<double>(distinct) / static_cast<double>(batches) : 0.0;
  // An i.i.d. batch (with replacement) from the labels' frequencies holds label l with
  // probability 1 - (1 - p_l)^batch_size.
  seen.clear();
  for (const std::int64_t label : labels) ++seen[label];
  for (const auto& [label, c] : seen) {
    const double p = static_cast<double>(c) / static_cast<double>(labels.size());
    q.iid_labels_per_batch += 1.0 - std::pow(1.0 - p, static_cast<double>(batch_size));
  }
  return q;
}

std::size_t samples_per_rank(const SampleOrder& spec) {
  const std::size_t world = spec.shard.world_size;
  if (spec.shard.drop_last) return spec.samples / world;
  return (spec.samples + world - 1) / world;
}

std::size_t batch_count(std::size_t samples, std::size_t batch_size, bool drop_last) {
  return drop_last ? samples / batch_size : (samples + batch_size - 1) / batch_size;
}

void epoch_order(const SampleOrder& spec, std::uint64_t epoch, std::vector<std::size_t>& out) {
  const std::size_t n = spec.samples;
  const std::size_t world = spec.shard.world_size;
  const std::size_t rank = spec.shard.rank;
  const std::size_t per_rank = samples_per_rank(spec);

  if (world == 1) {
    // Fast path, same result as the general one: no padding, no stride.
    if (spec.shuffle) {
      shuffled(spec, epoch, out);
    } else {
      out.resize(n);
      std::iota(out.begin(), out.end(), std::size_t{0});
    }
    out.resize(per_rank);
    return;
  }

  // The full order is conceptually permutation (or 0..n-1), extended cyclically to
  // per_rank * world entries; this rank takes every world-th entry starting at rank.
  // Position p of the padded order is full[p % n].
  thread_local std::vector<std::size_t> full;
  if (spec.shuffle) shuffled(spec, epoch, full);
  out.resize(per_rank);
  for (std::size_t k = 0; k < per_rank; ++k) {
    const std::size_t p = (rank + k * world) % n;
    out[k] = spec.shuffle ? full[p] : p;
  }
}

std::vector<std::size_t> epoch_order(const SampleOrder& order, std::uint64_t epoch) {
  std::vector<std::size_t> out;
  epoch_order(order, epoch, out);
  return out;
}

namespace {

void check_ranges(const PositionRanges& ranges, std::size_t samples) {
  std::size_t end = 0;
  for (std::size_t k = 0; k < ranges.size(); ++k) {
    const auto [b, e] = ranges[k];
    if (b >= e || e > samples || (k > 0 && b <= end)) {
      throw std::invalid_argument(
          "stoker: consumed positions must be sorted, disjoint, non-adjacent ranges within the "
          "data set's " +
          std::to_string(samples) + " samples; range " + std::to_string(k) + " is [" +
          std::to_string(b) + ", " + std::to_string(e) + ")");
    }
    end = e;
  }
}

// The positions not in `consumed` (sorted ranges within [0, samples)), as ranges.
PositionRanges complement(std::size_t samples, const PositionRanges& consumed) {
  PositionRanges out;
  std::size_t at = 0;
  for (const auto& [b, e] : consumed) {
    if (b > at) out.emplace_back(at, b);
    at = e;
  }
  if (at < samples) out.emplace_back(at, samples);
  return out;
}

// Adds [b, e) to sorted ranges whose last one ends at most at e, merging neighbours.
void append(PositionRanges& ranges, std::size_t b, std::size_t e) {
  if (!ranges.empty() && ranges.back().second >= b) {
    ranges.back().second = std::max(ranges.back().second, e);
  } else {
    ranges.emplace_back(b, e);
  }
}

PositionRanges normalized(PositionRanges ranges) {
  std::sort(ranges.begin(), ranges.end());
  PositionRanges out;
  for (const auto& [b, e] : ranges) {
    if (b < e) append(out, b, e);
  }
  return out;
}

}  // namespace

PositionRanges consumed_positions(std::size_t samples, const PositionRanges& before,
                                  std::span<const std::size_t> taken, bool drop_last) {
  check_ranges(before, samples);
  const std::size_t world = taken.size();
  if (world == 0) throw std::invalid_argument("stoker: consumed_positions needs one rank or more");
  const PositionRanges free = complement(samples, before);
  std::size_t remaining = 0;
  for (const auto& [b, e] : free) remaining += e - b;
  const std::size_t per_rank = drop_last ? remaining / world : (remaining + world - 1) / world;
  std::size_t common = per_rank;
  for (std::size_t r = 0; r < world; ++r) {
    if (taken[r] > per_rank) {
      throw std::invalid_argument("stoker: rank " + std::to_string(r) + " took " +
                                  std::to_string(taken[r]) + " samples of an epoch that gives " +
                                  "each rank " + std::to_string(per_rank));
    }
    common = std::min(common, taken[r]);
  }
  // Indices into the remaining positions: [0, world * common) for what every rank took, then
  // each rank's own tail (rank r's k-th sample is index r + k * world, wrapping round for the
  // padding's repeats). The tails are at most a few batches long.
  PositionRanges indices;
  if (remaining > 0) {
    indices.emplace_back(0, std::min(world * common, remaining));
    for (std::size_t r = 0; r < world; ++r) {
      for (std::size_t k = common; k < taken[r]; ++k) {
        const std::size_t q = (r + k * world) % remaining;
        indices.emplace_back(q, q + 1);
      }
    }
  }
  indices = normalized(std::move(indices));
  // Map index ranges onto positions through the free ranges, then add what came before.
  PositionRanges out = before;
  std::size_t f = 0, f_start = 0;  // free range f holds indices [f_start, f_start + its size)
  for (auto [b, e] : indices) {
    while (b < e) {
      while (b >= f_start + (free[f].second - free[f].first)) {
        f_start += free[f].second - free[f].first;
        ++f;
      }
      const std::size_t offset = b - f_start;
      const std::size_t n = std::min(e - b, free[f].second - free[f].first - offset);
      out.emplace_back(free[f].first + offset, free[f].first + offset + n);
      b += n;
    }
  }
  return normalized(std::move(out));
}

void resumed_order(const SampleOrder& order, std::uint64_t epoch, const PositionRanges& consumed,
                   std::vector<std::size_t>& out) {
  check_ranges(consumed, order.samples);
  if (consumed.empty()) {
    epoch_order(order, epoch, out);
    return;
  }
  SampleOrder global = order;
  global.shard = {};
  std::vector<std::size_t> all;
  epoch_order(global, epoch, all);
  std::vector<std::size_t> remaining;
  for (const auto& [b, e] : complement(order.samples, consumed)) {
    remaining.insert(remaining.end(), all.begin() + static_cast<std::ptrdiff_t>(b),
                     all.begin() + static_cast<std::ptrdiff_t>(e));
  }
  const std::size_t n = remaining.size();
  const std::size_t world = order.shard.world_size;
  const std::size_t per_rank = order.shard.drop_last ? n / world : (n + world - 1) / world;
  out.resize(per_rank);
  for (std::size_t k = 0; k < per_rank; ++k) {
    out[k] = remaining[(order.shard.rank + k * world) % n];
  }
}

}  // namespace stoker
