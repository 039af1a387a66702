// The timeline trace behind Loader::trace: every stage stamps its work (a worker's sample
// reads and chunks, a batch's life from opened to taken, the consumer's waits and steps, the
// device copies, queue depth and pinned bytes) into a buffer of the thread that did it, and
// the trace is written as Chrome trace-event JSON when recording stops.
//
// Cost. Off (the default), an event site costs one relaxed atomic load (Tracer::on()). On, an
// event is a clock read or two and an append to the calling thread's own buffer under that
// buffer's mutex, which only its thread and the final write take: no lock shared between
// threads per event.
//
// Size. Every thread keeps its newest `max_events` events in a ring. When a ring wrapped, the
// file starts where every track is complete again (the newest first-kept event of the rings
// that wrapped), then keeps the newest `max_events` of what is left, so all tracks cover the
// same window; the metadata says how many events were dropped and from when the trace is
// whole, and the log says so once.
//
// Thread safety: on(), record() and the static members from any thread; start() and stop()
// from one thread at a time (the loader's consumer). A Tracer outlives every thread that
// records into it (the loader destroys its engine first).
//
// Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "stoker/frontend/mutex.h"
#include "stoker/trace.h"

namespace stoker::detail {

// What an event is; its arguments a, b, c mean what the comment says.
enum class TraceName : std::uint8_t {
  read,    // span: one sample read by a worker thread or process (event.process); a = index
  chunk,   // span: rows of one batch read by one worker; a = epoch, b = batch, c = rows
  job,     // span: a chunk read by a worker process (event.process), job sent to reply;
           // a = rows, b = first sample index
  wait,    // span: the consumer in next() until a batch or the end of an epoch came
  step,    // span: the consumer from taking a batch to asking for the next (its training step)
  batch,   // one batch, start = opened (0 if before the trace), end = taken by the consumer's
           // stage; a = ready time (ns, 0 if unknown), b = epoch, c = batch
  copy,    // span: issuing a batch's host-to-device copy; a = bytes, b = epoch, c = batch
  queue,   // counter: a = batches in flight, b = of those ready
  pinned,  // counter: a = this loader's page-locked slab bytes, b = the whole process's
};

struct TraceEvent {
  std::int64_t start_ns = 0;  // steady clock, as Tracer::now_ns()
  std::int64_t end_ns = 0;    // spans and batches; counters use start_ns only
  std::uint64_t a = 0;
  std::uint64_t b = 0;
  std::uint64_t c = 0;
  std::int32_t process = 0;  // a worker process's pid: the event goes on that process's track
  TraceName name = TraceName::read;
};

class Tracer {
 public:
  Tracer();
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  static std::int64_t now_ns() noexcept;

  // Whether events are being recorded: the one check at every event site.
  bool on() const noexcept { return on_.load(std::memory_order_relaxed); }
  // Appends to the calling thread's buffer. Call only after on() said yes.
  void record(const TraceEvent& event);

  // Opens `path` for writing (std::system_error naming it if that fails) and starts
  // recording; a trace already recording is written first.
  void start(const std::string& path, const TraceOptions& options);
  // Stops recording and writes the file (std::system_error naming it if writing fails; the
  // trace is dropped either way). Nothing if no trace is recording.
  void stop();
  // Which recording this is (1, 2, ...; 0 before the first): tells events to stamp once
  // per recording apart.
  std::uint64_t recording() const noexcept { return recording_.load(std::memory_order_relaxed); }

  // The name of the calling thread's track in every trace ("worker 3"); the default is
  // "thread <tid>". Takes effect for tracers the thread has not recorded into yet.
  static void name_thread(std::string name);
  static void name_thread_once(const char* name);  // unless the thread has a name
  // The tracer code on the calling thread records for when it is not handed one (a worker
  // process's job and the reads it timed, recorded by the engine thread that sent the job):
  // set by engine threads.
  static Tracer* current() noexcept;
  static void set_current(Tracer* tracer) noexcept;

 private:
  struct Buffer;
  Buffer& buffer();  // the calling thread's
  Buffer& add_buffer() STOKER_EXCLUDES(buffers_mu_);

  const std::uint64_t id_;  // never reused, unlike an address: keys the threads' caches
  std::atomic<bool> on_{false};
  std::atomic<std::uint64_t> recording_{0};

  Mutex buffers_mu_;  // taken once per thread and recording, not per event
  std::vector<std::unique_ptr<Buffer>> buffers_ STOKER_GUARDED_BY(buffers_mu_);
  std::size_t max_events_ STOKER_GUARDED_BY(buffers_mu_) = 0;
  std::int64_t started_ns_ STOKER_GUARDED_BY(buffers_mu_) = 0;

  // The recording's file (the controlling thread only).
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace stoker::detail
