// The neon-bf16 decode PV kernel (contract in microkernels.hpp; design in neon_bf16_decode_common.hpp).
//   decode_pv_rows: the chunks of two V rows (keys j, j + 1) are interleaved into bf16 pairs along keys
//     (ZIP1/ZIP2: the pair layout of the packed V panels, built in registers) and each row's P word of
//     the same two keys, a lane of a 4-word P load (keys j .. j + 8), is accumulated with BFDOT by
//     lane. The rows' accumulators (16 at most: 8 columns x 2 registers per chunk) are loaded from O
//     and stored back once per group of keys and column pass: all rows in one pass (R >= 5: 8 columns
//     per pass, R = 3, 4: 16, R = 2: 32, R = 1: 64), the later column passes over a group reading its
//     rows from L1. The fast path (bf16 rows, H = 64 or 128, groups of 8 KiB of V whose keys are all
//     present) has every size a constant; the generic path (any dtype and H, groups of 32 keys)
//     converts and masks chunk by chunk. Each O element takes its keys in increasing order, two per
//     BFDOT, in both: the same bits.
#include "kernels/neon_bf16_decode_common.hpp"

namespace flashgqa {
namespace {

using namespace decode_neon_bf16;

constexpr int kPvGroup = 32;                 // keys per group on the generic path
constexpr int kPvFastGroupBytes = 8192;      // of bf16 V per group on the fast path (32 keys at H = 128)
constexpr int kPairsPerLoad = 4;             // P words (key pairs) per 128-bit P load

// Chunks of 8 columns per column pass for R rows: 2 accumulators per chunk and row, 16 in all.
template <int R>
constexpr int pass_chunks() {
  return R == 1 ? 8 : R == 2 ? 4 : R <= 4 ? 2 : 1;
}

// acc[r][..] += P[r][j, j + 1] . V[j, j + 1][chunk columns] for the C chunks, the rows' P words in lane
// L of pw[r]: one interleave of the two V rows per chunk feeds the R rows' BFDOTs.
template <int R, int C, int L, typename LoadV>
inline __attribute__((always_inline)) void pv_step(float32x4_t (&acc)[R][2 * C], const uint32x4_t (&pw)[R],
                                                   std::int64_t j, const LoadV& load) {
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
    const uint16x8_t a = load(j, c), b = load(j + 1, c);
    const bfloat16x8_t lo = vreinterpretq_bf16_u16(vzip1q_u16(a, b));  // columns 0..3 of the chunk
    const bfloat16x8_t hi = vreinterpretq_bf16_u16(vzip2q_u16(a, b));  // columns 4..7
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const bfloat16x8_t p = vreinterpretq_bf16_u32(pw[r]);
      acc[r][2 * c] = vbfdotq_laneq_f32(acc[r][2 * c], lo, p, L);
      acc[r][2 * c + 1] = vbfdotq_laneq_f32(acc[r][2 * c + 1], hi, p, L);
    }
  }
}

// O[r][0 .. 8 C) (o at the pass's first column) += sum_{j0 <= j < j1} P[r][j] V[j][...], keys in pairs
// (j0, j1 even); load(j, c) gives chunk c of the pass's columns of key j's row as bf16 (zero for a key
// that is not there). Four key pairs per P load (BFDOT by lane), the last pairs one word at a time.
template <int R, int C, typename LoadV>
inline __attribute__((always_inline)) void pv_pass(float* o, std::int64_t ldo, const std::uint32_t* p,
                                                   std::int64_t ldp_words, std::int64_t j0, std::int64_t j1,
                                                   const LoadV& load) {
  float32x4_t acc[R][2 * C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int i = 0; i < 2 * C; ++i) acc[r][i] = vld1q_f32(o + r * ldo + 4 * i);
  std::int64_t j = j0;
  for (; j + 2 * kPairsPerLoad <= j1; j += 2 * kPairsPerLoad) {
    uint32x4_t pw[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) pw[r] = vld1q_u32(p + r * ldp_words + j / 2);
    pv_step<R, C, 0>(acc, pw, j, load);
    pv_step<R, C, 1>(acc, pw, j + 2, load);
    pv_step<R, C, 2>(acc, pw, j + 4, load);
    pv_step<R, C, 3>(acc, pw, j + 6, load);
  }
  for (; j < j1; j += 2) {
    uint32x4_t pw[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) pw[r] = vld1q_dup_u32(p + r * ldp_words + j / 2);
    pv_step<R, C, 0>(acc, pw, j, load);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int i = 0; i < 2 * C; ++i) vst1q_f32(o + r * ldo + 4 * i, acc[r][i]);
}

