// The NEON BF16 kernel set (bf16-pair operand family, contract in microkernels.hpp), for aarch64 CPUs
// with FEAT_BF16 (HWCAP2_BF16: Neoverse V1, V2, N2, ...). Compiled with -march=armv8.2-a+bf16
// (CMakeLists.txt, this file only); chosen at run time. Precision::f32 runs on the neon set.
//
// BFDOT multiplies the two bf16 values of each 32-bit lane with the two of the other operand's lane
// and adds both products to the fp32 lane: the pair layout of the contract (the one vdpbf16ps uses),
// so the packed K and V panels are the avx512bf16 ones. Register tile 5 x 32 as two 5 x 16 halves, as
// in kernels_neon.cpp: 20 accumulators + 4 panel vectors + 5 row vectors of 4 pairs each; per 4 pair
// steps 16 panel loads and 5 row loads feed 80 BFDOTs (by lane), 8 multiply-adds each (twice FMLA's).
// Like vdpbf16ps, BFDOT (without FEAT_EBF16) flushes subnormal inputs and results to zero and rounds
// its steps to odd: differences below 2^-126 are allowed by the contract, the rest is within the fp32
// accumulation the tolerances count.
// The decode kernels (rows read straight from a KV cache) are in kernels_neon_bf16_decode_qk.cpp and
// _pv.cpp, with the same flags.
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "core/dtype.hpp"
#include "kernels/microkernels.hpp"
#include "kernels/neon_helpers.hpp"
#include "kernels/row_count.hpp"

