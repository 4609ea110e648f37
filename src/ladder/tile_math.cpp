#include "ladder/tile_math.hpp"

#include <cmath>
#include <limits>

#include "core/dtype.hpp"

namespace flashgqa {

void load_q_block(float* dst, const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t t0,
                  std::int64_t rows) {
  for (std::int64_t g = 0; g < p.G; ++g)
    for (std::int64_t r = 0; r < rows; ++r)
      load_row(dst + (g * rows + r) * p.H, p.q_row(b, kh, g, t0 + r), p.q_dtype, p.H, p.precision);
}

void load_k_block(float* dst, const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t s0,
                  std::int64_t n) {
  for (std::int64_t j = 0; j < n; ++j)
    load_row(dst + j * p.H, p.k_row(b, kh, s0 + j), p.k_dtype, p.H, p.precision);
}

void load_v_block(float* dst, const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t s0,
                  std::int64_t n) {
  for (std::int64_t j = 0; j < n; ++j)
    load_row(dst + j * p.H, p.v_row(b, kh, s0 + j), p.v_dtype, p.H, p.precision);
}

void qk_logits(float* L, const float* Q, std::int64_t M, const float* Kb, std::int64_t N,
               std::int64_t H, float scale) {
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      const float* q = Q + m * H;
      const float* k = Kb + n * H;
      float acc = 0.0f;
      for (std::int64_t h = 0; h < H; ++h) acc += q[h] * k[h];
      L[m * N + n] = scale * acc;
    }
}

void pv_accumulate(float* O, const float* P, std::int64_t M, std::int64_t N, const float* V,
                   std::int64_t H) {
  for (std::int64_t m = 0; m < M; ++m) {
    float* o = O + m * H;
    for (std::int64_t n = 0; n < N; ++n) {
      const float w = P[m * N + n];
      const float* v = V + n * H;
      for (std::int64_t h = 0; h < H; ++h) o[h] += w * v[h];
    }
  }
}

void mask_logits(float* L, const Problem& p, std::int64_t M, std::int64_t t0, std::int64_t rows,
                 std::int64_t s0, std::int64_t N) {
  if (!p.causal) return;
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  for (std::int64_t m = 0; m < M; ++m) {
    const std::int64_t visible = p.visible_keys(t0 + m % rows);
    for (std::int64_t n = std::max<std::int64_t>(visible - s0, 0); n < N; ++n) L[m * N + n] = kMinusInf;
  }
}

float round_weight(float w, Precision precision) {
  return precision == Precision::bf16 ? round_to_bf16(w) : w;
}

float online_softmax_update(float* p, const float* l, std::int64_t n, float& m, float& l_sum,
                           Precision precision) {
  float m_new = m;
  for (std::int64_t j = 0; j < n; ++j)
    if (l[j] > m_new) m_new = l[j];
  // While every logit so far is -inf (masked), subtract 0 so exp gives 0, not NaN.
  const float base = std::isinf(m_new) && m_new < 0 ? 0.0f : m_new;
  const float corr = std::exp(m - base);
  float sum = 0.0f;
  for (std::int64_t j = 0; j < n; ++j) {
    const float w = std::exp(l[j] - base);
    sum += w;
    p[j] = round_weight(w, precision);
  }
  l_sum = l_sum * corr + sum;
  m = m_new;
  return corr;
}

void write_output_row(const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t g,
                      std::int64_t t, float* acc, float m, float l_sum) {
  if (l_sum == 0.0f) {  // no visible key
    for (std::int64_t h = 0; h < p.H; ++h) acc[h] = 0.0f;
    if (p.lse) *p.lse_at(b, kh, g, t) = -std::numeric_limits<float>::infinity();
  } else {
    const float inv = 1.0f / l_sum;
    for (std::int64_t h = 0; h < p.H; ++h) acc[h] *= inv;
    if (p.lse) *p.lse_at(b, kh, g, t) = m + std::log(l_sum);
  }
  store_row(p.out_row(b, kh, g, t), p.out_dtype, acc, p.H);
}

}  // namespace flashgqa
