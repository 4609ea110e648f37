// Ceilings micro-benchmark loops for AVX-512F (compiled with -mavx512f).
#include <immintrin.h>

#include <cstdint>

#include "study/ceilings.hpp"

namespace flashgqa::study::detail {

// 16 independent FMA chains, 32 FLOPs per instruction.
double f32_fma_loop_avx512(long iterations, float* sink) {
  constexpr int kChains = 16;
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  __m512 total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
  *sink += _mm512_reduce_add_ps(total);
  return static_cast<double>(iterations) * kChains * 32.0;
}

// Streams `bytes` (a multiple of 256) through 64-byte loads; with `ahead` > 0, also prefetches
// (prefetcht1) the line `ahead` bytes on as each 4 KiB page of the source starts.
double read_loop_avx512(const void* data, long bytes, long ahead, long* sink) {
  const auto* p = static_cast<const __m512i*>(data);
  const auto* c = static_cast<const char*>(data);
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (long i = 0; i < bytes / 64; i += 4) {
    if (ahead > 0 && (reinterpret_cast<std::uintptr_t>(c + i * 64) & 4095) < 256 && i * 64 + ahead < bytes)
      _mm_prefetch(c + i * 64 + ahead, _MM_HINT_T1);  // once per page, as a page starts
    a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 1));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 2));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 3));
  }
  const __m512i x = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  *sink += _mm512_reduce_add_epi64(x);
  return static_cast<double>(bytes);
}

}  // namespace flashgqa::study::detail
