// How an algorithm sums over keys, for the error bounds (reference/tolerance.hpp): the longest chain of
// fp32 additions a term of a softmax denominator or of P.V passes through, and how many running-max
// rescale factors exp(m_old - m_new) a weight is multiplied by. An n-term sum whose terms each pass
// through at most d additions has error <= gamma(d) sum |terms|, whatever the order of the additions.
// Each algorithm states its own (ladder.hpp: key_sums), from the blocks it actually uses.
#pragma once

#include <cstdint>

#include "core/int_math.hpp"

namespace flashgqa {

struct KeySums {
  std::int64_t depth = 0;     // d: fp32 additions per term, denominators and P.V alike
  std::int64_t rescales = 0;  // r: rescale factors per weight (0: the max is known before any exp)
};

// Depth of a sum of n terms summed in chains of at most `chain` terms whose results are then added
// one after another: chain + ceil(n / chain) (>= 1).
constexpr std::int64_t chained_sum_depth(std::int64_t n, std::int64_t chain) {
  if (n < 1) n = 1;
  if (chain < 1) chain = 1;
  const std::int64_t c = chain < n ? chain : n;
  return c + ceil_div(n, c);
}

}  // namespace flashgqa
