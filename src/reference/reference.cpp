#include "reference/reference.hpp"

#include <cmath>
#include <limits>

#include "core/dtype.hpp"

namespace flashgqa {
namespace {

// Operand as the algorithms see it, widened to double.
double operand(const void* row, DType dtype, std::int64_t i, Precision precision) {
  const float x = load_element(row, dtype, i);
  return precision == Precision::bf16 ? round_to_bf16(x) : x;
}

// Calls body(b, k, g, t, row index) for every query row.
template <typename Body>
void for_each_query(const Problem& p, const ReferenceResult& r, Body body) {
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh)
      for (std::int64_t g = 0; g < p.G; ++g)
        for (std::int64_t t = 0; t < p.T; ++t) body(b, kh, g, t, r.row(b, kh, g, t));
}

ReferenceResult allocate(const Problem& p) {
  ReferenceResult r;
  r.B = p.B, r.K = p.K, r.G = p.G, r.T = p.T, r.H = p.H;
  const auto rows = static_cast<std::size_t>(p.B * p.K * p.G * p.T);
  const auto elems = rows * static_cast<std::size_t>(p.H);
  r.out.assign(elems, 0.0);
  r.abs_pv.assign(elems, 0.0);
  r.sq_pv.assign(elems, 0.0);
  r.abs_logit.assign(rows, 0.0);
  return r;
}

// Logits l_j = scale * q.k_j for j < n, and max_j |scale| sum_h |q_h k_jh|.
double logits(const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t,
              std::int64_t n, std::vector<double>& l) {
  const void* qrow = p.q_row(b, kh, g, t);
  double abs_max = 0.0;
  l.assign(static_cast<std::size_t>(n), 0.0);
  for (std::int64_t j = 0; j < n; ++j) {
    const void* krow = p.k_row(b, kh, j);
    double dot = 0.0, abs_dot = 0.0;
    for (std::int64_t h = 0; h < p.H; ++h) {
      const double prod = operand(qrow, p.q_dtype, h, p.precision) *
                          operand(krow, p.k_dtype, h, p.precision);
      dot += prod;
      abs_dot += std::fabs(prod);
    }
    l[static_cast<std::size_t>(j)] = static_cast<double>(p.scale) * dot;
    abs_max = std::max(abs_max, std::fabs(static_cast<double>(p.scale)) * abs_dot);
  }
  return abs_max;
}

// out = sum_j w_j v_j, with the magnitudes sum_j |w_j v_j| and sqrt(sum_j (w_j v_j)^2).
void weighted_sum(const Problem& p, ReferenceResult& r, std::int64_t b, std::int64_t kh,
                  std::int64_t row, const std::vector<double>& w) {
  const auto base = static_cast<std::size_t>(row * p.H);
  for (std::int64_t h = 0; h < p.H; ++h) {
    double acc = 0.0, abs_acc = 0.0, sq_acc = 0.0;
    for (std::size_t j = 0; j < w.size(); ++j) {
      const double term =
          w[j] * operand(p.v_row(b, kh, static_cast<std::int64_t>(j)), p.v_dtype, h, p.precision);
      acc += term;
      abs_acc += std::fabs(term);
      sq_acc += term * term;
    }
    r.out[base + static_cast<std::size_t>(h)] = acc;
    r.abs_pv[base + static_cast<std::size_t>(h)] = abs_acc;
    r.sq_pv[base + static_cast<std::size_t>(h)] = std::sqrt(sq_acc);
  }
}

}  // namespace

ReferenceResult reference_attention(const Problem& p) {
  ReferenceResult r = allocate(p);
  r.lse.assign(static_cast<std::size_t>(p.B * p.K * p.G * p.T),
               -std::numeric_limits<double>::infinity());
  std::vector<double> l;
  for_each_query(p, r, [&](std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t,
                           std::int64_t row) {
    const std::int64_t n = p.visible_keys(t);
    if (n == 0) return;  // sees no key: output 0, lse -inf
    r.abs_logit[static_cast<std::size_t>(row)] = logits(p, b, kh, g, t, n, l);
    // Pass 1: the max (a NaN logit is skipped here and poisons pass 2).
    double m = -std::numeric_limits<double>::infinity();
    for (double x : l)
      if (x > m) m = x;
    const double base = std::isinf(m) && m < 0 ? 0.0 : m;
    // Pass 2: the denominator.
    double sum = 0.0;
    for (double x : l) sum += std::exp(x - base);
    // Pass 3: the normalised weights.
    for (double& x : l) x = std::exp(x - base) / sum;
    r.lse[static_cast<std::size_t>(row)] = base + std::log(sum);
    weighted_sum(p, r, b, kh, row, l);
  });
  return r;
}

ReferenceResult reference_linear_attention(const Problem& p) {
  ReferenceResult r = allocate(p);
  r.abs_av.assign(r.out.size(), 0.0);
  std::vector<double> l;
  for_each_query(p, r, [&](std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t,
                           std::int64_t row) {
    const std::int64_t n = p.visible_keys(t);
    if (n == 0) return;
    r.abs_logit[static_cast<std::size_t>(row)] = logits(p, b, kh, g, t, n, l);
    weighted_sum(p, r, b, kh, row, l);
    const void* qrow = p.q_row(b, kh, g, t);
    for (std::int64_t j = 0; j < n; ++j) {
      double a = 0.0;
      for (std::int64_t h = 0; h < p.H; ++h)
        a += std::fabs(operand(qrow, p.q_dtype, h, p.precision) *
                       operand(p.k_row(b, kh, j), p.k_dtype, h, p.precision));
      a *= std::fabs(static_cast<double>(p.scale));
      for (std::int64_t h = 0; h < p.H; ++h)
        r.abs_av[static_cast<std::size_t>(row * p.H + h)] +=
            a * std::fabs(operand(p.v_row(b, kh, j), p.v_dtype, h, p.precision));
    }
  });
  return r;
}

}  // namespace flashgqa
