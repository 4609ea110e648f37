// The AVX-512 decode QK kernel (contract in microkernels.hpp; design in avx512_decode_common.hpp),
// over a multiply-add policy Mac (vdpbf16ps, or two FMAs per pair: the same bits above 2^-126):
//   decode_qk_rows: the rows go in blocks of RB = 8, 4, 2, 1 (R = 4: one block); per block and per
//     16 / RB keys, 16 accumulators (one per (row, key)) take Mac::mac(q[r] chunk, k[j] chunk) over
//     the Hp/32 chunks of 32 h, then a 16x16 transpose-add turns them into 16 logits (RB rows x 16 / RB
//     keys). Each logit's lanes are summed in the same fixed order whatever its slot. The fast path
//     (bf16 or int8 rows, H = 64, 96, 128, 256, whole groups of 16 keys) reads each K row whole
//     (key-major, Q chunks from L1, the Q rows contiguous so every offset is a constant) with every
//     size a constant, int8 chunks scaled and rounded as they are loaded; blocks of 8 rows go chunk
//     by chunk over their 2 keys, so each Q chunk is loaded once for both (T = 2 at G = 4: 1.12x
//     faster in L2, docs/performance.md, session 30); the generic path (other dtypes and H, the last
//     partial group) converts and masks chunk by chunk. Both give the same bits.
//   int8 K in the integers form (DotI16, decode_qk_rows_i8): the same loops on int16 Q rows and K rows
//     sign-extended as they are loaded, the sums added as integers, then each logit times its row's
//     factor and its key's scale (logits).
// Q rows: Q[r] chunk c at q + r ldq_bytes + c Mac::kQChunkBytes (QRows).
#pragma once

#include <cstring>
#include <type_traits>

#include "kernels/avx512_decode_common.hpp"

namespace flashgqa {
namespace {
namespace decode_avx512 {

struct QRows {
  const char* q;
  std::int64_t ld_bytes;
  const float* factor = nullptr;  // DotI16: row r's factor at factor[r] (quantize_q_rows); else null
};

// a + b as fp32, or as int32 (kInt: DotI16's sums).
template <bool kInt>
inline __m512 add_sums(__m512 a, __m512 b) {
  if constexpr (kInt)
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  else
    return _mm512_add_ps(a, b);
}

// out lane j = sum of the 16 lanes of v[j] (v is clobbered), fp32 or int32 (kInt).
template <bool kInt>
inline __attribute__((always_inline)) __m512 transpose_add16(__m512 v[16]) {
  __m512 t[8];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3)
    t[i] = add_sums<kInt>(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  __m512 u[4];
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: the lane's partial sums of keys 4i..4i+3
    const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = add_sums<kInt>(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // Sum the four 128-bit lanes: pairs of lanes, then the pairs.
  const __m512 w0 = add_sums<kInt>(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xdd));
  const __m512 w1 = add_sums<kInt>(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xdd));
  return add_sums<kInt>(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xdd));
}

// The RB x KG logits (lane r KG + j) of a transpose-add's sums: times the scale, or for DotI16
// (Mac::kIntSums) float(sum) times row r's factor rf[r] times key j's scale ks[j ld] (keys j >= nj: 0).
template <typename Mac, int RB>
inline __attribute__((always_inline)) __m512 logits(__m512 acc[kQkGroup], __m512 scale, const float* rf,
                                                   const float* ks, std::int64_t ld, int nj) {
  if constexpr (!Mac::kIntSums) {
    return _mm512_mul_ps(transpose_add16<false>(acc), scale);
  } else {
    constexpr int KG = kQkGroup / RB;
    const __m512 sums = _mm512_cvtepi32_ps(_mm512_castps_si512(transpose_add16<true>(acc)));
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i key = _mm512_and_si512(lane, _mm512_set1_epi32(KG - 1));
    const __m512 rows = _mm512_permutexvar_ps(_mm512_srli_epi32(lane, __builtin_ctz(KG)),
                                              _mm512_maskz_loadu_ps(first_lanes16(RB), rf));
    __m512 keys;
    if (ld == 1 && nj >= KG) {
      if constexpr (RB == 1) keys = _mm512_loadu_ps(ks);
      else if constexpr (RB == 2) keys = _mm512_broadcast_f32x8(_mm256_loadu_ps(ks));
      else if constexpr (RB == 4) keys = _mm512_broadcast_f32x4(_mm_loadu_ps(ks));
      else keys = _mm512_broadcast_f32x2(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(ks))));
    } else {
      const __mmask16 present = _mm512_cmplt_epi32_mask(key, _mm512_set1_epi32(nj));
      keys = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), present,
                                      _mm512_mullo_epi32(key, _mm512_set1_epi32(static_cast<int>(ld))), ks, 4);
    }
    return _mm512_mul_ps(_mm512_mul_ps(sums, rows), keys);
  }
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

