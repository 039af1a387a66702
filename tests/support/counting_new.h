// Replaces the global operator new with one that counts calls while `counting` is on, so a
// test can prove that a steady state allocates nothing. Include it in exactly one source file
// of a test binary, and not in sanitizer builds (their runtimes replace operator new).
#pragma once

#include <cstdlib>
#include <new>

#include "support/alloc_count.h"

void* operator new(std::size_t size) {
  if (stoker::alloc_count::counting.load(std::memory_order_relaxed)) {
    stoker::alloc_count::allocations.fetch_add(1);
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
// GCC cannot tell that these are the replacements of the operator new above.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
