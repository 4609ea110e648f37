// The avx512bf16 decode kernels (contract in microkernels.hpp): K and V read straight from their rows,
// whole rows in address order, for tasks of at most kDecodeMaxRows query rows.
// Compiled with the flags of kernels_avx512bf16.cpp (CMakeLists.txt).
//
// Decode does ~G FLOPs per K/V byte, so it is bound by the DRAM stream, not by vdpbf16ps: these
// kernels spend instructions (a transpose-add, permutes) to avoid any packed copy. What decides their
// speed is the order of the loads and the instructions per key: the hardware prefetchers keep a stream
// going only when the rows are read line after line, and then software prefetch only costs (it was
// removed: up to 28% slower with it, docs/performance.md, decode I).
//   decode_qk_rows: the rows go in blocks of RB = 8, 4, 2, 1 (R = 4: one block); per block and per
//     16 / RB keys, 16 accumulators (one per (row, key)) take `vdpbf16ps(q[r] chunk, k[j] chunk)` over
//     the Hp/32 chunks of 32 h, then a 16x16 transpose-add turns them into 16 logits (RB rows x 16 / RB
//     keys). Each logit's lanes are summed in the same fixed order whatever its slot. The fast path
//     (bf16 rows, H = 64, 128, 256, whole groups of 16 keys) reads each K row whole (key-major, Q
//     chunks from L1) with every size a constant; the generic path (other dtypes and H, the last
//     partial group) converts and masks chunk by chunk. Both give the same bits.
//   decode_pv_rows: two V rows are interleaved into bf16 pairs along keys (vpermt2w) and each row's
//     broadcast P word (the same two keys) is accumulated with vdpbf16ps into the row's accumulators,
//     loaded from and stored back to O (L1) once per group of keys. The fast path (as above, groups of
//     8 KiB of V) reads whole rows, in one pass when the rows' accumulators fit (R <= 8 / (H / 32)) or
//     two at H <= 128 when half the rows' do, else goes 64 columns per pass (32 when R > 4); the
//     generic path goes 64 or 32 columns per pass over groups of 32 keys. Both accumulate each O
//     element's keys in increasing order: the same bits.
#include <immintrin.h>

#include <cstdint>

#include "kernels/avx512_helpers.hpp"
#include "kernels/microkernels.hpp"
#include "kernels/row_count.hpp"

namespace flashgqa {
namespace {

constexpr int kQkGroup = 16;  // keys per transpose-add
constexpr int kPvGroup = 32;  // keys per pass over the columns (8 KiB of bf16 V at H = 128: L1)
constexpr int kPvFastGroupBytes = 8192;  // of V per group on the fast path (32 keys at H = 128)
using word_t = std::uint32_t __attribute__((may_alias));

inline std::int64_t elem_bytes(DType d) { return d == DType::f32 ? 4 : 2; }

// out lane j = sum of the 16 lanes of v[j] (v is clobbered).
inline __m512 transpose_add16(__m512 v[16]) {
  __m512 t[8];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3)
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  __m512 u[4];
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: the lane's partial sums of keys 4i..4i+3
    const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // Sum the four 128-bit lanes: pairs of lanes, then the pairs.
  const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xdd));
  const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xdd));
}

