// Scalar conversions between float and the 16-bit storage types, and row load/store helpers.
// Portable C++ only: every instruction-set path may rely on these giving the reference rounding.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "flashgqa/flashgqa.hpp"

namespace flashgqa {

// float -> bfloat16 bits, round to nearest even; NaN stays a (quiet) NaN.
inline std::uint16_t float_to_bf16_bits(float x) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

inline float bf16_bits_to_float(std::uint16_t h) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

// Rounds x to the nearest bfloat16 value, returned as a float.
inline float round_to_bf16(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

// float -> IEEE binary16 bits, round to nearest even, with subnormals, infinities and NaN.
inline std::uint16_t float_to_f16_bits(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;                // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;               // rounds to >= 65520: infinity
  if (a >= 0x38800000u) {                                    // normal half (>= 2^-14)
    std::uint32_t r = a - 0x38000000u;                       // rebias exponent 127 -> 15
    r += 0x0fffu + ((r >> 13) & 1u);                         // round to nearest even on bit 13
    return sign | static_cast<std::uint16_t>(r >> 13);
  }
  // Subnormal half or zero: value = m * 2^-24 with m an integer in [0, 1024].
  const float scaled = std::bit_cast<float>(a) * 16777216.0f;  // exact: times 2^24
  const float m = std::nearbyint(scaled);                       // default rounding: nearest even
  return sign | static_cast<std::uint16_t>(m);
}

inline float f16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  const std::uint32_t m = h & 0x3ffu;
  if (e == 0) {  // zero or subnormal: m * 2^-24
    const float v = static_cast<float>(m) * (1.0f / 16777216.0f);
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) | sign);
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

// Element i of a row of `dtype` as float.
inline float load_element(const void* row, DType dtype, std::int64_t i) {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(row)[i];
    case DType::bf16: return bf16_bits_to_float(static_cast<const std::uint16_t*>(row)[i]);
    case DType::f16: return f16_bits_to_float(static_cast<const std::uint16_t*>(row)[i]);
    case DType::i8: return static_cast<float>(static_cast<const std::int8_t*>(row)[i]);  // unscaled
  }
  return 0.0f;
}

// dst[0..n) <- row of `dtype`, as float; rounded to bfloat16 when `precision` is bf16 (operand rounding).
inline void load_row(float* dst, const void* row, DType dtype, std::int64_t n, Precision precision) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = load_element(row, dtype, i);
    dst[i] = precision == Precision::bf16 ? round_to_bf16(x) : x;
  }
}

// row of `dtype` [0..n) <- src, rounded to nearest even.
inline void store_row(void* row, DType dtype, const float* src, std::int64_t n) {
  switch (dtype) {
    case DType::f32: std::memcpy(row, src, static_cast<std::size_t>(n) * sizeof(float)); return;
    case DType::bf16:
      for (std::int64_t i = 0; i < n; ++i)
        static_cast<std::uint16_t*>(row)[i] = float_to_bf16_bits(src[i]);
      return;
    case DType::f16:
      for (std::int64_t i = 0; i < n; ++i)
        static_cast<std::uint16_t*>(row)[i] = float_to_f16_bits(src[i]);
      return;
    case DType::i8:  // unscaled: nearest even, saturated, NaN as 0 (quantize_kv is what scales)
      for (std::int64_t i = 0; i < n; ++i)
        static_cast<std::int8_t*>(row)[i] =
            std::isnan(src[i]) ? 0 : static_cast<std::int8_t>(std::clamp(std::nearbyint(src[i]), -128.0f, 127.0f));
      return;
  }
}

}  // namespace flashgqa
