// Worker processes' own memory, for the loader's memory cap (LoaderOptions::memory_limit):
// each process's proportional share of the anonymous memory it maps (Pss_Anon of
// /proc/<pid>/smaps_rollup), so that pages a forked worker still shares copy-on-write with
// the training process and its sibling workers are split among them, not counted in full in
// each (RssAnon of /proc/<pid>/status does that: a training process holding 1 GiB made two
// forked workers count 2.3 GiB). Not the files and shared memory it maps: the slabs worker
// processes write into are shared memory, counted once as slabs.
//
// Reading smaps_rollup walks every page the process maps (about 0.2 s for a worker mapping
// 1 GiB of slabs, 14 ms for a worker of a CUDA build of torch), far too slow for the training
// thread, which looks at the cap every 50 ms. And the walk holds the process's mmap lock: a
// worker that maps or unmaps memory meanwhile (a slab it is sent, an arena, its heap growing)
// waits for it, on a busy machine for several milliseconds more (a worker's first job after
// auto's move to processes waited 6-11 ms so on 2 cores). So AnonMemorySampler reads it on a
// thread of its own, seldom: in rounds a period apart (kSampleCostRatio times the last round's
// CPU time, at least kMinSamplePeriod; the first a period after it starts), and answers the
// training thread from RssAnon (/proc/<pid>/status, microseconds) combined with the last read:
// the share then plus what the process grew by since (new pages are its own), never more than
// its RssAnon now; a process not read yet counts its share of a fork (forked_sample). So
// growth counts at once; what the estimate misses until the next read is a share that grows
// without the process growing (a sibling that wrote its copies of shared pages, or exited), at
// most one period (plus one read) old.
//
// The Python package's worker process pool uses it (python/src/py_workers.cc).
// Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>

#include "stoker/frontend/mutex.h"

namespace stoker::detail {

// Processes are named by their pid (pid_t, an int on Linux: no system header here).

// --- /proc text, pure -------------------------------------------------------------------------

// The bytes of the line "`key`:   N kB" of /proc text (status, smaps_rollup); nullopt if it
// has no such line (or the line has no number). `key` is the name without its colon.
std::optional<std::uint64_t> proc_kib_field(std::string_view text, std::string_view key);

// A whole /proc file; nullopt if it cannot be read (the process is gone, no /proc).
std::optional<std::string> read_proc_file(const std::string& path);

// RssAnon of process `pid` (its anonymous resident memory, shared copy-on-write pages counted
// in full); nullopt if it is gone or has no memory any more (a zombie has no RssAnon line).
std::optional<std::uint64_t> read_rss_anon(int pid);

// --- the estimate, pure --------------------------------------------------------------------

// One read of a process's smaps_rollup.
struct AnonSample {
  // Its proportional share of anonymous memory then (Pss_Anon; on an older kernel whose
  // smaps_rollup has no Pss_Anon line: RssAnon, the process counted whole).
  std::uint64_t pss_anon = 0;
  std::uint64_t rss_anon = 0;  // its RssAnon read just before (growth is measured from it)
};

// What smaps_rollup text and the RssAnon read before it make: Pss_Anon if the text has it,
// else RssAnon.
AnonSample anon_sample(std::string_view smaps_rollup, std::uint64_t rss_anon);

// The estimate of a process's Pss_Anon now from its last sample and its RssAnon now: the share
// then plus what it grew by since, at most RssAnon now (a share is never more than the whole;
// a process that freed memory since counts no more than it holds).
constexpr std::uint64_t estimate_pss_anon(const AnonSample& last, std::uint64_t rss_anon_now) {
  const std::uint64_t grown = rss_anon_now > last.rss_anon ? rss_anon_now - last.rss_anon : 0;
  const std::uint64_t estimate = last.pss_anon + grown;
  return estimate < rss_anon_now ? estimate : rss_anon_now;
}

// The sample a process has before its first read, taken as it starts: a process just forked
// shares every anonymous page it holds with its parent, so of `rss_anon` its share is what one
// of the `sharers` processes sharing them gets (the training process and its live workers:
// a fork's pages are shared by all of them until written). An estimate, used only until the
// sampler's first read of it, which comes first in the sampler's next round.
constexpr AnonSample forked_sample(std::uint64_t rss_anon, std::size_t sharers) {
  return {rss_anon / (sharers > 0 ? sharers : 1), rss_anon};
}

// The sampler's period after a round of reads that cost `cost` of its thread's CPU time:
// kSampleCostRatio times it, at least `least` (so the reads take at most 1/50 of one core, and
// hold each process's mmap lock about as seldom).
inline constexpr int kSampleCostRatio = 50;
inline constexpr std::chrono::milliseconds kMinSamplePeriod{2000};
constexpr std::chrono::nanoseconds sample_period(
    std::chrono::nanoseconds cost, std::chrono::nanoseconds least = kMinSamplePeriod) {
  const auto scaled = cost * kSampleCostRatio;
  return scaled > least ? scaled : least;
}

// --- the sampler ---------------------------------------------------------------------------

// Reads the smaps_rollup of the processes it is told of on a thread of its own (named
// "stoker-pss"), and answers estimate() without reading it. Rounds run while someone asks,
// a period apart (the first a period after the sampler starts), each reading every process
// it was told of; none while nobody looks. A process added is first read in the next round:
// not at once, when a worker just started maps the most.
//
// Thread safety: every member but join() from any thread. The thread holds no reference to
// its owner; stop() wakes it (a read in progress finishes first: one process's smaps_rollup)
// and join() or the destructor joins it. A forked copy of the owner must not destroy its
// copy (the thread is not in the child): see ProcessPool::~ProcessPool.
class AnonMemorySampler {
 public:
  // Starts the thread; `least`: the shortest period (tests shorten it).
  explicit AnonMemorySampler(std::chrono::nanoseconds least = kMinSamplePeriod);
  ~AnonMemorySampler();
  AnonMemorySampler(const AnonMemorySampler&) = delete;
  AnonMemorySampler& operator=(const AnonMemorySampler&) = delete;

