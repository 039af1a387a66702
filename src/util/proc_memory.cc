#include "stoker/frontend/proc_memory.h"

#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <utility>
#include <vector>

namespace stoker::detail {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::nanoseconds thread_cpu() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec);
}

// RssAnon, then smaps_rollup (so that growth during the walk counts twice rather than never);
// nullopt if the process is gone.
std::optional<AnonSample> read_sample(int pid) {
  const auto rss = read_rss_anon(pid);
  if (!rss) return std::nullopt;
  const auto rollup = read_proc_file("/proc/" + std::to_string(pid) + "/smaps_rollup");
  if (!rollup) return std::nullopt;
  return anon_sample(*rollup, *rss);
}

}  // namespace

std::optional<std::uint64_t> proc_kib_field(std::string_view text, std::string_view key) {
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
    if (line.size() <= key.size() || line.substr(0, key.size()) != key || line[key.size()] != ':') {
      continue;
    }
    line.remove_prefix(key.size() + 1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    std::uint64_t kib = 0;
    const auto [at, error] = std::from_chars(line.data(), line.data() + line.size(), kib);
    if (error != std::errc{} || at == line.data()) return std::nullopt;
    return kib * 1024;
  }
  return std::nullopt;
}

std::optional<std::string> read_proc_file(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      close(fd);
      return std::nullopt;  // ESRCH: the process exited while it was read
    }
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  close(fd);
  return text;
}

std::optional<std::uint64_t> read_rss_anon(int pid) {
  const auto status = read_proc_file("/proc/" + std::to_string(pid) + "/status");
  if (!status) return std::nullopt;
  return proc_kib_field(*status, "RssAnon");
}

AnonSample anon_sample(std::string_view smaps_rollup, std::uint64_t rss_anon) {
  return {proc_kib_field(smaps_rollup, "Pss_Anon").value_or(rss_anon), rss_anon};
}

// --- AnonMemorySampler ---------------------------------------------------------------------

AnonMemorySampler::AnonMemorySampler(std::chrono::nanoseconds least)
    : least_(least), thread_([this] { run(); }) {}

AnonMemorySampler::~AnonMemorySampler() { join(); }

void AnonMemorySampler::join() {
  stop();
  if (thread_.joinable()) thread_.join();
}

void AnonMemorySampler::add(int pid) {
  const std::uint64_t rss = read_rss_anon(pid).value_or(0);
  {
    MutexLock lock(mu_);
    entries_[pid] = Entry{AnonSample{0, rss}, false};
  }
}

void AnonMemorySampler::remove(int pid) {
  MutexLock lock(mu_);
  entries_.erase(pid);
}

std::uint64_t AnonMemorySampler::estimate(std::span<const int> pids) {
  std::vector<std::optional<std::uint64_t>> rss(pids.size());
  for (std::size_t k = 0; k < pids.size(); ++k) rss[k] = read_rss_anon(pids[k]);
  std::uint64_t sum = 0;
  bool wake = false;
  {
    MutexLock lock(mu_);
    wake = !std::exchange(asked_, true);
    const std::size_t sharers = entries_.size() + 1;  // the training process too
    for (std::size_t k = 0; k < pids.size(); ++k) {
      if (!rss[k]) continue;  // gone
      const auto it = entries_.find(pids[k]);
      if (it == entries_.end()) {
        sum += *rss[k];
        continue;
      }
      const Entry& e = it->second;
      sum += estimate_pss_anon(e.read ? e.last : forked_sample(e.last.rss_anon, sharers), *rss[k]);
    }
  }
  if (wake) cv_.notify_all();
  return sum;
}

void AnonMemorySampler::stop() noexcept {
  {
    MutexLock lock(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
}

AnonMemorySampler::Cost AnonMemorySampler::cost() const {
  MutexLock lock(mu_);
  return cost_;
}

void AnonMemorySampler::run() {
  pthread_setname_np(pthread_self(), "stoker-pss");
  Clock::time_point due = Clock::now() + least_;
  MutexLock lock(mu_);
  while (!stopped_) {
    if (!asked_ || Clock::now() < due) {
      if (asked_) {
        lock.wait_until(cv_, due);
      } else {
        lock.wait(cv_);  // nobody looks: no reads
      }
      continue;
    }
    std::vector<int> pids;
    for (const auto& [pid, e] : entries_) pids.push_back(pid);
    asked_ = false;
    const auto start = thread_cpu();
    std::uint64_t reads = 0;
    for (const int pid : pids) {
      if (stopped_) break;
      std::optional<AnonSample> sample;
      {
        MutexUnlock unlocked(mu_);
        sample = read_sample(pid);
      }
      ++reads;
      const auto it = entries_.find(pid);
      if (!sample || it == entries_.end()) continue;  // gone, or removed while read
      it->second = Entry{*sample, true};
    }
    const auto spent = thread_cpu() - start;
    cost_.reads += reads;
    cost_.cpu += spent;
    due = Clock::now() + sample_period(spent, least_);
  }
}

}  // namespace stoker::detail
