#include "core/finish_rows.hpp"

#include <cmath>
#include <limits>

#include "core/dtype.hpp"

namespace flashgqa {
namespace {

// The row's end with a sink logit (Options::sinks): the denominator gains e^sink, with no value. In
// units of e^m' with m' = max(m, sink): f = e^(m - m'), l' = l f + e^(sink - m'), out = acc f / l',
// lse = m' + log l'. f is 1 exactly when m >= sink, so a -inf sink gives the bits of no sink. A row
// with l == 0 (it saw no key) has the denominator e^sink alone: out 0, lse = sink (so -inf for a -inf
// sink, the rule without sinks). A NaN m is kept as m', so a NaN still reaches the output. Callers that
// pass m = 0 with an unshifted l (chunked-unstable) get the same meaning: l e^0 is the sum itself.
void finish_row_with_sink(const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t,
                          float* acc, float m, float l, float sink) {
  if (l == 0.0f) {
    for (std::int64_t h = 0; h < p.H; ++h) acc[h] = 0.0f;
    store_row(p.out_row(b, kh, g, t), p.out_dtype, acc, p.H);
    if (p.lse) *p.lse_at(b, kh, g, t) = sink;
    return;
  }
  const float m_new = m >= sink || std::isnan(m) ? m : sink;  // running max over the logits and the sink
  const float f = std::exp(m - m_new);                        // rescales acc and l to units of e^m_new
  const float l_new = l * f + std::exp(sink - m_new);         // denominator with the sink's term
  for (std::int64_t h = 0; h < p.H; ++h) acc[h] = acc[h] * f / l_new;
  store_row(p.out_row(b, kh, g, t), p.out_dtype, acc, p.H);
  if (p.lse) *p.lse_at(b, kh, g, t) = m_new + std::log(l_new);
}

}  // namespace

void finish_row(const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t, float* acc,
                float m, float l) {
  if (p.sinks != nullptr) return finish_row_with_sink(p, b, kh, g, t, acc, m, l, p.sink(kh, g));
  const bool empty = l == 0.0f;
  for (std::int64_t h = 0; h < p.H; ++h) acc[h] = empty ? 0.0f : acc[h] / l;
  store_row(p.out_row(b, kh, g, t), p.out_dtype, acc, p.H);
  if (p.lse) *p.lse_at(b, kh, g, t) = empty ? -std::numeric_limits<float>::infinity() : m + std::log(l);
}

void merge_row(const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t,
               std::int64_t count, const float* m, const float* l, std::int64_t ml_stride, const float* o,
               std::int64_t o_stride, float* acc) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float m_max = kNegInf;
  for (std::int64_t i = 0; i < count; ++i) {
    const float mi = m[i * ml_stride];
    if (mi > m_max || std::isnan(mi)) m_max = mi;
  }
  const float m_use = m_max == kNegInf ? 0.0f : m_max;  // every part saw no key: factors e^-inf = 0
  float l_sum = 0.0f;
  for (std::int64_t h = 0; h < p.H; ++h) acc[h] = 0.0f;
  for (std::int64_t i = 0; i < count; ++i) {
    const float f = std::exp(m[i * ml_stride] - m_use);
    l_sum += l[i * ml_stride] * f;
    const float* oi = o + i * o_stride;
    for (std::int64_t h = 0; h < p.H; ++h) acc[h] += oi[h] * f;
  }
  finish_row(p, b, kh, g, t, acc, m_max, l_sum);
}

}  // namespace flashgqa
