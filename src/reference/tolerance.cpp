#include "reference/tolerance.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/dtype.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa {
double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::f32: return kU32;
    case DType::bf16: return 0x1p-8;
    case DType::f16: return 0x1p-11;
    case DType::i8: return 0.5;  // never an output; an integer's rounding relative to a unit scale
  }
  return 1.0;
}

double underflow_roundoff(DType dtype) { return dtype == DType::f16 ? 0x1p-25 : kTinyNormal; }

double operand_roundoff(Precision precision) { return precision == Precision::bf16 ? 0x1p-8 : kU32; }

double fp32_gamma(std::int64_t n) {
  const double nu = static_cast<double>(n) * kU32;
  return nu / (1.0 - nu);
}

KeySums any_key_sums(const Problem& p) {
  const std::int64_t s = std::max<std::int64_t>(p.S, 1);
  return {s, s};
}

Underflow forward_underflow(const Problem& p, double max_q, double max_k, double max_v) {
  const auto H = static_cast<double>(p.H), S = static_cast<double>(std::max<std::int64_t>(p.S, 1));
  const double abs_scale = std::fabs(static_cast<double>(p.scale));
  Underflow z;
  z.logit = abs_scale * kTinyNormal * H * (max_q + max_k + 2);
  z.out = kTinyNormal * (S * (2 * max_v + 2) + 1) + underflow_roundoff(p.out_dtype);
  z.lse = S * kTinyNormal;
  const double w = abs_scale * H * max_q * max_k;
  z.linear = S * (z.logit * max_v + kTinyNormal * (max_v + w + 2)) + underflow_roundoff(p.out_dtype);
  return z;
}

double forward_logit_error(const Problem& p, double abs_logit, const Underflow& z) {
  const double delta = (fp32_gamma(p.H) + 4 * kU32) * abs_logit + z.logit;
  if (p.softcap == 0.0f) return delta;
  // c tanh(s / c) has slope 1 - tanh^2 <= 1, so the error of s passes at most unchanged; the kernel's
  // cap adds (kTanhMaxRelError + 3 u32) of the capped logit, whose size is at most min(A, c).
  return delta + (kTanhMaxRelError + 3 * kU32) * std::min(abs_logit, static_cast<double>(p.softcap));
}

double forward_sink_error(const Problem& p, double abs_logit, double sink) {
  if (std::isinf(sink) && sink < 0) return 0.0;  // no sink: the row's end is the plain one
  const double log_s = std::log(static_cast<double>(p.S) + 1);
  return kExpRelError + kU32 * (2 * abs_logit + 3 * log_s + std::fabs(sink) + 3);
}

double forward_weight_rel_error(const Problem& p, const KeySums& sums, double abs_logit, double sink,
                                const Underflow& z) {
  const double rescales = 2.0 * static_cast<double>(sums.rescales) * (kExpRelError + kU32);
  return std::expm1(2 * forward_logit_error(p, abs_logit, z)) + 2 * kExpRelError +
         operand_roundoff(p.precision) + 2 * fp32_gamma(sums.depth) + 2 * kU32 + rescales +
         forward_sink_error(p, abs_logit, sink);
}

double forward_lse_error(const Problem& p, const KeySums& sums, double abs_logit, double sink, double lse_ref,
                         const Underflow& z) {
  return forward_logit_error(p, abs_logit, z) + 2 * kExpRelError + 2 * fp32_gamma(sums.depth) +
         2 * kU32 * (std::fabs(lse_ref) + 1) + z.lse + forward_sink_error(p, abs_logit, sink);
}

double forward_out_error(const Problem& p, const KeySums& sums, double abs_logit, double sink, double abs_pv,
                         double out_ref, const Underflow& z) {
  const double det = (forward_weight_rel_error(p, sums, abs_logit, sink, z) + fp32_gamma(sums.depth)) * abs_pv + z.out;
  return det + unit_roundoff(p.out_dtype) * (std::fabs(out_ref) + det);
}

std::string ErrorReport::describe() const {
  char lse[96] = "";
  if (lse_worst_ratio > 0.0)  // lse was checked (and some element of it differs)
    std::snprintf(lse, sizeof lse, ", lse max |err| %.3e (worst err/bound %.3f)", lse_max_err, lse_worst_ratio);
  char buf[416];
  std::snprintf(buf, sizeof buf,
                "max |err| %.3e (worst err/bound %.3f%s%s), mean |err| %.3e (bound %.3e)%s%s: %s", max_err,
                worst_ratio, worst_tensor ? " in " : "", worst_tensor ? worst_tensor : "", mean_err,
                mean_bound, lse, nan_mismatches ? ", NaN mismatches" : "", ok ? "ok" : "FAIL");
  return buf;
}

