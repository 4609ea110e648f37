// Symmetric int8 quantization of one row (quantize_kv and the KV-cache append of k_new/v_new into an
// int8 cache): scale = max |x| / 127 in fp32, x_int8 = x / scale rounded to nearest even (a row of
// zeros: scale 0, all 0). The bound is in flashgqa.hpp (quantize_kv).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.hpp"

namespace flashgqa {

// The first h with a NaN or infinite row[h], or -1.
inline std::int64_t first_non_finite(const void* row, DType dtype, std::int64_t H) {
  for (std::int64_t h = 0; h < H; ++h)
    if (!std::isfinite(load_element(row, dtype, h))) return h;
  return -1;
}

// dst[0..H) <- row quantized; returns the scale. row must be finite (first_non_finite < 0).
inline float quantize_row(std::int8_t* dst, const void* row, DType dtype, std::int64_t H) {
  float amax = 0.0f;
  for (std::int64_t h = 0; h < H; ++h) amax = std::max(amax, std::fabs(load_element(row, dtype, h)));
  const float scale = amax / 127.0f;
  for (std::int64_t h = 0; h < H; ++h) {
    const float x = load_element(row, dtype, h);
    // x / scale is within 127 (1 + 2^-23) of 0, so the clamp only guards the rounding.
    dst[h] = scale == 0.0f ? 0 : static_cast<std::int8_t>(std::clamp(std::nearbyint(x / scale), -127.0f, 127.0f));
  }
  return scale;
}

}  // namespace flashgqa
