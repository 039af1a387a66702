#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>

#include "stoker/frontend/log.h"
#include "stoker/frontend/tracer.h"

namespace stoker::detail {

struct Tracer::Buffer {
  Buffer(int thread_id, std::string thread_name) : tid(thread_id), name(std::move(thread_name)) {}
  const int tid;
  const std::string name;
  Mutex mu;  // its thread per event, and start() / stop(): never contended in between
  std::vector<TraceEvent> events STOKER_GUARDED_BY(mu);
  std::size_t capacity STOKER_GUARDED_BY(mu) = 0;
  std::size_t oldest STOKER_GUARDED_BY(mu) = 0;  // once the ring is full
  std::uint64_t overwritten STOKER_GUARDED_BY(mu) = 0;
};

namespace {

std::atomic<std::uint64_t> next_tracer_id{1};
thread_local std::string thread_name;
thread_local Tracer* current_tracer = nullptr;

// What a thread's buffer held when recording stopped, oldest first.
struct Track {
  int tid = 0;
  std::string name;
  std::vector<TraceEvent> events;
  bool wrapped = false;
};

// The time an event is kept or dropped by: a batch's is when it was taken (the writer leaves
// out its parts from before the window).
std::int64_t key(const TraceEvent& e) { return e.name == TraceName::batch ? e.end_ns : e.start_ns; }

// Writes the events as Chrome trace-event JSON (the JSON Object Format), times in microseconds
// from `origin`; the trace is whole from `complete_from` on. Names and metadata go through
// nlohmann::json (escaping); the events, which are numbers under fixed keys, are printed
// directly: a trace holds up to millions of them.
class JsonWriter {
 public:
  JsonWriter(std::FILE* file, std::int64_t origin, std::int64_t complete_from)
      : file_(file), origin_(origin), complete_from_(complete_from), pid_(getpid()) {}

