// The portable kernel set: plain C++ on the fp32 operand family (see the contract in microkernels.hpp).
// No instruction-set flags; the compiler vectorises the 32-wide inner loops with whatever the target
// baseline offers. It is a real path: the tests run it on every machine.
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.hpp"
#include "kernels/exp_poly.hpp"
#include "kernels/microkernels.hpp"
#include "kernels/tanh_poly.hpp"

namespace flashgqa {
namespace {

constexpr int kMR = 8;

// 2^x with the shared polynomial (exp_poly.hpp); scalar twin of the vector versions.
float exp2_poly(float x) {
  using namespace exp_poly;
  if (std::isnan(x)) return x;
  x = std::fmin(std::fmax(x, kMinExp2), kMaxExp2);
  const float n = std::floor(x);
  const float f = x - n;
  float p = kC5;
  p = std::fma(p, f, kC4);
  p = std::fma(p, f, kC3);
  p = std::fma(p, f, kC2);
  p = std::fma(p, f, kC1);
  p = std::fma(p, f, 1.0f);
  return std::ldexp(p, static_cast<int>(n));
}

void exp_n(float* dst, const float* src, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = exp2_poly(src[i] * exp_poly::kLog2e);
}

// x[i] = cap tanh(x[i] / cap), tanh by the rational of tanh_poly.hpp (comparisons, not fmin/fmax, so
// NaN passes the clamp).
void softcap_n(float* x, std::int64_t n, float cap) {
  using namespace tanh_poly;
  const float inv = 1.0f / cap;
  for (std::int64_t i = 0; i < n; ++i) {
    float y = x[i] * inv;
    y = y > kTanhClamp ? kTanhClamp : y < -kTanhClamp ? -kTanhClamp : y;
    const float u = y * y;
    float num = std::fma(std::fma(std::fma(std::fma(kP4, u, kP3), u, kP2), u, kP1), u, 1.0f);
    const float den = std::fma(std::fma(std::fma(std::fma(kQ4, u, kQ3), u, kQ2), u, kQ1), u, 1.0f);
    num *= y;
    x[i] = cap * (num / den);
  }
}

// S[r][0..32) = scale * sum_h Q[r][h] K[h][j]; K panel [Hp][32].
void qk_tile(const QkTile& t) {
  const auto* q = static_cast<const float*>(t.q);
  const auto* k = static_cast<const float*>(t.k);
  for (int r = 0; r < t.rows; ++r) {
    float acc[kPanelKeys] = {};
    const float* qr = q + r * t.ldq;
    for (std::int64_t h = 0; h < t.Hp; ++h) {
      const float qv = qr[h];
      const float* kh = k + h * kPanelKeys;
      for (int j = 0; j < kPanelKeys; ++j) acc[j] += qv * kh[j];
    }
    float* sr = t.s + r * t.lds;
    for (int j = 0; j < kPanelKeys; ++j) sr[j] = t.scale * acc[j];
  }
}

// O[r][0..32) = O[r][..] * corr[r] + sum_j P[r][j] V[j][c]; V panel [npad][32].
void pv_tile(const PvTile& t) {
  const auto* p = static_cast<const float*>(t.p);
  const auto* v = static_cast<const float*>(t.v);
  for (int r = 0; r < t.rows; ++r) {
    float* orow = t.o + r * t.ldo;
    float acc[kHTile];
    const float c = t.corr ? t.corr[r] : 1.0f;
    for (int j = 0; j < kHTile; ++j) acc[j] = t.corr ? orow[j] * c : orow[j];
    const float* pr = p + r * t.ldp;
    for (std::int64_t j = 0; j < t.nkeys; ++j) {
      const float pv = pr[j];
      const float* vj = v + j * kHTile;
      for (int c2 = 0; c2 < kHTile; ++c2) acc[c2] += pv * vj[c2];
    }
    for (int j = 0; j < kHTile; ++j) orow[j] = acc[j];
  }
}

bool softmax_tile(const SoftmaxTile& t) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  bool moved = false;
  for (int r = 0; r < t.rows; ++r) {
    const float* s = t.s + r * t.lds;
    float* p = static_cast<float*>(t.p) + r * t.ldp;
    const std::int64_t lo = t.lo ? t.lo[r] : 0, hi = t.lo ? t.hi[r] : t.n;
    float mx = kNegInf;
    for (std::int64_t j = lo; j < hi; ++j) mx = s[j] > mx ? s[j] : mx;  // NaN skipped; exp poisons
    const float m_old = t.m[r];
    const float m_new = m_old > mx ? m_old : mx;
    const float m_use = m_new == kNegInf ? 0.0f : m_new;
    float sum = 0.0f;
    for (std::int64_t j = 0; j < t.n; ++j) {
      if (j < lo || j >= hi) {
        p[j] = 0.0f;
        continue;
      }
      const float e = exp2_poly((s[j] - m_use) * exp_poly::kLog2e);
      sum += e;
      p[j] = t.round_p ? round_to_bf16(e) : e;
    }
    const float corr = exp2_poly((m_old - m_use) * exp_poly::kLog2e);
    t.l[r] = t.l[r] * corr + sum;
    t.corr[r] = corr;
    t.m[r] = m_new;
    moved |= !(corr == 1.0f);
  }
  return moved;
}

float operand(const void* row, const PackSource& s, std::int64_t h) {
  const float x = load_element(row, s.dtype, h);
  return s.round_bf16 ? round_to_bf16(x) : x;
}

const void* key_row(const PackSource& s, std::int64_t j) {
  return packed_key_row(s, j, static_cast<std::int64_t>(dtype_size(s.dtype)));
}

void pack_q_row(void* dst, const PackSource& s) {
  auto* d = static_cast<float*>(dst);
  for (std::int64_t h = 0; h < s.Hp; ++h) d[h] = h < s.H ? operand(s.src, s, h) : 0.0f;
}


// Panels [Hp][32] one after another.
void pack_k(void* dst, const PackSource& s) {
  auto* d = static_cast<float*>(dst);
  const std::int64_t npad = padded_keys(s.n);
  std::memset(d, 0, static_cast<std::size_t>(npad * s.Hp) * sizeof(float));
  for (std::int64_t j = 0; j < s.n; ++j) {
    const void* row = key_row(s, j);
    float* panel = d + (j / kPanelKeys) * s.Hp * kPanelKeys + j % kPanelKeys;
    for (std::int64_t h = 0; h < s.H; ++h) panel[h * kPanelKeys] = operand(row, s, h);
  }
}

// Panels [npad][32], one per h tile.
void pack_v(void* dst, const PackSource& s) {
  auto* d = static_cast<float*>(dst);
  const std::int64_t npad = padded_keys(s.n);
  std::memset(d, 0, static_cast<std::size_t>(npad * s.Hp) * sizeof(float));
  for (std::int64_t j = 0; j < s.n; ++j) {
    const void* row = key_row(s, j);
    for (std::int64_t h = 0; h < s.H; ++h)
      d[(h / kHTile) * npad * kHTile + j * kHTile + h % kHTile] = operand(row, s, h);
  }
}

}  // namespace

const FlashKernels& portable_kernels() {
  static const FlashKernels k{.name = "portable",
                              .operand_bytes = 4,
                              .mr = kMR,
                              .qk_tile = qk_tile,
                              .pv_tile = pv_tile,
                              .softmax_tile = softmax_tile,
                              .exp_n = exp_n,
                              .softcap_n = softcap_n,
                              .pack_q_row = pack_q_row,
                              .pack_k = pack_k,
                              .pack_v = pack_v};
  return k;
}

}  // namespace flashgqa
