// Error bounds of the backward pass, derived from the dtypes' unit roundoff and the reduction depths, and
// the comparison of an algorithm's dq, dk, dv against the float64 reference (reference_backward.hpp).
// The units are tolerance.hpp's: u32 = 2^-24, u_p = 2^-8 under Precision::bf16 (u32 under f32),
// u_out(x) = roundoff of x's dtype, gamma(n) = n u32 / (1 - n u32), eps_exp = kExpRelError. The operands
// q, k, v, dout are rounded identically in the reference, so they contribute no error. First the error
// of each (query t, key j) pair's P and dS, then their propagation through the three sums.
//
// Per row t (a query that sees a key), with the reference's exact values:
//   A_tj = |scale| sum_h |q_h k_jh|, A_t = max_j A_tj;  V_tj = sum_h |dout_h v_jh|;  X_tj = dP_tj - D_t
//   e_lse = the forward's lse bound (tolerance.hpp: its lse is what P is recomputed from)
//         = (gamma(H) + 4 u32) A_t + 2 eps_exp + 2 gamma(S) + 2 u32 (|lse_t| + 1)
//   beta_h = the forward's bound on out_th (tolerance.hpp's max bound per element; D reads out as stored)
//   E_D  = sum_h |dout_h| beta_h + (u_d + gamma(H)) / (1 - u_d) sum_h |dout_h| (|out_h| + beta_h)
//          (D = dout . out in fp32 from out as stored; u_d = 2^-8 under bf16 covers D formed from dout as
//           stored rather than as rounded, 0 under f32)
// Per pair (t, j):
//   e_l   = (gamma(H) + 4 u32) A_tj + e_lse + 2 u32 (|lse_t| + 1)   (logit dot product, scale, s - lse,
//                                                                   a log2(e) fold; and the lse's error)
//   rho_f = exp(e_l) (1 + eps_exp)(1 + u32) - 1          P's relative error in fp32
//   rho   = (1 + rho_f)(1 + u_p) - 1                     the same once rounded to u_p (dS may use either)
//   eX    = (gamma(H) V_tj + E_D)(1 + u32) + u32 |X_tj|   dP = dout . v in fp32, D, the subtraction
//   e_dS  = E1 + u32 (P |X| + E1),  E1 = P rho |X| + P (1 + rho) eX      (P (dP - D), its fp32 product)
//   so |dS_alg - dS| <= e_dS + u_p (|dS| + e_dS), the last term dS's rounding to u_p before dq, dk.
// Each gradient element x = sum_i term_i (n terms, n = S for dq, G T for dk, dv) has budgets
//   dq_th: term |scale| dS_tj k_jh,  budget |scale| e_dS |k_jh|
//   dk_jh: term |scale| dS_tj q_th,  budget |scale| e_dS |q_th|
//   dv_jh: term P_tj dout_th,        budget rho_f P |dout_th|      (P rounded to u_p before dv)
// and with Abs = sum_i |term_i|, Err = sum_i budget_i, Sq = sqrt(sum_i term_i^2) (the reference's):
//   det  = Err + u_p (Abs + Err) + (gamma(n) + 2 u32)(1 + u_p)(Abs + Err)
//          (the terms' errors, their rounding to u_p, the fp32 sum in any order, the scale's product)
//   max bound per element  |x - x_ref| <= det + u_out(x) (|x_ref| + det)
//   mean bound: the u_p roundings are independent zero-mean errors, so their sum has standard deviation
//   <= u_p Sq / sqrt(3); the mean over a gradient's elements of |x - x_ref| stays below the mean of
//   Err + 4 u_p Sq / sqrt(3) + (gamma(n) + 2 u32)(1 + u_p)(Abs + Err) + u_out(x) (|x_ref| + det).
// Underflow (tolerance.hpp: the avx512bf16 kernels flush subnormal operands and results, tiny = 2^-126;
// here per row, with M_q the row's largest |q|, M_dout its largest |dout|, M_k and M_v the kv head's):
//   z_l, z_o, S tiny: the forward's terms (tolerance.hpp) for those maxima, in e_lse, beta_h and e_l
//   z_dp = tiny H (M_dout + M_v + 2)   a dout.v_j (dP) or dout.out (D) product's; eX gains 2 z_dp
//   every gradient term a b (a = dS or P as the kernel sees it, within e_a of the reference's; b = k,
//   q or dout) may lose tiny (|a| + e_a) (b flushed), tiny |b| (a flushed), tiny (the product) and
//   tiny (the accumulator), and the scale may come before or after: its budget gains
//   tiny max(1, |scale|) (|a| + e_a + |b| + 2)        (backward_term_underflow)
//   For operands of normal size these are ~1e-30 and change no bound measurably.
// Sinks: e_lse and beta_h are the forward's bounds with the row's sink (tolerance.hpp, w_sink), and P is
// recomputed from the saved lse as without sinks. The sinks' gradient (backward/sink_gradient.hpp) sums,
// per head, n = B T terms -P_sink D_t, P_sink = exp(sink - lse_t), with D_t = dout . out from both as
// stored (the E_D above; its sum is in double, inside E_D's fp32 gamma(H)) and the exp in double:
//   rho_s = exp(e_lse) (1 + u32) - 1 + u32                      P_sink's relative error (generous for
//                                                               the double difference and exp)
//   budget of a term    P_sink (rho_s |D_t| + (1 + rho_s) E_D)
//   |dsink - dsink_ref| <= Err + gamma64(n) (Abs + Err) + u32 (|dsink_ref| + Err)
//   (gamma64(n) = n 2^-53 / (1 - n 2^-53): the double sum; u32: the result stored as float32)
// First order in the roundoffs except where a product of two relative errors was cheap to keep. A NaN
// where the reference is finite never passes; a NaN where the reference is NaN agrees. The forward's
// out and lse are taken to be within the forward's own bounds (its tests check them).
#pragma once

