// A consumer of the installed flashgqa package: grouped-query attention on small random problems,
// checked against a naive float64 attention written here. Exits 1 on a wrong answer.
//
// Shapes use flashgqa's letters: q [B,K,G,T,H], k and v [B,K,S,H], out like q (K kv heads, G query
// heads per kv head, T queries, S keys, H head dim).
#include <flashgqa/flashgqa.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr std::int64_t B = 2, K = 2, G = 4, T = 100, S = 300, H = 64;

// bfloat16 is the upper half of a float32: round to nearest even, and back.
std::uint16_t to_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t{b} << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// out[b,k,g,t,:] = sum_j softmax_j(q.k_j / sqrt(H)) v_j over the keys j that query t sees (causal:
// j <= t + S - T), in float64 from float copies of q, k, v.
std::vector<double> naive_attention(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, bool causal) {
  std::vector<double> out(q.size()), logits(S);
  for (std::int64_t bk = 0; bk < B * K; ++bk)
    for (std::int64_t g = 0; g < G; ++g)
      for (std::int64_t t = 0; t < T; ++t) {
        const float* qr = &q[((bk * G + g) * T + t) * H];
        const std::int64_t visible = causal ? std::min(S, t + S - T + 1) : S;
        double max = -INFINITY, sum = 0;
        for (std::int64_t j = 0; j < visible; ++j) {
          double dot = 0;
          for (std::int64_t h = 0; h < H; ++h) dot += double{qr[h]} * k[(bk * S + j) * H + h];
          logits[j] = dot / std::sqrt(double(H));
          max = std::max(max, logits[j]);
        }
        for (std::int64_t j = 0; j < visible; ++j) sum += logits[j] = std::exp(logits[j] - max);
        double* o = &out[((bk * G + g) * T + t) * H];
        for (std::int64_t j = 0; j < visible; ++j)
          for (std::int64_t h = 0; h < H; ++h) o[h] += logits[j] / sum * v[(bk * S + j) * H + h];
      }
  return out;
}

// The largest |got - want|, and whether it is within tol.
bool agrees(const char* what, const std::vector<float>& got, const std::vector<double>& want,
            double tol) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    if (!(err <= worst)) worst = err;  // NaN is the worst
  }
  const bool ok = worst <= tol;
  std::printf("%-34s max |err| %.2e (tolerance %.1e): %s\n", what, worst, tol, ok ? "ok" : "WRONG");
  return ok;
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> q(B * K * G * T * H), k(B * K * S * H), v(B * K * S * H);
  for (std::vector<float>* x : {&q, &k, &v})
    for (float& e : *x) e = normal(rng);
  bool ok = true;

  // float32 in and out, float32 matmul operands (Precision::f32): agrees to float32 rounding, about
  // S * 2^-24 * max|v| ~ 1e-4 at worst over the S-long sums.
  for (bool causal : {false, true}) {
    std::vector<float> out(q.size());
    flashgqa::Options options;
    options.precision = flashgqa::Precision::f32;
    options.causal = causal;
    using flashgqa::DType;
    flashgqa::attention(flashgqa::contiguous_view(out.data(), DType::f32, {B, K, G, T, H}),
                        flashgqa::contiguous_view(q.data(), DType::f32, {B, K, G, T, H}),
                        flashgqa::contiguous_view(k.data(), DType::f32, {B, K, S, H}),
                        flashgqa::contiguous_view(v.data(), DType::f32, {B, K, S, H}), options);
    ok &= agrees(causal ? "f32, causal" : "f32", out, naive_attention(q, k, v, causal), 1e-4);
  }

  // bfloat16 in and out with the default options (bf16 operands, fp32 accumulation): the softmax
  // weights (summing to 1) and the output are rounded to bfloat16, a relative error of 2^-9 each, so
  // |err| <= 2^-9 max|v| + 2^-9 |out| <= 2^-8 max|v| (fp32 accumulation adds far less).
  std::vector<std::uint16_t> qb(q.size()), kb(k.size()), vb(v.size()), outb(q.size());
  std::transform(q.begin(), q.end(), qb.begin(), to_bf16);
  std::transform(k.begin(), k.end(), kb.begin(), to_bf16);
  std::transform(v.begin(), v.end(), vb.begin(), to_bf16);
  std::vector<float> qr(q.size()), kr(k.size()), vr(v.size()), out(q.size());
  std::transform(qb.begin(), qb.end(), qr.begin(), from_bf16);
  std::transform(kb.begin(), kb.end(), kr.begin(), from_bf16);
  std::transform(vb.begin(), vb.end(), vr.begin(), from_bf16);
  flashgqa::Options options;
  options.causal = true;
  using flashgqa::DType;
  flashgqa::attention(flashgqa::contiguous_view(outb.data(), DType::bf16, {B, K, G, T, H}),
                      flashgqa::contiguous_view(qb.data(), DType::bf16, {B, K, G, T, H}),
                      flashgqa::contiguous_view(kb.data(), DType::bf16, {B, K, S, H}),
                      flashgqa::contiguous_view(vb.data(), DType::bf16, {B, K, S, H}), options);
  std::transform(outb.begin(), outb.end(), out.begin(), from_bf16);
  double max_v = 0;
  for (float x : vr) max_v = std::max(max_v, double{std::abs(x)});
  ok &= agrees("bf16, causal", out, naive_attention(qr, kr, vr, true), std::ldexp(max_v, -8));

  std::printf("%s\n", ok ? "flashgqa example: all results agree" : "flashgqa example: WRONG results");
  return ok ? 0 : 1;
}
