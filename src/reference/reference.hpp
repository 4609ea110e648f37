// The float64 reference: obvious loops, three-pass softmax (max, sum, normalise), every accumulation in
// double. It applies the same operand rounding as the algorithms (Precision::bf16 rounds q, k and v to
// bfloat16 before use), because that rounding is part of the function the seed defines; what it does
// not reproduce (fp32 accumulation, bf16 softmax weights, the output dtype) is what the tests bound.
//
// Besides the result it returns the magnitudes the tests derive their tolerances from.
#pragma once

#include <cstdint>
#include <vector>

#include "core/problem.hpp"

namespace flashgqa {

struct ReferenceResult {
  std::int64_t B = 0, K = 0, G = 0, T = 0, H = 0;
  std::vector<double> out;        // [B,K,G,T,H] contiguous
  std::vector<double> lse;        // [B,K,G,T]: log sum_j exp(l_j) over visible keys (+ e^sink with sinks);
                                  // -inf if none (the sink with sinks)
  std::vector<double> abs_pv;     // [B,K,G,T,H]: sum_j |w_j| |v_jh| (w the softmax or linear weights)
  std::vector<double> sq_pv;      // [B,K,G,T,H]: sqrt(sum_j (w_j v_jh)^2)
  std::vector<double> abs_logit;  // [B,K,G,T]: max_j |scale| sum_h |q_h k_jh|
  std::vector<double> abs_av;     // linear attention only, [B,K,G,T,H]: sum_j a_j |v_jh| with
                                  // a_j = |scale| sum_h |q_h k_jh| (bounds the logit error's effect)
  // The largest finite |q|, |k|, |v| of the operands as rounded (the bounds' underflow terms).
  double max_abs_q = 0.0, max_abs_k = 0.0, max_abs_v = 0.0;

  std::int64_t row(std::int64_t b, std::int64_t k, std::int64_t g, std::int64_t t) const {
    return ((b * K + k) * G + g) * T + t;
  }
};

// Softmax attention. p.out and p.lse are not touched.
ReferenceResult reference_attention(const Problem& p);

// The seed's linear attention (no softmax): out = sum_j (scale q.k_j) v_j over visible keys.
// lse is left empty.
ReferenceResult reference_linear_attention(const Problem& p);

}  // namespace flashgqa
