// What a timeline trace of a loader keeps (Loader::trace). The trace is Chrome trace-event
// JSON: it opens in Perfetto (ui.perfetto.dev) and chrome://tracing, and docs/engine.md
// ("Seeing where the time goes") says how to read it.
#pragma once

#include <cstddef>

namespace stoker {

struct TraceOptions {
  // The most events the file holds (a batch's life, from opened to taken, is one). Past it the
  // trace keeps the newest events (every thread keeps its newest ones in a ring, and the file
  // starts where every track is complete), and says so in its metadata and once in the log. Each
  // recording thread holds up to this many events of 48 bytes in memory; a written event is about
  // 100 bytes of JSON.
  std::size_t max_events = 1'000'000;
};

}  // namespace stoker
