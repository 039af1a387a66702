#include "gil.h"

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
    PyGILState_Release(gil_state);
  }
};

thread_local ThreadStateKeeper keeper;

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

}  // namespace stoker::python