// S[r0 + r][j0 + j] for RB rows and KG = 16 / RB keys (lane r KG + j of one transpose-add); keys
// j >= nj of the group are zero. Each K chunk is loaded once and feeds the RB rows' accumulators.
template <typename Mac, int RB, bool kPlain, bool kFull>
inline void qk_block(const DecodeQk& t, QRows qr, const char* kr, std::int64_t ld_bytes, int r0, std::int64_t j0,
                     int nj) {
  constexpr int KG = kQkGroup / RB;
  const char* q = qr.q + r0 * qr.ld_bytes;
  __m512 acc[kQkGroup];
#pragma GCC unroll 16
  for (int i = 0; i < kQkGroup; ++i) acc[i] = _mm512_setzero_ps();
  if (kFull || nj > 0) {
#pragma GCC unroll 8
    for (std::int64_t h0 = 0; h0 < t.Hp; h0 += 32) {
      const char* qc = q + h0 / 32 * Mac::kQChunkBytes;
#pragma GCC unroll 16
      for (int j = 0; j < KG; ++j) {
        const float* ks = t.k_scale != nullptr ? t.k_scale + (j0 + j) * t.ld_scale : nullptr;
        const __m512i kc = kFull || j < nj ? load_row32<Mac, kPlain>(kr + j * ld_bytes, t.k_dtype, h0, t.H, ks)
                                           : _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int r = 0; r < RB; ++r) acc[r * KG + j] = Mac::mac(acc[r * KG + j], qc + r * qr.ld_bytes, kc);
      }
    }
  }
  store_logits<RB>(t.s + r0 * t.lds + j0, t.lds,
                   logits<Mac, RB>(acc, _mm512_set1_ps(t.scale), qr.factor != nullptr ? qr.factor + r0 : nullptr,
                                   t.k_scale != nullptr ? t.k_scale + j0 * t.ld_scale : nullptr, t.ld_scale, nj));
}

// S[r0 .. r0+RB)[j0 .. j0+16) (the group's rows from kg, ld_bytes apart): sub-groups of 16 / RB keys;
// keys j >= nj of the group are zero.
template <typename Mac, int RB, bool kPlain>
inline void qk_rows_block(const DecodeQk& t, QRows qr, const char* kg, std::int64_t ld_bytes, int r0, std::int64_t j0,
                          int nj) {
  constexpr int KG = kQkGroup / RB;
  if (nj >= kQkGroup) {
#pragma GCC unroll 8
    for (int jj = 0; jj < kQkGroup; jj += KG)
      qk_block<Mac, RB, kPlain, true>(t, qr, kg + jj * ld_bytes, ld_bytes, r0, j0 + jj, KG);
    return;
  }
  for (int jj = 0; jj < kQkGroup; jj += KG)
    qk_block<Mac, RB, kPlain, false>(t, qr, kg + jj * ld_bytes, ld_bytes, r0, j0 + jj, nj - jj);
}

// S[r][j0 .. j0+16) for R rows (the group's rows from kg), in row blocks of 8, 4, 2, 1.
template <typename Mac, int R, bool kPlain>
inline void qk_group(const DecodeQk& t, QRows qr, const char* kg, std::int64_t ld_bytes, std::int64_t j0, int nj) {
  int r0 = 0;
  if constexpr (R >= 8) { qk_rows_block<Mac, 8, kPlain>(t, qr, kg, ld_bytes, r0, j0, nj); r0 += 8; }
  if constexpr (R % 8 >= 4) { qk_rows_block<Mac, 4, kPlain>(t, qr, kg, ld_bytes, r0, j0, nj); r0 += 4; }
  if constexpr (R % 4 >= 2) { qk_rows_block<Mac, 2, kPlain>(t, qr, kg, ld_bytes, r0, j0, nj); r0 += 2; }
  if constexpr (R % 2 == 1) qk_rows_block<Mac, 1, kPlain>(t, qr, kg, ld_bytes, r0, j0, nj);
}

