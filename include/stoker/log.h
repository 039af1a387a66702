// Where stoker's log lines go. stoker logs rarely: a fallback it took (no GPU, pinned-memory
// budget reached), never per batch.
#pragma once

#include <functional>
#include <string_view>

namespace stoker {

enum class LogLevel { debug, info, warning };

// Replaces the handler (default: one line on stderr, prefixed "stoker: "). Pass an empty
// function to restore the default. Thread safety: may be called from any thread; the handler
// is called from whichever thread logs, one call at a time, and never while another thread
// forks (a forked child may log at once: no thread of the parent holds the log's lock there).
void set_log_handler(std::function<void(LogLevel, std::string_view)> handler);

// Lines below `level` are dropped (default: info, or debug where the environment has
// STOKER_LOG=debug). Debug lines are the tuner's decisions, one per change.
void set_log_level(LogLevel level);
LogLevel log_level();

}  // namespace stoker
