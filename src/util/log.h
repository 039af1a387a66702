#pragma once

#include <string_view>

#include "stoker/log.h"

namespace stoker::detail {

void log(LogLevel level, std::string_view message);

}  // namespace stoker::detail
