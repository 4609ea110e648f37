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
// Sums over keys (core/key_sums.hpp): each algorithm states d, the fp32 additions a term of its
// denominators and of P.V passes through, and r, the running-max rescale factors a weight is multiplied
// by (ladder.hpp: key_sums). A sum whose terms each pass through at most d additions is within
// gamma(d) sum |terms| of the exact sum whatever the order, so gamma(d) replaces the gamma(S) of a
// sequential sum: the rungs sum in chains of kSumKeys keys and add the chains' sums (d = c + ceil(S / c)
// and the like, rung_kernels.hpp); flash chains a task's keys in pv_tile and merges its KV splits
// (d = keys per task + splits + 1, r = KV blocks per task + 2; kv_splits.hpp). The bound stays
// meaningful at long S only because d does: at S = 2^22 a sequential sum's gamma(S) is 1/3, and
// S rescales of 2^-20 each are 8, while chains of 256 give gamma(16640) = 1e-3.
// any_key_sums(p) = (S, S) is true of every algorithm here; it is the default of the check.
//
// Underflow: vdpbf16ps and vcvtne2ps2bf16 (the avx512bf16 kernels) treat bf16 and fp32 subnormals as
// zero, in their operands and their results, and every exp below 2^-126 has only an absolute error
// (kernels/microkernels.hpp). With tiny = 2^-126 and M_q, M_k, M_v the largest finite |q|, |k|, |v|
// (ReferenceResult::max_abs_*), each dropped value is below tiny, so:
//   a logit (H products, H additions) loses at most sum_h (tiny |k_jh| + tiny |q_h|) for an operand
//   flushed, tiny per product flushed and tiny per accumulator result flushed:
//                         z_l = |scale| tiny H (M_q + M_k + 2)
//   an output element: each weight P_j in [0, 1] (unnormalised, the row max gives 1, so l >= 1) may
//   lose tiny (flushed to bf16 or an exp below 2^-126): numerator sum_j tiny |v_jh| <= S tiny M_v,
//   denominator S tiny (relative, l >= 1) times |o| <= M_v; a v flushed loses sum_j P_j tiny / l = tiny;
//   each product and each accumulator result flushed loses tiny / l: 2 S tiny. With the output dtype's
//   own underflow u_min (half its smallest subnormal step: 2^-25 f16; tiny for bf16 and f32, which
//   covers a flushing store):
//                         z_o = tiny (S (2 M_v + 2) + 1) + u_min
//   For operands of normal size these are ~1e-30 and change no bound measurably; for inputs ~1e-40
//   (all flushed: the avx512bf16 path returns 0) they are what the bound allows.
//
// Softmax attention, per row (query) with A = max_j |scale| sum_h |q_h k_jh| over visible keys:
//   logit error           delta = (gamma(H) + 4 u32) A + z_l      (dot product, scale, l - m, underflow)
//                         with a softcap c: + (eps_tanh + 3 u32) min(A, c): the cap's slope
//                         1 - tanh^2 <= 1 passes the error of s unchanged at most, and the kernels' cap
//                         errs by (eps_tanh + 3 u32) of the capped logit (kTanhMaxRelError, microkernels.hpp)
//   weight rel. error     w_rel = exp(2 delta) - 1 + 2 eps_exp + u_p + 2 gamma(d) + 2 u32
//                                 + 2 r (eps_exp + u32)
//                         (numerator and denominator logits, both exps, P rounding, denominator sum,
//                          the final division; and the running-max rescales: each KV block's
//                          accumulated weight is a product of up to r computed factors
//                          exp(m_old - m_new), the same for numerator and denominator of that block
//                          but not across blocks, so the weighted mean moves by twice their error)
//   max bound per element |o - o_ref| <= w_rel sum_j p_j |v_jh| + gamma(d) sum_j p_j |v_jh| + z_o
//                                        + u_out (|o_ref| + that)
//   mean bound: the P roundings are independent zero-mean errors, so their sum over j has standard
//   deviation <= u_p sqrt(sum_j (p_j v_jh)^2) / sqrt(3); the mean over elements of |error| stays below
//   the mean of 4 such deviations plus the deterministic terms above.
//   lse:                  |lse - lse_ref| <= delta + 2 eps_exp + 2 gamma(d) + 2 u32 (|lse_ref| + 1)
//                                           + S tiny                 (l's underflow, relative: l >= 1)
// Sinks (Options::sinks; core/finish_rows.cpp): the row's denominator gains the exact e^sink, with no
// value. The weights keep their errors and the sink's term has none of its own (the row's computed max
// m cancels: acc and l are both in units of e^m), so the weighted mean keeps the bound above with p_j
// now over the larger denominator. The row's end adds: one factor e^(m - m') or e^(sink - m') (the
// other is e^0 = 1 exactly; m' = max(m, sink)), whose exp has eps_exp and whose exponent is rounded:
// m is the running max (|m| <= A), or, from the naive rung, the keys' lse base + ln l in fp32 (|m| <=
// A + ln S; ln l and the sum rounded, u32 ln S and u32 |m|; its O was divided by that same computed l,
// so l's own error cancels), and m - sink is rounded, u32 (A + ln S + |sink|). The out's sensitivity
// to the factor is at most 1. Then the products l f and acc f and the sum l f + e^(sink - m'): u32
// each. So, for a finite sink (one formula for every rung: the naive rung's is the largest),
//                         w_sink = eps_exp + u32 (2 A + 3 ln(S + 1) + |sink| + 3)
// joins w_rel (it multiplies |o| <= sum_j p_j |v_jh|) and the lse bound (a relative error of l' is an
// absolute error of log l'); 0 for a -inf sink (f = 1, e^-inf = 0 exactly: the bits of no sink). A
// factor below tiny has an absolute error below tiny: acc f / l' moves by at most tiny S M_v (acc <= S
// M_v l, l' >= 1), inside z_o, and l' by at most tiny, inside S tiny.
// Linear attention (weights w_j = scale q.k_j, rounded to u_p), with W = |scale| H M_q M_k >= |w_j|:
//   |o - o_ref| <= (gamma(H) + 2 u32) sum_j a_j |v_jh| + (u_p + gamma(d)) sum_j |w_j v_jh|
//                  + S (z_l M_v + tiny (M_v + W + 2)) + u_min + u_out (...)
//   (a logit's underflow times |v|; a weight flushed; a v flushed times |w|; a product and a result
//    flushed)
// A NaN where the reference is finite never passes; a NaN where the reference is NaN agrees.
#pragma once

