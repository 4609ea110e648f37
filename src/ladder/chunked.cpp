// Rung 3, numerically stable chunked softmax (the seed's attn_scan_s_stable): as the unstable rung,
// but every row keeps a running max m of its logits. Each chunk's weights are exp(l - m_new), and the
// numerator and denominator carried so far are multiplied by exp(m_old - m_new), so both stay scaled
// by the same constant and the final division cancels it. Nothing overflows; the result matches the
// naive rung to rounding. The carries (o, denom, m) for all G·T rows of a kv head live in memory, and
// so does each chunk's [G·T, block_kv] weight matrix.
#include <limits>
#include <vector>

#include "ladder/ladder.hpp"
#include "ladder/rung_kernels.hpp"

namespace flashgqa {

void chunked_attention(const Problem& p) {
  const RungKernels kernels(p);
  const std::int64_t bkv = clamp_block(p.block_kv, kSeedBlockKV, p.S), mr = kernels.kern->mr;
  const std::int64_t M = p.G * p.T;  // every query row of one kv head
  QRows Q;
  KvBlock kv;
  PRows P;
  P.reserve(kernels, M, padded_keys(bkv));
  AccRows O;
  std::vector<float> denom(static_cast<std::size_t>(M)), m_run(denom.size());
  AlignedBuffer L(static_cast<std::size_t>(M * padded_keys(bkv)) * sizeof(float));  // one chunk of logits
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh) {
      pack_q_block(Q, kernels, p, b, kh, 0, p.T);
      O.assign_zero(M, kernels.Hp);
      std::fill(denom.begin(), denom.end(), 0.0f);
      std::fill(m_run.begin(), m_run.end(), -std::numeric_limits<float>::infinity());
      // The chunks that hold a key some query sees.
      const KeyRange keys = p.visible_keys(0, p.T);
      for (std::int64_t s0 = keys.begin / bkv * bkv; s0 < keys.end; s0 += bkv) {
        p.check_interrupt();  // between KV chunks, outside the parallel regions
        const std::int64_t n = std::min(bkv, p.S - s0);
        pack_kv_block(kv, kernels, p, b, kh, s0, n);
        const std::int64_t ldl = kv.npad;
#pragma omp parallel for num_threads(p.threads) schedule(static)
        for (std::int64_t r0 = 0; r0 < M; r0 += mr) {
          const std::int64_t r1 = std::min(r0 + mr, M);
          float* lb = L.as<float>();
          qk_logits(lb, ldl, kernels, Q, r0, r1, kv, p.scale);  // logits of the chunk
          for (std::int64_t m = r0; m < r1; ++m) {
            float* l = lb + m * ldl;
            float* o = O.row(m, kernels.Hp);
            mask_logits(l, ldl, p, 1, m % p.T, 1, s0, n);  // row m is query m % T
            // Running max, weights exp(l - m_new) (in place), denominator rescaled by exp(m_old - m_new).
            const float corr = online_softmax_update(kernels, l, l, n, m_run[static_cast<std::size_t>(m)],
                                                     denom[static_cast<std::size_t>(m)], p.precision);
            for (std::int64_t h = 0; h < kernels.Hp; ++h) o[h] *= corr;  // numerator rescaled the same way
          }
          pack_p_rows(P, kernels, lb, ldl, r0, r1, n);
          pv_accumulate(O.ptr(), kernels, P, r0, r1, kv);  // o += w v
        }
      }
#pragma omp parallel for num_threads(p.threads) schedule(static)
      for (std::int64_t m = 0; m < M; ++m)
        finish_row(p, b, kh, m / p.T, m % p.T, O.row(m, kernels.Hp),
                         m_run[static_cast<std::size_t>(m)], denom[static_cast<std::size_t>(m)]);
    }
}

}  // namespace flashgqa
