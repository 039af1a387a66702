#include "gil.h"

#include <pthread.h>
#include <time.h>

#include <new>

namespace stoker::python {
namespace {

// The thread's Python thread state, made on its first EngineThreadGil and deleted at thread
// exit (when engine threads exit, the thread joining them has released the GIL).
struct ThreadStateKeeper {
  bool bound = false;
  PyGILState_STATE gil_state{};
  PyThreadState* state = nullptr;  // while the GIL is released

  ~ThreadStateKeeper() {
    if (!bound || interpreter_finalizing()) return;  // the interpreter reclaims it
    PyEval_RestoreThread(state);
    // What a data set kept in threading.local() for this thread goes now, while its thread
    // state is whole: a destructor that takes the GIL itself (pyarrow's Python files, held by
    // a ParquetFile over fsspec) run inside the release's PyThreadState_Clear crashed the
    // process or waited for good (tests/python/test_workers.py).
    if (PyObject* dict = PyThreadState_GetDict()) PyDict_Clear(dict);
    PyGILState_Release(gil_state);
  }
};

thread_local ThreadStateKeeper keeper;
thread_local std::size_t passes = 0;  // ForkGate::Pass scopes open on this thread

}  // namespace

bool on_engine_thread() { return keeper.bound; }

EngineThreadGil::EngineThreadGil() {
  if (PyGILState_Check()) return;
  if (!keeper.bound) {
    if (PyThreadState* own = PyGILState_GetThisThreadState()) {
      // A Python thread reading inline (workers = 0) inside a loader call that released the
      // GIL: it takes the GIL back with its own thread state, and stays no engine thread.
      PyEval_RestoreThread(own);
      acquired_ = true;
      return;
    }
    keeper.gil_state = PyGILState_Ensure();  // makes the thread state and takes the GIL
    keeper.bound = true;
  } else {
    PyEval_RestoreThread(keeper.state);
  }
  acquired_ = true;
}

EngineThreadGil::~EngineThreadGil() {
  if (!acquired_) return;
  PyThreadState* state = PyEval_SaveThread();
  if (keeper.bound) keeper.state = state;
}

ForkGate& ForkGate::instance() {
  // Never destroyed: engine threads may outlive statics. A forked child starts with a gate
  // of its own, open and unlocked (it was closed, maybe locked, for the fork).
  static ForkGate* gate = [] {
    static ForkGate* made = new ForkGate();
    pthread_atfork(nullptr, nullptr, [] { new (made) ForkGate(); });
    return made;
  }();
  return *gate;
}

ForkGate::Pass::Pass() {
  if (passes++ > 0) return;
  ForkGate& gate = instance();
  detail::MutexLock lock(gate.mu_);
  while (gate.closed_) lock.wait(gate.cv_);
  ++gate.inside_;
}

ForkGate::Pass::~Pass() {
  if (--passes > 0) return;
  ForkGate& gate = instance();
  detail::MutexLock lock(gate.mu_);
  --gate.inside_;
  if (gate.closed_) gate.cv_.notify_all();
}

ForkGate::Closed::Closed() {
  ForkGate& gate = instance();
  detail::MutexLock lock(gate.mu_);
  while (gate.closed_) lock.wait(gate.cv_);
  gate.closed_ = true;
  const std::size_t own = passes > 0 ? 1 : 0;
  while (gate.inside_ > own) lock.wait(gate.cv_);
}

ForkGate::Closed::~Closed() {
  ForkGate& gate = instance();
  detail::MutexLock lock(gate.mu_);
  gate.closed_ = false;
  gate.cv_.notify_all();
}

namespace {

std::int64_t ns(std::chrono::steady_clock::duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

std::int64_t thread_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return std::int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

}  // namespace

TimedGil::TimedGil(std::atomic<std::uint64_t>& reads, std::atomic<std::int64_t>& wait_ns,
                   std::atomic<std::int64_t>& held_ns, std::atomic<std::int64_t>& cpu_ns,
                   std::size_t samples)
    : held_ns_(held_ns),
      cpu_ns_(cpu_ns),
      start_(Clock::now()),
      held_from_(acquired()),
      cpu_from_(thread_cpu_ns()) {
  reads.fetch_add(samples, std::memory_order_relaxed);
  wait_ns.fetch_add(ns(held_from_ - start_), std::memory_order_relaxed);
}

TimedGil::~TimedGil() {
  // CPU time, not wall time: the wall time in here also counts sleeps and I/O (which release
  // the GIL) and waits for the GIL taken back in between.
  cpu_ns_.fetch_add(thread_cpu_ns() - cpu_from_, std::memory_order_relaxed);
  held_ns_.fetch_add(ns(Clock::now() - held_from_), std::memory_order_relaxed);
}

TimedGil::Clock::time_point TimedGil::acquired() {
  gil_.emplace();
  return Clock::now();
}

}  // namespace stoker::python
