// Rung 2, chunked softmax without a max (the seed's attn_scan_s): the KV axis is cut into chunks of
// block_kv keys; each chunk's weights exp(l) are accumulated into the output numerator and the
// denominator, and the division happens once at the end. The [T, S] logits are never whole in memory,
// but exp(l) overflows for logits above ~88 and the result turns into inf/inf = NaN. Kept to show why
// the next rung subtracts a running max.
#include <vector>

#include "ladder/ladder.hpp"
#include "ladder/rung_kernels.hpp"

namespace flashgqa {

void chunked_unstable_attention(const Problem& p) {
  const RungKernels kernels(p);
  const std::int64_t bkv = clamp_block(p.block_kv, kSeedBlockKV, p.S), mr = kernels.kern->mr;
  const std::int64_t M = p.G * p.T;  // every query row of one kv head
  QRows Q;
  KvBlock kv;
  PRows P;
  P.reserve(kernels, M, padded_keys(bkv));
  AccRows O;
  std::vector<float> denom(static_cast<std::size_t>(M));
  AlignedBuffer W(static_cast<std::size_t>(M * padded_keys(bkv)) * sizeof(float));  // one chunk of weights
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh) {
      pack_q_block(Q, kernels, p, b, kh, 0, p.T);
      O.assign_zero(M, kernels.Hp);
      std::fill(denom.begin(), denom.end(), 0.0f);
      // The chunks that hold a key some query sees.
      const KeyRange keys = p.visible_keys(0, p.T);
      for (std::int64_t s0 = keys.begin / bkv * bkv; s0 < keys.end; s0 += bkv) {
        p.check_interrupt();  // between KV chunks, outside the parallel regions
        const std::int64_t n = std::min(bkv, p.S - s0);
        pack_kv_block(kv, kernels, p, b, kh, s0, n);
        const std::int64_t ldw = kv.npad;
#pragma omp parallel for num_threads(p.threads) schedule(static)
        for (std::int64_t r0 = 0; r0 < M; r0 += mr) {
          const std::int64_t r1 = std::min(r0 + mr, M);
          float* w = W.as<float>();
          qk_logits(w, ldw, kernels, Q, r0, r1, kv, p.scale);
          for (std::int64_t m = r0; m < r1; ++m) {
            float* row = w + m * ldw;
            mask_logits(row, ldw, p, 1, m % p.T, 1, s0, n);  // row m is query m % T
            exp_row(kernels, row, row, n);  // no max subtracted: overflows for large logits
            denom[static_cast<std::size_t>(m)] += blocked_sum(row, n);
            for (std::int64_t j = 0; j < n; ++j) row[j] = round_weight(row[j], p.precision);
          }
          pack_p_rows(P, kernels, w, ldw, r0, r1, n);
          pv_accumulate(O.ptr(), kernels, P, r0, r1, kv);
        }
      }
#pragma omp parallel for num_threads(p.threads) schedule(static)
      for (std::int64_t m = 0; m < M; ++m) {
        const float d = denom[static_cast<std::size_t>(m)];
        // lse = log(denom) since no max was subtracted; a row with no key (d = 0) gets 0 and -inf.
        finish_row(p, b, kh, m / p.T, m % p.T, O.row(m, kernels.Hp), 0.0f, d);
      }
    }
}

}  // namespace flashgqa
