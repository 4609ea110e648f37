// Shared by the AVX-512 decode kernels (contract in microkernels.hpp): the avx512bf16 set's
// (kernels_avx512bf16_decode_qk.cpp, _pv.cpp: vdpbf16ps, or FMAs where it is half rate) and the avx512f set's
// (kernels_avx512f_decode_qk.cpp, _pv.cpp: fp32 FMAs on the bf16 pairs split into their halves). K and
// V are read straight from their rows, whole rows in address order, for tasks of at most
// kDecodeMaxRows query rows. Included only by those translation units, each compiled with its set's
// flags (CMakeLists.txt); everything here is in an anonymous namespace, so no unit's code is linked
// into another's.
//
// Decode does ~G FLOPs per K/V byte, so it is bound by the DRAM stream where the multiply-adds keep
// up: these kernels spend instructions (a transpose-add, permutes or splits) to avoid any packed copy.
// What decides their speed is the order of the loads and the instructions per key: the hardware
// prefetchers keep a stream going only when the rows are read line after line, so the kernels issue no
// software prefetch (docs/performance.md, decode I), except where they cannot follow: into the next
// piece of rows in pieces (decode_pieces.hpp) and int8 P.V's passes (avx512_decode_pv.hpp), and on
// Intel cores (FmaPairs, kPrefetchRows), where a stream with work beside its loads reads at the rate
// the core's own misses allow: there Q.K and P.V prefetch each line of bf16 K and V as they first load
// it, kDecodeAheadBytes on or from a piece further on (docs/performance.md, sessions 41 and 45).
//
// The multiply-add of a bf16 pair is a policy (Mac below): `vdpbf16ps` (DotBf16), or two fp32 FMAs,
// the odd element's product first, then the even one's (FmaPairs). A bf16 times a bf16 is exact in
// fp32, so each FMA rounds once, as vdpbf16ps rounds each of its two steps (Intel's definition,
// odd then even): for operands and sums above 2^-126 the two give the same bits. On Intel cores
// vdpbf16ps issues at half the FMA rate, which makes FmaPairs the faster one there
// (docs/performance.md, session 9).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "kernels/avx512_helpers.hpp"
#include "kernels/decode_pieces.hpp"
#include "kernels/microkernels.hpp"
#include "kernels/row_count.hpp"

namespace flashgqa {
namespace {
namespace decode_avx512 {

constexpr int kQkGroup = 16;  // keys per transpose-add
constexpr int kPvGroup = 32;  // keys per pass over the columns (8 KiB of bf16 V at H = 128: L1)
constexpr int kPvFastGroupBytes = 8192;  // of V per group on the fast path (32 keys at H = 128)
// How far ahead Q.K and P.V prefetch bf16 rows into L2, line by line, where the policy
// asks for it (Mac::kPrefetchRows): 32 keys at H = 128 (in pieces, whole pieces on: piece_rows_ahead).
constexpr std::int64_t kDecodeAheadBytes = 8192;
using word_t = std::uint32_t __attribute__((may_alias));

inline std::int64_t elem_bytes(DType d) { return static_cast<std::int64_t>(dtype_size(d)); }

static_assert(kQkGroup == kDecodePieceKeys, "a QK group's rows lie in one piece (decode_pieces.hpp)");

// 32 int8 values row[h0 .. h0+32) (lanes at or beyond H zero; kFull: all 32 are there) as fp32, each
// times `scale`: lo holds h0..h0+15, hi the rest.
template <bool kFull>
inline void load32_i8_scaled(const char* row, std::int64_t h0, std::int64_t H, __m512 scale, __m512& lo, __m512& hi) {
  __m128i b0, b1;
  if constexpr (kFull) {  // two 16-byte loads, each folded into its vpmovsxbd
    b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + h0));
    b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + h0 + 16));
  } else {
    b0 = _mm_maskz_loadu_epi8(first_lanes16(H - h0), row + h0);
    b1 = _mm_maskz_loadu_epi8(first_lanes16(H - h0 - 16), row + h0 + 16);
  }
  lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b0)), scale);
  hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b1)), scale);
}

