// SplitMix64 (Steele, Lea and Flood, 2014): the one generator stoker draws its random numbers
// from (sample order, per-sample augmentation, generated benchmark data). Fast, 64 bits of
// state, and identical on every platform, so results are a pure function of the seed.
//
// Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <cstdint>

namespace stoker::detail {

// Advances `state` and returns the next value.
inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() { return splitmix64(state_); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform in [0, n), n >= 1; the modulo bias is below 2^-40 for the small n it is used for
  // (image sizes). The sampler uses Lemire's unbiased draw instead.
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }

 private:
  std::uint64_t state_;
};

}  // namespace stoker::detail
