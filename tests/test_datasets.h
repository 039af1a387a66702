// Small data sets for tests.
#pragma once

#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "stoker/dataset.h"

namespace stoker::testing {

// Each sample is its own index (int64 "index") plus `payload` bytes of (index & 255) ("data").
// Samples in `fail` throw `Error` (with the index in its message); `delay` is slept per sample.
template <class Error = std::runtime_error>
class IndexDataset : public Dataset {
 public:
  explicit IndexDataset(std::size_t n, std::size_t payload = 16, std::set<std::size_t> fail = {},
                        std::chrono::microseconds delay = std::chrono::microseconds(0))
      : n_(n), payload_(payload), fail_(std::move(fail)), delay_(delay) {}

  std::size_t size() const override { return n_; }
  std::vector<FieldSpec> fields() const override {
    return {{"index", DType::i64, {}}, {"data", DType::u8, {static_cast<std::int64_t>(payload_)}}};
  }
  void read(std::size_t index, const SampleOut& out) const override {
    reads.fetch_add(1, std::memory_order_relaxed);
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    if (fail_.count(index)) throw Error("cannot read sample " + std::to_string(index));
    out.as<std::int64_t>(0)[0] = static_cast<std::int64_t>(index);
    std::memset(out.bytes(1).data(), static_cast<int>(index & 255), payload_);
  }

  mutable std::atomic<std::size_t> reads{0};

 private:
  std::size_t n_;
  std::size_t payload_;
  std::set<std::size_t> fail_;
  std::chrono::microseconds delay_;
};

// An IndexDataset whose reads wait until open() (a gate the test controls, so nothing depends
// on timing).
class GatedDataset : public IndexDataset<> {
 public:
  using IndexDataset::IndexDataset;
  void open() const { open_.store(true, std::memory_order_release); }
  void read(std::size_t index, const SampleOut& out) const override {
    while (!open_.load(std::memory_order_acquire)) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    IndexDataset::read(index, out);
  }

 private:
  mutable std::atomic<bool> open_{false};
};

}  // namespace stoker::testing
