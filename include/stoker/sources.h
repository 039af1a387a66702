// Built-in data sets: in-memory arrays and a synthetic source for tests and benchmarks.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "stoker/dataset.h"

namespace stoker {

// Samples held in memory as one contiguous array per field (sample-major: sample i of field f
// is bytes [i * f.bytes(), (i + 1) * f.bytes())). read() is one copy per field.
//
// Thread safety: immutable after construction; read() may be called from any thread.
class ArrayDataset final : public Dataset {
 public:
  // `data[f]` must hold exactly `samples * fields[f].bytes()` bytes and stay valid while
  // `keep_alive` (which may own them, or be null if the caller guarantees the lifetime) lives.
  // Throws std::invalid_argument on a size mismatch.
  ArrayDataset(std::vector<FieldSpec> fields, std::vector<std::span<const std::byte>> data,
               std::size_t samples, std::shared_ptr<const void> keep_alive);

  // Reads every sample of `source` into freshly allocated arrays (one pass, on this thread).
  static std::shared_ptr<ArrayDataset> materialize(const Dataset& source);

  std::size_t size() const override { return samples_; }
  std::vector<FieldSpec> fields() const override { return fields_; }
  void read(std::size_t index, const SampleOut& out) const override;
  void prefetch(std::size_t index) const override;

 private:
  std::vector<FieldSpec> fields_;
  std::vector<std::span<const std::byte>> data_;
  std::vector<std::size_t> field_bytes_;
  std::size_t samples_;
  std::shared_ptr<const void> keep_alive_;
};

// Generated samples with a set shape, and optionally a set per-sample latency (sleep, like
// I/O) and CPU work (busy spin, like decoding). Reproduces e.g. the HeavyDataset of the seed
// benchmark: 3x224x224 float32 plus a label, 5 ms per sample.
//
// Content is a pure function of (sample i, flat element j) so tests can check every byte:
//   u8:            (i * 131 + j * 7) & 255
//   f32, f64:      ((i * 131 + j * 7) % 1000) / 1000, computed in the field's type
//   i8..i64:       (i + j) % classes
// bench/torch_dataloader.py builds the same bytes for the PyTorch side of the benchmark.
//
// Thread safety: immutable after construction; read() may be called from any thread.
class SyntheticDataset final : public Dataset {
 public:
  struct Options {
    std::size_t samples = 0;
    std::vector<FieldSpec> fields;
    std::chrono::microseconds latency{0};   // slept per sample
    std::chrono::microseconds cpu_work{0};  // busy-spun per sample
    std::int64_t classes = 10;
  };

  // Throws std::invalid_argument for f16/bf16 fields or classes < 1.
  explicit SyntheticDataset(Options options);

  std::size_t size() const override { return options_.samples; }
  std::vector<FieldSpec> fields() const override { return options_.fields; }
  void read(std::size_t index, const SampleOut& out) const override;

 private:
  Options options_;
};

}  // namespace stoker
