#include <utility>

#include "device/backend.h"

namespace stoker::detail {
namespace {

class EventFence final : public ReleaseFence {
 public:
  EventFence(std::shared_ptr<DeviceBackend> backend, DeviceBackend::Stream stream)
      : backend_(std::move(backend)), event_(backend_->make_event()), stream_(stream) {}

  void record() noexcept override {
    try {
      backend_->stream_record(stream_, *event_);
    } catch (...) {
      // A device error: the stream's copies will not run, so nothing reads the slab.
    }
  }
  void wait() noexcept override {
    try {
      backend_->synchronize(*event_);
    } catch (...) {
      // As above: reported by the user's next operation on the stream.
    }
  }

 private:
  const std::shared_ptr<DeviceBackend> backend_;
  const std::unique_ptr<DeviceEvent> event_;
  const DeviceBackend::Stream stream_;
};

}  // namespace

std::function<std::unique_ptr<ReleaseFence>()> release_fences(
    std::shared_ptr<DeviceBackend> backend, DeviceBackend::Stream stream) {
  return [backend = std::move(backend), stream]() -> std::unique_ptr<ReleaseFence> {
    return std::make_unique<EventFence>(backend, stream);
  };
}

}  // namespace stoker::detail
