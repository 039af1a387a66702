#include "sampler/sampler.h"

#include <algorithm>
#include <numeric>

#include "util/random.h"

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
      permutation(n, spec.seed + epoch, out);
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
  if (spec.shuffle) {
    permutation(n, spec.seed + epoch, full);
  }
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

}  // namespace stoker
