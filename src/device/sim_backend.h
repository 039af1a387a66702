// The simulated device: streams are threads that run their operations in order and keep a
// virtual clock, so the copy stage's ordering and overlap are testable without a GPU.
//
// Time: every operation advances its stream's virtual clock (a copy by latency + bytes /
// bandwidth, a compute by its duration), and waiting on an event moves the clock to the
// event's time. Step times read off these clocks depend only on the order and dependencies of
// the operations, not on how busy the host is. With SimDevice::time_scale > 0 a stream also
// sleeps that many real seconds per simulated second, which widens race windows in tests.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>

#include "device/backend.h"
#include "stoker/frontend/mutex.h"

namespace stoker::detail {

class SimEvent final : public DeviceEvent {
 public:
  Mutex mu;  // taken before a stream's own mutex, never after
  std::condition_variable cv;
  std::uint64_t recorded STOKER_GUARDED_BY(mu) = 0;   // generations recorded so far
  std::uint64_t completed STOKER_GUARDED_BY(mu) = 0;  // generations completed
  double time STOKER_GUARDED_BY(mu) = 0;              // virtual time of the last completion
};

// Thread safety: every member may be called from any thread.
class SimStream {
 public:
  explicit SimStream(double time_scale = 0);
  ~SimStream();  // runs what is queued, then stops
  SimStream(const SimStream&) = delete;
  SimStream& operator=(const SimStream&) = delete;

  void wait(SimEvent& event);
  void record(SimEvent& event);
  void copy(std::byte* dst, const std::byte* src, std::size_t bytes, double seconds);
  // Consumer work: `seconds` of simulated time, then `body` on the stream's thread.
  void compute(double seconds, std::function<void()> body = {});
  void synchronize();  // blocks until everything queued so far has run
  double now();        // virtual time after the last operation that ran

 private:
  struct Op {
    enum Kind { kWait, kRecord, kCopy, kCompute } kind = kCompute;
    SimEvent* event = nullptr;
    std::uint64_t generation = 0;
    std::byte* dst = nullptr;
    const std::byte* src = nullptr;
    std::size_t bytes = 0;
    double seconds = 0;
    std::function<void()> body;
  };
  void push(Op op) STOKER_EXCLUDES(mu_);
  void run() STOKER_EXCLUDES(mu_);
  void execute(Op& op) STOKER_EXCLUDES(mu_);

  const double time_scale_;
  Mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_ STOKER_GUARDED_BY(mu_);
  std::uint64_t pushed_ STOKER_GUARDED_BY(mu_) = 0;
  std::uint64_t done_ STOKER_GUARDED_BY(mu_) = 0;
  double now_ STOKER_GUARDED_BY(mu_) = 0;  // written by the stream thread
  bool stop_ STOKER_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace stoker::detail
