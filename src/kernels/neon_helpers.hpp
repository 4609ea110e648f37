// NEON helpers shared by kernels_neon.cpp and kernels_neon_bf16.cpp: the half-tile drivers of qk_tile
// and pv_tile, the vector exp and tanh, exact bf16 rounding, lane masks, and the softmax row loop
// (contract in microkernels.hpp).
//
// Include ONLY from the aarch64 kernel files: everything here is in an anonymous namespace, so each
// unit gets its own copy, compiled with that unit's flags (as avx512_helpers.hpp does on x86-64).
#pragma once

#include <arm_neon.h>

#include <cstdint>

#include "kernels/exp_poly.hpp"
#include "kernels/microkernels.hpp"
#include "kernels/tanh_poly.hpp"

namespace flashgqa {
namespace {

constexpr std::int32_t kExpBias = 127;  // fp32 exponent bias
constexpr int kHalf = 16;               // columns per half tile (both NEON sets: 5 x 32 as two 5 x 16)
constexpr int kVecs = kHalf / 4;        // q registers per half-tile row

// qk_tile's R rows as two 16-key halves: dot(acc, c0) adds Q . K for keys c0 .. c0+16 into acc.
template <int R, typename Dot>
inline void qk_halves(const QkTile& t, Dot dot) {
  const float32x4_t scale = vdupq_n_f32(t.scale);
  for (int c0 = 0; c0 < kPanelKeys; c0 += kHalf) {
    float32x4_t acc[R][kVecs];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < kVecs; ++v) acc[r][v] = vdupq_n_f32(0.0f);
    dot(acc, c0);
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < kVecs; ++v) vst1q_f32(t.s + r * t.lds + c0 + 4 * v, vmulq_f32(acc[r][v], scale));
  }
}

// pv_tile's R rows as two 16-column halves: O rescaled by corr, then dot(acc, c0) adds P . V for
// columns c0 .. c0+16.
template <int R, typename Dot>
inline void pv_halves(const PvTile& t, Dot dot) {
  for (int c0 = 0; c0 < kHTile; c0 += kHalf) {
    float32x4_t acc[R][kVecs];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < kVecs; ++v) {
        acc[r][v] = vld1q_f32(t.o + r * t.ldo + c0 + 4 * v);
        if (t.corr) acc[r][v] = vmulq_n_f32(acc[r][v], t.corr[r]);
      }
    dot(acc, c0);
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < kVecs; ++v) vst1q_f32(t.o + r * t.ldo + c0 + 4 * v, acc[r][v]);
  }
}

// 2^x, the polynomial of exp_poly.hpp: clamp to [kMinExp2, kMaxExp2] (FMAX/FMIN keep NaN),
// n = floor(x), f = x - n, P(f), then times 2^n as two normal powers of two 2^(n/2 rounded down) and
// 2^(the rest), each in [2^-75, 2^65]: the first product is exact and the second rounds once, so
// results in the subnormal range round as ldexp does. exp2(-inf) = 2^-150 rounds to 0.
inline float32x4_t exp2_poly(float32x4_t x) {
  using namespace exp_poly;
  x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(kMinExp2)), vdupq_n_f32(kMaxExp2));
  const float32x4_t n = vrndmq_f32(x);
  const float32x4_t f = vsubq_f32(x, n);
  float32x4_t p = vfmaq_f32(vdupq_n_f32(kC4), vdupq_n_f32(kC5), f);
  p = vfmaq_f32(vdupq_n_f32(kC3), p, f);
  p = vfmaq_f32(vdupq_n_f32(kC2), p, f);
  p = vfmaq_f32(vdupq_n_f32(kC1), p, f);
  p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
  const int32x4_t ni = vcvtq_s32_f32(n);  // NaN lanes give 0; p is NaN there already
  const int32x4_t n1 = vshrq_n_s32(ni, 1);
  const int32x4_t n2 = vsubq_s32(ni, n1);
  const int32x4_t bias = vdupq_n_s32(kExpBias);
  const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, bias), 23));
  const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, bias), 23));
  return vmulq_f32(vmulq_f32(p, s1), s2);
}

