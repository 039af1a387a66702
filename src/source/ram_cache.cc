// cache_in_ram: encoded bytes kept in an anonymous memory arena, first come first kept.
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "stoker/encoded.h"

namespace stoker {
namespace {

class RamCache final : public EncodedSource {
 public:
  RamCache(std::shared_ptr<EncodedSource> inner, std::size_t budget)
      : inner_(std::move(inner)), budget_(budget), slots_(new Slot[inner_->size()]) {
    if (budget_ > 0) {
      // Address space only: pages are touched (and so use memory) as samples are kept.
      void* p = ::mmap(nullptr, budget_, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) {
        throw std::runtime_error("stoker::cache_in_ram: cannot reserve " + std::to_string(budget_) +
                                 " bytes of address space");
      }
      arena_ = static_cast<std::byte*>(p);
    }
  }
  ~RamCache() override {
    if (arena_) ::munmap(arena_, budget_);
  }

  std::size_t size() const override { return inner_->size(); }
  std::int64_t label(std::size_t index) const override { return inner_->label(index); }
  std::string name(std::size_t index) const override { return inner_->name(index); }
  std::vector<std::string> classes() const override { return inner_->classes(); }

  void read(std::size_t index, EncodedBytes& out) const override {
    if (index >= inner_->size()) {
      throw std::out_of_range("stoker::cache_in_ram: index " + std::to_string(index) +
                              " out of range");
    }
    reads_.fetch_add(1, std::memory_order_relaxed);
    Slot& slot = slots_[index];
    if (slot.state.load(std::memory_order_acquire) == kCached) {
      out.bytes = {arena_ + slot.offset, slot.length};
      return;
    }
    inner_->read(index, out);
    misses_.fetch_add(1, std::memory_order_relaxed);
    miss_bytes_.fetch_add(out.bytes.size(), std::memory_order_relaxed);
    std::uint8_t expected = kEmpty;
    if (!slot.state.compare_exchange_strong(expected, kFilling, std::memory_order_acquire)) {
      return;  // being kept by another thread, or not kept
    }
    const std::size_t n = out.bytes.size();
    std::size_t used = used_.load(std::memory_order_relaxed);
    do {
      if (n > budget_ - used) {
        slot.state.store(kNotKept, std::memory_order_release);  // over budget: read through
        return;
      }
    } while (!used_.compare_exchange_weak(used, used + n, std::memory_order_relaxed));
    std::memcpy(arena_ + used, out.bytes.data(), n);
    slot.offset = used;
    slot.length = n;
    kept_.fetch_add(1, std::memory_order_relaxed);
    slot.state.store(kCached, std::memory_order_release);
  }

  bool will_read(std::span<const std::size_t> rows) const noexcept override {
    return inner_->will_read(rows);  // rows the cache holds already cost nothing there either
  }
  std::vector<ObjectVersion> objects() const override { return inner_->objects(); }
  ObjectStorageCounters object_storage() const override { return inner_->object_storage(); }
  std::uint64_t ahead_bytes() const override { return inner_->ahead_bytes(); }

  Counters counters() const override {
    Counters c;
    c.reads = reads_.load(std::memory_order_relaxed);
    c.storage_reads = misses_.load(std::memory_order_relaxed);
    c.storage_bytes = miss_bytes_.load(std::memory_order_relaxed);
    c.cached = kept_.load(std::memory_order_relaxed);
    c.cached_bytes = used_.load(std::memory_order_relaxed);
    return c;
  }

 private:
  static constexpr std::uint8_t kEmpty = 0, kFilling = 1, kCached = 2, kNotKept = 3;
  // offset and length are written before state becomes kCached (release) and read after it is
  // seen (acquire), and never change afterwards.
  struct Slot {
    std::atomic<std::uint8_t> state{kEmpty};
    std::size_t offset = 0;
    std::size_t length = 0;
  };

  std::shared_ptr<EncodedSource> inner_;
  std::size_t budget_;
  std::unique_ptr<Slot[]> slots_;
  std::byte* arena_ = nullptr;
  mutable std::atomic<std::size_t> used_{0};
  mutable std::atomic<std::uint64_t> reads_{0};
  mutable std::atomic<std::uint64_t> misses_{0};
  mutable std::atomic<std::uint64_t> miss_bytes_{0};
  mutable std::atomic<std::uint64_t> kept_{0};
};

}  // namespace

std::shared_ptr<EncodedSource> cache_in_ram(std::shared_ptr<EncodedSource> source,
                                            std::size_t budget_bytes) {
  if (!source) throw std::invalid_argument("stoker::cache_in_ram: no source");
  return std::make_shared<RamCache>(std::move(source), budget_bytes);
}

}  // namespace stoker
