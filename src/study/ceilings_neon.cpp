// Ceilings micro-benchmark loops for aarch64 Advanced SIMD (baseline on aarch64: no flags; compiled on
// aarch64 only, CMakeLists.txt).
#include <arm_neon.h>

#include <cstdint>

#include "study/ceilings.hpp"

namespace flashgqa::study::detail {

// 16 independent FMLA chains (more than latency x throughput on Neoverse N1/V1/V2: 4 x 2, 4 x 4,
// 4 x 4), 8 FLOPs per instruction.
double f32_fma_loop_neon(long iterations, float* sink) {
  constexpr int kChains = 16;
  float32x4_t acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = vdupq_n_f32(static_cast<float>(c));
  const float32x4_t a = vdupq_n_f32(0.999999f), b = vdupq_n_f32(1e-7f);
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = vfmaq_f32(b, acc[c], a);
  float32x4_t total = acc[0];
  for (int c = 1; c < kChains; ++c) total = vaddq_f32(total, acc[c]);
  *sink += vaddvq_f32(total);
  return static_cast<double>(iterations) * kChains * 8.0;
}

// Streams `bytes` (a multiple of 256) through 16-byte loads, four chains of 64 bytes; with `ahead` > 0,
// also prefetches (PRFM PLDL2KEEP) the line `ahead` bytes on as each 4 KiB page of the source starts.
double read_loop_neon(const void* data, long bytes, long ahead, long* sink) {
  const auto* p = static_cast<const std::uint64_t*>(data);
  const auto* c = static_cast<const char*>(data);
  uint64x2_t a0 = vdupq_n_u64(0), a1 = a0, a2 = a0, a3 = a0;
  for (long i = 0; i < bytes / 8; i += 8) {
    if (ahead > 0 && (reinterpret_cast<std::uintptr_t>(c + i * 8) & 4095) < 64 && i * 8 + ahead < bytes)
      __builtin_prefetch(c + i * 8 + ahead, 0, 2);  // once per page, as a page starts
    a0 = veorq_u64(a0, vld1q_u64(p + i));
    a1 = veorq_u64(a1, vld1q_u64(p + i + 2));
    a2 = veorq_u64(a2, vld1q_u64(p + i + 4));
    a3 = veorq_u64(a3, vld1q_u64(p + i + 6));
  }
  const uint64x2_t x = veorq_u64(veorq_u64(a0, a1), veorq_u64(a2, a3));
  *sink += static_cast<long>(vgetq_lane_u64(x, 0) + vgetq_lane_u64(x, 1));
  return static_cast<double>(bytes);
}

}  // namespace flashgqa::study::detail
