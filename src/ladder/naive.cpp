// Rung 1, naive attention (the seed's attn_naive): for each (b, k, g) the whole [T, S] logit matrix is
// materialised in memory, softmax runs over it in fp32 (max, exp, sum, divide), and the normalised
// weights are rounded to bf16 — a second [T, S] matrix — for the second matmul. Memory grows as T·S;
// its intensity G·T·H·S / (G·T·H + S·H + G·T·S) never reaches H, so it is bound by memory traffic
// wherever H is below the machine's balance point.
#include <cmath>
#include <limits>
#include <vector>

#include "ladder/ladder.hpp"
#include "ladder/rung_kernels.hpp"

namespace flashgqa {

void naive_attention(const Problem& p) {
  const RungKernels kernels(p);
  const std::int64_t mr = kernels.kern->mr;
  KvBlock kv;  // all S keys of one kv head
  QRows Q;
  PRows P;
  AccRows O;
  AlignedBuffer L;  // the materialised logits [T, Spad]
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh) {
      if (p.S > 0) pack_kv_block(kv, kernels, p, b, kh, 0, p.S);
      const std::int64_t ldl = padded_keys(p.S);
      L.reset(static_cast<std::size_t>(p.T * std::max<std::int64_t>(ldl, 1)) * sizeof(float));
      P.reserve(kernels, p.T, ldl);
      float* l_all = L.as<float>();
      for (std::int64_t g = 0; g < p.G; ++g) {
        p.check_interrupt();  // between heads, outside the parallel regions
        pack_q_head(Q, kernels, p, b, kh, g);
        O.assign_zero(p.T, kernels.Hp);
        // Row tiles are independent: threads split them.
#pragma omp parallel for num_threads(p.threads) schedule(static)
        for (std::int64_t r0 = 0; r0 < p.T; r0 += mr) {
          const std::int64_t r1 = std::min(r0 + mr, p.T);
          if (p.S > 0) qk_logits(l_all, ldl, kernels, Q, r0, r1, kv, p.scale);  // L = scale Q Kᵀ
          mask_logits(l_all + r0 * ldl, ldl, p, r1 - r0, r0, r1 - r0, 0, p.S);
        }
        std::vector<float> denom(static_cast<std::size_t>(p.T)), base(denom.size());
#pragma omp parallel for num_threads(p.threads) schedule(static)
        for (std::int64_t t = 0; t < p.T; ++t) {
          // softmax(l) in fp32 over the whole row: max, exp, sum, divide; weights rounded for P·V.
          float* l = l_all + t * ldl;
          float m = -std::numeric_limits<float>::infinity();
          for (std::int64_t j = 0; j < p.S; ++j)
            if (l[j] > m) m = l[j];
          const float shift = std::isinf(m) && m < 0 ? 0.0f : m;
          for (std::int64_t j = 0; j < p.S; ++j) l[j] -= shift;
          exp_row(kernels, l, l, p.S);
          const float sum = blocked_sum(l, p.S);
          const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
          for (std::int64_t j = 0; j < p.S; ++j) l[j] = round_weight(l[j] * inv, p.precision);
          denom[static_cast<std::size_t>(t)] = sum;
          base[static_cast<std::size_t>(t)] = shift;
        }
#pragma omp parallel for num_threads(p.threads) schedule(static)
        for (std::int64_t r0 = 0; r0 < p.T; r0 += mr) {
          const std::int64_t r1 = std::min(r0 + mr, p.T);
          if (p.S > 0) {
            pack_p_rows(P, kernels, l_all, ldl, r0, r1, p.S);  // the bf16 weight matrix
            pv_accumulate(O.ptr(), kernels, P, r0, r1, kv);   // O = W V
          }
          for (std::int64_t t = r0; t < r1; ++t) {
            // O is already normalised: write it with a denominator of 1 (0 for a row with no key).
            const float sum = denom[static_cast<std::size_t>(t)];
            finish_row(p, b, kh, g, t, O.row(t, kernels.Hp), base[static_cast<std::size_t>(t)] + std::log(sum),
                             sum == 0.0f ? 0.0f : 1.0f);
          }
        }
      }
    }
}

}  // namespace flashgqa