namespace flashgqa {
namespace {

constexpr int kMR = 5;

// acc[r][0..4) += dot(a[r] pair i, b[i] pairs c0 .. c0+16) for the pair steps i given by load_a: the
// broadcast operand of row r at step i is lane L of x[r] (lane-indexed BFDOT).
template <int R, int L>
inline void dot_pair_step(float32x4_t (&acc)[R][kVecs], const bfloat16x8_t (&x)[R], const std::uint32_t* bi) {
  // No load moves across this: GCC 12 otherwise hoists all four steps' panel loads and spills.
  __asm__ volatile("" ::: "memory");
  bfloat16x8_t bv[kVecs];
  for (int v = 0; v < kVecs; ++v) bv[v] = vreinterpretq_bf16_u32(vld1q_u32(bi + 4 * v));
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = vbfdotq_laneq_f32(acc[r][v], bv[v], x[r], L);
}

// acc[r][0..4) += sum_{i < n} dot(a[r] pair i, b[i] pairs c0 .. c0+16); a rows of words (lda words
// apart), b rows of 32 words. Four pair steps per row load (BFDOT by lane); the last n % 4 steps
// with the row pair broadcast.
template <int R>
inline void dot_pairs_half(float32x4_t (&acc)[R][kVecs], const std::uint32_t* a, std::int64_t lda,
                           const std::uint32_t* b, std::int64_t n, int c0) {
  const std::uint32_t* arow[R];
  for (int r = 0; r < R; ++r) arow[r] = a + r * lda;
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    bfloat16x8_t x[R];
    for (int r = 0; r < R; ++r) x[r] = vreinterpretq_bf16_u32(vld1q_u32(arow[r] + i));
    dot_pair_step<R, 0>(acc, x, b + 32 * i + c0);
    dot_pair_step<R, 1>(acc, x, b + 32 * (i + 1) + c0);
    dot_pair_step<R, 2>(acc, x, b + 32 * (i + 2) + c0);
    dot_pair_step<R, 3>(acc, x, b + 32 * (i + 3) + c0);
  }
  for (; i < n; ++i) {
    bfloat16x8_t x[R];
    for (int r = 0; r < R; ++r) x[r] = vreinterpretq_bf16_u32(vld1q_dup_u32(arow[r] + i));
    dot_pair_step<R, 0>(acc, x, b + 32 * i + c0);
  }
}

template <int R>
void qk_rows(const QkTile& t) {
  qk_halves<R>(t, [&t](float32x4_t (&acc)[R][kVecs], int c0) {
    dot_pairs_half<R>(acc, static_cast<const std::uint32_t*>(t.q), t.ldq / 2, static_cast<const std::uint32_t*>(t.k), t.Hp / 2, c0);
  });
}

template <int R>
void pv_rows(const PvTile& t) {
  pv_halves<R>(t, [&t](float32x4_t (&acc)[R][kVecs], int c0) {
    dot_pairs_half<R>(acc, static_cast<const std::uint32_t*>(t.p), t.ldp / 2, static_cast<const std::uint32_t*>(t.v), t.nkeys / 2, c0);
  });
}

void qk_tile_5x32(const QkTile& t) {
  with_rows<kMR>(t.rows, [&](auto r) { qk_rows<decltype(r)::value>(t); });
}

void pv_tile_5x32(const PvTile& t) {
  with_rows<kMR>(t.rows, [&](auto r) { pv_rows<decltype(r)::value>(t); });
}

// P as bf16, rounded to nearest even: the high halves of the rounded fp32 lanes.
bool softmax_tile(const SoftmaxTile& t) {
  return softmax_rows(t, [&t](int r, std::int64_t j, float32x4_t e) {
    const uint16x4_t bits = vshrn_n_u32(vreinterpretq_u32_f32(round_bf16(e)), 16);
    vst1_u16(static_cast<std::uint16_t*>(t.p) + r * t.ldp + j, bits);
  });
}

// Element h of a source row as bf16 bits, rounded to nearest even (the bf16 family always rounds).
std::uint16_t operand_bits(const void* row, const PackSource& s, std::int64_t h) {
  return float_to_bf16_bits(load_element(row, s.dtype, h));
}

const void* key_row(const PackSource& s, std::int64_t j) {
  return packed_key_row(s, j, static_cast<std::int64_t>(dtype_size(s.dtype)));
}

void pack_q_row(void* dst, const PackSource& s) {
  auto* d = static_cast<std::uint16_t*>(dst);
  for (std::int64_t h = 0; h < s.Hp; ++h) d[h] = h < s.H ? operand_bits(s.src, s, h) : 0;
}

// K panels [Hp/2][32][2]: key j, element h at panel j/32, word (h/2, j%32), half h%2.
void pack_k(void* dst, const PackSource& s) {
  auto* d = static_cast<std::uint16_t*>(dst);
  const std::int64_t npad = padded_keys(s.n);
  std::memset(d, 0, static_cast<std::size_t>(npad * s.Hp) * sizeof(std::uint16_t));
  for (std::int64_t j = 0; j < s.n; ++j) {
    const void* row = key_row(s, j);
    std::uint16_t* panel = d + (j / kPanelKeys) * s.Hp * kPanelKeys + (j % kPanelKeys) * 2;
    for (std::int64_t h = 0; h < s.H; ++h) panel[(h / 2) * 2 * kPanelKeys + h % 2] = operand_bits(row, s, h);
  }
}

// V panels [npad/2][32][2] per h tile: key j, column c at word (j/2, c), half j%2.
void pack_v(void* dst, const PackSource& s) {
  auto* d = static_cast<std::uint16_t*>(dst);
  const std::int64_t npad = padded_keys(s.n);
  std::memset(d, 0, static_cast<std::size_t>(npad * s.Hp) * sizeof(std::uint16_t));
  for (std::int64_t j = 0; j < s.n; ++j) {
    const void* row = key_row(s, j);
    std::uint16_t* pair = d + (j / 2) * 2 * kHTile + j % 2;
    for (std::int64_t h = 0; h < s.H; ++h)
      pair[(h / kHTile) * npad * kHTile + (h % kHTile) * 2] = operand_bits(row, s, h);
  }
}

}  // namespace

const FlashKernels& neon_bf16_kernels() {
  static const FlashKernels k{.name = "neon-bf16",
                              .operand_bytes = 2,
                              .mr = kMR,
                              .qk_tile = qk_tile_5x32,
                              .pv_tile = pv_tile_5x32,
                              .softmax_tile = softmax_tile,
                              .exp_n = exp_n,
                              .softcap_n = softcap_n,
                              .pack_q_row = pack_q_row,
                              .pack_k = pack_k,
                              .pack_v = pack_v,
                              .decode_qk_rows = neon_bf16_decode_qk_rows,
                              .decode_pv_rows = neon_bf16_decode_pv_rows};
  return k;
}

}  // namespace flashgqa
