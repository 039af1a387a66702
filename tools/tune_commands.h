// `stoker tune` and `stoker diagnose` (tools/tune.h): on a built-in workload, an image folder
// or record shards.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace stoker::tools {

// Adds the subcommands to `app`; returns a function that runs whichever was parsed and gives
// the exit code, or -1 if none of them was.
std::function<int()> add_tune_commands(CLI::App& app);

}  // namespace stoker::tools
