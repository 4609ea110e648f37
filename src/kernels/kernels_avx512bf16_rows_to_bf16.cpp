// FlashKernels::decode_rows_to_bf16 and decode_int8_rows_to_bf16 (contract in microkernels.hpp) of the
// avx512bf16 and amx sets: the words of the AVX-512F ones (kernels_avx512f.cpp), which round on integers
// (round2_bf16: ~40 instructions per 32 values), from one vcvtne2ps2bf16 per 32 values where that gives
// the same word. vcvtne2ps2bf16 rounds to nearest even as round_to_bf16 does, but takes subnormal
// inputs as zero, and its NaN is not specified here to be round_to_bf16's; so a chunk with a subnormal
// or a NaN among its values, and an int8 row whose scale could make one (a NaN, an infinity or a
// nonzero scale below 2^-126: 0 times an infinity, or a subnormal product), take the integer rounding.
// Why: at T = 16 (G = 4, four row groups) the int8 rows' integer conversion took a third of the decode
// time in L2 (~38 ns a key for K and V, against ~76 for the bf16 tiles' four groups); docs/
// performance.md, session 26.
// Compiled with the avx512bf16 flags (CMakeLists.txt).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/avx512_helpers.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa {
namespace {

// An int8 row times s in fp32 gives no subnormal and no NaN: s is 0, or finite with |s| >= 2^-126 (a
// product 127 s past the largest float is an infinity, which both roundings keep).
inline bool plain_scale(float s) {
  const float a = std::fabs(s);
  return s == 0.0f || (a >= std::numeric_limits<float>::min() && a <= std::numeric_limits<float>::max());
}

// The 16 int8 values at x (the lanes of `live`; the others 0) as floats.
inline __m512 int8_16(const std::int8_t* x, __mmask16 live) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(live, x)));
}

}  // namespace

void avx512bf16_decode_rows_to_bf16(std::uint16_t* dst, std::int64_t ldd, const void* src, DType dtype,
                                    std::int64_t ld, std::int64_t n, std::int64_t H) {
  const std::int64_t row_bytes = ld * static_cast<std::int64_t>(dtype_size(dtype));
  for (std::int64_t j = 0; j < n; ++j) {
    const void* row = static_cast<const char*>(src) + j * row_bytes;
    for (std::int64_t h = 0; h < ldd; h += 32)
      _mm512_mask_storeu_epi16(dst + j * ldd + h, first_lanes32(ldd - h),
                               round2_bf16_cvt(load16_f32(row, dtype, h, H), load16_f32(row, dtype, h + 16, H)));
  }
}

void avx512bf16_decode_int8_rows_to_bf16(std::uint16_t* dst, std::int64_t ldd, const std::int8_t* src,
                                         std::int64_t ld, const float* scale, std::int64_t ld_scale, std::int64_t n,
                                         std::int64_t H) {
  for (std::int64_t j = 0; j < n; ++j) {
    const float sj = scale[j * ld_scale];
    std::uint16_t* out = dst + j * ldd;
    if (!plain_scale(sj)) {
      avx512_decode_int8_rows_to_bf16(out, ldd, src + j * ld, ld, scale + j * ld_scale, ld_scale, 1, H);
      continue;
    }
    const std::int8_t* row = src + j * ld;
    const __m512 s = _mm512_set1_ps(sj);
    std::int64_t h = 0;
    for (; h + 32 <= H; h += 32) {
      const __m512 lo = _mm512_mul_ps(int8_16(row + h, 0xffff), s), hi = _mm512_mul_ps(int8_16(row + h + 16, 0xffff), s);
      _mm512_storeu_si512(out + h, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    for (; h < ldd; h += 32) {  // the last values, then zeros (+0 whatever the scale's sign) up to ldd
      const __m512 lo = _mm512_mul_ps(int8_16(row + h, first_lanes16(H - h)), s);
      const __m512 hi = _mm512_mul_ps(int8_16(row + h + 16, first_lanes16(H - h - 16)), s);
      _mm512_mask_storeu_epi16(out + h, first_lanes32(ldd - h),
                               _mm512_maskz_mov_epi16(first_lanes32(H - h), (__m512i)_mm512_cvtne2ps_pbh(hi, lo)));
    }
  }
}

}  // namespace flashgqa
