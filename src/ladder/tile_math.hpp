// Portable tile operations shared by the rungs of the ladder: loading operand blocks (rounded per
// the precision rule), the two matmuls with fp32 accumulation, causal masking, and the online
// softmax update. Plain loops: the rungs differ in where their carries live, not in these.
//
// A q block holds `rows` queries [t0, t0 + rows) of all G heads of one kv head: row m of the block is
// head g = m / rows, query t = t0 + m % rows (G·rows rows, so every K/V row serves the whole group).
#pragma once

#include <cstdint>

#include "core/problem.hpp"

namespace flashgqa {

// dst [G·rows, H] <- q[b, kh, :, t0:t0+rows, :] as fp32 operands.
void load_q_block(float* dst, const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t t0,
                  std::int64_t rows);
// dst [n, H] <- k[b, kh, s0:s0+n, :] (or v) as fp32 operands.
void load_k_block(float* dst, const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t s0,
                  std::int64_t n);
void load_v_block(float* dst, const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t s0,
                  std::int64_t n);

// L [M, N] <- scale · Q [M, H] · Kᵀ, Kb [N, H]; fp32 accumulation in h order.
void qk_logits(float* L, const float* Q, std::int64_t M, const float* Kb, std::int64_t N,
               std::int64_t H, float scale);

// O [M, H] += P [M, N] · V [N, H]; fp32 accumulation in n order.
void pv_accumulate(float* O, const float* P, std::int64_t M, std::int64_t N, const float* V,
                   std::int64_t H);

// Sets L[m, n] = -inf (m < M) where key s0 + n is masked for row m's query t0 + m % rows (the block
// row order above; M = rows for a single head).
void mask_logits(float* L, const Problem& p, std::int64_t M, std::int64_t t0, std::int64_t rows,
                 std::int64_t s0, std::int64_t N);

// Rounds a softmax weight per the precision rule (bf16 for P·V under Precision::bf16).
float round_weight(float w, Precision precision);

// One online-softmax step for one row: logits l [n] (masked entries -inf), running max m and sum
// l_sum (updated). Writes the weights p [n] = exp(l - m_new), rounded for P·V, sums them unrounded,
// and returns the factor exp(m_old - m_new) by which the row's accumulator must be multiplied.
// A NaN logit is skipped by the max and poisons the sum, so it reaches the output.
float online_softmax_update(float* p, const float* l, std::int64_t n, float& m, float& l_sum,
                           Precision precision);

// Writes out row = acc / l_sum in out's dtype and lse = m + log(l_sum) (if p.lse). A row that saw no
// key (l_sum == 0) gets 0 and -inf.
void write_output_row(const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t g,
                      std::int64_t t, float* acc, float m, float l_sum);

// Number of G·rows q blocks and the block for an automatic (0) size.
inline std::int64_t block_or(std::int64_t requested, std::int64_t automatic) {
  return requested > 0 ? requested : automatic;
}

}  // namespace flashgqa