inline float32x4_t load_first(const float* src, std::int64_t n) {  // lanes >= n zero
  if (n >= 4) return vld1q_f32(src);
  float buf[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (std::int64_t i = 0; i < n; ++i) buf[i] = src[i];
  return vld1q_f32(buf);
}

inline void store_first(float* dst, float32x4_t x, std::int64_t n) {
  if (n >= 4) return vst1q_f32(dst, x);
  float buf[4];
  vst1q_f32(buf, x);
  for (std::int64_t i = 0; i < n; ++i) dst[i] = buf[i];
}

inline void exp_n(float* dst, const float* src, std::int64_t n) {
  const float32x4_t log2e = vdupq_n_f32(exp_poly::kLog2e);
  for (std::int64_t i = 0; i < n; i += 4)
    store_first(dst + i, exp2_poly(vmulq_f32(load_first(src + i, n - i), log2e)), n - i);
}

// x[i] = cap tanh(x[i] / cap), tanh by the rational of tanh_poly.hpp (FMIN/FMAX keep NaN).
inline void softcap_n(float* x, std::int64_t n, float cap) {
  using namespace tanh_poly;
  const float32x4_t inv = vdupq_n_f32(1.0f / cap), c = vdupq_n_f32(cap);
  for (std::int64_t i = 0; i < n; i += 4) {
    float32x4_t y = vmulq_f32(load_first(x + i, n - i), inv);
    y = vmaxq_f32(vminq_f32(y, vdupq_n_f32(kTanhClamp)), vdupq_n_f32(-kTanhClamp));
    const float32x4_t u = vmulq_f32(y, y);
    float32x4_t num = vfmaq_f32(vdupq_n_f32(kP3), vdupq_n_f32(kP4), u);
    num = vfmaq_f32(vdupq_n_f32(kP2), num, u);
    num = vfmaq_f32(vdupq_n_f32(kP1), num, u);
    num = vfmaq_f32(vdupq_n_f32(1.0f), num, u);
    float32x4_t den = vfmaq_f32(vdupq_n_f32(kQ3), vdupq_n_f32(kQ4), u);
    den = vfmaq_f32(vdupq_n_f32(kQ2), den, u);
    den = vfmaq_f32(vdupq_n_f32(kQ1), den, u);
    den = vfmaq_f32(vdupq_n_f32(1.0f), den, u);
    store_first(x + i, vmulq_f32(c, vdivq_f32(vmulq_f32(num, y), den)), n - i);
  }
}

// x rounded to nearest even bf16 (low 16 bits zero); NaN becomes a quiet NaN. Identical to
// float_to_bf16_bits in core/dtype.hpp, subnormals included.
inline float32x4_t round_bf16(float32x4_t x) {
  const uint32x4_t u = vreinterpretq_u32_f32(x);
  const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
  const uint32x4_t r = vandq_u32(vaddq_u32(u, vaddq_u32(lsb, vdupq_n_u32(0x7fff))), vdupq_n_u32(0xffff0000u));
  const uint32x4_t is_num = vceqq_f32(x, x);
  return vreinterpretq_f32_u32(vbslq_u32(is_num, r, vorrq_u32(u, vdupq_n_u32(0x00400000u))));
}

// Lanes j + i (i < 4) with lo <= j + i < hi.
inline uint32x4_t lanes4(std::int64_t j, std::int64_t lo, std::int64_t hi) {
  static constexpr std::int32_t kIota[4] = {0, 1, 2, 3};
  const int32x4_t idx = vaddq_s32(vld1q_s32(kIota), vdupq_n_s32(static_cast<std::int32_t>(j)));
  return vandq_u32(vcgeq_s32(idx, vdupq_n_s32(static_cast<std::int32_t>(lo))),
                   vcltq_s32(idx, vdupq_n_s32(static_cast<std::int32_t>(hi))));
}

// softmax_tile (contract in microkernels.hpp), one row at a time in 4-lane vectors; write_p(r, j, e)
// stores the weights e of keys j..j+3 of row r in the set's operand type.
template <typename WriteP>
bool softmax_rows(const SoftmaxTile& t, WriteP write_p) {
  const float neg_inf = -__builtin_inff();
  const float32x4_t log2e = vdupq_n_f32(exp_poly::kLog2e), zero = vdupq_n_f32(0.0f);
  const bool masked = t.lo != nullptr;
  bool moved = false;
  for (int r = 0; r < t.rows; ++r) {
    const float* s = t.s + r * t.lds;
    const std::int64_t lo = masked ? t.lo[r] : 0, hi = masked ? t.hi[r] : t.n;
    // Running max over the unmasked keys (FMAXNM skips NaN; exp spreads it below).
    float32x4_t mx = vdupq_n_f32(neg_inf);
    for (std::int64_t j = lo / 4 * 4; j < hi; j += 4) {
      const float32x4_t x = vld1q_f32(s + j);
      mx = vmaxnmq_f32(mx, masked ? vbslq_f32(lanes4(j, lo, hi), x, vdupq_n_f32(neg_inf)) : x);
    }
    const float mb = vmaxnmvq_f32(mx);
    const float m_old = t.m[r];
    const float m_new = m_old > mb ? m_old : mb;
    const float m_use = m_new == neg_inf ? 0.0f : m_new;
    // P = 2^((s - m) log2e); masked keys exactly 0, 4-key groups wholly outside [lo, hi) unread.
    const float32x4_t m = vdupq_n_f32(m_use);
    const std::int64_t jbegin = masked && lo < hi ? lo / 4 * 4 : 0;
    const std::int64_t jend = masked ? (lo < hi ? (hi + 3) / 4 * 4 : 0) : t.n;
    float32x4_t sum = zero;
    for (std::int64_t j = 0; j < jbegin; j += 4) write_p(r, j, zero);
    for (std::int64_t j = jbegin; j < jend; j += 4) {
      float32x4_t e = exp2_poly(vmulq_f32(vsubq_f32(vld1q_f32(s + j), m), log2e));
      if (masked) e = vbslq_f32(lanes4(j, lo, hi), e, zero);
      sum = vaddq_f32(sum, e);
      write_p(r, j, e);
    }
    for (std::int64_t j = jend; j < t.n; j += 4) write_p(r, j, zero);
    const float corr = vgetq_lane_f32(exp2_poly(vdupq_n_f32((m_old - m_use) * exp_poly::kLog2e)), 0);
    t.l[r] = t.l[r] * corr + vaddvq_f32(sum);
    t.corr[r] = corr;
    t.m[r] = m_new;
    moved |= !(corr == 1.0f);
  }
  return moved;
}

}  // namespace
}  // namespace flashgqa
