// The processes of a node taking turns: a lock file, and the key of a torchrun job on the node.
#pragma once

#include <string>

namespace stoker::detail {

// The key of this process's job on this node for sharing listings, or "" when it is not run by
// torchrun: TORCHELASTIC_RUN_ID with the parent's pid (torchrun's agent on this node, the
// parent of every local rank), so that the ranks of one job share and a later job, or another
// job on the node, does not see their listings.
std::string torchrun_job();

// An exclusive lock on a file (flock), held from construction to destruction, so that the
// processes of a node that make the same data set take turns: the first lists and indexes, the
// next find its results in the caches. Released by the kernel if the holder dies. Throws
// std::runtime_error naming the file when it cannot be made or locked.
class NodeLock {
 public:
  explicit NodeLock(const std::string& path);
  ~NodeLock();
  NodeLock(const NodeLock&) = delete;
  NodeLock& operator=(const NodeLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace stoker::detail
