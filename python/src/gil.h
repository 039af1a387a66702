// GIL rules for the bindings, in one place.
//
// 1. Never wait on the engine (its lock, a condition variable, a join) while holding the GIL:
//    workers reading a Python data set need the GIL to make progress. Every binding that calls
//    into the Loader releases it first.
// 2. Engine threads (and a consumer thread reading inline, with no workers) take the GIL only
//    around Python calls, through EngineThreadGil.
// 3. No Python object crosses into the engine: exceptions from __getitem__ travel as a ticket
//    (PythonError, py_dataset.h), so that the engine may destroy them anywhere, with or
//    without the GIL.
// 4. Nothing touches Python while the interpreter is finalizing; the package closes every
//    loader from an atexit hook, before that.
// 5. No worker process is forked while an engine thread runs a data set's Python code: that
//    thread may hold a lock in native code that released the GIL (torch's default generator
//    in torch.randn, say), and the child would inherit it locked for good (seen: a worker
//    forked when worker_type='auto' moved reads to processes hung in torch.manual_seed).
//    Reads run Python under a ForkGate::Pass, a fork under a ForkGate::Closed.
#pragma once

#include <Python.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "stoker/frontend/mutex.h"

namespace stoker::python {

inline bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// Whether the calling thread is one the engine owns and has run Python on (a worker). Python
// code can run there, including a garbage collection that finalizes a loader; such a loader
// must not be stopped from there (it could mean joining this thread).
bool on_engine_thread();

// Holds the GIL for a scope around a Python call from native code. On a thread the engine
// owns, each thread keeps one Python thread state for its whole life rather than one per
// sample: a read costs one GIL acquisition, and threading.local() data that a data set keeps
// in __getitem__ (open files, connections) survives from sample to sample. The thread state is
// registered with the PyGILState API, so extension code that calls PyGILState_Ensure inside
// __getitem__ finds it. It is deleted when the thread exits; engine threads exit only inside
// Loader calls made with the GIL released (rule 1). A Python thread (the consumer reading
// inline) uses its own thread state.
//
// If the thread already holds the GIL (a nested use), the scope does nothing.
class EngineThreadGil {
 public:
  EngineThreadGil();
  ~EngineThreadGil();
  EngineThreadGil(const EngineThreadGil&) = delete;
  EngineThreadGil& operator=(const EngineThreadGil&) = delete;

 private:
  bool acquired_ = false;
};

// The process's one gate between engine threads running Python and a fork.
//
// Thread safety: Pass and Closed on any thread; neither is taken with the GIL held (a thread
// inside a Pass may need the GIL to leave it).
class ForkGate {
 public:
  // For as long as a read runs Python: waits while the gate is closed. A nested Pass on the
  // same thread counts once.
  class Pass {
   public:
    Pass();
    ~Pass();
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;
  };
  // Around a fork: waits until no other thread holds a Pass (a closer inside one of its own
  // counts itself out), then keeps new ones waiting until it is destroyed. Closers take turns.
  class Closed {
   public:
    Closed();
    ~Closed();
    Closed(const Closed&) = delete;
    Closed& operator=(const Closed&) = delete;
  };

 private:
  friend class Pass;
  friend class Closed;
  static ForkGate& instance();

  detail::Mutex mu_;
  std::condition_variable cv_;
  std::size_t inside_ STOKER_GUARDED_BY(mu_) = 0;  // threads holding a Pass
  bool closed_ STOKER_GUARDED_BY(mu_) = false;
};

// The GIL for a read on an engine thread, timed: how long the thread waited to take it and
// how long it held it, and the CPU time of the thread meanwhile (the auto worker type and the
// tuner read these); `reads` counts `samples` more. No worker process is forked meanwhile.
class TimedGil {
 public:
  TimedGil(std::atomic<std::uint64_t>& reads, std::atomic<std::int64_t>& wait_ns,
           std::atomic<std::int64_t>& held_ns, std::atomic<std::int64_t>& cpu_ns,
           std::size_t samples);
  ~TimedGil();
  TimedGil(const TimedGil&) = delete;
  TimedGil& operator=(const TimedGil&) = delete;

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point acquired();

  std::atomic<std::int64_t>& held_ns_;
  std::atomic<std::int64_t>& cpu_ns_;
  ForkGate::Pass pass_;  // taken before the GIL, let go after it (rule 5)
  std::optional<EngineThreadGil> gil_;
  Clock::time_point start_;
  Clock::time_point held_from_;
  std::int64_t cpu_from_;
};

}  // namespace stoker::python
