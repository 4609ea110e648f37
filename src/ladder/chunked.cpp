// Rung 3, numerically stable chunked softmax (the seed's attn_scan_s_stable): as the unstable rung,
// but every row keeps a running max m of its logits. Each chunk's weights are exp(l - m_new), and the
// numerator and denominator carried so far are multiplied by exp(m_old - m_new), so both stay scaled
// by the same constant and the final division cancels it. Nothing overflows; the result matches the
// naive rung to rounding. The carries (o, denom, m) for all G·T rows of a kv head live in memory.
#include <limits>
#include <vector>

#include "ladder/ladder.hpp"
#include "ladder/tile_math.hpp"

namespace flashgqa {

void chunked_attention(const Problem& p) {
  const std::int64_t bkv = block_or(p.block_kv, kSeedBlockKV);
  const std::int64_t M = p.G * p.T;  // every query row of one kv head
  std::vector<float> Q(static_cast<std::size_t>(M * p.H)), O(Q.size());
  std::vector<float> denom(static_cast<std::size_t>(M)), m_run(denom.size());
  std::vector<float> Kb(static_cast<std::size_t>(bkv * p.H)), Vb(Kb.size());
  std::vector<float> L(static_cast<std::size_t>(M * bkv)), W(L.size());
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh) {
      load_q_block(Q.data(), p, b, kh, 0, p.T);
      std::fill(O.begin(), O.end(), 0.0f);
      std::fill(denom.begin(), denom.end(), 0.0f);
      std::fill(m_run.begin(), m_run.end(), -std::numeric_limits<float>::infinity());
      for (std::int64_t s0 = 0; s0 < p.S; s0 += bkv) {
        if (p.kv_block_masked(s0, p.T)) break;  // this chunk and all later ones are masked
        const std::int64_t n = std::min(bkv, p.S - s0);
        load_k_block(Kb.data(), p, b, kh, s0, n);
        load_v_block(Vb.data(), p, b, kh, s0, n);
#pragma omp parallel for num_threads(p.threads) schedule(static)
        for (std::int64_t m = 0; m < M; ++m) {
          float* l = L.data() + m * n;
          float* w = W.data() + m * n;
          float* o = O.data() + m * p.H;
          qk_logits(l, Q.data() + m * p.H, 1, Kb.data(), n, p.H, p.scale);
          mask_logits(l, p, 1, m % p.T, 1, s0, n);
          // Running max, weights exp(l - m_new), denominator rescaled by exp(m_old - m_new).
          const float corr = online_softmax_update(w, l, n, m_run[static_cast<std::size_t>(m)],
                                                   denom[static_cast<std::size_t>(m)], p.precision);
          for (std::int64_t h = 0; h < p.H; ++h) o[h] *= corr;  // numerator rescaled the same way
          pv_accumulate(o, w, 1, n, Vb.data(), p.H);
        }
      }
#pragma omp parallel for num_threads(p.threads) schedule(static)
      for (std::int64_t m = 0; m < M; ++m)
        write_output_row(p, b, kh, m / p.T, m % p.T, O.data() + m * p.H,
                         m_run[static_cast<std::size_t>(m)], denom[static_cast<std::size_t>(m)]);
    }
}

}  // namespace flashgqa
