// Rung 1, naive attention (the seed's attn_naive): for each (b, k, g) the whole [T, S] logit matrix is
// materialised in memory, softmax runs over it in fp32 (max, exp, sum, divide), and the normalised
// weights are rounded to bf16 for the second matmul. Memory grows as T·S; its intensity
// G·T·H·S / (G·T·H + S·H + G·T·S) never reaches H, so it is bound by memory traffic.
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.hpp"
#include "ladder/ladder.hpp"
#include "ladder/tile_math.hpp"

namespace flashgqa {

void naive_attention(const Problem& p) {
  std::vector<float> Kb(static_cast<std::size_t>(p.S * p.H)), Vb(Kb.size());
  std::vector<float> Q(static_cast<std::size_t>(p.T * p.H));
  std::vector<float> L(static_cast<std::size_t>(p.T * p.S));  // the materialised logits
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh) {
      load_k_block(Kb.data(), p, b, kh, 0, p.S);
      load_v_block(Vb.data(), p, b, kh, 0, p.S);
      for (std::int64_t g = 0; g < p.G; ++g) {
        // Rows t are independent: threads split them.
#pragma omp parallel for num_threads(p.threads) schedule(static)
        for (std::int64_t t = 0; t < p.T; ++t) {
          float* q = Q.data() + t * p.H;
          load_row(q, p.q_row(b, kh, g, t), p.q_dtype, p.H, p.precision);
          float* l = L.data() + t * p.S;
          qk_logits(l, q, 1, Kb.data(), p.S, p.H, p.scale);
          mask_logits(l, p, 1, t, 1, 0, p.S);
          // softmax(l) in fp32: max, exp, sum, divide; weights rounded for the second matmul.
          float m = -std::numeric_limits<float>::infinity();
          for (std::int64_t j = 0; j < p.S; ++j)
            if (l[j] > m) m = l[j];
          const float base = std::isinf(m) && m < 0 ? 0.0f : m;
          float sum = 0.0f;
          for (std::int64_t j = 0; j < p.S; ++j) sum += (l[j] = std::exp(l[j] - base));
          const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
          for (std::int64_t j = 0; j < p.S; ++j) l[j] = round_weight(l[j] * inv, p.precision);
          std::vector<float> o(static_cast<std::size_t>(p.H), 0.0f);
          pv_accumulate(o.data(), l, 1, p.S, Vb.data(), p.H);
          // o is already normalised: write it with a denominator of 1 (0 for a row with no key).
          write_output_row(p, b, kh, g, t, o.data(), base + std::log(sum), sum == 0.0f ? 0.0f : 1.0f);
        }
      }
    }
}

}  // namespace flashgqa
