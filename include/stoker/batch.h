// What Loader::next() hands out: a Batch, the errors a batch can carry (SampleError,
// SkippedSample), and a loader's Position in its sample order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/dataset.h"

namespace stoker {

namespace detail {
class BatchOwner;
}  // namespace detail

// A sample failed to read. what() names the sample index and the reason; the original
// exception, with its type, is kept in cause() (and rethrow_cause() throws it as it was).
class SampleError : public std::runtime_error {
 public:
  SampleError(std::size_t index, std::exception_ptr cause, const std::string& reason);
  std::size_t index() const noexcept { return index_; }
  std::exception_ptr cause() const noexcept { return cause_; }
  [[noreturn]] void rethrow_cause() const { std::rethrow_exception(cause_); }

 private:
  std::size_t index_;
  std::exception_ptr cause_;
};

struct SkippedSample {
  std::size_t index;   // the sample that failed
  std::string reason;  // its exception's what()
  std::string name{};  // the data set's name for it (Dataset::sample_name), if it has one
};

// Where a loader stands in its sample order: `batch` batches of epoch `epoch` have been handed
// out. Restoring it yields exactly the batches that were still to come.
struct Position {
  std::uint64_t epoch = 0;
  std::size_t batch = 0;
};

// A batch handed out by Loader::next(). One contiguous buffer per field, shaped
// [size(), field shape...]. Move-only; destroying it (or release()) gives its memory back to
// its owner (the host slab pool, or the device slots), so keep it only as long as its data is
// needed. It may outlive the Loader.
//
// Thread safety: a Batch is used by one thread at a time.
class Batch {
 public:
  // What the engine says about the batch it filled.
  struct Info {
    std::uint64_t epoch = 0;
    std::size_t number = 0;  // position of this batch in its epoch, from 0
    std::size_t size = 0;    // samples
    std::vector<SkippedSample> skipped;
  };

  Batch() = default;
  // Made by the loader's internals: `owner` holds the memory until the batch is released.
  Batch(std::shared_ptr<detail::BatchOwner> owner, Info info) noexcept;
  Batch(Batch&& other) noexcept = default;
  Batch& operator=(Batch&& other) noexcept;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch() { release(); }

  explicit operator bool() const noexcept { return owner_ != nullptr; }
  void release() noexcept;

  std::uint64_t epoch() const noexcept { return info_.epoch; }
  std::size_t number() const noexcept { return info_.number; }  // in its epoch, from 0
  std::size_t size() const noexcept { return info_.size; }      // samples in this batch
  std::span<const FieldSpec> fields() const noexcept;
  std::size_t field_index(std::string_view name) const;  // throws std::out_of_range

  // The field's host bytes. For a batch on a device, fields other than host_only ones live in
  // device memory: use data() for those (bytes() then still holds the host copy it was made
  // from, valid while the batch lives).
  std::span<std::byte> bytes(std::size_t field) const noexcept;
  template <class T>
  std::span<T> as(std::size_t field) const noexcept {
    auto b = bytes(field);
    return {reinterpret_cast<T*>(b.data()), b.size() / sizeof(T)};
  }

  // Where the consumer reads the field: device memory for a batch on a device (unless the field
  // is host_only), else the host bytes.
  void* data(std::size_t field) const noexcept;
  bool on_device(std::size_t field) const noexcept;
  std::string_view device() const noexcept;  // "cpu", "cuda:0", "sim"
  // Makes `stream` wait (on the device, not the host) for this batch's copy; next() already did
  // it for LoaderOptions::stream. Releasing the batch marks its device memory free once the
  // work queued so far on the last stream passed here (or that one) is done.
  void wait(void* stream);
  void synchronize();  // blocks the calling thread until the batch's copy is done

  std::span<const std::size_t> indices() const noexcept;  // data set index of each row
  std::span<const SkippedSample> skipped() const noexcept { return info_.skipped; }

 private:
  std::shared_ptr<detail::BatchOwner> owner_;
  Info info_;
};

// What Loader::next_for() found: a batch, the end of the epoch, or nothing yet.
struct NextResult {
  enum class Status : std::uint8_t { batch, end_of_epoch, timed_out };
  Status status = Status::timed_out;
  std::optional<Batch> batch;  // with Status::batch
};

}  // namespace stoker
