// The sampler's internals: the permutation and the seed mixing, also used by the engine to
// seed samples and pick replacements. The epoch order itself is public (stoker/sampler.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "stoker/sampler.h"

namespace stoker::detail {

// A uniformly random permutation of 0..n-1 from `seed` (Fisher-Yates over SplitMix64 with
// Lemire's unbiased bounded draw), identical on every platform.
void permutation(std::size_t n, std::uint64_t seed, std::vector<std::size_t>& out);

// Mixes words into a well-spread 64-bit value (SplitMix64 finalizer chain).
std::uint64_t mix(std::uint64_t a, std::uint64_t b, std::uint64_t c = 0);

}  // namespace stoker::detail