// Lane r KG + j of v (KG = 16 / RB) to s[r lds + j]: the RB x KG logits of one transpose-add.
template <int RB>
inline __attribute__((always_inline)) void store_logits(float* s, std::int64_t lds, __m512 v) {
  if constexpr (RB == 1) {
    _mm512_storeu_ps(s, v);
  } else if constexpr (RB == 2) {
    _mm256_storeu_ps(s, _mm512_castps512_ps256(v));
    _mm256_storeu_ps(s + lds, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  } else if constexpr (RB == 4) {
    _mm_storeu_ps(s, _mm512_castps512_ps128(v));
    _mm_storeu_ps(s + lds, _mm512_extractf32x4_ps(v, 1));
    _mm_storeu_ps(s + 2 * lds, _mm512_extractf32x4_ps(v, 2));
    _mm_storeu_ps(s + 3 * lds, _mm512_extractf32x4_ps(v, 3));
  } else {
    static_assert(RB == 8);
    const __m128 x[4] = {_mm512_castps512_ps128(v), _mm512_extractf32x4_ps(v, 1), _mm512_extractf32x4_ps(v, 2),
                         _mm512_extractf32x4_ps(v, 3)};
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {  // rows 2i and 2i + 1
      _mm_storel_pi(reinterpret_cast<__m64*>(s + 2 * i * lds), x[i]);
      _mm_storeh_pi(reinterpret_cast<__m64*>(s + (2 * i + 1) * lds), x[i]);
    }
  }
}

// 32 operands of a source row from column h0, as bf16: a plain load when the row is bf16 and H is a
// multiple of 32 (kPlain), otherwise converted, rounded and masked by load32_bf16.
template <bool kPlain>
inline __m512i load_row32(const char* row, DType dtype, std::int64_t h0, std::int64_t H) {
  if (kPlain) return _mm512_loadu_si512(reinterpret_cast<const std::uint16_t*>(row) + h0);
  return load32_bf16(row, dtype, h0, H);
}

// S[r0 + r][j0 + j] for RB rows and KG = 16 / RB keys (lane r KG + j of one transpose-add); keys
// j >= nj of the group are zero. Each K chunk is loaded once and feeds the RB rows' accumulators.
template <int RB, bool kPlain, bool kFull>
inline void qk_block(const DecodeQk& t, const char* kr, std::int64_t ld_bytes, int r0, std::int64_t j0, int nj) {
  constexpr int KG = kQkGroup / RB;
  const auto* q = static_cast<const std::uint16_t*>(t.q) + r0 * t.ldq;
  __m512 acc[kQkGroup];
#pragma GCC unroll 16
  for (int i = 0; i < kQkGroup; ++i) acc[i] = _mm512_setzero_ps();
  if (kFull || nj > 0) {
#pragma GCC unroll 8
    for (std::int64_t h0 = 0; h0 < t.Hp; h0 += 32) {
      __m512bh qc[RB];
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r) qc[r] = (__m512bh)_mm512_load_si512(q + r * t.ldq + h0);
#pragma GCC unroll 16
      for (int j = 0; j < KG; ++j) {
        const __m512i kc = kFull || j < nj ? load_row32<kPlain>(kr + j * ld_bytes, t.k_dtype, h0, t.H) : _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int r = 0; r < RB; ++r) acc[r * KG + j] = _mm512_dpbf16_ps(acc[r * KG + j], qc[r], (__m512bh)kc);
      }
    }
  }
  store_logits<RB>(t.s + r0 * t.lds + j0, t.lds, _mm512_mul_ps(transpose_add16(acc), _mm512_set1_ps(t.scale)));
}

// S[r0 .. r0+RB)[j0 .. j0+16): sub-groups of 16 / RB keys; keys j >= nj of the group are zero.
template <int RB, bool kPlain>
inline void qk_rows_block(const DecodeQk& t, const char* k0, std::int64_t ld_bytes, int r0, std::int64_t j0, int nj) {
  constexpr int KG = kQkGroup / RB;
  if (nj >= kQkGroup) {
#pragma GCC unroll 8
    for (int jj = 0; jj < kQkGroup; jj += KG)
      qk_block<RB, kPlain, true>(t, k0 + (j0 + jj) * ld_bytes, ld_bytes, r0, j0 + jj, KG);
    return;
  }
  for (int jj = 0; jj < kQkGroup; jj += KG)
    qk_block<RB, kPlain, false>(t, k0 + (j0 + jj) * ld_bytes, ld_bytes, r0, j0 + jj, nj - jj);
}

// S[r][j0 .. j0+16) for R rows, in row blocks of 8, 4, 2, 1.
template <int R, bool kPlain>
inline void qk_group(const DecodeQk& t, const char* k0, std::int64_t ld_bytes, std::int64_t j0, int nj) {
  int r0 = 0;
  if constexpr (R >= 8) { qk_rows_block<8, kPlain>(t, k0, ld_bytes, r0, j0, nj); r0 += 8; }
  if constexpr (R % 8 >= 4) { qk_rows_block<4, kPlain>(t, k0, ld_bytes, r0, j0, nj); r0 += 4; }
  if constexpr (R % 4 >= 2) { qk_rows_block<2, kPlain>(t, k0, ld_bytes, r0, j0, nj); r0 += 2; }
  if constexpr (R % 2 == 1) qk_rows_block<1, kPlain>(t, k0, ld_bytes, r0, j0, nj);
}

