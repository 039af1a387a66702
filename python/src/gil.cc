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
    keeper.gil_state = PyGILState_Ensure();  // makes the thread state and takes the GIL
    keeper.bound = true;
  } else {
    PyEval_RestoreThread(keeper.state);
  }
  acquired_ = true;
}

EngineThreadGil::~EngineThreadGil() {
  if (acquired_) keeper.state = PyEval_SaveThread();
}

}  // namespace stoker::python
