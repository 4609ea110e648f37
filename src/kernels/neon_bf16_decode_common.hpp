// Shared by the neon-bf16 decode kernels, kernels_neon_bf16_decode_qk.cpp and _pv.cpp (contract in
// microkernels.hpp): K and V read straight from their rows, whole rows in address order, for tasks of at
// most kDecodeMaxRows query rows. Included only by those two translation units, which are compiled with
// the flags of kernels_neon_bf16.cpp (-march=armv8.2-a+bf16, CMakeLists.txt).
//
// As on x86 (avx512_decode_common.hpp), decode does ~G FLOPs per K/V byte: it is bound by the DRAM
// stream, not by BFDOT. The kernels convert each 8-element chunk of a source row to bf16 in registers
// (no packed copy), read rows in address order and issue no software prefetch (docs/performance.md,
// decode I). A chunk is 8 bf16 operands: one q register, four BFDOT lanes of two operands each.
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.hpp"
#include "kernels/microkernels.hpp"
#include "kernels/neon_helpers.hpp"
#include "kernels/row_count.hpp"

namespace flashgqa::decode_neon_bf16 {

constexpr int kChunk = 8;  // operands per q register

inline std::int64_t elem_bytes(DType d) { return static_cast<std::int64_t>(dtype_size(d)); }

// The high halves of the rounded fp32 lanes of a and b: 8 bf16 bit patterns (little endian: the high
// half of lane i is 16-bit element 2i + 1, which UZP2 gathers).
inline uint16x8_t narrow_bf16(float32x4_t a, float32x4_t b) {
  return vuzp2q_u16(vreinterpretq_u16_f32(round_bf16(a)), vreinterpretq_u16_f32(round_bf16(b)));
}

// The 8 operands of a row at element h, all present: bf16 as stored, the other dtypes widened to fp32
// (exactly), int8 times its key's scale (one fp32 rounding), then rounded to nearest even bf16 by
// round_bf16: the bits float_to_bf16_bits gives, so the packers' bits.
template <DType D>
inline uint16x8_t convert8(const char* row, std::int64_t h, float scale) {
  if constexpr (D == DType::bf16) {
    return vld1q_u16(reinterpret_cast<const std::uint16_t*>(row) + h);
  } else if constexpr (D == DType::f32) {
    const float* x = reinterpret_cast<const float*>(row) + h;
    return narrow_bf16(vld1q_f32(x), vld1q_f32(x + 4));
  } else if constexpr (D == DType::f16) {
    const float16x8_t x = vreinterpretq_f16_u16(vld1q_u16(reinterpret_cast<const std::uint16_t*>(row) + h));
    return narrow_bf16(vcvt_f32_f16(vget_low_f16(x)), vcvt_high_f32_f16(x));
  } else {
    static_assert(D == DType::i8);
    const int16x8_t x = vmovl_s8(vld1_s8(reinterpret_cast<const std::int8_t*>(row) + h));
    const float32x4_t s = vdupq_n_f32(scale);
    return narrow_bf16(vmulq_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(x))), s),
                       vmulq_f32(vcvtq_f32_s32(vmovl_high_s16(x)), s));
  }
}

// The 8 operands at element h of a row of H elements, zero past H. The last partial chunk goes through
// core/dtype.hpp one element at a time (the same roundings: identical bits), so no read passes the row.
template <DType D>
inline uint16x8_t load8(const char* row, std::int64_t h, std::int64_t H, float scale) {
  if (h + kChunk <= H) return convert8<D>(row, h, scale);
  alignas(16) std::uint16_t buf[kChunk] = {};
  for (std::int64_t i = 0; h + i < H; ++i) {
    float x = load_element(row, D, h + i);
    if constexpr (D == DType::i8) x *= scale;
    buf[i] = float_to_bf16_bits(x);
  }
  return vld1q_u16(buf);
}

// Calls fn(std::integral_constant<DType, d>{}): each dtype's loads compiled as their own loop.
template <typename Fn>
inline void with_dtype(DType d, Fn&& fn) {
  switch (d) {
    case DType::f32: return fn(std::integral_constant<DType, DType::f32>{});
    case DType::f16: return fn(std::integral_constant<DType, DType::f16>{});
    case DType::i8: return fn(std::integral_constant<DType, DType::i8>{});
    default: return fn(std::integral_constant<DType, DType::bf16>{});
  }
}

}  // namespace flashgqa::decode_neon_bf16
