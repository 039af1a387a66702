// Where stoker's log lines go. stoker logs rarely: a fallback it took (no GPU, pinned-memory
// budget reached), never per batch.
#pragma once

#include <functional>
#include <string_view>

namespace stoker {

enum class LogLevel { info, warning };

// Replaces the handler (default: one line on stderr, prefixed "stoker: "). Pass an empty
// function to restore the default. Thread safety: may be called from any thread; the handler
// is called from whichever thread logs, one call at a time.
void set_log_handler(std::function<void(LogLevel, std::string_view)> handler);

}  // namespace stoker
