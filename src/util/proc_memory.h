// A process's share of anonymous memory (/proc/<pid>/smaps_rollup, Pss_Anon): its heap and
// the like, each page shared copy-on-write with other processes (a forked worker and its
// parent) counted in proportion, so that the figures of several processes add up to the
// memory they use together. Shared-memory mappings (the slabs worker processes write into)
// are Pss_Shmem, not counted here. The Python package reads its worker processes' for the
// loader's memory cap (LoaderOptions::memory_limit).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>

namespace stoker::detail {

// nullopt if the file cannot be read (the process is gone, or the kernel has no Pss_Anon).
inline std::optional<std::uint64_t> read_pss_anon(const char* smaps_rollup_path) {
  FILE* f = std::fopen(smaps_rollup_path, "r");
  if (f == nullptr) return std::nullopt;
  char line[256];
  std::optional<std::uint64_t> bytes;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long kib = 0;
    if (std::strncmp(line, "Pss_Anon:", 9) == 0 && std::sscanf(line + 9, "%llu", &kib) == 1) {
      bytes = static_cast<std::uint64_t>(kib) * 1024;
      break;
    }
  }
  std::fclose(f);
  return bytes;
}

}  // namespace stoker::detail
