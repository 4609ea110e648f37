#include "reference/reference_backward.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/dtype.hpp"
#include "reference/tolerance_backward.hpp"

namespace flashgqa {
namespace {

// Operand as the algorithms see it, widened to double.
double operand(const void* row, DType dtype, std::int64_t i, Precision precision) {
  const float x = load_element(row, dtype, i);
  return precision == Precision::bf16 ? round_to_bf16(x) : x;
}

void load_operand_row(double* dst, const void* row, DType dtype, std::int64_t n, Precision precision) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = operand(row, dtype, i, precision);
}

ReferenceGradients allocate(const BackwardProblem& p) {
  const Problem& f = p.fwd;
  ReferenceGradients r;
  r.B = f.B, r.K = f.K, r.G = f.G, r.T = f.T, r.S = f.S, r.H = f.H;
  const auto rows = static_cast<std::size_t>(f.B * f.K * f.G * f.T);
  const auto q_elems = rows * static_cast<std::size_t>(f.H);
  const auto kv_elems = static_cast<std::size_t>(f.B * f.K * f.S * f.H);
  for (auto* x : {&r.dq, &r.dq_abs, &r.dq_sq, &r.dq_err}) x->assign(q_elems, 0.0);
  for (auto* x : {&r.dk, &r.dk_abs, &r.dk_sq, &r.dk_err, &r.dv, &r.dv_abs, &r.dv_sq, &r.dv_err})
    x->assign(kv_elems, 0.0);
  if (f.sinks != nullptr)
    for (auto* x : {&r.dsinks, &r.dsinks_abs, &r.dsinks_err}) x->assign(static_cast<std::size_t>(f.K * f.G), 0.0);
  r.lse.assign(rows, -std::numeric_limits<double>::infinity());
  r.d.assign(rows, 0.0);
  return r;
}

// One query row's softmax over its visible keys, in three passes, and the values derived from it.
// Index i is key keys.begin + i.
struct RowSoftmax {
  std::vector<double> p;      // P
  std::vector<double> a;      // A_tj = |scale| sum_h |q_h k_jh|
  std::vector<double> slope;  // the softcap's 1 - tanh^2(s_tj / c) (1 without a softcap)
  std::vector<double> dp;     // dP = dout . v_j
  std::vector<double> v_abs;  // V_tj = sum_h |dout_h v_jh|
  std::vector<double> out, abs_pv;  // [H]: sum_j P v_jh, sum_j P |v_jh|
  double lse = 0.0, d = 0.0, a_max = 0.0;
};

void row_softmax(RowSoftmax& r, const Problem& f, const double* q, const double* dout, const double* k,
                 const double* v, KeyRange keys, double sink) {
  const std::int64_t n = keys.size(), H = f.H;
  const double scale = f.scale;
  r.p.assign(static_cast<std::size_t>(n), 0.0);
  r.a.assign(r.p.size(), 0.0);
  r.slope.assign(r.p.size(), 1.0);
  r.dp.assign(r.p.size(), 0.0);
  r.v_abs.assign(r.p.size(), 0.0);
  r.out.assign(static_cast<std::size_t>(H), 0.0);
  r.abs_pv.assign(r.out.size(), 0.0);
  r.a_max = 0.0;
  // Logits, dP and the magnitudes.
  for (std::int64_t i = 0; i < n; ++i) {
    const double* kj = k + (keys.begin + i) * H;
    const double* vj = v + (keys.begin + i) * H;
    double dot = 0.0, abs_dot = 0.0, dp = 0.0, abs_dp = 0.0;
    for (std::int64_t h = 0; h < H; ++h) {
      dot += q[h] * kj[h];
      abs_dot += std::fabs(q[h] * kj[h]);
      dp += dout[h] * vj[h];
      abs_dp += std::fabs(dout[h] * vj[h]);
    }
    const auto u = static_cast<std::size_t>(i);
    r.p[u] = scale * dot;
    if (f.softcap != 0.0f) {  // c tanh(s / c), and the cap's slope 1 - tanh^2 for dS
      const double th = std::tanh(r.p[u] / f.softcap);
      r.p[u] = f.softcap * th;
      r.slope[u] = 1.0 - th * th;
    }
    r.a[u] = std::fabs(scale) * abs_dot;
    r.dp[u] = dp;
    r.v_abs[u] = abs_dp;
    r.a_max = std::max(r.a_max, r.a[u]);
  }
  // Pass 1: the max over the logits and the sink (-inf: none; a NaN logit is skipped here and poisons
  // pass 2).
  double m = sink;
  for (double x : r.p)
    if (x > m) m = x;
  const double base = std::isinf(m) && m < 0 ? 0.0 : m;
  // Pass 2: the denominator, with the sink's term (no value attached).
  double sum = std::exp(sink - base);
  for (double x : r.p) sum += std::exp(x - base);
  // Pass 3: the normalised weights; D = sum_j P dP; out and sum_j P |v_j| for the forward's bound.
  r.d = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto u = static_cast<std::size_t>(i);
    r.p[u] = std::exp(r.p[u] - base) / sum;
    r.d += r.p[u] * r.dp[u];
    const double* vj = v + (keys.begin + i) * H;
    for (std::int64_t h = 0; h < H; ++h) {
      r.out[static_cast<std::size_t>(h)] += r.p[u] * vj[h];
      r.abs_pv[static_cast<std::size_t>(h)] += r.p[u] * std::fabs(vj[h]);
    }
  }
  r.lse = base + std::log(sum);
}