// The generic path: S[r][j] for j in [j_begin, n) (j_begin a multiple of 16), any dtype and H, dense
// rows or pieces.
template <typename Mac, int R, bool kPlain>
void qk_rows(const DecodeQk& t, QRows qr, std::int64_t j_begin) {
  const KeyRows rows{static_cast<const char*>(t.k), t.k_pieces, t.ldk * elem_bytes(t.k_dtype)};
  for (std::int64_t j0 = j_begin; j0 < t.n; j0 += kQkGroup) {
    const std::int64_t nj = t.n - j0;
    qk_group<Mac, R, kPlain>(t, qr, rows.row(j0), rows.ld_bytes, j0, nj >= kQkGroup ? kQkGroup : static_cast<int>(nj));
  }
}

// The fast path for bf16 rows with H = Hp = 32 HC: whole groups of 16 keys, everything a compile-time
// constant but the pointers, each transpose-add's accumulators in registers. Each key's row is read
// whole, in address order (key-major: the hardware prefetchers follow a sequential stream, which they
// did not when the rows were read chunk by chunk across keys; docs/performance.md); the Q chunks come
// from L1. Same sums in the same order as qk_block, so the same bits.
// The keys' scales of Int8Rows (DotI16's logits), null for Bf16Rows.
inline const float* key_scales(const Bf16Rows&) { return nullptr; }
inline std::int64_t key_scales_ld(const Bf16Rows&) { return 0; }
inline const float* key_scales(const Bf16RowsAhead&) { return nullptr; }
inline std::int64_t key_scales_ld(const Bf16RowsAhead&) { return 0; }
template <typename Mac>
inline const float* key_scales(const Int8Rows<Mac>& r) { return r.scale; }
template <typename Mac>
inline std::int64_t key_scales_ld(const Int8Rows<Mac>& r) { return r.ld_scale; }

// The RB x KG logits of keys kr.at(0 .. KG) (lane r KG + j). Q row r's chunk c at q + (r HC + c)
// Mac::kQChunkBytes (the rows contiguous: one base register, constant offsets). Blocks of 8 rows go
// chunk by chunk: chunk c of both keys, then each row's Q chunk loaded once for the two. Smaller
// blocks go key by key: chunk by chunk would hold KG = 16 / RB keys' chunks beside the 16
// accumulators (all 32 registers at RB = 1), and at RB = 4 (T = 1) it was no faster. Either way each
// accumulator sums its chunks in order c = 0, 1, ..: the same bits as qk_block.
template <typename Mac, int RB, int HC, typename Rows>
inline __attribute__((always_inline)) __m512 qk_sums_fast(const char* q, const Rows& kr, __m512 scale,
                                                          const float* rf) {
  constexpr int KG = kQkGroup / RB;
  constexpr std::int64_t kRowBytes = HC * Mac::kQChunkBytes;
  __m512 acc[kQkGroup];
#pragma GCC unroll 16
  for (int i = 0; i < kQkGroup; ++i) acc[i] = _mm512_setzero_ps();
  if constexpr (RB == 8) {
#pragma GCC unroll 8
    for (int c = 0; c < HC; ++c) {
      __m512i kc[KG];
#pragma GCC unroll 16
      for (int j = 0; j < KG; ++j) kc[j] = kr.chunk(j, c);
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r)
#pragma GCC unroll 16
        for (int j = 0; j < KG; ++j)
          acc[r * KG + j] = Mac::mac(acc[r * KG + j], q + r * kRowBytes + c * Mac::kQChunkBytes, kc[j]);
    }
  } else {
#pragma GCC unroll 16
    for (int j = 0; j < KG; ++j)
#pragma GCC unroll 8
      for (int c = 0; c < HC; ++c) {
        const __m512i kc = kr.chunk(j, c);
#pragma GCC unroll 8
        for (int r = 0; r < RB; ++r)
          acc[r * KG + j] = Mac::mac(acc[r * KG + j], q + r * kRowBytes + c * Mac::kQChunkBytes, kc);
      }
  }
  return logits<Mac, RB>(acc, scale, rf, key_scales(kr), key_scales_ld(kr), KG);
}

template <typename Mac, int RB, int HC, typename Rows>
inline __attribute__((always_inline)) void qk_rows_block_fast(const char* q, const Rows& kr, float* s,
                                                             std::int64_t lds, __m512 scale, const float* rf) {
  constexpr int KG = kQkGroup / RB;
#pragma GCC unroll 16
  for (int jj = 0; jj < kQkGroup; jj += KG)
    store_logits<RB>(s + jj, lds, qk_sums_fast<Mac, RB, HC>(q, kr.at(jj), scale, rf));
}

