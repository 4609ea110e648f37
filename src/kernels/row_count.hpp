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

}  // namespace flashgqa
