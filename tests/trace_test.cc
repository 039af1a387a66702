// Loader::trace: the Chrome trace-event JSON it writes, what it holds for a small run, the size
// cap (the newest events kept, said in the metadata and once in the log), and when the file is
// written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "stoker/loader.h"
#include "stoker/log.h"
#include "test_datasets.h"

namespace stoker {
namespace {

using json = nlohmann::json;
using testing::IndexDataset;

// A file name in the temporary directory, removed when the test ends.
class TempPath {
 public:
  explicit TempPath(const std::string& name)
      : path_(std::filesystem::temp_directory_path() /
              ("stoker-trace-" + std::to_string(getpid()) + "-" + name + ".json")) {
    std::filesystem::remove(path_);
  }
  ~TempPath() { std::filesystem::remove(path_); }
  std::string str() const { return path_.string(); }
  bool exists() const { return std::filesystem::exists(path_); }

 private:
  std::filesystem::path path_;
};

json read_json(const TempPath& path) {
  std::ifstream f(path.str());
  return json::parse(f);  // throws if it is not JSON
}

// Reads of 20 us or more, so that each is traced (shorter ones are drawn as their chunk only).
LoaderOptions options(std::size_t samples, std::size_t batch, std::size_t workers,
                      std::chrono::microseconds delay = std::chrono::microseconds(20)) {
  LoaderOptions o;
  o.dataset = std::make_shared<IndexDataset<>>(samples, 64, std::set<std::size_t>{}, delay);
  o.batch_size = batch;
  o.workers = workers;
  return o;
}

void drain(Loader& loader) {
  while (loader.next()) {
  }
}

// Event names by phase ("X" -> {"read", ...}) and thread names by tid.
struct Summary {
  std::map<std::string, std::multiset<std::string>> names;
  std::map<long, std::string> threads;
  std::map<std::string, std::set<long>> tids_of;  // span name -> tids it appears on
  std::set<std::string> counter_keys;             // "queue/in flight", ...
  std::size_t events = 0;  // recorded: a batch's life is one, written as up to four slice ends
};

Summary summarize(const json& trace) {
  Summary s;
  std::set<std::string> batches;
  for (const json& e : trace.at("traceEvents")) {
    const std::string ph = e.at("ph");
    const std::string name = e.at("name");
    if (ph == "M") {
      if (name == "thread_name") s.threads[e.at("tid")] = e.at("args").at("name");
      continue;
    }
    s.names[ph].insert(name);
    if (ph == "b" || ph == "e") {
      batches.insert(e.at("id").get<std::string>());
    } else {
      ++s.events;
    }
    if (ph == "X") s.tids_of[name].insert(e.at("tid").get<long>());
    if (ph == "C") {
      for (const auto& [key, value] : e.at("args").items()) s.counter_keys.insert(name + "/" + key);
    }
  }
  s.events += batches.size();
  return s;
}

std::set<std::string> thread_names(const Summary& s, const std::string& span) {
  std::set<std::string> out;
  for (long tid : s.tids_of.at(span)) out.insert(s.threads.at(tid));
  return out;
}

TEST(Trace, SmallRunHasEveryKindOfEventOnItsThread) {
  TempPath path("small");
  auto o = options(64, 8, 2);
  o.device = "sim";
  Loader loader(o);
  loader.trace(path.str());
  drain(loader);
  drain(loader);
  loader.stop_trace();

  const json trace = read_json(path);
  EXPECT_EQ(trace.at("otherData").at("dropped_events"), 0);
  const Summary s = summarize(trace);
  for (const char* span : {"read", "chunk", "wait for batch", "step", "copy to device"}) {
    EXPECT_TRUE(s.names.at("X").count(span)) << span;
  }
  // Chunks claimed before the trace began are not in it; the second epoch's all are.
  std::set<std::size_t> samples;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("name") == "read") samples.insert(e.at("args").at("sample").get<std::size_t>());
  }
  EXPECT_EQ(samples.size(), 64u);
  EXPECT_GE(s.names.at("X").count("read"), 64u);
  // Which of the two workers claims which chunk is up to timing.
  for (const auto& name : thread_names(s, "read")) {
    EXPECT_TRUE(name == "worker 1" || name == "worker 2") << name;
  }
  EXPECT_EQ(thread_names(s, "wait for batch"), std::set<std::string>{"consumer"});
  EXPECT_EQ(thread_names(s, "copy to device"), std::set<std::string>{"consumer"});
  // A nested "batch" and "ready" slice per batch; the first ones, opened or completed before
  // the trace began, have only what was stamped after.
  for (const char* part : {"batch", "ready"}) {
    EXPECT_GE(s.names.at("b").count(part), 8u) << part;
    EXPECT_EQ(s.names.at("b").count(part), s.names.at("e").count(part)) << part;
  }
  EXPECT_EQ(s.counter_keys,
            (std::set<std::string>{"queue/in flight", "queue/ready", "pinned bytes/this loader",
                                   "pinned bytes/process"}));
  // A step lies between each two batches the consumer took.
  EXPECT_GE(s.names.at("X").count("step"), 15u);
}