// Rows: Bf16Rows, Bf16RowsAhead (bf16 rows prefetched line by line, Mac::kPrefetchRows), or
// Int8Rows (int8 rows with their scales, same order and sums). The Q rows are copied together first
// where they are not (R HC chunks, at most 8 KiB). Dense int8 rows go to L2 kDecodeInt8AheadKeys keys
// ahead (microkernels.hpp: from DRAM on Zen 4, 8 sequences at T = 1, 1.06x faster, 1.15x with the
// policy's prefetch of each call's first keys; docs/performance.md, session 32); bf16 rows were no
// faster with it there. On Intel cores (Mac::kPrefetchRows: FmaPairs, DotI16Ahead) each line is
// prefetched as it is loaded instead, through Bf16RowsAhead and Int8RowsAhead (session 41).
template <typename Mac, int R, int HC, typename Rows>
void qk_rows_fast(const DecodeQk& t, QRows qr, const Rows& k0) {
  constexpr std::int64_t kRowBytes = HC * Mac::kQChunkBytes;
  alignas(64) char qbuf[R * kRowBytes];
  const char* q = qr.q;
  if (qr.ld_bytes != kRowBytes) {
    for (int r = 0; r < R; ++r) std::memcpy(qbuf + r * kRowBytes, qr.q + r * qr.ld_bytes, kRowBytes);
    q = qbuf;
  }
  float* const s = t.s;
  const std::int64_t lds = t.lds;
  const std::int64_t full = t.n / kQkGroup * kQkGroup;
  const __m512 scale = _mm512_set1_ps(t.scale);
  const float* const rf0 = qr.factor;  // DotI16's row factors, else null
  const auto rf_at = [rf0](int r) { return rf0 != nullptr ? rf0 + r : nullptr; };
  const std::int64_t row_bytes = t.H * elem_bytes(t.k_dtype);
  for (std::int64_t j0 = 0; j0 < full; j0 += kQkGroup) {
    // (In pieces, the group's 16 rows lie in one.)
    Rows kr;
    if constexpr (std::is_same_v<Rows, Bf16RowsAhead>)
      kr = t.k_pieces != nullptr ? piece_rows_ahead(t.k_pieces, k0.ld_bytes, row_bytes, j0, t.n) : k0.at(j0);
    else
      kr = k0.at(j0, step_rows_ahead(k0.base, t.k_pieces, k0.ld_bytes, row_bytes, j0, t.n));
    if constexpr (kIsInt8Rows<Rows> && !Mac::kPrefetchRows)  // dense int8 rows: kDecodeInt8AheadKeys on (the contract)
      if (t.k_pieces == nullptr && j0 + kDecodeInt8AheadKeys + kQkGroup <= t.n)
        prefetch_rows_l2(k0.base + (j0 + kDecodeInt8AheadKeys) * k0.ld_bytes, k0.ld_bytes, row_bytes, kQkGroup);
    int r0 = 0;  // row blocks of 8, 4, 2, 1
    if constexpr (R >= 8) { qk_rows_block_fast<Mac, 8, HC>(q, kr, s + j0, lds, scale, rf0); r0 += 8; }
    if constexpr (R % 8 >= 4) { qk_rows_block_fast<Mac, 4, HC>(q + r0 * kRowBytes, kr, s + r0 * lds + j0, lds, scale, rf_at(r0)); r0 += 4; }
    if constexpr (R % 4 >= 2) { qk_rows_block_fast<Mac, 2, HC>(q + r0 * kRowBytes, kr, s + r0 * lds + j0, lds, scale, rf_at(r0)); r0 += 2; }
    if constexpr (R % 2 == 1) qk_rows_block_fast<Mac, 1, HC>(q + r0 * kRowBytes, kr, s + r0 * lds + j0, lds, scale, rf_at(r0));
  }
  if (full < t.n) {
    if constexpr (!kIsInt8Rows<Rows>) qk_rows<Mac, R, true>(t, qr, full);
    else qk_rows<Mac, R, false>(t, qr, full);
  }
}

template <typename Mac, int R, int HC>
void qk_rows_fast_any(const DecodeQk& t, QRows qr) {
  const char* k0 = static_cast<const char*>(t.k);
  if (t.k_dtype == DType::i8) return qk_rows_fast<Mac, R, HC>(t, qr, Int8Rows<Mac>{k0, t.ldk, t.k_scale, t.ld_scale});
  if constexpr (Mac::kPrefetchRows) return qk_rows_fast<Mac, R, HC>(t, qr, Bf16RowsAhead{k0, t.ldk * 2});
  qk_rows_fast<Mac, R, HC>(t, qr, Bf16Rows{k0, t.ldk * 2});
}

