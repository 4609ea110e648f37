// Error bounds derived from the dtypes' unit roundoff and the reduction depths, and the comparison of
// an algorithm's output against the float64 reference. Used by the tests and by `flashgqa attention
// --check`, so both judge with the same formula.
//
// Units: u32 = 2^-24 (fp32 accumulation), u_p = unit roundoff of the softmax weights entering P.V
// (2^-8 under Precision::bf16, u32 under f32), u_out = roundoff of the output dtype (2^-8 bf16,
// 2^-11 f16, 2^-24 f32), gamma(n) = n u32 / (1 - n u32) (an n-term fp32 sum), eps_exp = kExpRelError
// (the budget every exp in the library must meet, tested with the vectorised exps).
// The operands q, k, v are rounded identically in the reference, so they contribute no error.
//
// Softmax attention, per row (query) with A = max_j |scale| sum_h |q_h k_jh| over visible keys:
//   logit error           delta = (gamma(H) + 4 u32) A        (dot product, scale, l - m)
//   weight rel. error     w_rel = exp(2 delta) - 1 + 2 eps_exp + u_p + 2 gamma(S) + 2 u32
//                                 + 2 S (eps_exp + u32)
//                         (numerator and denominator logits, both exps, P rounding, denominator sum,
//                          the final division; and the running-max rescales: each KV block's
//                          accumulated weight is a product of up to (number of KV blocks) <= S computed
//                          factors exp(m_old - m_new), the same for numerator and denominator of that
//                          block but not across blocks, so the weighted mean moves by twice their error)
//   max bound per element |o - o_ref| <= w_rel sum_j p_j |v_jh| + gamma(S) sum_j p_j |v_jh|
//                                        + u_out (|o_ref| + that)
//   mean bound: the P roundings are independent zero-mean errors, so their sum over j has standard
//   deviation <= u_p sqrt(sum_j (p_j v_jh)^2) / sqrt(3); the mean over elements of |error| stays below
//   the mean of 4 such deviations plus the deterministic terms above.
//   lse:                  |lse - lse_ref| <= delta + 2 eps_exp + 2 gamma(S) + 2 u32 (|lse_ref| + 1)
// Linear attention (weights w_j = scale q.k_j, rounded to u_p):
//   |o - o_ref| <= (gamma(H) + 2 u32) sum_j a_j |v_jh| + (u_p + gamma(S)) sum_j |w_j v_jh| + u_out (...)
// A NaN where the reference is finite never passes; a NaN where the reference is NaN agrees.
#pragma once

#include <cstdint>
#include <string>

#include "core/problem.hpp"
#include "reference/reference.hpp"

namespace flashgqa {

// Relative error budget of every exp the library evaluates (std::exp and the vectorised exps).
inline constexpr double kExpRelError = 0x1p-20;
// Unit roundoff of fp32 (u32).
inline constexpr double kU32 = 0x1p-24;

// The units and the forward's bounds above, in one place: check_against_reference and the backward's
// bounds (tolerance_backward.hpp, which start from the forward's out and lse) both call these.
double unit_roundoff(DType dtype);             // u_out: 2^-8 bf16, 2^-11 f16, 2^-24 f32
double operand_roundoff(Precision precision);  // u_p: 2^-8 under bf16, u32 under f32
double fp32_gamma(std::int64_t n);             // gamma(n) = n u32 / (1 - n u32)
// Softmax attention, one row with A = abs_logit (ReferenceResult::abs_logit):
double forward_logit_error(const Problem& p, double abs_logit);       // delta
double forward_weight_rel_error(const Problem& p, double abs_logit);  // w_rel
// |lse - lse_ref| for a finite lse_ref.
double forward_lse_error(const Problem& p, double abs_logit, double lse_ref);
// The max bound on |o - o_ref| of one element, abs_pv = sum_j p_j |v_jh| (ReferenceResult::abs_pv).
double forward_out_error(const Problem& p, double abs_logit, double abs_pv, double out_ref);

struct ErrorReport {
  double max_err = 0.0;    // max |o - o_ref| over elements
  double max_bound = 0.0;  // the bound at the element where err/bound is largest
  double worst_ratio = 0.0;  // max err/bound (<= 1 passes)
  double mean_err = 0.0;
  double mean_bound = 0.0;
  double lse_max_err = 0.0;
  double lse_worst_ratio = 0.0;
  std::int64_t nan_mismatches = 0;  // NaN in out (or lse) where the reference is not NaN, or vice versa
  std::int64_t worst_index = -1;    // flat [B,K,G,T,H] index of the worst element
  // The backward's checks: the gradient holding the worst element ("dq", "dk" or "dv"; worst_index is
  // then flat in its layout) and, in the mean fields, the gradient whose mean err/bound is largest.
  const char* worst_tensor = nullptr;
  bool ok = true;

  std::string describe() const;  // one line: errors, bounds, verdict
};

// Compares p.out (and p.lse when set) with `ref`. `linear` selects the linear-attention bound.
ErrorReport check_against_reference(const Problem& p, const ReferenceResult& ref, bool linear = false);

}  // namespace flashgqa
