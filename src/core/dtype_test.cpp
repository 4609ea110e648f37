// The scalar conversions every path relies on: bf16 and f16 rounding, specials, round trips.
#include "core/dtype.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace flashgqa {
namespace {

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(float_to_bf16_bits(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(float_to_bf16_bits(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above halfway: up
  EXPECT_EQ(round_to_bf16(-2.5f), -2.5f);
}

TEST(Bf16, SpecialsSurvive) {
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(round_to_bf16(-std::numeric_limits<float>::signaling_NaN())));
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::max()), std::numeric_limits<float>::infinity());
  EXPECT_EQ(round_to_bf16(-0.0f), -0.0f);
  EXPECT_TRUE(std::signbit(round_to_bf16(-0.0f)));
}

TEST(Bf16, EveryValueRoundTrips) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float x = bf16_bits_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(x)) continue;
    ASSERT_EQ(float_to_bf16_bits(x), h) << std::hex << h;
  }
}

TEST(F16, EveryValueRoundTrips) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float x = f16_bits_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(f16_bits_to_float(float_to_f16_bits(x))));
      continue;
    }
    ASSERT_EQ(float_to_f16_bits(x), h) << std::hex << h;
  }
}

TEST(F16, MidpointsRoundToEven) {
  // Between every pair of adjacent positive finite halves, the midpoint goes to the even one and
  // points just off it go to the nearer one. Covers subnormals, normals and the top binade.
  for (std::uint32_t h = 0; h < 0x7bff; ++h) {
    const double lo = f16_bits_to_float(static_cast<std::uint16_t>(h));
    const double hi = f16_bits_to_float(static_cast<std::uint16_t>(h + 1));
    const auto mid = static_cast<float>((lo + hi) / 2);  // exact in float
    const std::uint16_t even = (h % 2 == 0) ? static_cast<std::uint16_t>(h) : static_cast<std::uint16_t>(h + 1);
    ASSERT_EQ(float_to_f16_bits(mid), even) << std::hex << h;
    ASSERT_EQ(float_to_f16_bits(std::nextafter(mid, 0.0f)), h) << std::hex << h;
    ASSERT_EQ(float_to_f16_bits(std::nextafter(mid, 1e9f)), h + 1) << std::hex << h;
  }
}

TEST(F16, OverflowAndSpecials) {
  EXPECT_EQ(float_to_f16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16_bits(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_f16_bits(65520.0f), 0x7c00);  // the midpoint to 2^16 ties to even: infinity
  EXPECT_EQ(float_to_f16_bits(-1e10f), 0xfc00);
  EXPECT_EQ(float_to_f16_bits(1e-10f), 0x0000);
  EXPECT_EQ(float_to_f16_bits(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(f16_bits_to_float(float_to_f16_bits(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Rows, LoadRoundsOperandsOnlyUnderBf16) {
  const float src[3] = {1.0f + 0x1p-10f, -3.0f, 0x1p-20f};
  float dst[3];
  load_row(dst, src, DType::f32, 3, Precision::f32);
  EXPECT_EQ(dst[0], src[0]);
  load_row(dst, src, DType::f32, 3, Precision::bf16);
  EXPECT_EQ(dst[0], 1.0f);
  EXPECT_EQ(dst[1], -3.0f);
  std::uint16_t half[3];
  store_row(half, DType::f16, src, 3);
  EXPECT_EQ(f16_bits_to_float(half[1]), -3.0f);
}

}  // namespace
}  // namespace flashgqa
