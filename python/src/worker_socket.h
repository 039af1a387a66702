// The socket end of the worker protocol (docs/worker_protocol.md) in the training process:
// a message's framing, sending (with a file descriptor passed along) and receiving in full,
// the registry of the sockets the process pools hold (a forked worker closes those), and the
// message for a worker whose socket was closed.
//
// Thread safety: any thread, no GIL.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stoker::python {

// Starts tracking `fd` (a pool's end of a worker's socket); close_fd closes and forgets it.
void track_fd(int fd);
void close_fd(int fd);
// The fds tracked now (ProcessPool::all_fds).
std::vector<int> tracked_fds();

// A message: u32 kind, u32 payload bytes, the payload.
std::vector<std::uint8_t> message(std::uint32_t kind, const std::vector<std::uint8_t>& payload);
// Sends all `size` bytes, `pass_fd` (if not -1) with the first (SCM_RIGHTS). False if the
// peer is gone.
bool send_all(int fd, const std::uint8_t* data, std::size_t size, int pass_fd = -1);
// Why worker `pid`, whose socket was closed, is gone: PyTorch's message ("DataLoader worker
// (pid N) is killed by signal: Killed", or its exit code), from its status read with
// waitid(WNOWAIT), so that multiprocessing still reaps it. Nothing when the status is gone
// (multiprocessing reaped it already: ProcessPool asks its Process).
std::optional<std::string> death_message(pid_t pid);
// The same message from an exit code as multiprocessing gives it (negative: the signal that
// killed the worker; nothing: not known).
std::string death_message(pid_t pid, std::optional<int> exitcode);
// Receives exactly `size` bytes. False at EOF (the peer is gone, or the socket was shut down).
bool recv_all(int fd, std::uint8_t* data, std::size_t size);

}  // namespace stoker::python
