// Rung 5, flash attention (the seed's flash_attention): the KV loop moves inside the task. Each task
// owns one q block (block_q queries × all G heads of one kv head) and walks every KV block with its
// accumulators (o, denom, m) in a thread-local tile that never goes back to memory; the output is
// written once, in the output dtype. Tasks over (b, kv head, q block) are spread over threads; KV
// blocks past the causal diagonal of the block's last query are skipped. Per KV block a task moves
// 2·block_kv·H operand values and does 4·G·block_q·block_kv·H FLOPs: intensity grows with G·block_q.
#include <limits>
#include <vector>

#include "ladder/ladder.hpp"
#include "ladder/tile_math.hpp"

namespace flashgqa {
namespace {

constexpr std::int64_t kDefaultBlockQ = 64;
constexpr std::int64_t kDefaultBlockKV = 256;

}  // namespace

void flash_attention(const Problem& p) {
  const std::int64_t bq = block_or(p.block_q, kDefaultBlockQ);
  const std::int64_t bkv = block_or(p.block_kv, kDefaultBlockKV);
  const std::int64_t num_q_blocks = (p.T + bq - 1) / bq;
  const std::int64_t tasks = p.B * p.K * num_q_blocks;
#pragma omp parallel num_threads(p.threads)
  {
    const auto tile = static_cast<std::size_t>(p.G * bq);
    std::vector<float> Q(tile * static_cast<std::size_t>(p.H)), O(Q.size());
    std::vector<float> m_run(tile), denom(tile), L(tile * static_cast<std::size_t>(bkv));
    std::vector<float> Kb(static_cast<std::size_t>(bkv * p.H)), Vb(Kb.size());
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t task = 0; task < tasks; ++task) {
      const std::int64_t b = task / (p.K * num_q_blocks), kh = task / num_q_blocks % p.K;
      const std::int64_t t0 = task % num_q_blocks * bq, rows = std::min(bq, p.T - t0), M = p.G * rows;
      load_q_block(Q.data(), p, b, kh, t0, rows);
      std::fill(O.begin(), O.end(), 0.0f);
      std::fill(denom.begin(), denom.end(), 0.0f);
      std::fill(m_run.begin(), m_run.end(), -std::numeric_limits<float>::infinity());
      for (std::int64_t s0 = 0; s0 < p.S; s0 += bkv) {
        if (p.kv_block_masked(s0, t0 + rows)) break;  // past the diagonal: the rest is masked
        const std::int64_t n = std::min(bkv, p.S - s0);
        load_k_block(Kb.data(), p, b, kh, s0, n);
        load_v_block(Vb.data(), p, b, kh, s0, n);
        qk_logits(L.data(), Q.data(), M, Kb.data(), n, p.H, p.scale);  // S_tile = scale Q Kᵀ
        mask_logits(L.data(), p, M, t0, rows, s0, n);                   // diagonal tiles only
        for (std::int64_t r = 0; r < M; ++r) {
          float* l = L.data() + r * n;
          float* o = O.data() + r * p.H;
          const auto ri = static_cast<std::size_t>(r);
          const float corr = online_softmax_update(l, l, n, m_run[ri], denom[ri], p.precision);
          if (corr != 1.0f)  // rescale only when the max moved
            for (std::int64_t h = 0; h < p.H; ++h) o[h] *= corr;
        }
        pv_accumulate(O.data(), L.data(), M, n, Vb.data(), p.H);  // O += P V
      }
      for (std::int64_t r = 0; r < M; ++r)
        write_output_row(p, b, kh, r / rows, t0 + r % rows, O.data() + r * p.H,
                         m_run[static_cast<std::size_t>(r)], denom[static_cast<std::size_t>(r)]);
    }
  }
}

}  // namespace flashgqa
