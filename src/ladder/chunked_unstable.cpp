// Rung 2, chunked softmax without a max (the seed's attn_scan_s): the KV axis is cut into chunks of
// block_kv keys; each chunk's weights exp(l) are accumulated into the output numerator and the
// denominator, and the division happens once at the end. The [T, S] logits are never whole in memory,
// but exp(l) overflows for logits above ~88 and the result turns into inf/inf = NaN. Kept to show why
// the next rung subtracts a running max.
#include <cmath>
#include <limits>
#include <vector>

#include "ladder/ladder.hpp"
#include "ladder/tile_math.hpp"

namespace flashgqa {

void chunked_unstable_attention(const Problem& p) {
  const std::int64_t bkv = block_or(p.block_kv, kSeedBlockKV);
  const std::int64_t M = p.G * p.T;  // every query row of one kv head
  std::vector<float> Q(static_cast<std::size_t>(M * p.H)), O(Q.size()), denom(static_cast<std::size_t>(M));
  std::vector<float> Kb(static_cast<std::size_t>(bkv * p.H)), Vb(Kb.size());
  std::vector<float> W(static_cast<std::size_t>(M * bkv));  // one chunk of weights
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh) {
      load_q_block(Q.data(), p, b, kh, 0, p.T);
      std::fill(O.begin(), O.end(), 0.0f);
      std::fill(denom.begin(), denom.end(), 0.0f);
      for (std::int64_t s0 = 0; s0 < p.S; s0 += bkv) {
        if (p.kv_block_masked(s0, p.T)) break;  // this chunk and all later ones are masked
        const std::int64_t n = std::min(bkv, p.S - s0);
        load_k_block(Kb.data(), p, b, kh, s0, n);
        load_v_block(Vb.data(), p, b, kh, s0, n);
#pragma omp parallel for num_threads(p.threads) schedule(static)
        for (std::int64_t m = 0; m < M; ++m) {
          float* w = W.data() + m * n;
          qk_logits(w, Q.data() + m * p.H, 1, Kb.data(), n, p.H, p.scale);
          mask_logits(w, p, 1, m % p.T, 1, s0, n);
          float sum = 0.0f;
          for (std::int64_t j = 0; j < n; ++j) {
            const float e = std::exp(w[j]);  // no max subtracted: overflows for large logits
            sum += e;
            w[j] = round_weight(e, p.precision);
          }
          denom[static_cast<std::size_t>(m)] += sum;
          pv_accumulate(O.data() + m * p.H, w, 1, n, Vb.data(), p.H);
        }
      }
#pragma omp parallel for num_threads(p.threads) schedule(static)
      for (std::int64_t m = 0; m < M; ++m) {
        const float d = denom[static_cast<std::size_t>(m)];
        const bool sees_none = p.visible_keys(m % p.T) == 0;
        // lse = log(denom) since no max was subtracted; a row with no key gets 0 and -inf.
        write_output_row(p, b, kh, m / p.T, m % p.T, O.data() + m * p.H, 0.0f, sees_none ? 0.0f : d);
      }
    }
}

}  // namespace flashgqa
