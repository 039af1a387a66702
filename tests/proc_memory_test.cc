// Worker processes' memory for the cap (stoker/frontend/proc_memory.h): /proc text parsed
// (made-up and real), the estimate combined (pure), and the sampler on a forked child that
// shares its parent's pages copy-on-write.
#include "stoker/frontend/proc_memory.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace stoker::detail {
namespace {

constexpr std::uint64_t kKiB = 1024;
constexpr std::uint64_t kMiB = 1024 * kKiB;

// As Linux 6.x writes them (abridged); the older kernel's rollup has no Pss_Anon line.
constexpr const char* kStatus =
    "Name:\tpython3\nUmask:\t0022\nState:\tS (sleeping)\nVmRSS:\t  912340 kB\n"
    "RssAnon:\t  800004 kB\nRssFile:\t  101212 kB\nRssShmem:\t   11124 kB\nThreads:\t5";
constexpr const char* kRollup =
    "559a80f14000-7ffef67d8000 ---p 00000000 00:00 0                          [rollup]\n"
    "Rss:              912340 kB\nPss:              350000 kB\nPss_Dirty:        280000 kB\n"
    "Pss_Anon:         270001 kB\nPss_File:          70000 kB\nPss_Shmem:          9999 kB\n"
    "Anonymous:        800004 kB\nSwap:                  0 kB\nSwapPss:               0 kB\n";
constexpr const char* kOldRollup =
    "00400000-7ffef67d8000 ---p 00000000 00:00 0                          [rollup]\n"
    "Rss:              912340 kB\nPss:              350000 kB\nAnonymous:        800004 kB\n";

TEST(ProcMemory, ParsesTheFieldsOfMadeUpProcText) {
  EXPECT_EQ(proc_kib_field(kStatus, "RssAnon"), 800004 * kKiB);
  EXPECT_EQ(proc_kib_field(kStatus, "RssShmem"), 11124 * kKiB);
  EXPECT_EQ(proc_kib_field(kRollup, "Pss_Anon"), 270001 * kKiB);
  // A name is whole: "Pss" is not "Pss_Anon", and the other way round.
  EXPECT_EQ(proc_kib_field(kRollup, "Pss"), 350000 * kKiB);
  EXPECT_EQ(proc_kib_field(kOldRollup, "Pss_Anon"), std::nullopt);
  EXPECT_EQ(proc_kib_field(kStatus, "Rss"), std::nullopt);
  EXPECT_EQ(proc_kib_field("", "RssAnon"), std::nullopt);
  EXPECT_EQ(proc_kib_field("RssAnon:\t kB\n", "RssAnon"), std::nullopt);  // no number
  EXPECT_EQ(proc_kib_field("Threads:\t5", "Threads"), 5 * kKiB);          // the last line
}

TEST(ProcMemory, ASampleIsPssAnonOrRssAnonWhereTheKernelHasNoPssAnon) {
  const AnonSample now = anon_sample(kRollup, 800004 * kKiB);
  EXPECT_EQ(now.pss_anon, 270001 * kKiB);
  EXPECT_EQ(now.rss_anon, 800004 * kKiB);
  const AnonSample old = anon_sample(kOldRollup, 800004 * kKiB);
  EXPECT_EQ(old.pss_anon, 800004 * kKiB);  // counted whole, as before Pss_Anon
  EXPECT_EQ(old.rss_anon, 800004 * kKiB);
}

TEST(ProcMemory, TheEstimateIsTheShareThenPlusTheGrowthSinceAtMostRssAnonNow) {
  const AnonSample last{300 * kMiB, 900 * kMiB};
  EXPECT_EQ(estimate_pss_anon(last, 900 * kMiB), 300 * kMiB);  // unchanged
  EXPECT_EQ(estimate_pss_anon(last, 950 * kMiB), 350 * kMiB);  // new pages are its own
  EXPECT_EQ(estimate_pss_anon(last, 600 * kMiB), 300 * kMiB);  // freed: the share stays
  EXPECT_EQ(estimate_pss_anon(last, 200 * kMiB), 200 * kMiB);  // never more than it holds
  EXPECT_EQ(estimate_pss_anon({0, 0}, 0), 0U);
  // Not read yet: a fork's pages split among the processes sharing them.
  EXPECT_EQ(forked_sample(900 * kMiB, 3).pss_anon, 300 * kMiB);
  EXPECT_EQ(forked_sample(900 * kMiB, 3).rss_anon, 900 * kMiB);
  EXPECT_EQ(forked_sample(900 * kMiB, 0).pss_anon, 900 * kMiB);
  EXPECT_EQ(estimate_pss_anon(forked_sample(900 * kMiB, 3), 910 * kMiB), 310 * kMiB);
}

TEST(ProcMemory, ThePeriodIsFiftyTimesTheReadsCostAndAtLeastTwoSeconds) {
  using std::chrono::milliseconds;
  EXPECT_EQ(sample_period(milliseconds(0)), kMinSamplePeriod);
  EXPECT_EQ(sample_period(milliseconds(28)), kMinSamplePeriod);  // two workers of CUDA torch
  EXPECT_EQ(sample_period(milliseconds(40)), milliseconds(2000));
  EXPECT_EQ(sample_period(milliseconds(200)), milliseconds(10000));
  EXPECT_EQ(sample_period(milliseconds(1), milliseconds(10)), milliseconds(50));
  EXPECT_EQ(sample_period(milliseconds(0), milliseconds(10)), milliseconds(10));
}

TEST(ProcMemory, ReadsThisProcesssRealProcText) {
  const auto status = read_proc_file("/proc/self/status");
  ASSERT_TRUE(status);
  const auto rss = proc_kib_field(*status, "RssAnon");
  ASSERT_TRUE(rss);
  EXPECT_GT(*rss, 0U);
  EXPECT_EQ(read_rss_anon(getpid()).has_value(), true);
  const auto rollup = read_proc_file("/proc/self/smaps_rollup");
  ASSERT_TRUE(rollup);
  const auto anonymous = proc_kib_field(*rollup, "Anonymous");
  ASSERT_TRUE(anonymous);
  const AnonSample sample = anon_sample(*rollup, *rss);
  if (proc_kib_field(*rollup, "Pss_Anon")) {
    EXPECT_GT(sample.pss_anon, 0U);
    EXPECT_LE(sample.pss_anon, *anonymous);  // one walk: a share is at most the whole
  } else {
    EXPECT_EQ(sample.pss_anon, *rss);
  }
  EXPECT_EQ(read_proc_file("/proc/self/no such file"), std::nullopt);
}

// A child forked after this process wrote `bytes`: it shares them copy-on-write until told
// (grow()) to allocate and write `more` bytes of its own; it exits when the parent lets go.
class Forked {
 public:
  Forked(std::size_t bytes, std::size_t more) : held_(bytes, 1) {
    int go[2], done[2];
    if (pipe(go) != 0 || pipe(done) != 0) throw std::runtime_error("pipe");
    pid_ = fork();
    if (pid_ == 0) {
      close(go[1]);
      close(done[0]);
      char c = 0;
      if (read(go[0], &c, 1) == 1) {
        char* mine = static_cast<char*>(std::malloc(more));
        if (mine != nullptr) std::memset(mine, 2, more);
        c = mine != nullptr ? mine[more - 1] : 0;
        if (write(done[1], &c, 1) != 1) _exit(1);
        while (read(go[0], &c, 1) > 0) {
        }
      }
      _exit(0);
    }
    close(go[0]);
    close(done[1]);
    go_ = go[1];
    done_ = done[0];
  }
  ~Forked() {
    close(go_);
    close(done_);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  Forked(const Forked&) = delete;
  Forked& operator=(const Forked&) = delete;

  pid_t pid() const { return pid_; }
  // True once the child has written its own bytes.
  bool grow() {
    char c = 1;
    return write(go_, &c, 1) == 1 && read(done_, &c, 1) == 1 && c == 2;
  }

 private:
  std::vector<char> held_;
  pid_t pid_ = -1;
  int go_ = -1;
  int done_ = -1;
};

// The tests' sampler period (the product's is kMinSamplePeriod, 2 s).
constexpr std::chrono::milliseconds kShortPeriod{10};

// Waits (without a time limit of its own: ctest's ends a hung test) until the sampler has
// read `reads` files.
void wait_for_reads(const AnonMemorySampler& sampler, std::uint64_t reads) {
  while (sampler.cost().reads < reads) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

TEST(AnonMemorySampler, AForkedChildCountsItsShareOfTheParentsPagesAndItsGrowthAtOnce) {
  constexpr std::size_t kHeld = 64 * kMiB;
  constexpr std::size_t kMore = 32 * kMiB;
  Forked child(kHeld, kMore);
  const pid_t pid = child.pid();
  const std::uint64_t rss = read_rss_anon(pid).value();
  ASSERT_GE(rss, kHeld);  // RssAnon counts the shared pages whole
  AnonMemorySampler sampler(kShortPeriod);
  sampler.add(pid);
  const pid_t pids[] = {pid};
  // Before its first read: the fork's share (it and this process: 2 sharers), at most RssAnon.
  // After: its Pss_Anon, about half of the pages it shares.
  EXPECT_LE(sampler.estimate(pids), read_rss_anon(pid).value());  // asks for a round
  wait_for_reads(sampler, 1);
  const std::uint64_t shared = sampler.estimate(pids);
  const std::uint64_t rss_then = read_rss_anon(pid).value();
  const auto rollup = read_proc_file("/proc/" + std::to_string(pid) + "/smaps_rollup");
  ASSERT_TRUE(rollup);
  if (proc_kib_field(*rollup, "Pss_Anon")) {
    EXPECT_LT(shared, rss_then - kHeld / 4) << "the shared pages count half, not whole";
    EXPECT_GE(shared, kHeld / 2 - kHeld / 8);
  } else {
    EXPECT_EQ(shared, rss_then);  // no Pss_Anon: counted whole
  }
  // Its own new pages count in full before any read sees them (and after one: they are its
  // own either way).
  ASSERT_TRUE(child.grow());
  EXPECT_GE(sampler.estimate(pids), shared + kMore - kMore / 8);
  EXPECT_LE(sampler.estimate(pids), read_rss_anon(pid).value());
}

TEST(AnonMemorySampler, ProcessesNotAddedCountRssAnonAndThoseGoneNothing) {
  AnonMemorySampler sampler;
  const pid_t self[] = {getpid()};
  EXPECT_GT(sampler.estimate(self), 0U);
  pid_t gone = fork();
  if (gone == 0) _exit(0);
  int status = 0;
  waitpid(gone, &status, 0);
  sampler.add(gone);
  const pid_t pids[] = {gone};
  EXPECT_EQ(sampler.estimate(pids), 0U);
  sampler.remove(gone);
  EXPECT_EQ(sampler.estimate(pids), 0U);
}

TEST(AnonMemorySampler, ReadsOnlyWhileAskedAndStopsAtOnceWhenWaiting) {
  Forked child(kMiB, kMiB);
  auto sampler = std::make_unique<AnonMemorySampler>(kShortPeriod);
  sampler->add(child.pid());
  std::this_thread::sleep_for(10 * kShortPeriod);
  EXPECT_EQ(sampler->cost().reads, 0U) << "nobody asked: nothing read, not even the new process";
  const pid_t pids[] = {child.pid()};
  sampler->estimate(pids);  // asks: a round once the period has passed since the start
  wait_for_reads(*sampler, 1);
  sampler->estimate(pids);  // and again, a period after the first
  wait_for_reads(*sampler, 2);
  EXPECT_GT(sampler->cost().cpu.count(), 0);
  sampler->stop();
  const auto reads = sampler->cost().reads;
  sampler->join();  // the thread has ended: nothing of it is left open
  sampler->join();
  EXPECT_GT(sampler->estimate(pids), 0U);  // answers after it, from the last read
  EXPECT_EQ(sampler->cost().reads, reads);
  sampler.reset();
}

TEST(AnonMemorySampler, TheFirstRoundComesAPeriodAfterTheStartNotWhenAProcessIsAdded) {
  // A worker just started maps the most (its slabs, its arenas, its heap growing): the walk of
  // its pages, which holds its mmap lock, waits for the period.
  Forked child(kMiB, kMiB);
  AnonMemorySampler sampler(std::chrono::hours(1));
  sampler.add(child.pid());
  const pid_t pids[] = {child.pid()};
  EXPECT_GT(sampler.estimate(pids), 0U);  // its share of the fork, from RssAnon
  std::this_thread::sleep_for(10 * kShortPeriod);
  EXPECT_EQ(sampler.cost().reads, 0U);
}

TEST(AnonMemorySampler, ADestroyedSamplerThatWasNeverAskedJoinsItsThread) {
  AnonMemorySampler sampler;  // waits for work; the destructor wakes and joins it
  EXPECT_EQ(sampler.cost().reads, 0U);
}

}  // namespace
}  // namespace stoker::detail