#ifdef __AVX512BF16__
// vdpbf16ps: Q chunks are 32 bf16 as pack_q_row writes them; int8 products rounded by vcvtne2ps2bf16.
struct DotBf16 {
  static constexpr int kQChunkBytes = 64;
  static constexpr bool kIntSums = false;
  static __m512 mac(__m512 acc, const char* q, __m512i k) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_load_si512(q), (__m512bh)k);
  }
  // decode PV: a key pair's P word, broadcast; w the two keys' rows interleaved into pairs (vpermt2w);
  // the accumulators hold O's columns in order.
  static constexpr bool kSplitO = false;
  static constexpr bool kPrefetchRows = false;
  static constexpr bool kSplitWeights = false;  // the word is its own broadcast operand
  using Weights = __m512bh;
  static Weights weights(word_t pw) { return (__m512bh)_mm512_set1_epi32(static_cast<int>(pw)); }
  struct Pairs {
    __m512bh lo, hi;  // words (a[c], b[c]) for c in 0..15, and for 16..31
  };
  static Pairs pairs(__m512i a, __m512i b) {
    const RowPairs w = pair_rows(a, b);
    return {(__m512bh)w.lo, (__m512bh)w.hi};
  }
  static void mac_pv(__m512& acc0, __m512& acc1, Weights x, const Pairs& w) {
    acc0 = _mm512_dpbf16_ps(acc0, x, w.lo);
    acc1 = _mm512_dpbf16_ps(acc1, x, w.hi);
  }
  template <bool kFull>
  static inline __attribute__((always_inline)) __m512i i8_chunk(const char* row, std::int64_t h0,
                                                                std::int64_t H, __m512 scale) {
    __m512 lo, hi;
    load32_i8_scaled<kFull>(row, h0, H, scale, lo, hi);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // lanes 0..15 from lo
  }
};
#endif

// Two FMAs per pair. kSplitQ: Q chunks are 32 fp32, the 16 odd elements then the 16 even ones
// (split_q_rows); otherwise 32 bf16 as pack_q_row writes them, split as they are used. int8 products
// rounded by round_bf16_hi (the same bits as vcvtne2ps2bf16 above 2^-126).
template <bool kSplitQ>
struct FmaPairs {
  static constexpr int kQChunkBytes = kSplitQ ? 128 : 64;
  static constexpr bool kIntSums = false;
  static __m512 mac(__m512 acc, const char* q, __m512i k) {
    __m512 qo, qe;
    if constexpr (kSplitQ) {
      qo = _mm512_load_ps(reinterpret_cast<const float*>(q));
      qe = _mm512_load_ps(reinterpret_cast<const float*>(q) + 16);
    } else {
      const __m512i w = _mm512_load_si512(q);
      qo = odd_half(w), qe = even_half(w);
    }
    return _mm512_fmadd_ps(qe, even_half(k), _mm512_fmadd_ps(qo, odd_half(k), acc));
  }
  // decode PV: the P word's two weights (key j + 1's, key j's) as fp32 broadcasts; w the two keys' rows
  // as loaded; the accumulators hold each 32-column chunk of O as its 16 even columns, then its 16 odd
  // ones (split_o / join_o around the passes).
  static constexpr bool kSplitO = true;
  // Q.K and P.V prefetch each line of bf16 K and V they first load ~kDecodeAheadBytes on, into
  // L2 (Bf16RowsAhead): the FmaPairs sets run on Intel cores (avx512bf16 where vdpbf16ps is half rate,
  // avx512f), where the stream otherwise waits on the kernels' own misses (on an Emerald Rapids without
  // AMX, T = 1: 8 sequences 1.2x faster dense, 1.1-1.2x at page 16, one of 32768 keys 1.3x;
  // docs/performance.md, session 41).
  static constexpr bool kPrefetchRows = true;
  // P.V's fast path splits each group's P words into fp32 once (split_weights, PFloats): the passes
  // then broadcast the weights from memory instead of splitting each word per row and pass.
  static constexpr bool kSplitWeights = true;
  struct Weights {
    __m512 odd, even;
  };
  static Weights weights(word_t pw) {
    const __m512i x = _mm512_set1_epi32(static_cast<int>(pw));
    return {odd_half(x), even_half(x)};
  }
  struct Pairs {
    __m512 a_even, a_odd, b_even, b_odd;  // the even and odd columns of key j's row (a) and key j + 1's (b)
  };
  static Pairs pairs(__m512i a, __m512i b) { return {even_half(a), odd_half(a), even_half(b), odd_half(b)}; }
  static void mac_pv(__m512& even_cols, __m512& odd_cols, Weights x, const Pairs& w) {
    even_cols = _mm512_fmadd_ps(x.even, w.a_even, _mm512_fmadd_ps(x.odd, w.b_even, even_cols));
    odd_cols = _mm512_fmadd_ps(x.even, w.a_odd, _mm512_fmadd_ps(x.odd, w.b_odd, odd_cols));
  }
  template <bool kFull>
  static inline __attribute__((always_inline)) __m512i i8_chunk(const char* row, std::int64_t h0,
                                                                std::int64_t H, __m512 scale) {
    __m512 lo, hi;
    load32_i8_scaled<kFull>(row, h0, H, scale, lo, hi);
    return round2_bf16(lo, hi);
  }
};

