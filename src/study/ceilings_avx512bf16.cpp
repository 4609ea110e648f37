// Ceilings micro-benchmark loop for AVX512_BF16 (compiled with -mavx512f -mavx512bf16).
#include <immintrin.h>

#include "study/ceilings.hpp"

namespace flashgqa::study::detail {

// 16 independent vdpbf16ps chains (more than latency x throughput), 64 FLOPs each per instruction.
double bf16_dot_loop(long iterations, float* sink) {
  constexpr int kChains = 16;
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // (1.0, 1.0) pairs
  const __m512bh b = (__m512bh)_mm512_set1_epi32(0x00010001);  // tiny: accumulators stay finite
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  __m512 total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
  *sink += _mm512_reduce_add_ps(total);
  return static_cast<double>(iterations) * kChains * 64.0;
}

}  // namespace flashgqa::study::detail
