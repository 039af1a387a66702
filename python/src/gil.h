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
#pragma once

#include <Python.h>

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

}  // namespace stoker::python