#ifdef __AVX512BF16__
// FmaPairs with int8 products rounded by vcvtne2ps2bf16, as DotBf16 rounds them: the avx512bf16 set's
// decode on CPUs whose vdpbf16ps issues at half the FMA rate (bf16_dot_half_rate()).
template <bool kSplitQ>
struct FmaPairsCvt : FmaPairs<kSplitQ> {
  template <bool kFull>
  static inline __attribute__((always_inline)) __m512i i8_chunk(const char* row, std::int64_t h0,
                                                                std::int64_t H, __m512 scale) {
    return DotBf16::i8_chunk<kFull>(row, h0, H, scale);
  }
};
#endif

#ifdef __AVX512VNNI__
// int8 K on vpdpwssd (the avx512bf16 set: docs/performance.md, session 11): the K chunk is its 32 int8
// values sign-extended to int16 (one vpmovsxbw), each Q row is quantized to int16 once per call
// (quantize_q_rows: q_int = round(q * 32767 / max|q|)), and the 16 lanes of a (row, key) accumulator
// hold exact int32 sums (|sum| <= 256 * 32767 * 128 < 2^31 for H <= 256) that the transpose-add adds as
// integers. A logit is float(sum) times the row's factor (scale * max|q| / 32767) times the key's scale:
// the key's scale stays out of the operands, so nothing is rounded before the sum.
struct DotI16 {
  static constexpr int kQChunkBytes = 64;
  static constexpr bool kIntSums = true;
  static constexpr bool kPrefetchRows = false;  // dense K rows kDecodeInt8AheadKeys on, 16 at a time
  static __m512 mac(__m512 acc, const char* q, __m512i k) {
    return _mm512_castsi512_ps(_mm512_dpwssd_epi32(_mm512_castps_si512(acc), _mm512_load_si512(q), k));
  }
  template <bool kFull>
  static inline __attribute__((always_inline)) __m512i i8_chunk(const char* row, std::int64_t h0,
                                                                std::int64_t H, __m512) {
    if constexpr (kFull) return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + h0)));
    return _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(first_lanes32(H - h0), row + h0));
  }
};

// DotI16 on Intel cores (the fma set, where vdpbf16ps is half rate): dense K rows prefetched line by
// line, each kDecodeInt8AheadKeys keys on as its first chunk is loaded (Int8RowsAhead), not 16 rows at a
// time; with P.V's rows the same way (decode_pv_rows_i8<true>) int8 decode on Emerald Rapids 1.1x
// faster (docs/performance.md, session 41).
struct DotI16Ahead : DotI16 {
  static constexpr bool kPrefetchRows = true;
};

