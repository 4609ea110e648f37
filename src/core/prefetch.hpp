// A software prefetch the compiler keeps.
#pragma once

namespace flashgqa {

// The line at `line` into L2 (x86-64 prefetcht1, aarch64 prfm pldl2keep), as an asm statement rather
// than __builtin_prefetch: GCC's pure-const analysis counts __builtin_prefetch as no side effect, so it
// finds a helper whose only effect is prefetches "pure" and deletes every call to it; where it inlined
// such a loop into a kernel it deleted the loop too (docs/performance.md, sessions 32 and 33). The
// asm statement is volatile, which it may not remove.
inline void prefetch_l2(const void* line) {
#if defined(__x86_64__)
  asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(line)));
#elif defined(__aarch64__)
  asm volatile("prfm pldl2keep, [%0]" : : "r"(line));
#else
  __builtin_prefetch(line, 0, 2);
  asm volatile("" : : "r"(line));  // (not pure)
#endif
}

// The line at `line` into L1 (x86-64 prefetcht0, aarch64 prfm pldl1keep), an asm statement as above.
inline void prefetch_l1(const void* line) {
#if defined(__x86_64__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(line)));
#elif defined(__aarch64__)
  asm volatile("prfm pldl1keep, [%0]" : : "r"(line));
#else
  __builtin_prefetch(line, 0, 3);
  asm volatile("" : : "r"(line));  // (not pure)
#endif
}

}  // namespace flashgqa
