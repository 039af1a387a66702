// A message to the library's log (the sink set with stoker/log.h), from stoker's own parts and
// its front ends.
//
// Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <string_view>

#include "stoker/log.h"

namespace stoker::detail {

void log(LogLevel level, std::string_view message);

}  // namespace stoker::detail