// The generic path: S[r][j] for j in [j_begin, n), any dtype and H.
template <int R, bool kPlain>
void qk_rows(const DecodeQk& t, std::int64_t j_begin) {
  const char* k0 = static_cast<const char*>(t.k);
  const std::int64_t ld_bytes = t.ldk * elem_bytes(t.k_dtype);
  for (std::int64_t j0 = j_begin; j0 < t.n; j0 += kQkGroup) {
    const std::int64_t nj = t.n - j0;
    qk_group<R, kPlain>(t, k0, ld_bytes, j0, nj >= kQkGroup ? kQkGroup : static_cast<int>(nj));
  }
}

// The fast path for bf16 rows with H = Hp = 32 HC: whole groups of 16 keys, everything a compile-time
// constant but the pointers, each transpose-add's accumulators in registers. Each key's row is read
// whole, in address order (key-major: the hardware prefetchers follow a sequential stream, which they
// did not when the rows were read chunk by chunk across keys; docs/performance.md); the Q chunks come
// from L1. Same sums in the same order as qk_block, so the same bits.
template <int RB, int HC>
inline __attribute__((always_inline)) __m512 qk_sums_fast(const std::uint16_t* q, std::int64_t ldq, const char* kr,
                                                         std::int64_t ld_bytes) {
  constexpr int KG = kQkGroup / RB;
  __m512 acc[kQkGroup];
#pragma GCC unroll 16
  for (int i = 0; i < kQkGroup; ++i) acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int j = 0; j < KG; ++j)
#pragma GCC unroll 8
    for (int c = 0; c < HC; ++c) {
      const __m512bh kc = (__m512bh)_mm512_loadu_si512(kr + j * ld_bytes + 64 * c);
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r)
        acc[r * KG + j] = _mm512_dpbf16_ps(acc[r * KG + j], (__m512bh)_mm512_load_si512(q + r * ldq + 32 * c), kc);
    }
  return transpose_add16(acc);
}

template <int RB, int HC>
inline __attribute__((always_inline)) void qk_rows_block_fast(const std::uint16_t* q, std::int64_t ldq, const char* kr,
                                                             std::int64_t ld_bytes, float* s, std::int64_t lds,
                                                             __m512 scale) {
  constexpr int KG = kQkGroup / RB;
#pragma GCC unroll 16
  for (int jj = 0; jj < kQkGroup; jj += KG)
    store_logits<RB>(s + jj, lds, _mm512_mul_ps(qk_sums_fast<RB, HC>(q, ldq, kr + jj * ld_bytes, ld_bytes), scale));
}

template <int R, int HC>
void qk_rows_fast(const DecodeQk& t) {
  const auto* q = static_cast<const std::uint16_t*>(t.q);
  const char* k0 = static_cast<const char*>(t.k);
  float* const s = t.s;
  const std::int64_t ldq = t.ldq, lds = t.lds, ld_bytes = t.ldk * 2;
  const std::int64_t full = t.n / kQkGroup * kQkGroup;
  const __m512 scale = _mm512_set1_ps(t.scale);
  for (std::int64_t j0 = 0; j0 < full; j0 += kQkGroup) {
    const char* kr = k0 + j0 * ld_bytes;
    int r0 = 0;  // row blocks of 8, 4, 2, 1
    if constexpr (R >= 8) { qk_rows_block_fast<8, HC>(q, ldq, kr, ld_bytes, s + j0, lds, scale); r0 += 8; }
    if constexpr (R % 8 >= 4) { qk_rows_block_fast<4, HC>(q + r0 * ldq, ldq, kr, ld_bytes, s + r0 * lds + j0, lds, scale); r0 += 4; }
    if constexpr (R % 4 >= 2) { qk_rows_block_fast<2, HC>(q + r0 * ldq, ldq, kr, ld_bytes, s + r0 * lds + j0, lds, scale); r0 += 2; }
    if constexpr (R % 2 == 1) qk_rows_block_fast<1, HC>(q + r0 * ldq, ldq, kr, ld_bytes, s + r0 * lds + j0, lds, scale);
  }
  if (full < t.n) qk_rows<R, true>(t, full);
}

