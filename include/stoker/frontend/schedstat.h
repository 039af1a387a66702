// Linux's scheduler statistics of one task (/proc/<pid>/schedstat, /proc/self/task/<tid>/
// schedstat): how long it ran on a CPU and how long it was runnable but waited for one. The
// engine reads its worker threads', the Python package its worker processes'.
//
// Installed for front ends, unstable (include/stoker/frontend/README.md).
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>

namespace stoker::detail {

struct SchedStat {
  std::int64_t on_cpu_ns = 0;
  std::int64_t run_delay_ns = 0;
};

// nullopt if the file cannot be read (the task is gone, or there is no /proc).
inline std::optional<SchedStat> read_schedstat(const char* path) {
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return std::nullopt;
  unsigned long long on_cpu = 0, waited = 0;
  const int fields = std::fscanf(f, "%llu %llu", &on_cpu, &waited);
  std::fclose(f);
  if (fields != 2) return std::nullopt;
  return SchedStat{static_cast<std::int64_t>(on_cpu), static_cast<std::int64_t>(waited)};
}

}  // namespace stoker::detail
