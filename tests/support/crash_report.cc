// Native stacks of a test process that crashes: preloaded into the pytest runs
// (LD_PRELOAD=build/tests/support/libstoker_crash_report.so, scripts/test.sh), it catches
// SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT in a Python process and has gdb print every thread's
// stack before the process dies as it would have. Python's faulthandler, enabled later by pytest,
// runs first (it prints the Python threads, then hands the signal back here); a thread of ours
// without Python frames shows only here. Tests only: nothing of it ships.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

constexpr std::array kSignals = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
struct sigaction g_previous[NSIG];
int g_stderr = -1;      // the process's stderr as it was at load (pytest captures fd 2 later)
char g_gdb[4096] = {};  // gdb's path, found at load (no PATH search in a signal handler)
std::atomic<bool> g_fired{false};

void say(const char* s) { (void)!write(g_stderr, s, std::strlen(s)); }

// Decimal digits of n into buf (async-signal-safe).
void decimal(long n, char* buf) {
  char tmp[24];
  int k = 0;
  do {
    tmp[k++] = static_cast<char>('0' + n % 10);
    n /= 10;
  } while (n > 0);
  for (int i = 0; i < k; ++i) buf[i] = tmp[k - 1 - i];
  buf[k] = '\0';
}

void on_fatal(int sig, siginfo_t*, void*) {
  if (!g_fired.exchange(true) && g_gdb[0] != '\0') {
    char pid[24];
    decimal(static_cast<long>(getpid()), pid);
    say("\n-- crash_report: a fatal signal; gdb prints every thread's native stack\n");
    pid_t child = fork();
    if (child == 0) {
      dup2(g_stderr, 1);
      dup2(g_stderr, 2);
      char arg_gdb[] = "gdb", arg_p[] = "-p", arg_batch[] = "-batch", arg_nx[] = "-nx",
           arg_ex[] = "-ex", arg_short[] = "set print frame-arguments presence",
           arg_bt[] = "thread apply all bt 40";
      char* argv[] = {arg_gdb, arg_p,     pid,    arg_batch, arg_nx,
                      arg_ex,  arg_short, arg_ex, arg_bt,    nullptr};
      char* envp[] = {nullptr};  // no LD_PRELOAD of this into gdb
      execve(g_gdb, argv, envp);
      _exit(127);
    }
    if (child > 0) {
      prctl(PR_SET_PTRACER, child, 0, 0, 0);
      int status = 0;
      while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  // Die as the signal would have: the handler before this one (the default), raised again.
  sigaction(sig, &g_previous[sig], nullptr);
  raise(sig);
}

std::string find_gdb() {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  for (std::size_t at = 0; at <= dirs.size();) {
    std::size_t end = dirs.find(':', at);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = dirs.substr(at, end - at) + "/gdb";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    at = end + 1;
  }
  return {};
}

__attribute__((constructor)) void install() {
  // Python processes only (pytest's, its workers'): not the servers and tools they start.
  char exe[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  const char* base = n > 0 ? std::strrchr(exe, '/') : nullptr;
  if (base == nullptr || std::strncmp(base + 1, "python", 6) != 0) return;
  const std::string gdb = find_gdb();
  if (gdb.empty() || gdb.size() >= sizeof(g_gdb)) return;  // nothing to print stacks with
  std::memcpy(g_gdb, gdb.c_str(), gdb.size() + 1);
  g_stderr = fcntl(2, F_DUPFD_CLOEXEC, 100);
  if (g_stderr < 0) return;
  // Each process loads this once; the children it starts (worker processes, torchrun's) have
  // it preloaded too and install their own.
  static char stack[1 << 16];  // a handler for a stack overflow needs a stack of its own
  stack_t ss{};
  ss.ss_sp = stack;
  ss.ss_size = sizeof(stack);
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = on_fatal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int sig : kSignals) sigaction(sig, &sa, &g_previous[sig]);
}

}  // namespace