#include <cstdint>
#include <string>

#include "core/key_sums.hpp"
#include "core/problem.hpp"
#include "reference/reference.hpp"

namespace flashgqa {

// Relative error budget of every exp the library evaluates (std::exp and the vectorised exps).
inline constexpr double kExpRelError = 0x1p-20;
// Unit roundoff of fp32 (u32).
inline constexpr double kU32 = 0x1p-24;
// The smallest normal fp32 (tiny): vdpbf16ps and vcvtne2ps2bf16 flush what lies below it.
inline constexpr double kTinyNormal = 0x1p-126;

// The units and the forward's bounds above, in one place: check_against_reference and the backward's
// bounds (tolerance_backward.hpp, which start from the forward's out and lse) both call these.
double unit_roundoff(DType dtype);             // u_out: 2^-8 bf16, 2^-11 f16, 2^-24 f32
double underflow_roundoff(DType dtype);        // u_min: 2^-25 f16, tiny bf16 and f32
double operand_roundoff(Precision precision);  // u_p: 2^-8 under bf16, u32 under f32
double fp32_gamma(std::int64_t n);             // gamma(n) = n u32 / (1 - n u32)
// (S, S): a depth and a rescale count no algorithm here exceeds (the check's default).
KeySums any_key_sums(const Problem& p);

// The absolute terms of underflow above, for operands at most max_q, max_k, max_v in magnitude.
struct Underflow {
  double logit = 0.0;  // z_l
  double out = 0.0;    // z_o
  double lse = 0.0;    // S tiny
  double linear = 0.0;  // linear attention's S (z_l M_v + tiny (M_v + W + 2)) + u_min
  double dp = 0.0;     // the backward's: a dout.v (or dout.out) product's, tolerance_backward.hpp
};
Underflow forward_underflow(const Problem& p, double max_q, double max_k, double max_v);

// Softmax attention, one row with A = abs_logit (ReferenceResult::abs_logit) and sink logit `sink`
// (Problem::sink: -inf without sinks), summed as `sums` says:
double forward_logit_error(const Problem& p, double abs_logit, const Underflow& z);  // delta
double forward_sink_error(const Problem& p, double abs_logit, double sink);          // w_sink
double forward_weight_rel_error(const Problem& p, const KeySums& sums, double abs_logit, double sink,
                                const Underflow& z);  // w_rel (with w_sink)
// |lse - lse_ref| for a finite lse_ref.
double forward_lse_error(const Problem& p, const KeySums& sums, double abs_logit, double sink, double lse_ref,
                         const Underflow& z);
// The max bound on |o - o_ref| of one element, abs_pv = sum_j p_j |v_jh| (ReferenceResult::abs_pv).
double forward_out_error(const Problem& p, const KeySums& sums, double abs_logit, double sink, double abs_pv,
                         double out_ref, const Underflow& z);

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

// Compares p.out (and p.lse when set) with `ref`, for an algorithm that sums as `sums` says (without
// it: any_key_sums, true of every algorithm). `linear` selects the linear-attention bound.
ErrorReport check_against_reference(const Problem& p, const ReferenceResult& ref, bool linear = false);
ErrorReport check_against_reference(const Problem& p, const ReferenceResult& ref, const KeySums& sums,
                                    bool linear = false);

// Errors a path adds beyond the arithmetic the bounds above describe, for the check's caller to state:
// the int8 cache's integer form (FlashKernels::int8_on_integers, microkernels.hpp), checked against
// the reference on the float32 products under Precision::f32 (those kernels round neither K nor V
// operands), adds
//   logit:   |scale| H M_q M_k (2^-16 + 2^-22): each Q row quantized to int16 against its largest
//            |q|, m: |q - q_int fl(m / 32767)| <= m (2^-16 + 2^-22), times sum_h |k_h| <= H M_k;
//   weights: 2^-8: P is rounded to bf16 before it is weighted, as under Precision::bf16;
//   output:  16 * 128 (2^-16 + 2^-22) max_j s_j: per row and group of 16 keys the int16 weights err by
//            at most W (2^-16 + 2^-22) each (W = max_j P_j s_j <= the group's largest P times max_j
//            s_j), on |x_j| <= 128, and the groups' largest P add up to at most the row's sum l.
struct ExtraError {
  double logit = 0.0;       // added to delta (so to the weights' and the lse's bounds)
  double weight_rel = 0.0;  // added to w_rel
  double out = 0.0;         // added to each output element's bound, before the output's rounding
};
ErrorReport check_against_reference(const Problem& p, const ReferenceResult& ref, const KeySums& sums, bool linear,
                                    const ExtraError& extra);

}  // namespace flashgqa
