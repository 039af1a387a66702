// `stoker shuffle-report`: the shuffle a loader would give a data set, and its quality beside
// a full shuffle, a stream's buffer and reading in order (docs/storage.md).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace stoker::tools {

// Adds the subcommand to `app`; returns a function that runs it when it was parsed and gives
// the exit code, or -1 if it was not.
std::function<int()> add_shuffle_commands(CLI::App& app);

}  // namespace stoker::tools