// The generic path for every key: plain loads where the rows are bf16 and H a multiple of 32.
template <typename Mac, int R>
void qk_rows_generic(const DecodeQk& t, QRows qr) {
  if (t.k_dtype == DType::bf16 && t.H == t.Hp) return qk_rows<Mac, R, true>(t, qr, 0);
  qk_rows<Mac, R, false>(t, qr, 0);
}

template <typename Mac, int R>
void qk_rows_any(const DecodeQk& t, QRows qr) {
  if constexpr (Mac::kIntSums) {  // DotI16: int8 rows only
    const Int8Rows<Mac> k0{static_cast<const char*>(t.k), t.ldk, t.k_scale, t.ld_scale};
    const auto fast = [&](const auto& rows) {
      if (t.H == t.Hp && t.Hp == 64) return qk_rows_fast<Mac, R, 2>(t, qr, rows), true;
      if (t.H == t.Hp && t.Hp == 96) return qk_rows_fast<Mac, R, 3>(t, qr, rows), true;
      if (t.H == t.Hp && t.Hp == 128) return qk_rows_fast<Mac, R, 4>(t, qr, rows), true;
      if (t.H == t.Hp && t.Hp == 256) return qk_rows_fast<Mac, R, 8>(t, qr, rows), true;
      return false;
    };
    if constexpr (Mac::kPrefetchRows)  // DotI16Ahead: dense rows line by line
      if (t.k_pieces == nullptr && fast(Int8RowsAhead<Mac>{k0})) return;
    if (!fast(k0)) qk_rows<Mac, R, false>(t, qr, 0);
    return;
  }
  if ((t.k_dtype != DType::bf16 && t.k_dtype != DType::i8) || t.H != t.Hp) return qk_rows<Mac, R, false>(t, qr, 0);
  switch (t.Hp) {
    case 64: return qk_rows_fast_any<Mac, R, 2>(t, qr);
    case 96: return qk_rows_fast_any<Mac, R, 3>(t, qr);
    case 128: return qk_rows_fast_any<Mac, R, 4>(t, qr);
    case 256: return qk_rows_fast_any<Mac, R, 8>(t, qr);
    default: return qk_rows_generic<Mac, R>(t, qr);
  }
}

// decode_qk_rows with Mac, Q rows as qr.
template <typename Mac>
void decode_qk_rows(const DecodeQk& t, QRows qr) {
  with_rows<kDecodeMaxRows>(t.rows, [&](auto r) { qk_rows_any<Mac, decltype(r)::value>(t, qr); });
}

#ifdef __AVX512VNNI__
// int8 K on DotI16 (avx512_decode_common.hpp) where H <= kSplitMaxHp and the Q rows are finite; false
// (nothing done) otherwise, and the caller takes its own path.
template <typename Mac = DotI16>
inline bool decode_qk_rows_i8(const DecodeQk& t) {
  if (t.k_dtype != DType::i8 || t.Hp > kSplitMaxHp) return false;
  alignas(64) std::int16_t qi[kDecodeMaxRows * kSplitMaxHp];
  float factor[kDecodeMaxRows];
  if (!quantize_q_rows(qi, factor, t.q, t.ldq, t.Hp, t.rows, t.scale)) return false;
  decode_qk_rows<Mac>(t, {reinterpret_cast<const char*>(qi), t.Hp * 2, factor});
  return true;
}
#endif

// decode_qk_rows with two FMAs per pair (Fma<kSplitQ>: FmaPairs or FmaPairsCvt): up to kSplitMaxHp
// the Q rows are split once per call (split_q_rows), so the per-key loop only splits K; wider rows
// split Q as they use it (the same bits), on the generic path, the only one they can take (the fast
// paths stop at H = 256): instantiating the fast ones for them too doubled this file's compile time.
template <template <bool> class Fma>
void decode_qk_rows_fma(const DecodeQk& t) {
  if (t.Hp > kSplitMaxHp) {
    const QRows qr{static_cast<const char*>(t.q), t.ldq * 2};
    return with_rows<kDecodeMaxRows>(t.rows, [&](auto r) { qk_rows_generic<Fma<false>, decltype(r)::value>(t, qr); });
  }
  alignas(64) float qs[kDecodeMaxRows * kSplitMaxHp];
  split_q_rows(qs, t.q, t.ldq, t.Hp, t.rows);
  decode_qk_rows<Fma<true>>(t, {reinterpret_cast<const char*>(qs), t.Hp * 4});
}

}  // namespace decode_avx512
}  // namespace
}  // namespace flashgqa
