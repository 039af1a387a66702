#include "stoker/info.h"

namespace stoker {

// STOKER_VERSION comes from CMake's project() (CMakeLists.txt), the one place it is set.
std::string_view version() { return STOKER_VERSION; }

}  // namespace stoker
