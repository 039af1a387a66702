// `stoker pack` and the hidden `stoker decode` (the Pillow comparison's helper).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace stoker::tools {

// Adds the subcommands to `app`; returns a function that runs whichever was parsed and gives
// the exit code, or -1 if none of them was.
std::function<int()> add_image_commands(CLI::App& app);

}  // namespace stoker::tools
