// The row count of a partial register tile as a compile-time constant, so each kernel's row loop is
// fully unrolled: with_rows<kMax>(rows, fn) calls fn(std::integral_constant<int, R>{}) with
// R = min(max(rows, 1), kMax). Plain C++ (no instruction-set code): the per-ISA kernel files share it.
#pragma once

#include <type_traits>

namespace flashgqa {

template <int kMax, typename Fn>
inline void with_rows(int rows, Fn&& fn) {
  if constexpr (kMax > 1) {
    if (rows < kMax) return with_rows<kMax - 1>(rows, static_cast<Fn&&>(fn));
  }
  fn(std::integral_constant<int, kMax>{});
}

// Rows [r0, r0 + R) in blocks of kMaxBlock, then halves of it down to 1 (R = 8 with kMaxBlock = 4: two
// blocks of 4; R = 7: 4, 2, 1): fn(std::integral_constant<int, RB>{}, first row of the block).
template <int R, int kMaxBlock = 4, typename Fn>
inline __attribute__((always_inline)) void row_blocks(Fn&& fn, int r0 = 0) {
  if constexpr (R > 0) {
    constexpr int RB = R >= kMaxBlock ? kMaxBlock : R >= 4 ? 4 : R >= 2 ? 2 : 1;
    static_assert(kMaxBlock == 8 || kMaxBlock == 4);
    fn(std::integral_constant<int, RB>{}, r0);
    row_blocks<R - RB, kMaxBlock>(fn, r0 + RB);
  }
}

}  // namespace flashgqa
