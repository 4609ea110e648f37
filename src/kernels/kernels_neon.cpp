// The NEON kernel set (fp32 operand family, contract in microkernels.hpp), for aarch64 CPUs. Advanced
// SIMD is part of the aarch64 baseline, so this file needs no compiler flags (CMakeLists.txt compiles
// it on aarch64 only); the path is still chosen at run time (HWCAP_ASIMD, cpu_features.cpp).
//
// Register tile 5 x 32, computed as two 5 x 16 halves: 20 q-register accumulators + 4 panel vectors +
// 5 row scalars fit the 32 vector registers (6 rows would need 34: GCC 12 spills three accumulators to
// the stack in the inner loop); per reduction step 4 panel loads and 5 scalar loads feed 20 FMLAs (by
// element, the row value in lane 0). Operands were widened to fp32 (bf16-rounded under
// Precision::bf16) when packed, as on avx2 and avx512f; the packers are the portable ones (packing is
// O(n H) per KV block against O(rows n H) for the tiles).
#include <arm_neon.h>

#include <cstdint>

#include "kernels/microkernels.hpp"
#include "kernels/neon_helpers.hpp"
#include "kernels/row_count.hpp"

namespace flashgqa {
namespace {

constexpr int kMR = 5;

// acc[r][0..4) += sum_{i < n} a[r][i] * b[i][c0 .. c0+16), b rows of 32 floats.
template <int R>
inline void dot_rows_half(float32x4_t (&acc)[R][kVecs], const float* a, std::int64_t lda, const float* b,
                          std::int64_t n, int c0) {
  const float* arow[R];
  for (int r = 0; r < R; ++r) arow[r] = a + r * lda;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* bi = b + 32 * i + c0;
    float32x4_t bv[kVecs];
    for (int v = 0; v < kVecs; ++v) bv[v] = vld1q_f32(bi + 4 * v);
    for (int r = 0; r < R; ++r) {
      const float x = arow[r][i];
      for (int v = 0; v < kVecs; ++v) acc[r][v] = vfmaq_n_f32(acc[r][v], bv[v], x);
    }
  }
}

template <int R>
void qk_rows(const QkTile& t) {
  qk_halves<R>(t, [&t](float32x4_t (&acc)[R][kVecs], int c0) {
    dot_rows_half<R>(acc, static_cast<const float*>(t.q), t.ldq, static_cast<const float*>(t.k), t.Hp, c0);
  });
}

template <int R>
void pv_rows(const PvTile& t) {
  pv_halves<R>(t, [&t](float32x4_t (&acc)[R][kVecs], int c0) {
    dot_rows_half<R>(acc, static_cast<const float*>(t.p), t.ldp, static_cast<const float*>(t.v), t.nkeys, c0);
  });
}

void qk_tile_5x32(const QkTile& t) {
  with_rows<kMR>(t.rows, [&](auto r) { qk_rows<decltype(r)::value>(t); });
}

void pv_tile_5x32(const PvTile& t) {
  with_rows<kMR>(t.rows, [&](auto r) { pv_rows<decltype(r)::value>(t); });
}

// P as fp32, rounded to bf16 under Precision::bf16.
bool softmax_tile(const SoftmaxTile& t) {
  return softmax_rows(t, [&t](int r, std::int64_t j, float32x4_t e) {
    vst1q_f32(static_cast<float*>(t.p) + r * t.ldp + j, t.round_p ? round_bf16(e) : e);
  });
}

}  // namespace

const FlashKernels& neon_kernels() {
  static const FlashKernels k{.name = "neon",
                              .operand_bytes = 4,
                              .mr = kMR,
                              .qk_tile = qk_tile_5x32,
                              .pv_tile = pv_tile_5x32,
                              .softmax_tile = softmax_tile,
                              .exp_n = exp_n,
                              .softcap_n = softcap_n,
                              .pack_q_row = portable_kernels().pack_q_row,
                              .pack_k = portable_kernels().pack_k,
                              .pack_v = portable_kernels().pack_v};
  return k;
}

}  // namespace flashgqa