template <int R>
void rescale_o(const DecodePv& t) {
  for (int r = 0; r < R; ++r)
    for (std::int64_t h = 0; h < t.Hp; h += 4)
      vst1q_f32(t.o + r * t.ldo + h, vmulq_n_f32(vld1q_f32(t.o + r * t.ldo + h), t.corr[r]));
}

// The generic path: keys [j_begin, nkeys) (j_begin even) of dtype D, any H, in groups of kPvGroup
// keys; column passes of pass_chunks<R>() chunks (R = 1 with Hp an odd multiple of 32: the last pass
// 32 columns). Keys j >= n read as zero rows.
template <int R, DType D>
void pv_rows(const DecodePv& t, std::int64_t j_begin) {
  constexpr int C = pass_chunks<R>(), kTail = C > 4 ? 4 : C;
  const char* v0 = static_cast<const char*>(t.v);
  const auto* p = static_cast<const std::uint32_t*>(t.p);
  const std::int64_t ld_bytes = t.ldv * elem_bytes(D), ldp_words = t.ldp / 2, H = t.H;
  for (std::int64_t j0 = j_begin; j0 < t.nkeys; j0 += kPvGroup) {
    const std::int64_t j1 = j0 + kPvGroup < t.nkeys ? j0 + kPvGroup : t.nkeys;
    std::int64_t h0 = 0;
    const auto load = [&](std::int64_t j, int c) {
      if (j >= t.n) return vdupq_n_u16(0);
      const float scale = D == DType::i8 ? t.v_scale[j * t.ld_scale] : 1.0f;
      return load8<D>(v0 + j * ld_bytes, h0 + std::int64_t{kChunk} * c, H, scale);
    };
    for (; h0 + kChunk * C <= t.Hp; h0 += kChunk * C) pv_pass<R, C>(t.o + h0, t.ldo, p, ldp_words, j0, j1, load);
    for (; h0 < t.Hp; h0 += kChunk * kTail) pv_pass<R, kTail>(t.o + h0, t.ldo, p, ldp_words, j0, j1, load);
  }
}

// The fast path for bf16 rows with H = Hp = 8 HC: groups of kPvFastGroupBytes of V whose keys are all
// present (j < n), plain loads and every size a constant, then the generic path for the rest. Same sums
// in the same order as the generic path, so the same bits.
template <int R, int HC>
void pv_rows_fast(const DecodePv& t) {
  constexpr int C = pass_chunks<R>();
  constexpr std::int64_t kGroup = kPvFastGroupBytes / (2 * kChunk * HC);
  static_assert(HC % C == 0 && kGroup % 2 == 0);
  const auto* v0 = static_cast<const std::uint16_t*>(t.v);
  const auto* p = static_cast<const std::uint32_t*>(t.p);
  const std::int64_t ldv = t.ldv, ldp_words = t.ldp / 2;
  const std::int64_t full = (t.nkeys < t.n ? t.nkeys : t.n) / kGroup * kGroup;
  for (std::int64_t j0 = 0; j0 < full; j0 += kGroup)
#pragma GCC unroll 16
    for (int c0 = 0; c0 < HC; c0 += C)
      pv_pass<R, C>(t.o + kChunk * c0, t.ldo, p, ldp_words, j0, j0 + kGroup, [&](std::int64_t j, int c) {
        return vld1q_u16(v0 + j * ldv + kChunk * (c0 + c));
      });
  pv_rows<R, DType::bf16>(t, full);
}

template <int R>
void pv_rows_any(const DecodePv& t) {
  if (t.corr) rescale_o<R>(t);
  if (t.v_dtype == DType::bf16 && t.H == t.Hp) {
    if (t.Hp == 64) return pv_rows_fast<R, 8>(t);
    if (t.Hp == 128) return pv_rows_fast<R, 16>(t);
  }
  with_dtype(t.v_dtype, [&](auto d) { pv_rows<R, decltype(d)::value>(t, 0); });
}

}  // namespace

void neon_bf16_decode_pv_rows(const DecodePv& t) {
  with_rows<kDecodeMaxRows>(t.rows, [&](auto r) { pv_rows_any<decltype(r)::value>(t); });
}

}  // namespace flashgqa
