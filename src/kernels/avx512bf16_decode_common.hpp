// Shared by the avx512bf16 decode kernels, kernels_avx512bf16_decode_qk.cpp and _pv.cpp (contract in
// microkernels.hpp): K and V read straight from their rows, whole rows in address order, for tasks of at
// most kDecodeMaxRows query rows. Included only by those two translation units, which are compiled with
// the flags of kernels_avx512bf16.cpp (CMakeLists.txt).
//
// Decode does ~G FLOPs per K/V byte, so it is bound by the DRAM stream, not by vdpbf16ps: these
// kernels spend instructions (a transpose-add, permutes) to avoid any packed copy. What decides their
// speed is the order of the loads and the instructions per key: the hardware prefetchers keep a stream
// going only when the rows are read line after line, so the kernels issue no software prefetch
// (docs/performance.md, decode I).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/avx512_helpers.hpp"
#include "kernels/microkernels.hpp"
#include "kernels/row_count.hpp"

namespace flashgqa::decode_avx512bf16 {

constexpr int kQkGroup = 16;  // keys per transpose-add
constexpr int kPvGroup = 32;  // keys per pass over the columns (8 KiB of bf16 V at H = 128: L1)
constexpr int kPvFastGroupBytes = 8192;  // of V per group on the fast path (32 keys at H = 128)
using word_t = std::uint32_t __attribute__((may_alias));

inline std::int64_t elem_bytes(DType d) { return static_cast<std::int64_t>(dtype_size(d)); }

// 32 int8 values row[h0 .. h0+32) (lanes at or beyond H zero) times `scale` in fp32, rounded to
// bf16 by vcvtne2ps2bf16 (nearest even; the contract's int8 rows). kFull: all 32 are there.
template <bool kFull = false>
inline __m512i load32_i8_bf16(const char* row, std::int64_t h0, std::int64_t H, __m512 scale) {
  __m128i b0, b1;
  if constexpr (kFull) {  // two 16-byte loads, each folded into its vpmovsxbd
    b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + h0));
    b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + h0 + 16));
  } else {
    b0 = _mm_maskz_loadu_epi8(first_lanes16(H - h0), row + h0);
    b1 = _mm_maskz_loadu_epi8(first_lanes16(H - h0 - 16), row + h0 + 16);
  }
  const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b0)), scale);
  const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b1)), scale);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // lanes 0..15 from lo
}

// 32 operands of a source row from column h0, as bf16: a plain load when the row is bf16 and H is a
// multiple of 32 (kPlain), int8 rows times their key's scale (*scale), otherwise converted, rounded
// and masked by load32_bf16.
template <bool kPlain>
inline __m512i load_row32(const char* row, DType dtype, std::int64_t h0, std::int64_t H, const float* scale) {
  if (kPlain) return _mm512_loadu_si512(reinterpret_cast<const std::uint16_t*>(row) + h0);
  if (dtype == DType::i8) return load32_i8_bf16(row, h0, H, _mm512_set1_ps(*scale));
  return load32_bf16(row, dtype, h0, H);
}

// The rows the fast paths read (H = 32 HC, whole chunks): bf16 rows as they are, or int8 rows with
// their keys' scales. chunk(j, c) is chunk c (32 operands) of key j; at(j) the rows from key j on.
struct Bf16Rows {
  const char* base;
  std::int64_t ld_bytes;
  Bf16Rows at(std::int64_t j) const { return {base + j * ld_bytes, ld_bytes}; }
  __m512i chunk(std::int64_t j, int c) const { return _mm512_loadu_si512(base + j * ld_bytes + 64 * c); }
};
struct Int8Rows {
  const char* base;
  std::int64_t ld_bytes;  // = elements between keys (one byte each)
  const float* scale;
  std::int64_t ld_scale;
  Int8Rows at(std::int64_t j) const { return {base + j * ld_bytes, ld_bytes, scale + j * ld_scale, ld_scale}; }
  __m512i chunk(std::int64_t j, int c) const {
    return load32_i8_bf16<true>(base + j * ld_bytes, 32 * c, 0, _mm512_set1_ps(scale[j * ld_scale]));
  }
};

}  // namespace flashgqa::decode_avx512bf16