// Words (a[c], b[c]) of two rows for c in 0..15 (lo) and 16..31 (hi).
inline __m512i pair_lo_idx() {
  return _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4,
                          35, 3, 34, 2, 33, 1, 32, 0);
}

// O[r][0 .. 32 NC) (o at the pass's first column) += sum_{j0 <= j < j1} P[r][j] V[j][...], keys in
// pairs (j0, j1 even); load(j, c) gives the 32 bf16 operands of chunk c of key j's row (zero for a key
// that is not there).
template <int R, int NC, typename Load>
inline __attribute__((always_inline)) void pv_pass(float* o, std::int64_t ldo, const word_t* p,
                                                  std::int64_t ldp_words, std::int64_t j0, std::int64_t j1,
                                                  const Load& load) {
  const __m512i lo_idx = pair_lo_idx(), hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
  __m512 acc[R][2 * NC];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < 2 * NC; ++c) acc[r][c] = _mm512_load_ps(o + r * ldo + 16 * c);
  const word_t* pw = p + j0 / 2;  // the P words of keys (j, j + 1), row r at pw[r ldp_words]
  for (std::int64_t j = j0; j < j1; j += 2, ++pw) {
    __m512bh w[2 * NC];  // the two rows' bf16 pairs, 16 columns each
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) {
      const __m512i a = load(j, c), b = load(j + 1, c);
      w[2 * c] = (__m512bh)_mm512_permutex2var_epi16(a, lo_idx, b);
      w[2 * c + 1] = (__m512bh)_mm512_permutex2var_epi16(a, hi_idx, b);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(pw[r * ldp_words]));
#pragma GCC unroll 8
      for (int c = 0; c < 2 * NC; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], x, w[c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < 2 * NC; ++c) _mm512_store_ps(o + r * ldo + 16 * c, acc[r][c]);
}

template <int R>
void rescale_o(const DecodePv& t) {
  for (int r = 0; r < R; ++r) {
    const __m512 c = _mm512_set1_ps(t.corr[r]);
    for (std::int64_t h = 0; h < t.Hp; h += 16)
      _mm512_store_ps(t.o + r * t.ldo + h, _mm512_mul_ps(_mm512_load_ps(t.o + r * t.ldo + h), c));
  }
}

// The generic path: keys [j_begin, nkeys) (j_begin even), any dtype and H.
template <int R, bool kPlain>
void pv_rows(const DecodePv& t, std::int64_t j_begin) {
  const char* v0 = static_cast<const char*>(t.v);
  const auto* p = static_cast<const word_t*>(t.p);
  const std::int64_t ld_bytes = t.ldv * elem_bytes(t.v_dtype), ldp_words = t.ldp / 2;
  // Up to 4 rows: 64 columns per pass (16 accumulators), so each broadcast P word feeds 4 vdpbf16ps.
  constexpr int kWide = R <= 4 ? 2 : 1;
  for (std::int64_t j0 = j_begin; j0 < t.nkeys; j0 += kPvGroup) {
    const std::int64_t j1 = j0 + kPvGroup < t.nkeys ? j0 + kPvGroup : t.nkeys;
    std::int64_t h0 = 0;
    const auto load = [&](std::int64_t j, int c) {
      return j < t.n ? load_row32<kPlain>(v0 + j * ld_bytes, t.v_dtype, h0 + 32 * c, t.H) : _mm512_setzero_si512();
    };
    for (; h0 + 32 * kWide <= t.Hp; h0 += 32 * kWide) pv_pass<R, kWide>(t.o + h0, t.ldo, p, ldp_words, j0, j1, load);
    for (; h0 < t.Hp; h0 += 32) pv_pass<R, 1>(t.o + h0, t.ldo, p, ldp_words, j0, j1, load);
  }
}