// DotI16's Q rows: rows [0, rows) of q (pack_q_row's bf16, ldq elements apart, zero past H) as int16,
// Hp per row, and each row's factor scale * max|q| / 32767. False (nothing usable written) when a row
// holds an infinity or a NaN, or its largest |q| is below kI16MinQ: the caller then takes the bf16 path,
// whose sums carry them.
inline bool quantize_q_rows(std::int16_t* qi, float* factor, const void* q, std::int64_t ldq, std::int64_t Hp,
                            int rows, float scale) {
  for (int r = 0; r < rows; ++r) {
    const auto* row = static_cast<const std::uint16_t*>(q) + r * ldq;
    __m512 mx = _mm512_setzero_ps();
    for (std::int64_t h = 0; h < Hp; h += 32) {
      const __m512i w = _mm512_load_si512(row + h);
      const __m512 a = odd_half(w), b = even_half(w);
      if (_mm512_fpclass_ps_mask(a, 0x99) | _mm512_fpclass_ps_mask(b, 0x99)) return false;  // NaN, +-inf
      mx = _mm512_max_ps(mx, _mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    }
    const float m = _mm512_reduce_max_ps(mx);
    if (m > 0.0f && m < kI16MinQ) return false;  // 32767 / m could overflow
    const __m512 to_int = _mm512_set1_ps(m > 0.0f ? 32767.0f / m : 0.0f);
    factor[r] = scale * (m / 32767.0f);
    for (std::int64_t h = 0; h < Hp; h += 16) {  // rounded to nearest even (MXCSR's default)
      const __m512 x = load16_f32(row, DType::bf16, h, Hp);
      _mm256_store_si256(reinterpret_cast<__m256i*>(qi + r * Hp + h),
                         _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(x, to_int))));
    }
  }
  return true;
}
#endif

// Q rows for FmaPairs<true>: each 32-h chunk of rows [0, rows) of q (pack_q_row's bf16, ldq elements
// apart) as its 16 odd elements then its 16 even ones in fp32, Hp floats per row (Hp <= kSplitMaxHp).
constexpr std::int64_t kSplitMaxHp = 256;
inline void split_q_rows(float* qs, const void* q, std::int64_t ldq, std::int64_t Hp, int rows) {
  for (int r = 0; r < rows; ++r)
    for (std::int64_t h = 0; h < Hp; h += 32) {
      const __m512i w = _mm512_load_si512(static_cast<const std::uint16_t*>(q) + r * ldq + h);
      _mm512_store_ps(qs + r * Hp + h, odd_half(w));
      _mm512_store_ps(qs + r * Hp + h + 16, even_half(w));
    }
}

// 32 operands of a source row from column h0, as bf16: a plain load when the row is bf16 and H is a
// multiple of 32 (kPlain), int8 rows times their key's scale (*scale), otherwise converted, rounded
// and masked by load32_bf16.
template <typename Mac, bool kPlain>
inline __m512i load_row32(const char* row, DType dtype, std::int64_t h0, std::int64_t H, const float* scale) {
  if (kPlain) return _mm512_loadu_si512(reinterpret_cast<const std::uint16_t*>(row) + h0);
  if (dtype == DType::i8) return Mac::template i8_chunk<false>(row, h0, H, _mm512_set1_ps(*scale));
  return load32_bf16(row, dtype, h0, H);
}

// The rows the fast paths read (H = 32 HC, whole chunks): bf16 rows as they are, or int8 rows with
// their keys' scales. chunk(j, c) is chunk c (32 operands) of key j; at(j) the rows from key j on.
// chunk, called per key and chunk in the kernels' loops, is always inlined, as are the int8 chunk
// converters, the P.V weights' at() and P.V's loader lambdas (avx512_decode_pv.hpp): GCC's inliner
// weighs each unit's growth, and had outlined PFloats::at in the avx512f set, a call per row and key
// pair returning two vectors through memory, and did the same in the avx512bf16 set once more row
// counts used that pass. On an Emerald Rapids all of it together: the avx512f set's T = 2 and 8 1.3x,
// the fma set's T = 2 1.04x faster in L2 (docs/performance.md, session 44). A forced inline also
// moves GCC's other choices (an avx2 prefetch lambda forced inline made that set's decode 1.4x
// slower, not kept), so the DotBf16 and DotI16 code (AMD) shifted too, unmeasured there.
struct Bf16Rows {
  const char* base;
  std::int64_t ld_bytes;
  Bf16Rows at(std::int64_t j) const { return {base + j * ld_bytes, ld_bytes}; }
  Bf16Rows at(std::int64_t, const char* row) const { return {row, ld_bytes}; }  // key j's row at `row` (a piece's)
  inline __attribute__((always_inline)) __m512i chunk(std::int64_t j, int c) const {
    return _mm512_loadu_si512(base + j * ld_bytes + 64 * c);
  }
};

