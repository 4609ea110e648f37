// Tile operations shared by the rungs of the ladder. The two matmuls and the exps run on the
// micro-kernels of the active instruction set (kernels/microkernels.hpp: packed operands, register
// tiles), the same ones flash uses, so the rungs differ only in what the seed's ladder changes —
// where the logits and the carries live — and `flashgqa bench` measures exactly that.
//
// A q block holds `rows` queries [t0, t0 + rows) of all G heads of one kv head: row m of the block is
// head g = m / rows, query t = t0 + m % rows (G·rows rows, so every K/V row serves the whole group).
// Row-range functions take rows [r0, r1) so rungs can spread row tiles over threads.
//
// Sums over keys are chained, not sequential: pv_accumulate and blocked_sum add at most kSumKeys terms
// in one fp32 chain and then add the chains' sums to the result one after another, so a term passes
// through at most kSumKeys + (number of chains) additions instead of S (rung_key_sums: the depth the
// error bounds use, reference/tolerance.hpp). At S = 2^22 a sequential fp32 sum of equal terms drifts
// by percents; chains of 256 keep it near 1e-3 at worst.
#pragma once

#include <cstdint>

#include "core/finish_rows.hpp"
#include "core/key_sums.hpp"
#include "core/problem.hpp"
#include "core/aligned_buffer.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa {

// The kernels (active instruction set, p.precision) and the padded head dim, chosen once per call.
struct RungKernels {
  explicit RungKernels(const Problem& p);
  const FlashKernels* kern;
  std::int64_t H, Hp;          // Hp: H padded to the kernels' column tile
  std::int64_t operand_bytes;  // 2 (bf16 pairs) or 4 (fp32)
  bool round_bf16;             // Precision::bf16
  float softcap;               // Problem::softcap (0 = off): qk_logits caps the logits
};

// fp32 accumulator rows [M][Hp], 64-byte aligned as the kernels require, zeroed.
struct AccRows {
  AlignedBuffer data;
  void assign_zero(std::int64_t M, std::int64_t Hp);
  float* row(std::int64_t r, std::int64_t Hp) const { return data.as<float>() + r * Hp; }
  float* ptr() const { return data.as<float>(); }
};

// Packed q rows [M][Hp] (operands).
struct QRows {
  AlignedBuffer data;
  std::int64_t M = 0;
};
// The G·rows rows of a q block (order above).
void pack_q_block(QRows& dst, const RungKernels& kernels, const Problem& p, std::int64_t b, std::int64_t kh,
                  std::int64_t t0, std::int64_t rows);
// The T rows of one head g.
void pack_q_head(QRows& dst, const RungKernels& kernels, const Problem& p, std::int64_t b, std::int64_t kh,
                 std::int64_t g);

// A KV block, keys [s0, s0 + n) packed for qk_tile and pv_tile, zero padded to npad keys.
struct KvBlock {
  AlignedBuffer k, v;
  std::int64_t n = 0, npad = 0;
};
void pack_kv_block(KvBlock& dst, const RungKernels& kernels, const Problem& p, std::int64_t b, std::int64_t kh,
                   std::int64_t s0, std::int64_t n);

// L [r][0..npad) <- scale · q_r · k_j for rows [r0, r1), then c tanh(L / c) with a softcap c; ldl a
// multiple of 16 (keys past n give 0).
void qk_logits(float* L, std::int64_t ldl, const RungKernels& kernels, const QRows& Q, std::int64_t r0,
               std::int64_t r1, const KvBlock& kv, float scale);

// Packed weights [rows][npad] (operands), for P·V.
struct PRows {
  AlignedBuffer data;
  std::int64_t ld = 0;  // = npad
  void reserve(const RungKernels& kernels, std::int64_t rows, std::int64_t npad);
};
// P rows [r0, r1) <- W [r][0..n) (fp32 weights, already rounded per the precision), zero padded.
void pack_p_rows(PRows& dst, const RungKernels& kernels, const float* W, std::int64_t ldw, std::int64_t r0,
                 std::int64_t r1, std::int64_t n);
// Keys per fp32 chain of the rungs' sums over keys (a multiple of kPanelKeys).
inline constexpr std::int64_t kSumKeys = 256;

// O [r][0..Hp) += P[r] · V for rows [r0, r1); O rows have leading dimension Hp. Each chain of kSumKeys
// keys is summed from zero and then added to O.

void pv_accumulate(float* O, const RungKernels& kernels, const PRows& P, std::int64_t r0, std::int64_t r1,
                   const KvBlock& kv);

// Sets L[m, n] = -inf (m < M, n < N, row stride ldl) where key s0 + n is not among the keys that row m's
// query t0 + m % rows may see (the block row order above; rows = M for a single head).
void mask_logits(float* L, std::int64_t ldl, const Problem& p, std::int64_t M, std::int64_t t0,
                 std::int64_t rows, std::int64_t s0, std::int64_t N);

// sum_j x[j], j < n, in chains of kSumKeys (chained_sum_depth(n, kSumKeys) additions per term).
float blocked_sum(const float* x, std::int64_t n);

// The sums over keys of a rung that walks the keys in blocks of bkv (S for one block), each block's
// weights summed by blocked_sum and its P·V by pv_accumulate, both added to the row's carries, which
// are rescaled once per block when `rescaled` (a running max): per term at most min(bkv, kSumKeys)
// additions in its chain, one per later chain of any block, and one into the carry.
KeySums rung_key_sums(const Problem& p, std::int64_t bkv, bool rescaled);

// Rounds a softmax weight per the precision rule (bf16 for P·V under Precision::bf16).
float round_weight(float w, Precision precision);

// dst[0..n) = exp(src[0..n)) with the kernels' vectorised exp (in place allowed).
inline void exp_row(const RungKernels& kernels, float* dst, const float* src, std::int64_t n) {
  kernels.kern->exp_n(dst, src, n);
}

// One online-softmax step for one row: logits l [n] (masked entries -inf), running max m and sum
// l_sum (updated). Writes the weights p [n] = exp(l - m_new), rounded for P·V (in place allowed),
// sums them unrounded, and returns the factor exp(m_old - m_new) by which the row's accumulator must
// be multiplied. The weights are summed by blocked_sum. A NaN logit is skipped by the max and poisons the sum, so it reaches the output.
float online_softmax_update(const RungKernels& kernels, float* p, const float* l, std::int64_t n, float& m,
                            float& l_sum, Precision precision);

// The requested block size, or `automatic` for 0, never longer than `extent` (the keys or queries it
// cuts; a longer block would only cost memory) and at least 1.
inline std::int64_t clamp_block(std::int64_t requested, std::int64_t automatic, std::int64_t extent) {
  const std::int64_t b = requested > 0 ? requested : automatic;
  return b < extent ? b : (extent > 0 ? extent : 1);
}

}  // namespace flashgqa
