// AVX2 helpers shared by kernels_avx2.cpp and the AVX2 decode kernels (kernels_avx2_decode_qk.cpp,
// _pv.cpp): loads that convert any input dtype to fp32, exact bf16 rounding, bf16 words and their halves.
//
// Include ONLY from translation units compiled with -mavx2 -mfma -mf16c: everything here is in an
// anonymous namespace, so each unit gets its own copy and no AVX2 code can be linked into a portable
// caller. No standard-library templates are used for the same reason.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/microkernels.hpp"

namespace flashgqa {
namespace {

// 8 bf16 words as fp32 (exact).
inline __m256 widen_bf16(__m128i w) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(w), 16)); }

// All ones in the lanes of x that hold an infinity or a NaN.
inline __m256i inf_or_nan(__m256 x) {
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x), exponent), exponent);
}

// The largest lane of v.
inline float hmax(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// 8 values row[h0 .. h0+8) as fp32, zero at or beyond H.
inline __m256 load8_f32(const void* row, DType dtype, std::int64_t h0, std::int64_t H) {
  const std::int64_t n = H - h0;
  if (n >= 8) {
    switch (dtype) {
      case DType::f32: return _mm256_loadu_ps(static_cast<const float*>(row) + h0);
      case DType::bf16:
        return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(row) + h0)));
      case DType::f16:
        return _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(row) + h0)));
      case DType::i8:  // unscaled values (no packer is given int8 rows: the KV-cache API dequantizes)
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const std::int8_t*>(row) + h0))));
    }
  }
  if (dtype == DType::i8) {
    alignas(32) float buf[8] = {};
    for (std::int64_t i = 0; i < n && i < 8; ++i) buf[i] = static_cast<const std::int8_t*>(row)[h0 + i];
    return _mm256_load_ps(buf);
  }
  // Tail: copy the valid elements into a zeroed buffer first.
  alignas(32) std::uint32_t buf32[8] = {};
  alignas(16) std::uint16_t buf16[8] = {};
  for (std::int64_t i = 0; i < n && i < 8; ++i) {
    if (dtype == DType::f32)
      buf32[i] = static_cast<const std::uint32_t*>(row)[h0 + i];
    else
      buf16[i] = static_cast<const std::uint16_t*>(row)[h0 + i];
  }
  if (dtype == DType::f32) return _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<__m256i*>(buf32)));
  return load8_f32(buf16, dtype, 0, 8);
}

// x rounded to nearest even bf16 in each lane's high 16 bits, NaN quieted; the low 16 bits are
// left as they fall (bf16_words drops them).
inline __m256i round_bf16_high(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(q), nan));
}

// x rounded to nearest even bf16 (as fp32), NaN quieted: identical to round_to_bf16.
inline __m256 round_bf16(__m256 x) {
  return _mm256_castsi256_ps(
      _mm256_and_si256(round_bf16_high(x), _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

// 16 values as bf16 words in order: a (values 0..7) and b (8..15) rounded by round_bf16.
inline __m256i bf16_words(__m256 a, __m256 b) {
  const __m256i lo = _mm256_srli_epi32(round_bf16_high(a), 16);
  const __m256i hi = _mm256_srli_epi32(round_bf16_high(b), 16);
  // packus interleaves the 128-bit lanes (a0..3 b0..3 | a4..7 b4..7); the permute puts them in order.
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
}

// The n bytes before `end` (n <= 16) as bytes 0 .. n of the result, zero from byte n on: the 16 bytes
// that end at `end` (all 16 must be readable), shifted down by one vpshufb (index -128: zero).
inline __m128i bytes_ending_at(const char* end, std::int64_t n) {
  alignas(16) static constexpr std::int8_t kDown[32] = {0,    1,    2,    3,    4,    5,    6,    7,    8,    9,    10,
                                                        11,   12,   13,   14,   15,   -128, -128, -128, -128, -128, -128,
                                                        -128, -128, -128, -128, -128, -128, -128, -128, -128, -128};
  return _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(end - 16)),
                          _mm_loadu_si128(reinterpret_cast<const __m128i*>(kDown + 16 - n)));
}

// Words h0 .. h0 + 16 of a row of H 16-bit words (H - h0 < 16) in order, zero from word H on; nothing
// past row + H is read: plain loads that end at row + H, shifted down (no masked load, whose masked-off
// lanes may fault on some implementations), a copy where the row holds fewer than 8 words.
inline __m256i load_words_below(const std::uint16_t* row, std::int64_t h0, std::int64_t H) {
  const std::int64_t left = H - h0;
  if (left <= 0) return _mm256_setzero_si256();
  const char* end = reinterpret_cast<const char*>(row + H);
  if (left >= 8)
    return _mm256_set_m128i(bytes_ending_at(end, 2 * (left - 8)), _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + h0)));
  if (H >= 8) return _mm256_zextsi128_si256(bytes_ending_at(end, 2 * left));
  alignas(32) std::uint16_t buf[16] = {};
  for (std::int64_t i = 0; i < left; ++i) buf[i] = row[h0 + i];
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(buf));
}

// The 16 operands row[h0 .. h0+16) as bf16 words (element h0 + i in word i), zero at or beyond H: bf16
// rows as stored, the other dtypes rounded to nearest even (int8 values times `scale` first, one fp32
// rounding: the products form). The bits of float_to_bf16_bits for every non-NaN value.
inline __m256i load16_bf16(const char* row, DType dtype, std::int64_t h0, std::int64_t H, float scale) {
  if (dtype == DType::bf16)
    return h0 + 16 <= H ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const std::uint16_t*>(row) + h0))
                        : load_words_below(reinterpret_cast<const std::uint16_t*>(row), h0, H);
  __m256 a = load8_f32(row, dtype, h0, H), b = load8_f32(row, dtype, h0 + 8, H);
  if (dtype == DType::i8) {  // the products, zero past H even for an infinite or NaN scale (0 * inf)
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i left = _mm256_set1_epi32(static_cast<int>(H - h0 < 16 ? H - h0 : 16));
    const __m256 in_a = _mm256_castsi256_ps(_mm256_cmpgt_epi32(left, lane));
    const __m256 in_b = _mm256_castsi256_ps(_mm256_cmpgt_epi32(left, _mm256_add_epi32(lane, _mm256_set1_epi32(8))));
    a = _mm256_and_ps(_mm256_mul_ps(a, _mm256_set1_ps(scale)), in_a);
    b = _mm256_and_ps(_mm256_mul_ps(b, _mm256_set1_ps(scale)), in_b);
  }
  return bf16_words(a, b);
}

// The two halves of 8 bf16 pairs (16 words) as fp32: the even elements (the low half of each 32-bit
// lane, word 2i) and the odd ones (the high half, word 2i + 1). Exact.
inline __m256 even_half(__m256i w) { return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)); }
inline __m256 odd_half(__m256i w) {
  return _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

}  // namespace
}  // namespace flashgqa
