// Ceilings micro-benchmark loop for aarch64 FEAT_BF16 (compiled with -march=armv8.2-a+bf16, aarch64
// only; run only where HWCAP2_BF16 says the CPU has it).
#include <arm_neon.h>

#include "study/ceilings.hpp"

namespace flashgqa::study::detail {

// 16 independent BFDOT chains, 16 FLOPs per instruction (4 lanes x 2 pairs x multiply and add).
double bf16_dot_loop_neon(long iterations, float* sink) {
  constexpr int kChains = 16;
  float32x4_t acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = vdupq_n_f32(static_cast<float>(c));
  uint32x4_t ones = vdupq_n_u32(0x3f803f80u);  // (1.0, 1.0) pairs
  uint32x4_t tiny = vdupq_n_u32(0x00010001u);  // accumulators stay finite
  // Opaque to GCC 12, which would otherwise build the constant with an fp16 FMOV (not in +bf16).
  __asm__("" : "+w"(ones), "+w"(tiny));
  const bfloat16x8_t a = vreinterpretq_bf16_u32(ones), b = vreinterpretq_bf16_u32(tiny);
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = vbfdotq_f32(acc[c], a, b);
  float32x4_t total = acc[0];
  for (int c = 1; c < kChains; ++c) total = vaddq_f32(total, acc[c]);
  *sink += vaddvq_f32(total);
  return static_cast<double>(iterations) * kChains * 16.0;
}

}  // namespace flashgqa::study::detail
