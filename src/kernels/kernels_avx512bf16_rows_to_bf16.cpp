// FlashKernels::decode_rows_to_bf16 and decode_int8_rows_to_bf16 (contract in microkernels.hpp) of the
// avx512bf16 and amx sets: the words of the AVX-512F ones (kernels_avx512f.cpp), which round on integers
// (round2_bf16: ~40 instructions per 32 values), from one vcvtne2ps2bf16 per 32 values where that gives
// the same word: everywhere but for subnormal values, which it takes as zeros, and NaNs where this CPU
// writes them otherwise than Intel defines (round2_bf16_cvt, avx512_helpers.hpp). f32 rows are checked
// 32 values at a time; f16 rows widen to no subnormal float; an int8 row's products can be subnormal
// only for a scale below 2^-126 (and not 0), and such rows take the integer rounding whole.
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

// An int8 row times s in fp32 has no subnormal product unless 0 < |s| < 2^-126; a NaN or infinite s gives
// NaN products, which vcvtne2ps2bf16 writes as round2_bf16 does where bf16_cvt_nan_exact().
inline bool plain_scale(float s) {
  const float a = std::fabs(s);
  if (a > 0.0f && a < std::numeric_limits<float>::min()) return false;
  return bf16_cvt_nan_exact() || a <= std::numeric_limits<float>::max();
}

// Whether vcvtne2ps2bf16 writes 32 NaNs (quiet and signalling, both signs, assorted payloads) as
// round2_bf16 does.
bool probe_nan_words() {
  alignas(64) std::uint32_t x[32];
  const std::uint32_t nans[] = {0x7f800001u, 0x7fc00000u, 0x7fffffffu, 0x7fbfffffu, 0xff800001u,
                                0xffc00000u, 0xffffffffu, 0x7f80ffffu, 0x7fa5a5a5u, 0xfff0f0f0u};
  for (int i = 0; i < 32; ++i) x[i] = nans[i % 10] ^ (static_cast<std::uint32_t>(i) << 13 & 0x003fe000u);
  const __m512 lo = _mm512_castsi512_ps(_mm512_load_si512(x)), hi = _mm512_castsi512_ps(_mm512_load_si512(x + 16));
  const __m512i want = round2_bf16(lo, hi), got = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
  return _mm512_cmpneq_epi16_mask(want, got) == 0;
}

// The 16 int8 values at x (the lanes of `live`; the others 0) as floats.
inline __m512 int8_16(const std::int8_t* x, __mmask16 live) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(live, x)));
}

}  // namespace

std::atomic<bool> g_bf16_cvt_nan_exact{false};

void probe_bf16_cvt_nan() { g_bf16_cvt_nan_exact.store(probe_nan_words(), std::memory_order_relaxed); }

void avx512bf16_decode_rows_to_bf16(std::uint16_t* dst, std::int64_t ldd, const void* src, DType dtype,
                                    std::int64_t ld, std::int64_t n, std::int64_t H) {
  const std::int64_t row_bytes = ld * static_cast<std::int64_t>(dtype_size(dtype));
  with_whole_loads(dtype, [&](auto load) {
    for (std::int64_t j = 0; j < n; ++j) {
      const char* row = static_cast<const char*>(src) + j * row_bytes;
      std::uint16_t* out = dst + j * ldd;
      std::int64_t h = 0;
      for (; h + 32 <= H; h += 32) _mm512_storeu_si512(out + h, load(row, h));
      for (; h < ldd; h += 32)  // the last values, then zeros up to ldd
        _mm512_mask_storeu_epi16(out + h, first_lanes32(ldd - h), load32_bf16(row, dtype, h, H));
    }
  });
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
