#include "interrupt.h"

#include <signal.h>

#include <atomic>

namespace stoker::tools {
namespace {

// Lock-free atomics: read and written from the signal handler.
std::atomic<int> g_signal{0};
std::atomic<pid_t> g_group{0};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<pid_t>::is_always_lock_free);

extern "C" void on_signal(int signal) {
  if (g_signal.exchange(signal) != 0) {  // the second one: as if there were no handler
    ::signal(signal, SIG_DFL);
    ::raise(signal);
    return;
  }
  if (const pid_t group = g_group.load(); group > 0) ::kill(-group, signal);
}

}  // namespace

void install_interrupt_handler() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: a blocking read returns, and the loop looks at the flag
  for (const int signal : {SIGINT, SIGTERM}) {
    // A signal ignored when the program started stays ignored, as the shell's own tools and
    // Python leave it: a script runs background commands with SIGINT ignored so that Ctrl-C
    // at the terminal stops only the foreground one.
    struct sigaction inherited {};
    if (sigaction(signal, nullptr, &inherited) == 0 && inherited.sa_handler == SIG_IGN) continue;
    sigaction(signal, &action, nullptr);
  }
}

bool interrupted() noexcept { return g_signal.load(std::memory_order_relaxed) != 0; }

void throw_if_interrupted() {
  if (interrupted()) throw Interrupted();
}

void set_interrupt_group(pid_t group) noexcept { g_group.store(group); }

}  // namespace stoker::tools
