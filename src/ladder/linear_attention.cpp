// The seed's linear_attn_scan_s: attention without the softmax, out = sum_j (scale q.k_j) v_j. Because
// the reduction over keys is the last matmul, chunking over S needs nothing but an accumulator: each
// chunk's weights go straight into o. Weights are rounded to bf16 for the second matmul under
// Precision::bf16, as in the seed. A causally masked key has weight 0.
#include <vector>

#include "core/dtype.hpp"
#include "ladder/ladder.hpp"
#include "ladder/rung_kernels.hpp"

namespace flashgqa {

void linear_attention_chunked(const Problem& p) {
  const RungKernels kernels(p);
  const std::int64_t bkv = clamp_block(p.block_kv, kSeedBlockKV, p.S), mr = kernels.kern->mr;
  const std::int64_t M = p.G * p.T;
  QRows Q;
  KvBlock kv;
  PRows P;
  P.reserve(kernels, M, padded_keys(bkv));
  AccRows O;
  AlignedBuffer W(static_cast<std::size_t>(M * padded_keys(bkv)) * sizeof(float));
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh) {
      pack_q_block(Q, kernels, p, b, kh, 0, p.T);
      O.assign_zero(M, kernels.Hp);
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
          qk_logits(w, ldw, kernels, Q, r0, r1, kv, p.scale);  // w = scale q kᵀ
          for (std::int64_t m = r0; m < r1; ++m) {
            const KeyRange keys = p.visible_keys(m % p.T).clamp_to(s0, s0 + n, s0);
            float* row = w + m * ldw;
            for (std::int64_t j = 0; j < n; ++j)
              row[j] = j >= keys.begin && j < keys.end ? round_weight(row[j], p.precision) : 0.0f;
          }
          pack_p_rows(P, kernels, w, ldw, r0, r1, n);
          pv_accumulate(O.ptr(), kernels, P, r0, r1, kv);  // o += w v
        }
      }
      for (std::int64_t m = 0; m < M; ++m)
        store_row(p.out_row(b, kh, m / p.T, m % p.T), p.out_dtype, O.row(m, kernels.Hp), p.H);
    }
}

}  // namespace flashgqa