#include <cstdint>

#include "core/backward_problem.hpp"
#include "reference/reference_backward.hpp"
#include "reference/tolerance.hpp"

namespace flashgqa {

// The per-row terms above: e_lse and E_D.
struct BackwardRowBudget {
  double lse_err = 0.0;  // e_lse
  double d_err = 0.0;    // E_D
  Underflow z;           // z_l, z_o, z_dp of the row
};
// The underflow terms of a row whose operands are at most these in magnitude (see above).
Underflow backward_underflow(const BackwardProblem& p, double max_q, double max_k, double max_v,
                             double max_dout);
// A row of H elements each: dout (rounded as the operands), the exact out and sum_j P |v_jh| (the
// forward reference's abs_pv); abs_logit = A_t, lse_ref = the exact lse (finite), z its underflow terms.
// sink: the row's sink logit (Problem::sink; -inf without sinks).
BackwardRowBudget backward_row_budget(const BackwardProblem& p, double abs_logit, double sink, double lse_ref,
                                      const double* dout, const double* out_ref, const double* abs_pv,
                                      const Underflow& z);
// The budget of one term P_sink D_t of the sinks' gradient (above): p_sink and d the exact values.
double backward_sink_term_error(const BackwardRowBudget& row, double p_sink, double d);
// The underflow budget of one gradient term a b: tiny max(1, |scale|) (|a| + a_err + |b| + 2).
double backward_term_underflow(const BackwardProblem& p, double a, double a_err, double b);

// The per-pair terms above: rho_f and e_dS.
struct BackwardPairBudget {
  double p_rel = 0.0;  // rho_f
  double ds_err = 0.0;  // e_dS
};
// prob = P_tj, x = dP_tj - D_t, abs_dout_v = V_tj, pair_abs_logit = A_tj; cap_slope = 1 - tanh^2(s_tj / c)
// with a softcap c (ignored without one): then dS = P X sigma and
//   e_dS' = E2 + u32 (P |X| sigma + E2),  E2 = e_dS (sigma + e_sigma) + P |X| e_sigma,
//   e_sigma = 2 |t| dt + dt^2 + 2 u32,  dt = delta / c + 2 u32 |t|  (t = tanh(s / c); delta the capped
//   logit's error, forward_logit_error).
BackwardPairBudget backward_pair_budget(const BackwardProblem& p, const BackwardRowBudget& row,
                                        double lse_ref, double pair_abs_logit, double prob, double x,
                                        double abs_dout_v, double cap_slope = 1.0);

enum class Gradient : std::uint8_t { dq, dk, dv };
const char* gradient_name(Gradient which);  // "dq", "dk", "dv"

// The max bound on |x - x_ref| of element i (flat, in the gradient's layout) of gradient `which`.
double backward_error_bound(const BackwardProblem& p, const ReferenceGradients& ref, Gradient which,
                            std::int64_t i);

// Compares p.dq, p.dk, p.dv (read in their dtypes and strides), and p.dsinks when set, with `ref`. ok needs every element within
// its max bound, each gradient's mean |err| within its mean bound, and no NaN mismatch. worst_tensor
// names the gradient of the worst element; mean_err and mean_bound are the gradient's whose ratio is
// largest; the lse fields are unused.
ErrorReport check_backward_against_reference(const BackwardProblem& p, const ReferenceGradients& ref);

}  // namespace flashgqa
