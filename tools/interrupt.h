// Ctrl-C for the command line. The first SIGINT (or SIGTERM) asks the running command to stop:
// it is passed on to the child processes the command waits for (a baseline script), and the
// command's loops check interrupted() between units of work and throw Interrupted, so loaders
// stop and temporary output is removed while the stack unwinds. A second one ends the process
// at once, as if no handler were installed. A signal the program inherited as ignored stays
// ignored.
#pragma once

#include <sys/types.h>

#include <stdexcept>

namespace stoker::tools {

struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};

// Installs the handler (for the process; call once, from main).
void install_interrupt_handler();
bool interrupted() noexcept;
// Throws Interrupted if a signal came.
void throw_if_interrupted();
// The process group a signal is passed on to while the command waits for it (0: none).
void set_interrupt_group(pid_t group) noexcept;

}  // namespace stoker::tools
