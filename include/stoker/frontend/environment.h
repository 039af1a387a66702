// Reads of the process's environment. A getenv races with a setenv on another thread (glibc may
// move the array being read: the reader dies of a SIGSEGV), and Python changes the environment
// from any thread (os.environ[...] = ...) holding the GIL, while stoker reads it with the GIL
// released (a data set's constructor resolving its URLs). Every read here is a copy taken under
// the environment guard the embedding installs: the Python module's takes the GIL where the
// reading thread is a Python thread that released it (python/src/module.cc). Threads of our own
// read no environment after they start (the object store reads its proxies when it is made).
//
// Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace stoker::detail {

// Runs the read it is given; by default, at once.
using EnvironmentGuard = std::function<void(const std::function<void()>& read)>;
void set_environment_guard(EnvironmentGuard guard);

// The variable's value (nullopt where it is not set).
std::optional<std::string> env_var(const char* name);
// The variable's value where it is set and not empty.
std::optional<std::string> env_nonempty(const char* name);
// Every variable whose name `keep` accepts, by name.
std::map<std::string, std::string> env_vars(const std::function<bool(std::string_view)>& keep);

}  // namespace stoker::detail
