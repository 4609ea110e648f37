// The seed's linear_attn_scan_s: attention without the softmax, out = sum_j (scale q.k_j) v_j. Because
// the reduction over keys is the last matmul, chunking over S needs nothing but an accumulator: each
// chunk's weights go straight into o. Weights are rounded to bf16 for the second matmul under
// Precision::bf16, as in the seed. A causally masked key has weight 0.
#include <vector>

#include "core/dtype.hpp"
#include "ladder/ladder.hpp"
#include "ladder/tile_math.hpp"

namespace flashgqa {

void linear_attention_chunked(const Problem& p) {
  const std::int64_t bkv = block_or(p.block_kv, kSeedBlockKV);
  const std::int64_t M = p.G * p.T;
  std::vector<float> Q(static_cast<std::size_t>(M * p.H)), O(Q.size());
  std::vector<float> Kb(static_cast<std::size_t>(bkv * p.H)), Vb(Kb.size());
  std::vector<float> W(static_cast<std::size_t>(M * bkv));
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh) {
      load_q_block(Q.data(), p, b, kh, 0, p.T);
      std::fill(O.begin(), O.end(), 0.0f);
      for (std::int64_t s0 = 0; s0 < p.S; s0 += bkv) {
        if (p.kv_block_masked(s0, p.T)) break;
        const std::int64_t n = std::min(bkv, p.S - s0);
        load_k_block(Kb.data(), p, b, kh, s0, n);
        load_v_block(Vb.data(), p, b, kh, s0, n);
#pragma omp parallel for num_threads(p.threads) schedule(static)
        for (std::int64_t m = 0; m < M; ++m) {
          float* w = W.data() + m * n;
          qk_logits(w, Q.data() + m * p.H, 1, Kb.data(), n, p.H, p.scale);
          const std::int64_t visible = p.visible_keys(m % p.T) - s0;
          for (std::int64_t j = 0; j < n; ++j) w[j] = j < visible ? round_weight(w[j], p.precision) : 0.0f;
          pv_accumulate(O.data() + m * p.H, w, 1, n, Vb.data(), p.H);
        }
      }
      for (std::int64_t m = 0; m < M; ++m)
        store_row(p.out_row(b, kh, m / p.T, m % p.T), p.out_dtype, O.data() + m * p.H, p.H);
    }
}

}  // namespace flashgqa
