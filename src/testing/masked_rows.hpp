// The assertion shared by the "fully masked rows" tests: in head 0's first `masked` query positions
// (which see no key) every head's output is 0 and lse -inf; in the later ones both are finite.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "testing/attention_case.hpp"

namespace flashgqa::testing {

inline void expect_first_rows_masked(const AttentionCase& c, std::int64_t masked) {
  const Shape& s = c.shape;
  for (std::int64_t g = 0; g < s.G; ++g)
    for (std::int64_t t = 0; t < s.T; ++t) {
      if (t < masked) {
        EXPECT_EQ(c.lse_at(0, 0, g, t), -std::numeric_limits<float>::infinity()) << "g " << g << " t " << t;
        for (std::int64_t h = 0; h < s.H; ++h) ASSERT_EQ(c.out_at(0, 0, g, t, h), 0.0f) << "g " << g << " t " << t;
      } else {
        EXPECT_TRUE(std::isfinite(c.lse_at(0, 0, g, t))) << "g " << g << " t " << t;
        for (std::int64_t h = 0; h < s.H; ++h)
          ASSERT_TRUE(std::isfinite(c.out_at(0, 0, g, t, h))) << "g " << g << " t " << t;
      }
    }
}

}  // namespace flashgqa::testing
