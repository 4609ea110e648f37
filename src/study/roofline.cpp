#include "study/roofline.hpp"

#include <limits>

namespace flashgqa::study {
namespace {

constexpr double kBf16 = 2.0, kF32 = 4.0;

double d(std::int64_t x) { return static_cast<double>(x); }

// Bytes of q, k, v and o in bf16 for all (b, kv head).
double io_bytes(const Shape& s) { return kBf16 * d(s.B * s.K) * (2.0 * d(s.G * s.T * s.H) + 2.0 * d(s.S * s.H)); }

double kv_steps(const Shape& s, std::int64_t block_kv) {
  return d((s.S + block_kv - 1) / std::max<std::int64_t>(block_kv, 1));
}

}  // namespace

std::string to_string(const Shape& s) {
  return std::to_string(s.B) + "," + std::to_string(s.K) + "," + std::to_string(s.G) + "," +
         std::to_string(s.T) + "," + std::to_string(s.S) + "," + std::to_string(s.H);
}

double attention_flops(const Problem& p) {
  return 4.0 * d(p.B) * d(p.K) * d(p.G) * d(p.H) * d(p.visible_pairs());
}

double attention_flops(const Shape& s, bool causal, std::optional<std::int64_t> causal_offset) {
  Problem p;
  p.B = s.B, p.K = s.K, p.G = s.G, p.T = s.T, p.S = s.S, p.H = s.H;
  p.causal = causal;
  p.causal_offset = causal_offset.value_or(s.S - s.T);
  return attention_flops(p);
}

double naive_intensity(const Shape& s) {
  const double gth = d(s.G) * d(s.T) * d(s.H);
  return gth * d(s.S) / (gth + d(s.S) * d(s.H) + d(s.G) * d(s.T) * d(s.S));
}

double flash_intensity(const Shape& s) {
  return d(s.G) * d(s.T) * d(s.S) / (d(s.G) * d(s.T) + d(s.S));
}

double chunked_intensity(const Shape& s, std::int64_t block_kv) {
  const double flops = attention_flops(s, false);
  const double naive_bytes = flops / naive_intensity(s);
  const double gth = d(s.B * s.K) * d(s.G) * d(s.T) * d(s.H);
  return flops / (naive_bytes + kv_steps(s, block_kv) * gth * (2 * kF32 + kBf16));
}

double kernel1_intensity(const Shape& s, std::int64_t block_kv) {
  const double flops = attention_flops(s, false);
  const double rows = d(s.B * s.K) * d(s.G) * d(s.T);
  const double per_step = rows * (2 * kF32 * (d(s.H) + 2) + kBf16 * d(s.H));
  return flops / (io_bytes(s) + kv_steps(s, block_kv) * per_step);
}

double intensity(Algorithm algorithm, const Shape& s, std::int64_t block_kv) {
  switch (algorithm) {
    case Algorithm::naive: return naive_intensity(s);
    case Algorithm::chunked_unstable:
    case Algorithm::chunked: return chunked_intensity(s, block_kv);
    case Algorithm::kernel1: return kernel1_intensity(s, block_kv);
    case Algorithm::flash: return flash_intensity(s);
  }
  return 0;
}

Prediction predict(double flops, double intensity, const Machine& m) {
  Prediction p;
  p.t_math = flops / m.flops;
  p.t_comms = flops / intensity / m.bandwidth;
  return p;
}

double flash_compute_bound_length(std::int64_t G, double balance) {
  return balance * d(G + 1) / d(G);
}

double naive_compute_bound_length(std::int64_t G, std::int64_t H, double balance) {
  if (d(H) <= balance) return std::numeric_limits<double>::infinity();
  return balance * d(H) * d(G + 1) / (d(G) * (d(H) - balance));
}

double memory_bytes(Algorithm algorithm, const Shape& s, DType dtype, std::int64_t block_q,
                    std::int64_t block_kv, int threads) {
  const double e = d(static_cast<std::int64_t>(dtype_size(dtype)));
  const double io = e * d(s.B * s.K) * (2.0 * d(s.G * s.T * s.H) + 2.0 * d(s.S * s.H));
  const double gt = d(s.G) * d(s.T), sh = d(s.S) * d(s.H);
  const double th = d(threads);
  switch (algorithm) {
    case Algorithm::naive:  // packed K, V, q of one head, the [T, S] logits (fp32) and weights (bf16)
      return io + kF32 * (2 * sh + d(s.T) * d(s.H) + d(s.T) * d(s.S)) + kBf16 * d(s.T) * d(s.S);
    case Algorithm::chunked_unstable:
    case Algorithm::chunked:  // Q, O of all G·T rows, one chunk of logits and weights
      return io + kF32 * (2 * gt * d(s.H) + 2 * gt + 2 * gt * d(block_kv) + 2 * d(block_kv) * d(s.H));
    case Algorithm::kernel1:  // two sets of carries, per-thread tiles
      return io + kF32 * (2 * gt * (d(s.H) + 2) + 2 * d(block_kv) * d(s.H) +
                          th * d(s.G) * d(block_q) * (d(s.H) + d(block_kv)));
    case Algorithm::flash:  // packed K/V of one kv head (bf16) and per-thread tiles
      return io + kBf16 * 2 * sh +
             kF32 * th * (d(s.G) * d(block_q) * (2 * d(s.H) + d(block_kv) + 2) + 2 * d(block_kv) * d(s.H));
  }
  return io;
}

}  // namespace flashgqa::study