  void begin(const nlohmann::json& metadata) {
    std::fprintf(file_, "{\"displayTimeUnit\": \"ms\", \"otherData\": %s, \"traceEvents\": [\n",
                 metadata.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  void end() { std::fprintf(file_, "\n]}\n"); }

  void name_process(int pid, const std::string& name) { meta("process_name", pid, 0, name); }
  void name_thread(int pid, int tid, const std::string& name) {
    meta("thread_name", pid, tid, name);
  }
  void label_process(const std::string& label) {
    separator();
    std::fprintf(file_,
                 R"({"ph": "M", "name": "process_labels", "pid": %d, "args": {"labels": %s}})",
                 pid_, quote(label).c_str());
  }

  void event(int tid, const TraceEvent& e) {
    switch (e.name) {
      case TraceName::read:  // on a worker process's track if it read there
        span("worker", "read", e.process ? e.process : pid_, e.process ? e.process : tid, e);
        std::fprintf(file_, R"({"sample": %llu}})", ull(e.a));
        break;
      case TraceName::chunk:
        span("worker", "chunk", pid_, tid, e);
        std::fprintf(file_, R"({"epoch": %llu, "batch": %llu, "rows": %llu}})", ull(e.a), ull(e.b),
                     ull(e.c));
        break;
      case TraceName::job:
        span("worker process", "job", e.process, e.process, e);
        std::fprintf(file_, R"({"rows": %llu, "first sample": %llu}})", ull(e.a), ull(e.b));
        break;
      case TraceName::wait:
        span("consumer", "wait for batch", pid_, tid, e);
        std::fprintf(file_, "{}}");
        break;
      case TraceName::step:
        span("consumer", "step", pid_, tid, e);
        std::fprintf(file_, "{}}");
        break;
      case TraceName::copy:
        span("device", "copy to device", pid_, tid, e);
        std::fprintf(file_, R"({"bytes": %llu, "epoch": %llu, "batch": %llu}})", ull(e.a), ull(e.b),
                     ull(e.c));
        break;
      case TraceName::batch:
        batch(tid, e);
        break;
      case TraceName::queue:
        counter("queue", e.start_ns, "in flight", e.a, "ready", e.b);
        break;
      case TraceName::pinned:
        counter("pinned bytes", e.start_ns, "this loader", e.a, "process", e.b);
        break;
    }
  }

 private:
  static unsigned long long ull(std::uint64_t v) { return v; }
  static std::string quote(const std::string& s) {
    return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }

  void separator() {
    if (!first_) std::fputs(",\n", file_);
    first_ = false;
  }
  // Microseconds since the origin, to the nanosecond.
  void time(const char* key, std::int64_t ns) {
    const std::int64_t t = std::max<std::int64_t>(ns - origin_, 0);
    std::fprintf(file_, ", \"%s\": %lld.%03lld", key, static_cast<long long>(t / 1000),
                 static_cast<long long>(t % 1000));
  }
  void meta(const char* what, int pid, int tid, const std::string& name) {
    separator();
    std::fprintf(file_, R"({"ph": "M", "name": "%s", "pid": %d, "tid": %d, "args": {"name": %s}})",
                 what, pid, tid, quote(name).c_str());
  }
  // Opens a complete event; the caller prints its args object and the closing brace.
  void span(const char* cat, const char* name, int pid, int tid, const TraceEvent& e) {
    separator();
    std::fprintf(file_, R"({"ph": "X", "cat": "%s", "name": "%s", "pid": %d, "tid": %d)", cat, name,
                 pid, tid);
    time("ts", e.start_ns);
    std::fprintf(file_, ", \"dur\": %lld.%03lld, \"args\": ",
                 static_cast<long long>((e.end_ns - e.start_ns) / 1000),
                 static_cast<long long>((e.end_ns - e.start_ns) % 1000));
  }
  void counter(const char* name, std::int64_t ns, const char* k1, std::uint64_t v1, const char* k2,
               std::uint64_t v2) {
    separator();
    std::fprintf(file_, R"({"ph": "C", "name": "%s", "pid": %d)", name, pid_);
    time("ts", ns);
    std::fprintf(file_, R"(, "args": {"%s": %llu, "%s": %llu}})", k1, ull(v1), k2, ull(v2));
  }
  // A batch as nested async slices under one id: "batch" from opened to taken, "ready" from
  // complete to taken (the time it waited for the consumer). Parts from before the window (or
  // not stamped: the batch was opened or completed before the trace began) are left out. `tid`
  // is the thread that took it.
  void batch(int tid, const TraceEvent& e) {
    const auto ready = static_cast<std::int64_t>(e.a);
    char id[40];
    std::snprintf(id, sizeof id, "0x%llx", (ull(e.b) << 32) | (ull(e.c) & 0xffffffffULL));
    const auto part = [&](const char* ph, const char* name, std::int64_t ns) {
      separator();
      std::fprintf(file_,
                   R"({"ph": "%s", "cat": "batch", "name": "%s", "id": "%s", "pid": %d, "tid": %d)",
                   ph, name, id, pid_, tid);
      time("ts", ns);
      std::fprintf(file_, R"(, "args": {"epoch": %llu, "batch": %llu}})", ull(e.b), ull(e.c));
    };
    const bool opened = e.start_ns >= complete_from_;
    const bool was_ready = ready >= complete_from_;
    if (opened) part("b", "batch", e.start_ns);
    if (was_ready) part("b", "ready", ready);
    if (was_ready) part("e", "ready", e.end_ns);
    if (opened) part("e", "batch", e.end_ns);
    if (!opened && !was_ready) {
      separator();
      std::fprintf(file_,
                   R"({"ph": "i", "s": "p", "cat": "batch", "name": "taken", "pid": %d, "tid": %d)",
                   pid_, tid);
      time("ts", e.end_ns);
      std::fprintf(file_, R"(, "args": {"epoch": %llu, "batch": %llu}})", ull(e.b), ull(e.c));
    }
  }

  std::FILE* const file_;
  const std::int64_t origin_;
  const std::int64_t complete_from_;
  const int pid_;
  bool first_ = true;
};

}  // namespace

Tracer::Tracer() : id_(next_tracer_id.fetch_add(1, std::memory_order_relaxed)) {}

Tracer::~Tracer() {
  if (file_ == nullptr) return;
  try {
    stop();
  } catch (const std::exception& e) {
    log(LogLevel::warning, std::string("trace not written: ") + e.what());
  }
}

std::int64_t Tracer::now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Tracer::name_thread(std::string name) { thread_name = std::move(name); }
void Tracer::name_thread_once(const char* name) {
  if (thread_name.empty()) thread_name = name;
}
Tracer* Tracer::current() noexcept { return current_tracer; }
void Tracer::set_current(Tracer* tracer) noexcept { current_tracer = tracer; }

Tracer::Buffer& Tracer::buffer() {
  // A few tracers per thread (a train and a val loader on one consumer thread) stay cached.
  struct Entry {
    std::uint64_t tracer = 0;
    Buffer* buffer = nullptr;
  };
  thread_local std::array<Entry, 4> cache{};
  thread_local std::size_t replace = 0;
  for (const Entry& e : cache) {
    if (e.tracer == id_) return *e.buffer;
  }
  Buffer& b = add_buffer();
  cache[replace++ % cache.size()] = {id_, &b};
  return b;
}

Tracer::Buffer& Tracer::add_buffer() {
  const int tid = static_cast<int>(gettid());
  std::string name = thread_name.empty() ? "thread " + std::to_string(tid) : thread_name;
  MutexLock lock(buffers_mu_);
  // A thread whose cache entry was evicted finds its buffer again (by name too: the kernel
  // reuses the ids of threads that ended).
  for (auto& b : buffers_) {
    if (b->tid == tid && b->name == name) return *b;
  }
  auto b = std::make_unique<Buffer>(tid, std::move(name));
  {
    MutexLock buffer_lock(b->mu);
    b->capacity = max_events_;
  }
  buffers_.push_back(std::move(b));
  return *buffers_.back();
}

void Tracer::record(const TraceEvent& event) {
  Buffer& b = buffer();
  MutexLock lock(b.mu);
  if (b.events.size() < b.capacity) {
    b.events.push_back(event);
  } else if (b.capacity > 0) {
    b.events[b.oldest] = event;
    b.oldest = (b.oldest + 1) % b.capacity;
    ++b.overwritten;
  }
}

void Tracer::start(const std::string& path, const TraceOptions& options) {
  stop();
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    throw std::system_error(errno, std::generic_category(), "stoker: trace file " + path);
  }
  file_ = file;
  path_ = path;
  {
    MutexLock lock(buffers_mu_);
    max_events_ = std::max<std::size_t>(options.max_events, 1);
    started_ns_ = now_ns();
    for (auto& b : buffers_) {
      MutexLock buffer_lock(b->mu);
      b->capacity = max_events_;
    }
  }
  recording_.fetch_add(1, std::memory_order_relaxed);
  on_.store(true, std::memory_order_relaxed);
}

void Tracer::stop() {
  if (file_ == nullptr) return;
  on_.store(false, std::memory_order_relaxed);
  std::FILE* file = std::exchange(file_, nullptr);
  const std::string path = std::move(path_);

  // Take every buffer's events. An event whose site saw on() just before it went off may
  // still land; it is older than the next recording's start and left out then.
  std::vector<Track> tracks;
  std::int64_t origin = 0;
  std::size_t max_events = 0;
  std::uint64_t dropped = 0;
  {
    MutexLock lock(buffers_mu_);
    origin = started_ns_;
    max_events = max_events_;
    for (auto& b : buffers_) {
      MutexLock buffer_lock(b->mu);
      Track t{b->tid, b->name, {}, b->overwritten > 0};
      t.events.reserve(b->events.size());
      t.events.insert(t.events.end(), b->events.begin() + static_cast<std::ptrdiff_t>(b->oldest),
                      b->events.end());
      t.events.insert(t.events.end(), b->events.begin(),
                      b->events.begin() + static_cast<std::ptrdiff_t>(b->oldest));
      dropped += b->overwritten;
      std::vector<TraceEvent>().swap(b->events);  // the memory goes back now
      b->oldest = 0;
      b->overwritten = 0;
      tracks.push_back(std::move(t));
    }
  }

  // One window for all tracks: from where the last wrapped ring still has everything.
  std::int64_t whole_from = origin;
  for (Track& t : tracks) {
    std::erase_if(t.events, [&](const TraceEvent& e) { return key(e) < origin; });
    if (t.wrapped && !t.events.empty()) whole_from = std::max(whole_from, key(t.events.front()));
  }
  std::size_t total = 0;
  for (Track& t : tracks) {
    dropped += std::erase_if(t.events, [&](const TraceEvent& e) { return key(e) < whole_from; });
    total += t.events.size();
  }
  // Then the newest max_events of those: all later than the nth newest time, and those at
  // that time if they all fit.
  if (total > max_events) {
    std::vector<std::int64_t> keys;
    keys.reserve(total);
    for (const Track& t : tracks) {
      for (const TraceEvent& e : t.events) keys.push_back(key(e));
    }
    const auto nth = keys.end() - static_cast<std::ptrdiff_t>(max_events);
    std::nth_element(keys.begin(), nth, keys.end());
    const std::int64_t cut = *nth;
    // The events at that time are kept only if all of them fit: the trace then says it is
    // whole from `cut` on, and no event kept is older than what it says.
    const auto newer = std::count_if(keys.begin(), keys.end(), [&](auto k) { return k > cut; });
    const auto ties = std::count(keys.begin(), keys.end(), cut);
    const bool keep_ties = static_cast<std::size_t>(newer + ties) <= max_events;
    whole_from = keep_ties ? cut : cut + 1;
    for (Track& t : tracks) {
      dropped += std::erase_if(t.events, [&](const TraceEvent& e) { return key(e) < whole_from; });
    }
  }

  nlohmann::json metadata = {
      {"producer", "stoker"},
      {"max_events", max_events},
      {"dropped_events", dropped},
      {"complete_from_us", (whole_from - origin) / 1000},
  };
  const double from_s = static_cast<double>(whole_from - origin) / 1e9;
  std::string note;
  if (dropped > 0) {
    note = "over the cap of " + std::to_string(max_events) + " events: kept the newest, from " +
           std::to_string(from_s) + " s on (" + std::to_string(dropped) + " older ones dropped)";
    metadata["note"] = note;
  }

  JsonWriter out(file, origin, whole_from);
  out.begin(metadata);
  out.name_process(getpid(), "stoker (pid " + std::to_string(getpid()) + ")");
  if (!note.empty()) out.label_process(note);
  std::vector<std::int32_t> processes;
  for (const Track& t : tracks) {
    if (t.events.empty()) continue;
    out.name_thread(getpid(), t.tid, t.name);
    for (const TraceEvent& e : t.events) {
      out.event(t.tid, e);
      if (e.process != 0 &&
          std::find(processes.begin(), processes.end(), e.process) == processes.end()) {
        processes.push_back(e.process);
      }
    }
  }
  for (std::int32_t pid : processes) {
    out.name_process(pid, "worker process " + std::to_string(pid));
    out.name_thread(pid, pid, "jobs and reads");
  }
  out.end();
  const bool failed = std::ferror(file) != 0;
  const int error = errno;
  if (std::fclose(file) != 0 || failed) {
    throw std::system_error(failed ? error : errno, std::generic_category(),
                            "stoker: writing trace file " + path);
  }
  if (dropped > 0) log(LogLevel::warning, "trace " + path + ": " + note);
}

}  // namespace stoker::detail