// Bf16Rows whose chunk(j, c) also prefetches the line `ahead` bytes on into L2. For rows laid out in
// address order (a dense cache, or a page's run of rows) that is kDecodeAheadBytes: the lines past
// the call's keys are the next block's rows (dense) or the next kv head's of the page, which its head
// group reads next; a prefetch past the cache's end is dropped (no fault). For a piece of rows
// (piece_rows_ahead) it is the same line of a piece further on.
struct Bf16RowsAhead {
  const char* base;
  std::int64_t ld_bytes;
  std::int64_t ahead = kDecodeAheadBytes;
  Bf16RowsAhead at(std::int64_t j) const { return {base + j * ld_bytes, ld_bytes, ahead}; }
  inline __attribute__((always_inline)) __m512i chunk(std::int64_t j, int c) const {
    const char* line = base + j * ld_bytes + 64 * c;
    prefetch_l2(line + ahead);
    return _mm512_loadu_si512(line);
  }
};

// The piece of rows that holds keys [j, j + kDecodePieceKeys) (j a multiple of it; n keys in the
// call), prefetching from the piece about kDecodeAheadBytes on (at least the next; none past the
// call's keys: then each line prefetches itself). On Emerald Rapids, page 16 (bf16, 8 sequences at
// T = 1): 1.1-1.2x faster than the whole next piece at each piece's start (step_rows_ahead); the piece
// two on at H = 128; one on was 1.07-1.09x slower (docs/performance.md, session 41).
inline Bf16RowsAhead piece_rows_ahead(const void* const* pieces, std::int64_t ld_bytes, std::int64_t row_bytes,
                                      std::int64_t j, std::int64_t n) {
  const std::int64_t step = kDecodeAheadBytes / (kDecodePieceKeys * row_bytes);
  const std::int64_t i = j / kDecodePieceKeys, later = i + (step > 1 ? step : 1);
  const char* row = static_cast<const char*>(pieces[i]);
  const char* ahead = later * kDecodePieceKeys < n ? static_cast<const char*>(pieces[later]) : row;
  return {row, ld_bytes, ahead - row};
}

// The scales of 16 keys, key i's at s[i ld] (int8 rows): lanes outside m 0, and not read.
inline __m512 load_scales16(const float* s, std::int64_t ld, __mmask16 m) {
  if (ld == 1) return _mm512_maskz_loadu_ps(m, s);
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i offsets = _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(ld)));
  return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, offsets, s, 4);
}

template <typename Mac>
struct Int8Rows {
  const char* base;
  std::int64_t ld_bytes;  // = elements between keys (one byte each)
  const float* scale;
  std::int64_t ld_scale;
  Int8Rows at(std::int64_t j) const { return {base + j * ld_bytes, ld_bytes, scale + j * ld_scale, ld_scale}; }
  Int8Rows at(std::int64_t j, const char* row) const { return {row, ld_bytes, scale + j * ld_scale, ld_scale}; }
  inline __attribute__((always_inline)) __m512i chunk(std::int64_t j, int c) const {
    return Mac::template i8_chunk<true>(base + j * ld_bytes, 32 * c, 0, _mm512_set1_ps(scale[j * ld_scale]));
  }
};

// Int8Rows whose chunk(j, c) also prefetches, with a line's first chunk, the line kDecodeInt8AheadKeys
// keys on into L2 (dense rows; DotI16Ahead).
template <typename Mac>
struct Int8RowsAhead : Int8Rows<Mac> {
  Int8RowsAhead at(std::int64_t j) const { return {Int8Rows<Mac>::at(j)}; }
  Int8RowsAhead at(std::int64_t j, const char* row) const { return {Int8Rows<Mac>::at(j, row)}; }
  inline __attribute__((always_inline)) __m512i chunk(std::int64_t j, int c) const {
    const char* chunk0 = this->base + j * this->ld_bytes + 32 * c;
    if (c % 2 == 0) prefetch_l2(chunk0 + kDecodeInt8AheadKeys * this->ld_bytes);
    return Int8Rows<Mac>::chunk(j, c);
  }
};

template <typename Rows>
constexpr bool kIsInt8Rows = !std::is_same_v<Rows, Bf16Rows> && !std::is_same_v<Rows, Bf16RowsAhead>;

}  // namespace decode_avx512
}  // namespace
}  // namespace flashgqa
