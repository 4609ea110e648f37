// The neon-bf16 decode QK kernel (contract in microkernels.hpp; design in neon_bf16_decode_common.hpp).
//   decode_qk_rows: keys go in groups of 4 and rows in blocks of RB = 4, 2, 1 (R = 8: two blocks of 4,
//     the second reading the group's K rows from L1). Per block and group, RB x 4 accumulators (one per
//     (row, key)) take BFDOT(q[r] chunk, k[j] chunk) over the chunks of 8 h, key after key, each K row
//     read whole in address order (the Q chunks come from L1); then two FADDP rounds per row turn its
//     4 accumulators into the 4 logits ((l0 + l1) + (l2 + l3) per key: one fixed order whatever the row
//     block or path). The fast path (bf16 rows, H = 64 or 128, whole groups) has every size a constant;
//     the generic path (any dtype and H, the last partial group, the zero keys up to round_up(n, 16))
//     converts and masks chunk by chunk. Both give the same bits.
#include "kernels/neon_bf16_decode_common.hpp"

namespace flashgqa {
namespace {

using namespace decode_neon_bf16;

constexpr int kQkKeys = 4;  // keys per group: one FADDP tree gives a row's 4 logits in one register

// Lane j = the sum of the 4 lanes of a[j], pairwise: (a[j]0 + a[j]1) + (a[j]2 + a[j]3).
inline float32x4_t sum_lanes4(const float32x4_t (&a)[kQkKeys]) {
  return vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3]));
}

// S[r0 + r][j0 .. j0 + 4) for RB rows: keys j0 + j for j < nj are read (load(j0 + j, c) gives chunk c
// of the key's row as bf16), nc chunks each (kNc when it is not 0: the fast path, its chunk loop
// unrolled; the generic path's stays a loop, which cut this file's compile time from 234 s to 12 s);
// lanes j >= nj are written as 0 (keys past n).
template <int RB, int kNc, typename LoadK>
inline __attribute__((always_inline)) void qk_block(const DecodeQk& t, int r0, std::int64_t j0, int nj, int nc,
                                                    const LoadK& load) {
  const auto* q = static_cast<const std::uint16_t*>(t.q) + r0 * t.ldq;
  float32x4_t acc[RB][kQkKeys];
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < kQkKeys; ++j) acc[r][j] = vdupq_n_f32(0.0f);
#pragma GCC unroll 4
  for (int j = 0; j < kQkKeys; ++j) {
    if (j >= nj) break;
    // No load moves across this: GCC 12 otherwise hoists the Q chunks of all keys (RB x H / 8 registers
    // at H = 128) out of the key loop and spills them; they are L1 loads either way.
    __asm__ volatile("" ::: "memory");
    const auto chunk = [&](int c) {
      const bfloat16x8_t k = vreinterpretq_bf16_u16(load(j0 + j, c));
#pragma GCC unroll 4
      for (int r = 0; r < RB; ++r)
        acc[r][j] = vbfdotq_f32(acc[r][j], vreinterpretq_bf16_u16(vld1q_u16(q + r * t.ldq + kChunk * c)), k);
    };
    if constexpr (kNc > 0) {
#pragma GCC unroll 16
      for (int c = 0; c < kNc; ++c) chunk(c);
    } else {
      for (int c = 0; c < nc; ++c) chunk(c);
    }
  }
  const float32x4_t scale = vdupq_n_f32(t.scale);
  // Keys past n are 0 whatever the scale (0 * inf would not be).
  const uint32x4_t present = lanes4(0, 0, nj);
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r) {
    const float32x4_t logits = vmulq_f32(sum_lanes4(acc[r]), scale);
    vst1q_f32(t.s + (r0 + r) * t.lds + j0, vbslq_f32(present, logits, vdupq_n_f32(0.0f)));
  }
}

// The generic path: S[r][j] for j in [j_begin, round_up(n, 16)) (j_begin a multiple of 4), dtype D,
// any H: ceil(H / 8) chunks per key (Q is zero past H, the loads mask K there).
template <int R, DType D>
void qk_rows(const DecodeQk& t, std::int64_t j_begin) {
  const char* k0 = static_cast<const char*>(t.k);
  const std::int64_t ld_bytes = t.ldk * elem_bytes(D), H = t.H;
  const int nc = static_cast<int>((H + kChunk - 1) / kChunk);
  const auto load = [&](std::int64_t j, int c) {
    const float scale = D == DType::i8 ? t.k_scale[j * t.ld_scale] : 1.0f;
    return load8<D>(k0 + j * ld_bytes, std::int64_t{kChunk} * c, H, scale);
  };
  const std::int64_t end = round_up(t.n, std::int64_t{16});
  for (std::int64_t j0 = j_begin; j0 < end; j0 += kQkKeys) {
    const std::int64_t left = t.n - j0;
    const int nj = left >= kQkKeys ? kQkKeys : left > 0 ? static_cast<int>(left) : 0;
    row_blocks<R>([&](auto rb, int r0) { qk_block<decltype(rb)::value, 0>(t, r0, j0, nj, nc, load); });
  }
}

// The fast path for bf16 rows with H = Hp = 8 HC: whole groups of 4 keys with plain loads and every
// size a constant, then the generic path for the rest. Same sums in the same order: the same bits.
template <int R, int HC>
void qk_rows_fast(const DecodeQk& t) {
  const auto* k0 = static_cast<const std::uint16_t*>(t.k);
  const std::int64_t ldk = t.ldk;
  const auto load = [&](std::int64_t j, int c) { return vld1q_u16(k0 + j * ldk + kChunk * c); };
  const std::int64_t full = t.n / kQkKeys * kQkKeys;
  for (std::int64_t j0 = 0; j0 < full; j0 += kQkKeys)
    row_blocks<R>([&](auto rb, int r0) { qk_block<decltype(rb)::value, HC>(t, r0, j0, kQkKeys, HC, load); });
  qk_rows<R, DType::bf16>(t, full);
}

template <int R>
void qk_rows_any(const DecodeQk& t) {
  if (t.k_dtype == DType::bf16 && t.H == t.Hp) {
    if (t.Hp == 64) return qk_rows_fast<R, 8>(t);
    if (t.Hp == 128) return qk_rows_fast<R, 16>(t);
  }
  with_dtype(t.k_dtype, [&](auto d) { qk_rows<R, decltype(d)::value>(t, 0); });
}

}  // namespace

void neon_bf16_decode_qk_rows(const DecodeQk& t) {
  with_rows<kDecodeMaxRows>(t.rows, [&](auto r) { qk_rows_any<decltype(r)::value>(t); });
}

}  // namespace flashgqa
