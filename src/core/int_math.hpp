// Integer helpers for block and padding arithmetic (non-negative x, positive m).
#pragma once

#include <cstdint>

namespace flashgqa {

// x rounded up to a multiple of m.
constexpr std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }
// The number of m-sized pieces that cover x.
constexpr std::int64_t ceil_div(std::int64_t x, std::int64_t m) { return (x + m - 1) / m; }

}  // namespace flashgqa
