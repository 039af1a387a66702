// One sample of a data set read as a loader reads it (Dataset::read into buffers of its fields'
// sizes), its fields' bytes kept: for tests that check what a source gives.
#pragma once

#include <cstddef>
#include <vector>

#include "stoker/dataset.h"

namespace stoker::testing {

struct Read {
  std::vector<std::vector<std::byte>> fields;
};

inline Read read_sample(const Dataset& d, std::size_t i) {
  Read r;
  std::vector<std::size_t> bytes;
  std::vector<std::byte*> bases;
  for (const auto& f : d.fields()) {
    r.fields.emplace_back(f.bytes());
    bytes.push_back(f.bytes());
  }
  for (auto& f : r.fields) bases.push_back(f.data());
  d.read(i, SampleOut(bytes, bases.data(), 0, 7));
  return r;
}

}  // namespace stoker::testing