ErrorReport check_against_reference(const Problem& p, const ReferenceResult& ref, bool linear) {
  return check_against_reference(p, ref, any_key_sums(p), linear);
}

ErrorReport check_against_reference(const Problem& p, const ReferenceResult& ref, const KeySums& sums,
                                    bool linear) {
  return check_against_reference(p, ref, sums, linear, ExtraError{});
}

ErrorReport check_against_reference(const Problem& p, const ReferenceResult& ref, const KeySums& sums, bool linear,
                                    const ExtraError& extra) {
  ErrorReport r;
  const double u_p = operand_roundoff(p.precision);
  const double u_out = unit_roundoff(p.out_dtype);
  const double g_h = fp32_gamma(p.H), g_s = fp32_gamma(sums.depth);
  const Underflow z = forward_underflow(p, ref.max_abs_q, ref.max_abs_k, ref.max_abs_v);
  double sum_err = 0.0, sum_bound = 0.0;
  std::int64_t count = 0;
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh)
      for (std::int64_t g = 0; g < p.G; ++g)
        for (std::int64_t t = 0; t < p.T; ++t) {
          const std::int64_t row = ref.row(b, kh, g, t);
          const double a = ref.abs_logit[static_cast<std::size_t>(row)];
          const double sink = p.sink(kh, g);
          const double delta = forward_logit_error(p, a, z);
          const double w_rel = forward_weight_rel_error(p, sums, a, sink, z) + extra.weight_rel +
                               (std::expm1(2 * (delta + extra.logit)) - std::expm1(2 * delta));
          const void* out_row = p.out_row(b, kh, g, t);
          for (std::int64_t h = 0; h < p.H; ++h) {
            const auto i = static_cast<std::size_t>(row * p.H + h);
            const double o = load_element(out_row, p.out_dtype, h);
            const double o_ref = ref.out[i];
            double det, stat;  // deterministic worst case; statistical (mean) estimate
            if (linear) {
              det = (g_h + 2 * kU32) * ref.abs_av[i] + (u_p + g_s) * ref.abs_pv[i] + z.linear;
              stat = det;
            } else {
              const double fixed = w_rel - u_p + g_s;
              det = (w_rel + g_s) * ref.abs_pv[i] + z.out + extra.out;
              stat = fixed * ref.abs_pv[i] + 4 * u_p * ref.sq_pv[i] / std::sqrt(3.0) + z.out + extra.out;
            }
            const double bound = det + u_out * (std::fabs(o_ref) + det) + 1e-300;
            const double mean_bound = stat + u_out * (std::fabs(o_ref) + det) + 1e-300;
            double err = std::fabs(o - o_ref);
            if (std::isnan(o) != std::isnan(o_ref)) {
              ++r.nan_mismatches;
              continue;
            }
            if (std::isnan(o)) err = 0.0;  // both NaN: they agree
            if (std::isinf(o_ref) && o == o_ref) err = 0.0;
            const double ratio = err / bound;
            if (!(ratio <= r.worst_ratio)) {
              r.worst_ratio = ratio;
              r.max_bound = bound;
              r.worst_index = static_cast<std::int64_t>(i);
            }
            r.max_err = std::max(r.max_err, err);
            sum_err += err;
            sum_bound += mean_bound;
            ++count;
          }
          if (p.lse != nullptr && !linear) {
            const double l = *p.lse_at(b, kh, g, t);
            const double l_ref = ref.lse[static_cast<std::size_t>(row)];
            if (std::isnan(l) != std::isnan(l_ref)) {
              ++r.nan_mismatches;
            } else if (std::isinf(l_ref) || std::isinf(l)) {
              if (l != l_ref) ++r.nan_mismatches;  // -inf must match -inf exactly
            } else if (!std::isnan(l)) {
              const double bound = forward_lse_error(p, sums, a, sink, l_ref, z) + extra.logit;
              const double err = std::fabs(l - l_ref);
              r.lse_max_err = std::max(r.lse_max_err, err);
              r.lse_worst_ratio = std::max(r.lse_worst_ratio, err / bound);
            }
          }
        }
  if (count > 0) {
    r.mean_err = sum_err / static_cast<double>(count);
    r.mean_bound = sum_bound / static_cast<double>(count);
  }
  r.ok = r.nan_mismatches == 0 && r.worst_ratio <= 1.0 && r.mean_err <= r.mean_bound &&
         r.lse_worst_ratio <= 1.0;
  return r;
}

}  // namespace flashgqa