// Quick reads (under 10 us) are drawn as their chunk only, so chunks must cover every row.
TEST(Trace, ChunksCoverEveryRowWhateverTheReadTime) {
  TempPath path("quick");
  Loader loader(options(64, 8, 2, std::chrono::microseconds(0)));
  loader.trace(path.str());
  drain(loader);
  drain(loader);
  loader.stop_trace();
  const json trace = read_json(path);
  std::size_t rows = 0;  // of the second epoch, claimed after the trace began
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("name") == "chunk" && e.at("args").at("epoch") == 1) {
      rows += e.at("args").at("rows").get<std::size_t>();
    }
  }
  EXPECT_EQ(rows, 64u);
}

TEST(Trace, InlineReadsAreOnTheConsumerThread) {
  TempPath path("inline");
  Loader loader(options(20, 5, 0));
  loader.trace(path.str());
  drain(loader);
  loader.stop_trace();
  const Summary s = summarize(read_json(path));
  EXPECT_EQ(thread_names(s, "read"), std::set<std::string>{"consumer"});
  EXPECT_EQ(s.names.at("X").count("read"), 20u);
}

TEST(Trace, OverTheCapKeepsTheNewestEventsAndSaysSoOnce) {
  std::mutex mu;
  std::vector<std::string> lines;
  set_log_handler([&](LogLevel, std::string_view line) {
    std::lock_guard lock(mu);
    lines.emplace_back(line);
  });
  TempPath path("cap");
  constexpr std::size_t kCap = 200;
  {
    Loader loader(options(512, 8, 2));
    loader.trace(path.str(), {.max_events = kCap});
    drain(loader);
    // The last epoch's samples, in order: the newest reads must be the ones kept.
    drain(loader);
  }  // written by the destructor
  set_log_handler({});

  const json trace = read_json(path);
  const Summary s = summarize(trace);
  EXPECT_LE(s.events, kCap);
  EXPECT_GT(s.events, kCap / 4);  // the common window is not empty
  const json& meta = trace.at("otherData");
  EXPECT_GT(meta.at("dropped_events").get<std::size_t>(), 0u);
  EXPECT_EQ(meta.at("max_events"), kCap);
  EXPECT_NE(meta.at("note").get<std::string>().find("kept the newest"), std::string::npos);

  // The newest events are there: the reads of the second epoch's last batch (sequential order:
  // samples 504..511), and nothing from before the window, like the first epoch's chunks.
  std::set<std::size_t> read_samples;
  double first_ts = 1e300;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M") continue;
    first_ts = std::min(first_ts, e.at("ts").get<double>());
    if (e.at("name") == "read") read_samples.insert(e.at("args").at("sample").get<std::size_t>());
    if (e.at("name") == "chunk") {
      EXPECT_NE(e.at("args").at("epoch"), 0);
    }
  }
  for (std::size_t i = 504; i < 512; ++i) EXPECT_TRUE(read_samples.count(i)) << i;
  EXPECT_GE(first_ts, meta.at("complete_from_us").get<double>());

  std::size_t said = 0;
  for (const auto& line : lines) said += line.find("kept the newest") != std::string::npos;
  EXPECT_EQ(said, 1u);
}

TEST(Trace, WrittenByStopByTheDestructorAndByTheNextTrace) {
  TempPath first("first"), second("second"), third("third");
  {
    Loader loader(options(32, 8, 1));
    loader.stop_trace();  // nothing recording: nothing to do
    loader.trace(first.str());
    EXPECT_TRUE(first.exists());  // created at once, so a bad path fails here
    drain(loader);
    loader.trace(second.str());  // writes the first
    EXPECT_GT(summarize(read_json(first)).events, 0u);
    drain(loader);
    loader.stop_trace();
    EXPECT_GT(summarize(read_json(second)).events, 0u);
    loader.trace(third.str());
    drain(loader);
  }
  EXPECT_GT(summarize(read_json(third)).events, 0u);
}

TEST(Trace, AFileThatCannotBeCreatedThrowsWithItsCause) {
  Loader loader(options(8, 4, 1));
  try {
    loader.trace("/nonexistent-dir/run.json");
    FAIL() << "no error";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), std::errc::no_such_file_or_directory);
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/run.json"), std::string::npos);
  }
  drain(loader);  // and the loader goes on, untraced
}

}  // namespace
}  // namespace stoker