  // Process `pid` has just been forked (or started otherwise): its RssAnon is read now
  // (microseconds) and its first smaps_rollup read comes in the next round. Until then it
  // counts as forked_sample(), shared by the training process and every process added.
  void add(int pid) STOKER_EXCLUDES(mu_);
  void remove(int pid) STOKER_EXCLUDES(mu_);  // gone, or replaced
  // The sum of the estimates of `pids` now (estimate_pss_anon), each one's RssAnon read now; a
  // process not added counts its RssAnon, one gone counts 0. Never reads smaps_rollup.
  std::uint64_t estimate(std::span<const int> pids) STOKER_EXCLUDES(mu_);
  // The thread ends (at once if waiting; a read in progress finishes first). Idempotent, any
  // thread. estimate() still answers, from the last reads.
  void stop() noexcept STOKER_EXCLUDES(mu_);
  // stop(), and waits for the thread to end (no descriptor of it left open). Idempotent; not
  // from two threads at once (the destructor joins too).
  void join() STOKER_EXCLUDES(mu_);

  // What the reads cost so far: smaps_rollup files read, and the thread's CPU time in rounds.
  struct Cost {
    std::uint64_t reads = 0;
    std::chrono::nanoseconds cpu{0};
  };
  Cost cost() const STOKER_EXCLUDES(mu_);

 private:
  void run() STOKER_EXCLUDES(mu_);

  struct Entry {
    AnonSample last;    // the last read; before the first, RssAnon at start in last.rss_anon
    bool read = false;  // smaps_rollup read at least once
  };
  mutable Mutex mu_;
  std::condition_variable cv_;
  std::map<int, Entry> entries_ STOKER_GUARDED_BY(mu_);
  bool stopped_ STOKER_GUARDED_BY(mu_) = false;
  bool asked_ STOKER_GUARDED_BY(mu_) = false;  // estimate() called since the last round
  Cost cost_ STOKER_GUARDED_BY(mu_);
  const std::chrono::nanoseconds least_;
  std::thread thread_;  // last: started once the rest is made
};

}  // namespace stoker::detail
