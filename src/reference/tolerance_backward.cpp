#include "reference/tolerance_backward.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.hpp"

namespace flashgqa {
namespace {

// 2^-8 under bf16: D may be formed from dout as stored rather than as rounded to bf16.
double dout_for_d_roundoff(Precision precision) { return precision == Precision::bf16 ? 0x1p-8 : 0.0; }

// One gradient's view for the check: its dtype, reference values, magnitudes and reduction depth.
struct GradientTerms {
  Gradient which;
  DType dtype;
  const std::vector<double>* ref;
  const std::vector<double>* abs;
  const std::vector<double>* sq;
  const std::vector<double>* err;
  std::int64_t depth;  // n: terms per element
};

GradientTerms terms(const BackwardProblem& p, const ReferenceGradients& r, Gradient which) {
  const std::int64_t rows = std::max<std::int64_t>(p.fwd.G * p.fwd.T, 1);
  const std::int64_t keys = std::max<std::int64_t>(p.fwd.S, 1);
  switch (which) {
    case Gradient::dq: return {which, p.dq_dtype, &r.dq, &r.dq_abs, &r.dq_sq, &r.dq_err, keys};
    case Gradient::dk: return {which, p.dk_dtype, &r.dk, &r.dk_abs, &r.dk_sq, &r.dk_err, rows};
    case Gradient::dv: break;
  }
  return {which, p.dv_dtype, &r.dv, &r.dv_abs, &r.dv_sq, &r.dv_err, rows};
}

// The header's det and the two bounds of element i: max (det + u_out (|x_ref| + det)) and mean.
struct ElementBound {
  double max_bound, mean_bound;
};
ElementBound element_bound(const BackwardProblem& p, const GradientTerms& g, std::size_t i) {
  const double u_p = operand_roundoff(p.fwd.precision), u_out = unit_roundoff(g.dtype);
  const double abs = (*g.abs)[i], err = (*g.err)[i];
  const double sum = (fp32_gamma(g.depth) + 2 * kU32) * (1 + u_p) * (abs + err);
  const double det = err + u_p * (abs + err) + sum;
  const double stat = err + 4 * u_p * (*g.sq)[i] / std::sqrt(3.0) + sum;
  const double out = u_out * (std::fabs((*g.ref)[i]) + det) + 1e-300;
  return {det + out, stat + out};
}

// The sinks' gradient against the reference (the header's bound), into r's max fields as "dsinks".
void check_dsinks(const BackwardProblem& p, const ReferenceGradients& ref, ErrorReport& r) {
  const double n = static_cast<double>(p.fwd.B * p.fwd.T) * 0x1p-53;
  const double gamma64 = n / (1 - n);
  for (std::size_t i = 0; i < ref.dsinks.size(); ++i) {
    const double x = p.dsinks[i], x_ref = ref.dsinks[i], err_budget = ref.dsinks_err[i];
    if (std::isnan(x) != std::isnan(x_ref)) {
      ++r.nan_mismatches;
      continue;
    }
    if (std::isnan(x)) continue;
    const double bound = err_budget + gamma64 * (ref.dsinks_abs[i] + err_budget) +
                         kU32 * (std::fabs(x_ref) + err_budget) + 1e-300;
    const double err = std::fabs(x - x_ref), ratio = err / bound;
    if (!(ratio <= r.worst_ratio)) {
      r.worst_ratio = ratio;
      r.max_bound = bound;
      r.worst_index = static_cast<std::int64_t>(i);
      r.worst_tensor = "dsinks";
    }
    r.max_err = std::max(r.max_err, err);
  }
}

}  // namespace

Underflow backward_underflow(const BackwardProblem& p, double max_q, double max_k, double max_v,
                             double max_dout) {
  Underflow z = forward_underflow(p.fwd, max_q, max_k, max_v);
  z.dp = kTinyNormal * static_cast<double>(p.fwd.H) * (max_dout + max_v + 2);
  return z;
}

double backward_term_underflow(const BackwardProblem& p, double a, double a_err, double b) {
  const double scale = std::max(1.0, std::fabs(static_cast<double>(p.fwd.scale)));
  return kTinyNormal * scale * (std::fabs(a) + a_err + std::fabs(b) + 2);
}

BackwardRowBudget backward_row_budget(const BackwardProblem& p, double abs_logit, double sink, double lse_ref,
                                      const double* dout, const double* out_ref, const double* abs_pv,
                                      const Underflow& z) {
  const Problem& f = p.fwd;
  // The forward that produced out and lse may have summed in any order (any_key_sums).
  const KeySums sums = any_key_sums(f);
  const double u_d = dout_for_d_roundoff(f.precision);
  double sum_beta = 0.0, sum_out = 0.0;
  for (std::int64_t h = 0; h < f.H; ++h) {
    const double beta = forward_out_error(f, sums, abs_logit, sink, abs_pv[h], out_ref[h], z);
    sum_beta += std::fabs(dout[h]) * beta;
    sum_out += std::fabs(dout[h]) * (std::fabs(out_ref[h]) + beta);
  }
  BackwardRowBudget r;
  r.lse_err = forward_lse_error(f, sums, abs_logit, sink, lse_ref, z);
  r.z = z;
  r.d_err = sum_beta + (u_d + fp32_gamma(f.H)) / (1 - u_d) * sum_out;
  return r;
}

BackwardPairBudget backward_pair_budget(const BackwardProblem& p, const BackwardRowBudget& row,
                                        double lse_ref, double pair_abs_logit, double prob, double x,
                                        double abs_dout_v, double cap_slope) {
  const Problem& f = p.fwd;
  const double u_p = operand_roundoff(f.precision);
  const double e_l = forward_logit_error(f, pair_abs_logit, row.z) + row.lse_err +
                     2 * kU32 * (std::fabs(lse_ref) + 1);
  const double growth = std::expm1(e_l);
  const double rho_f = growth + (1 + growth) * ((1 + kExpRelError) * (1 + kU32) - 1);
  const double rho = rho_f + (1 + rho_f) * u_p;
  const double ax = std::fabs(x);
  const double e_x = (fp32_gamma(f.H) * abs_dout_v + row.d_err) * (1 + kU32) + kU32 * ax + 2 * row.z.dp;
  const double e1 = prob * rho * ax + prob * (1 + rho) * e_x;
  BackwardPairBudget r;
  r.p_rel = rho_f;
  r.ds_err = e1 + kU32 * (prob * ax + e1);
  if (f.softcap != 0.0f) {
    // dS = P (dP - D) sigma, sigma = 1 - t^2 the cap's slope (cap_slope, the reference's), t = S / c
    // from the kernel's capped logit: |dt| <= delta / c + 2 u32 |t| (delta: the capped logit's error;
    // 1/c and the product rounded), e_sigma = 2 |t| dt + dt^2 + 2 u32 (the square and the subtraction),
    // and the product with sigma one more u32.
    const double t = std::sqrt(std::max(0.0, 1.0 - cap_slope));
    const double dt = forward_logit_error(f, pair_abs_logit, row.z) / f.softcap + 2 * kU32 * t;
    const double e_sigma = 2 * t * dt + dt * dt + 2 * kU32;
    const double e2 = r.ds_err * (cap_slope + e_sigma) + prob * ax * e_sigma;
    r.ds_err = e2 + kU32 * (prob * ax * cap_slope + e2);
  }
  return r;
}

double backward_sink_term_error(const BackwardRowBudget& row, double p_sink, double d) {
  const double rho_s = std::expm1(row.lse_err) * (1 + kU32) + 2 * kU32;
  return p_sink * (rho_s * std::fabs(d) + (1 + rho_s) * row.d_err);
}

const char* gradient_name(Gradient which) {
  switch (which) {
    case Gradient::dq: return "dq";
    case Gradient::dk: return "dk";
    case Gradient::dv: return "dv";
  }
  return "unknown";
}

double backward_error_bound(const BackwardProblem& p, const ReferenceGradients& ref, Gradient which,
                            std::int64_t i) {
  return element_bound(p, terms(p, ref, which), static_cast<std::size_t>(i)).max_bound;
}

ErrorReport check_backward_against_reference(const BackwardProblem& p, const ReferenceGradients& ref) {
  const Problem& f = p.fwd;
  ErrorReport r;
  double worst_mean_ratio = -1.0;
  bool means_ok = true;
  for (Gradient which : {Gradient::dq, Gradient::dk, Gradient::dv}) {
    const GradientTerms g = terms(p, ref, which);
    const bool is_dq = which == Gradient::dq;
    const std::int64_t rows = is_dq ? f.B * f.K * f.G * f.T : f.B * f.K * f.S;
    double sum_err = 0.0, sum_bound = 0.0;
    std::int64_t count = 0;
    for (std::int64_t n = 0; n < rows; ++n) {
      // n is the flat row index: (b, k, g, t) for dq, (b, k, s) for dk and dv.
      const void* row;
      if (is_dq) {
        const std::int64_t t = n % f.T, g_ = n / f.T % f.G, kh = n / (f.T * f.G) % f.K,
                           b = n / (f.T * f.G * f.K);
        row = p.dq_row(b, kh, g_, t);
      } else {
        const std::int64_t s = n % f.S, kh = n / f.S % f.K, b = n / (f.S * f.K);
        row = which == Gradient::dk ? p.dk_row(b, kh, s) : p.dv_row(b, kh, s);
      }
      for (std::int64_t h = 0; h < f.H; ++h) {
        const auto i = static_cast<std::size_t>(n * f.H + h);
        const double x = load_element(row, g.dtype, h), x_ref = (*g.ref)[i];
        if (std::isnan(x) != std::isnan(x_ref)) {
          ++r.nan_mismatches;
          continue;
        }
        if (std::isnan(x)) continue;  // both NaN: they agree (and the magnitudes are NaN)
        const double err = std::isinf(x_ref) && x == x_ref ? 0.0 : std::fabs(x - x_ref);
        const ElementBound bound = element_bound(p, g, i);
        const double ratio = err / bound.max_bound;
        if (!(ratio <= r.worst_ratio)) {
          r.worst_ratio = ratio;
          r.max_bound = bound.max_bound;
          r.worst_index = static_cast<std::int64_t>(i);
          r.worst_tensor = gradient_name(which);
        }
        r.max_err = std::max(r.max_err, err);
        sum_err += err;
        sum_bound += bound.mean_bound;
        ++count;
      }
    }
    if (count == 0) continue;
    const double mean_err = sum_err / static_cast<double>(count);
    const double mean_bound = sum_bound / static_cast<double>(count);
    if (!(mean_err <= mean_bound)) means_ok = false;
    const double mean_ratio = mean_err / mean_bound;
    if (!(mean_ratio <= worst_mean_ratio)) {
      worst_mean_ratio = mean_ratio;
      r.mean_err = mean_err;
      r.mean_bound = mean_bound;
    }
  }
  if (p.dsinks != nullptr) check_dsinks(p, ref, r);
  r.ok = r.nan_mismatches == 0 && r.worst_ratio <= 1.0 && means_ok;
  return r;
}

}  // namespace flashgqa