// The largest finite |x| of x[0..n).
double max_abs(const double* x, std::int64_t n) {
  double m = 0.0;
  for (std::int64_t i = 0; i < n; ++i)
    if (const double a = std::fabs(x[i]); std::isfinite(a) && a > m) m = a;
  return m;
}

// x += term, with its magnitudes: abs += |term|, sq += term^2, err += budget.
void accumulate(std::vector<double>& x, std::vector<double>& abs, std::vector<double>& sq,
                std::vector<double>& err, std::int64_t i, double term, double budget) {
  const auto u = static_cast<std::size_t>(i);
  x[u] += term;
  abs[u] += std::fabs(term);
  sq[u] += term * term;
  err[u] += budget;
}

}  // namespace

ReferenceGradients reference_attention_backward(const BackwardProblem& p) {
  const Problem& f = p.fwd;
  ReferenceGradients r = allocate(p);
  const std::int64_t H = f.H;
  const double scale = f.scale, abs_scale = std::fabs(scale);
  std::vector<double> k(static_cast<std::size_t>(f.S * H)), v(k.size());
  std::vector<double> q(static_cast<std::size_t>(H)), dout(q.size());
  RowSoftmax row;
  for (std::int64_t b = 0; b < f.B; ++b)
    for (std::int64_t kh = 0; kh < f.K; ++kh) {
      for (std::int64_t s = 0; s < f.S; ++s) {
        load_operand_row(k.data() + s * H, f.k_row(b, kh, s), f.k_dtype, H, f.precision);
        load_operand_row(v.data() + s * H, f.v_row(b, kh, s), f.v_dtype, H, f.precision);
      }
      const double max_k = max_abs(k.data(), f.S * H), max_v = max_abs(v.data(), f.S * H);
      for (std::int64_t g = 0; g < f.G; ++g)
        for (std::int64_t t = 0; t < f.T; ++t) {
          const KeyRange keys = f.visible_keys(t);
          const double sink = f.sink(kh, g);
          const auto ri = static_cast<std::size_t>(r.row(b, kh, g, t));
          if (keys.empty()) {  // sees no key: zero gradients, nothing added to dk, dv (out = 0: nor dsinks)
            r.lse[ri] = sink;
            continue;
          }
          load_operand_row(q.data(), f.q_row(b, kh, g, t), f.q_dtype, H, f.precision);
          load_operand_row(dout.data(), p.dout_row(b, kh, g, t), p.dout_dtype, H, f.precision);
          row_softmax(row, f, q.data(), dout.data(), k.data(), v.data(), keys, sink);
          r.lse[ri] = row.lse;
          r.d[ri] = row.d;
          const Underflow z = backward_underflow(p, max_abs(q.data(), H), max_k, max_v, max_abs(dout.data(), H));
          const BackwardRowBudget budget = backward_row_budget(p, row.a_max, sink, row.lse, dout.data(),
                                                               row.out.data(), row.abs_pv.data(), z);
          if (f.sinks != nullptr) {  // dsink -= P_sink D, with its budget (tolerance_backward.hpp)
            const auto hi = static_cast<std::size_t>(kh * f.G + g);
            const double p_sink = std::exp(sink - row.lse);
            r.dsinks[hi] -= p_sink * row.d;
            r.dsinks_abs[hi] += p_sink * std::fabs(row.d);
            r.dsinks_err[hi] += backward_sink_term_error(budget, p_sink, row.d);
          }
          for (std::int64_t i = 0; i < keys.size(); ++i) {
            const auto u = static_cast<std::size_t>(i);
            const std::int64_t j = keys.begin + i;
            const double prob = row.p[u], x = row.dp[u] - row.d;
            const double ds = prob * x * row.slope[u];  // dS = P (dP - D) (1 - tanh^2 with a softcap)
            const BackwardPairBudget pair =
                backward_pair_budget(p, budget, row.lse, row.a[u], prob, x, row.v_abs[u], row.slope[u]);
            const double* kj = k.data() + j * H;
            for (std::int64_t h = 0; h < H; ++h) {
              const std::int64_t qi = r.q_index(b, kh, g, t, h), kvi = r.kv_index(b, kh, j, h);
              const auto uh = static_cast<std::size_t>(h);
              // dq_t += scale dS k_j;  dk_j += scale dS q_t;  dv_j += P dout_t
              // (each budget with the term's underflow, tolerance_backward.hpp)
              accumulate(r.dq, r.dq_abs, r.dq_sq, r.dq_err, qi, scale * ds * kj[h],
                         abs_scale * pair.ds_err * std::fabs(kj[h]) +
                             backward_term_underflow(p, ds, pair.ds_err, kj[h]));
              accumulate(r.dk, r.dk_abs, r.dk_sq, r.dk_err, kvi, scale * ds * q[uh],
                         abs_scale * pair.ds_err * std::fabs(q[uh]) +
                             backward_term_underflow(p, ds, pair.ds_err, q[uh]));
              accumulate(r.dv, r.dv_abs, r.dv_sq, r.dv_err, kvi, prob * dout[uh],
                         pair.p_rel * prob * std::fabs(dout[uh]) +
                             backward_term_underflow(p, prob, pair.p_rel * prob, dout[uh]));
            }
          }
        }
    }
  for (auto* sq : {&r.dq_sq, &r.dk_sq, &r.dv_sq})
    for (double& x : *sq) x = std::sqrt(x);
  return r;
}

}  // namespace flashgqa
