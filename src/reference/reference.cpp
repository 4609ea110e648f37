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

// The operands of one (b, kv head) in double: K and V [S, H], and one query row [H].
struct HeadOperands {
  std::vector<double> k, v, q;
  HeadOperands(const Problem& p, std::int64_t b, std::int64_t kh)
      : k(static_cast<std::size_t>(p.S * p.H)), v(k.size()), q(static_cast<std::size_t>(p.H)) {
    for (std::int64_t s = 0; s < p.S; ++s)
      for (std::int64_t h = 0; h < p.H; ++h) {
        k[static_cast<std::size_t>(s * p.H + h)] = operand(p.k_row(b, kh, s), p.k_dtype, h, p.precision);
        v[static_cast<std::size_t>(s * p.H + h)] = operand(p.v_row(b, kh, s), p.v_dtype, h, p.precision);
      }
  }
  void load_query(const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t) {
    for (std::int64_t h = 0; h < p.H; ++h)
      q[static_cast<std::size_t>(h)] = operand(p.q_row(b, kh, g, t), p.q_dtype, h, p.precision);
  }
  const double* k_row(std::int64_t s, std::int64_t H) const { return k.data() + s * H; }
  const double* v_row(std::int64_t s, std::int64_t H) const { return v.data() + s * H; }
};

// Calls body(operands, t, row index) for every query row, with the query loaded.
template <typename Body>
void for_each_query(const Problem& p, const ReferenceResult& r, Body body) {
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh) {
      HeadOperands ops(p, b, kh);
      for (std::int64_t g = 0; g < p.G; ++g)
        for (std::int64_t t = 0; t < p.T; ++t) {
          ops.load_query(p, b, kh, g, t);
          body(ops, t, r.row(b, kh, g, t));
        }
    }
}

// The largest finite |x| over the operands as rounded (q, k and v, all rows the problem reads).
void operand_maxima(const Problem& p, ReferenceResult& r) {
  auto fold = [&p](double& m, const void* row, DType dtype) {
    for (std::int64_t h = 0; h < p.H; ++h) {
      const double x = std::fabs(operand(row, dtype, h, p.precision));
      if (std::isfinite(x) && x > m) m = x;
    }
  };
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh) {
      for (std::int64_t g = 0; g < p.G; ++g)
        for (std::int64_t t = 0; t < p.T; ++t) fold(r.max_abs_q, p.q_row(b, kh, g, t), p.q_dtype);
      for (std::int64_t s = 0; s < p.S; ++s) {
        fold(r.max_abs_k, p.k_row(b, kh, s), p.k_dtype);
        fold(r.max_abs_v, p.v_row(b, kh, s), p.v_dtype);
      }
    }
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
  operand_maxima(p, r);
  return r;
}

// Logits l_i = scale * q.k_j, capped to c tanh(l_i / c) with a softcap c, and a_i = |scale| sum_h
// |q_h k_jh| (before the cap: what the logit's error bound scales with) for the visible keys
// j = keys.begin + i.
void logits(const Problem& p, const HeadOperands& ops, KeyRange keys, std::vector<double>& l,
            std::vector<double>& a) {
  const std::int64_t n = keys.size();
  l.assign(static_cast<std::size_t>(n), 0.0);
  a.assign(static_cast<std::size_t>(n), 0.0);
  const double scale = p.scale, cap = p.softcap;
  for (std::int64_t j = 0; j < n; ++j) {
    const double* k = ops.k_row(keys.begin + j, p.H);
    double dot = 0.0, abs_dot = 0.0;
    for (std::int64_t h = 0; h < p.H; ++h) {
      const double prod = ops.q[static_cast<std::size_t>(h)] * k[h];
      dot += prod;
      abs_dot += std::fabs(prod);
    }
    l[static_cast<std::size_t>(j)] = p.softcap != 0.0f ? cap * std::tanh(scale * dot / cap) : scale * dot;
    a[static_cast<std::size_t>(j)] = std::fabs(scale) * abs_dot;
  }
}

double max_of(const std::vector<double>& x) {
  double m = 0.0;
  for (double e : x) m = std::max(m, e);
  return m;
}

// out = sum_i w_i v_j (j = keys.begin + i), with the magnitudes sum |w_i v_j| and sqrt(sum (w_i v_j)^2).
void weighted_sum(const Problem& p, ReferenceResult& r, const HeadOperands& ops, std::int64_t row, KeyRange keys,
                  const std::vector<double>& w) {
  const auto base = static_cast<std::size_t>(row * p.H);
  for (std::int64_t h = 0; h < p.H; ++h) {
    double acc = 0.0, abs_acc = 0.0, sq_acc = 0.0;
    for (std::size_t j = 0; j < w.size(); ++j) {
      const double term = w[j] * ops.v_row(keys.begin + static_cast<std::int64_t>(j), p.H)[h];
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
  std::vector<double> l, a;
  for_each_query(p, r, [&](const HeadOperands& ops, std::int64_t t, std::int64_t row) {
    const KeyRange keys = p.visible_keys(t);
    // The sink logit of the row's head (-inf: none): one more term of the denominator, with no value.
    const std::int64_t head = row / p.T % (p.K * p.G);
    const double sink = p.sink(head / p.G, head % p.G);
    if (keys.empty()) {  // sees no key: output 0, lse = log e^sink (-inf without a sink)
      r.lse[static_cast<std::size_t>(row)] = sink;
      return;
    }
    logits(p, ops, keys, l, a);
    r.abs_logit[static_cast<std::size_t>(row)] = max_of(a);
    // Pass 1: the max over the logits and the sink (a NaN logit is skipped here and poisons pass 2).
    double m = sink;
    for (double x : l)
      if (x > m) m = x;
    const double base = std::isinf(m) && m < 0 ? 0.0 : m;
    // Pass 2: the denominator.
    double sum = std::exp(sink - base);
    for (double x : l) sum += std::exp(x - base);
    // Pass 3: the normalised weights.
    for (double& x : l) x = std::exp(x - base) / sum;
    r.lse[static_cast<std::size_t>(row)] = base + std::log(sum);
    weighted_sum(p, r, ops, row, keys, l);
  });
  return r;
}

ReferenceResult reference_linear_attention(const Problem& p) {
  ReferenceResult r = allocate(p);
  r.abs_av.assign(r.out.size(), 0.0);
  std::vector<double> l, a;
  for_each_query(p, r, [&](const HeadOperands& ops, std::int64_t t, std::int64_t row) {
    const KeyRange keys = p.visible_keys(t);
    if (keys.empty()) return;
    logits(p, ops, keys, l, a);
    r.abs_logit[static_cast<std::size_t>(row)] = max_of(a);
    weighted_sum(p, r, ops, row, keys, l);
    for (std::int64_t h = 0; h < p.H; ++h) {
      double acc = 0.0;
      for (std::int64_t j = 0; j < keys.size(); ++j)
        acc += a[static_cast<std::size_t>(j)] * std::fabs(ops.v_row(keys.begin + j, p.H)[h]);
      r.abs_av[static_cast<std::size_t>(row * p.H + h)] = acc;
    }
  });
  return r;
}

}  // namespace flashgqa