// Rows [0, R) in passes of RP rows over all HC chunks (2 HC RP <= 16 accumulators): each pass reads
// the group's V rows whole, in address order (the second from L1).
template <int R, int RP, int HC>
inline __attribute__((always_inline)) void pv_row_passes(float* o, std::int64_t ldo, const word_t* p,
                                                        std::int64_t ldp_words, std::int64_t j0, std::int64_t j1,
                                                        const char* v0, std::int64_t ld_bytes) {
  constexpr int kRows = R < RP ? R : RP;
  pv_pass<kRows, HC>(o, ldo, p, ldp_words, j0, j1,
                     [&](std::int64_t j, int c) { return _mm512_loadu_si512(v0 + j * ld_bytes + 64 * c); });
  if constexpr (R > RP) pv_row_passes<R - RP, RP, HC>(o + RP * ldo, ldo, p + RP * ldp_words, ldp_words, j0, j1, v0, ld_bytes);
}

// The fast path for bf16 rows with H = Hp = 32 HC: groups of kPvFastGroupBytes of V whose keys are all
// present, then the generic path for the rest. Where the accumulators of RP = 8 / HC rows over whole
// rows fit 16 registers and R <= RP, or R <= 2 RP at H <= 128 (G = 1..4 at H = 128), the group goes in
// one or two passes over whole V rows, each read in address order (two passes: +3-5% at G = 3, 4 and
// H = 128, -3% at H = 256); otherwise the columns go in passes of 64 (32 when R > 4) over the group,
// the later passes from L1. Same sums in the same order as the generic path, so the same bits.
template <int R, int HC>
void pv_rows_fast(const DecodePv& t) {
  constexpr int kRowsPerPass = 8 / HC;
  constexpr bool kWholeRows = R <= kRowsPerPass || (R <= 2 * kRowsPerPass && HC <= 4);
  constexpr int kWide = R <= 4 ? 2 : 1;  // 32-column chunks per column pass
  constexpr std::int64_t kGroup = kPvFastGroupBytes / (64 * HC);
  static_assert(HC % kWide == 0 && kGroup % 2 == 0);
  const char* v0 = static_cast<const char*>(t.v);
  const auto* p = static_cast<const word_t*>(t.p);
  float* const o = t.o;
  const std::int64_t ldo = t.ldo, ldp_words = t.ldp / 2, ld_bytes = t.ldv * 2;
  const std::int64_t full = (t.nkeys < t.n ? t.nkeys : t.n) / kGroup * kGroup;
  for (std::int64_t j0 = 0; j0 < full; j0 += kGroup) {
    if constexpr (kWholeRows) {
      pv_row_passes<R, kRowsPerPass, HC>(o, ldo, p, ldp_words, j0, j0 + kGroup, v0, ld_bytes);
    } else {
#pragma GCC unroll 8
      for (int c0 = 0; c0 < HC; c0 += kWide)
        pv_pass<R, kWide>(o + 32 * c0, ldo, p, ldp_words, j0, j0 + kGroup, [&](std::int64_t j, int c) {
          return _mm512_loadu_si512(v0 + j * ld_bytes + 64 * (c0 + c));
        });
    }
  }
  pv_rows<R, true>(t, full);
}

template <int R>
void qk_rows_any(const DecodeQk& t) {
  if (t.k_dtype != DType::bf16 || t.H != t.Hp) return qk_rows<R, false>(t, 0);
  switch (t.Hp) {
    case 64: return qk_rows_fast<R, 2>(t);
    case 128: return qk_rows_fast<R, 4>(t);
    case 256: return qk_rows_fast<R, 8>(t);
    default: return qk_rows<R, true>(t, 0);
  }
}

template <int R>
void pv_rows_any(const DecodePv& t) {
  if (t.corr) rescale_o<R>(t);
  if (t.v_dtype != DType::bf16 || t.H != t.Hp) return pv_rows<R, false>(t, 0);
  switch (t.Hp) {
    case 64: return pv_rows_fast<R, 2>(t);
    case 128: return pv_rows_fast<R, 4>(t);
    case 256: return pv_rows_fast<R, 8>(t);
    default: return pv_rows<R, true>(t, 0);
  }
}

}  // namespace

void avx512bf16_decode_qk_rows(const DecodeQk& t) {
  with_rows<kDecodeMaxRows>(t.rows, [&](auto r) { qk_rows_any<decltype(r)::value>(t); });
}

void avx512bf16_decode_pv_rows(const DecodePv& t) {
  with_rows<kDecodeMaxRows>(t.rows, [&](auto r) { pv_rows_any<decltype(r)::value>(t); });
}

}  // namespace flashgqa
