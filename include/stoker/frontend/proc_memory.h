// A process's anonymous resident memory (/proc/<pid>/status, RssAnon): its heap and the like,
// not the files and shared memory it maps (the slabs worker processes write into are
// RssShmem). Pages a forked worker still shares copy-on-write with its parent count in full
// in each (an overcount, on the cap's safe side, that shrinks as they are written, which
// Python's reference counting does to most objects it touches). Not Pss_Anon from
// smaps_rollup, which splits those pages fairly: reading it walks every mapped page, about
// 0.2 s for a worker mapping 1 GiB of slabs, where status costs microseconds. The Python
// package reads its worker processes' for the loader's memory cap (LoaderOptions::memory_limit).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>

namespace stoker::detail {

// nullopt if the file cannot be read (the process is gone) or has no RssAnon line.
inline std::optional<std::uint64_t> read_rss_anon(const char* status_path) {
  FILE* f = std::fopen(status_path, "r");
  if (f == nullptr) return std::nullopt;
  char line[256];
  std::optional<std::uint64_t> bytes;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long kib = 0;
    if (std::strncmp(line, "RssAnon:", 8) == 0 && std::sscanf(line + 8, "%llu", &kib) == 1) {
      bytes = static_cast<std::uint64_t>(kib) * 1024;
      break;
    }
  }
  std::fclose(f);
  return bytes;
}

}  // namespace stoker::detail
