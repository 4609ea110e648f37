// Ceilings micro-benchmark loops for AVX2 + FMA (compiled with -mavx2 -mfma).
#include <immintrin.h>

#include <cstdint>

#include "study/ceilings.hpp"

namespace flashgqa::study::detail {

// 12 independent FMA chains, 16 FLOPs per instruction.
double f32_fma_loop_avx2(long iterations, float* sink) {
  constexpr int kChains = 12;
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  __m256 total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm256_add_ps(total, acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  for (float x : lanes) *sink += x;
  return static_cast<double>(iterations) * kChains * 16.0;
}

// Streams `bytes` (a multiple of 256) through 32-byte loads; `ahead` as in read_loop_avx512.
double read_loop_avx2(const void* data, long bytes, long ahead, long* sink) {
  const auto* p = static_cast<const __m256i*>(data);
  const auto* c = static_cast<const char*>(data);
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (long i = 0; i < bytes / 32; i += 4) {
    if (ahead > 0 && (reinterpret_cast<std::uintptr_t>(c + i * 32) & 4095) < 128 && i * 32 + ahead < bytes)
      _mm_prefetch(c + i * 32 + ahead, _MM_HINT_T1);
    a0 = _mm256_xor_si256(a0, _mm256_load_si256(p + i));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256(p + i + 1));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256(p + i + 2));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256(p + i + 3));
  }
  alignas(32) long lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3)));
  for (long x : lanes) *sink += x;
  return static_cast<double>(bytes);
}

}  // namespace flashgqa::study::detail
