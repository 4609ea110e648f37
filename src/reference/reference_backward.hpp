// The float64 reference of the backward pass: obvious loops, every accumulation in double. It rounds
// the operands as the algorithms do (Precision::bf16: q, k, v and dout to bfloat16 before use, as
// reference_attention rounds q, k and v), then computes the exact gradients of exact softmax attention
// of those operands. The softmax is recomputed here in three passes (max, sum, normalise) over the keys
// each query sees (Problem::visible_keys), never from the saved lse or out, and D_t = sum_j P dP exactly:
//   P[t,j]  = softmax_j(scale q_t.k_j)          dP[t,j] = dout_t . v_j         D_t = sum_j P dP
//   dS[t,j] = P (dP - D_t)    dq_t = scale sum_j dS k_j    dk_j = scale sum_{g,t} dS q_t
//   dv_j    = sum_{g,t} P dout_t                 (dk, dv summed over the G query heads of the kv head)
// A row that sees no key has zero gradients and adds nothing to dk, dv (nor to dsinks: its out is 0).
// With sinks (Problem::sinks) each softmax's denominator holds e^sink, with no value, and the reference
// also returns the sinks' gradient. p.dq, p.dk, p.dv, p.fwd.out and
// p.fwd.lse are not read.
//
// Besides the gradients it returns the magnitudes tolerance_backward.hpp derives its bounds from: for
// every element of each gradient, the sum of |terms| it adds up, the root of the sum of their squares,
// and the sum of the propagated error budgets of its terms (the P and dS budgets of
// tolerance_backward.hpp, which this reference evaluates per (query, key) pair while it has them).
#pragma once

#include <cstdint>
#include <vector>

#include "core/backward_problem.hpp"

namespace flashgqa {

struct ReferenceGradients {
  std::int64_t B = 0, K = 0, G = 0, T = 0, S = 0, H = 0;
  std::vector<double> dq;  // [B,K,G,T,H] contiguous
  std::vector<double> dk;  // [B,K,S,H] contiguous
  std::vector<double> dv;  // [B,K,S,H] contiguous
  std::vector<double> lse;  // [B,K,G,T]: log sum_j exp(scale q.k_j) over visible keys; -inf if none
  std::vector<double> d;    // [B,K,G,T]: D_t = sum_j P dP (0 for a row that sees no key)
  // With sinks, [K*G]: dsink = -sum_{b,t} exp(sink - lse_t) D_t, the sum of |terms| and of their budgets
  // (tolerance_backward.hpp); empty without sinks.
  std::vector<double> dsinks, dsinks_abs, dsinks_err;

  // Per gradient element, in that gradient's layout (x the gradient, x = sum_i term_i):
  //   *_abs = sum_i |term_i|, *_sq = sqrt(sum_i term_i^2), *_err = sum_i (budget of term_i)
  // dq's terms |scale| dS[t,j] k_jh over j; dk's |scale| dS[t,j] q_th and dv's P[t,j] dout_th over (g,t).
  // A term's budget bounds its error before the fp32 accumulation and before the rounding of dS (or P)
  // to the operand precision: tolerance_backward.hpp.
  std::vector<double> dq_abs, dq_sq, dq_err;
  std::vector<double> dk_abs, dk_sq, dk_err;
  std::vector<double> dv_abs, dv_sq, dv_err;

  std::int64_t row(std::int64_t b, std::int64_t k, std::int64_t g, std::int64_t t) const {
    return ((b * K + k) * G + g) * T + t;
  }
  // Flat index of dq[b,k,g,t,h] and of dk/dv[b,k,s,h].
  std::int64_t q_index(std::int64_t b, std::int64_t k, std::int64_t g, std::int64_t t, std::int64_t h) const {
    return row(b, k, g, t) * H + h;
  }
  std::int64_t kv_index(std::int64_t b, std::int64_t k, std::int64_t s, std::int64_t h) const {
    return ((b * K + k) * S + s) * H + h;
  }
};

// The exact gradients of p (see above), with the magnitudes the bounds need.
ReferenceGradients reference_attention_backward(const BackwardProblem& p);

}  // namespace flashgqa
