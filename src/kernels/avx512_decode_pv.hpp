// The AVX-512 decode PV kernel (contract in microkernels.hpp; design in avx512_decode_common.hpp), over
// a multiply-add policy Mac:
//   decode_pv_rows: per pair of keys, Mac::pairs arranges the two V rows (DotBf16: interleaved into
//     bf16 pairs along keys by vpermt2w; FmaPairs: as loaded) and each row's P word (the same two
//     keys, Mac::weights) is accumulated into the row's accumulators (Mac::mac_pv), loaded from and
//     stored back to O (L1) once per group of keys. FmaPairs keeps each 32 columns of O as its even
//     columns then its odd ones for the call (split_o, join_o). The fast path (bf16 or int8 rows,
//     H = 64, 96, 128, 256, groups of up to 8 KiB of bf16 V, int8 rows scaled as they are loaded)
//     reads whole rows, in one pass when the rows' accumulators fit (R <= 8 / (H / 32), rounded down)
//     or two at H <= 128 when half the rows' do (DotBf16's bf16 rows only: a second pass would convert
//     int8 rows, or split FmaPairs' bf16 rows, again), else goes 64 columns per pass (32 when R > 4 or
//     at H = 96), converting each int8 chunk once; the generic path goes 64 or 32 columns per pass over
//     groups of 32 keys. Both accumulate each O element's keys in the same order (per pair the odd key,
//     then the even one): the same bits.
#pragma once

#include <type_traits>

#include "kernels/avx512_decode_common.hpp"

namespace flashgqa {
namespace {
namespace decode_avx512 {

// Where a pass takes row r's weights of keys (j, j + 1) (j even): at(r, j); from_row(r): the same
// source from row r on.
// PWords: P's words as the call has them (key j's pair at p[r ldp_words + j / 2]), each made into
// Mac::Weights as it is used.
template <typename Mac>
struct PWords {
  const word_t* p;
  std::int64_t ldp_words;
  inline __attribute__((always_inline)) typename Mac::Weights at(int r, std::int64_t j) const {
    return Mac::weights(p[r * ldp_words + j / 2]);
  }
  PWords from_row(int r) const { return {p + r * ldp_words, ldp_words}; }
};

// PFloats (FmaPairs, Mac::kSplitWeights): a group's weights split once into fp32 (split_weights), so that a
// pass broadcasts each from memory (a load, no shuffle or shift per row, pair and pass: with 8 rows
// those were ~40% of the pass's vector operations). Row r's pairs i = 16 b + l (key j_base + 2 i and
// the next) at w[r ld + 32 b + l] (the odd key's weight) and w[r ld + 32 b + 16 + l] (the even key's).
template <typename Mac>
struct PFloats {
  const float* w;
  std::int64_t ld, j_base;
  inline __attribute__((always_inline)) typename Mac::Weights at(int r, std::int64_t j) const {
    const std::int64_t i = (j - j_base) / 2, at = r * ld + (i / 16) * 32 + i % 16;
    return {_mm512_set1_ps(w[at]), _mm512_set1_ps(w[at + 16])};
  }
  PFloats from_row(int r) const { return {w + r * ld, ld, j_base}; }
};

// The weights of `pairs` key pairs of rows [0, R) from p (word i of row r at p[r ldp_words + i]) into
// w as PFloats lays them out (ld = 2 pairs rounded up to 32 floats a row).
template <int R>
inline void split_weights(float* w, std::int64_t ld, const word_t* p, std::int64_t ldp_words, std::int64_t pairs) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
    for (std::int64_t i = 0; i < pairs; i += 16) {
      const __m512i x = _mm512_maskz_loadu_epi32(first_lanes16(pairs - i), p + r * ldp_words + i);
      _mm512_store_ps(w + r * ld + 2 * i, odd_half(x));
      _mm512_store_ps(w + r * ld + 2 * i + 16, even_half(x));
    }
}

// O[r][0 .. 32 NC) (o at the pass's first column) += sum_{j0 <= j < j1} P[r][j] V[j][...], keys in
// pairs (j0, j1 even), the weights from ws (PWords or PFloats); load(j, c) gives the 32 bf16 operands
// of chunk c of key j's row (zero for a key that is not there).
template <typename Mac, int R, int NC, typename Weights, typename Load>
inline __attribute__((always_inline)) void pv_pass(float* o, std::int64_t ldo, const Weights& ws, std::int64_t j0,
                                                  std::int64_t j1, const Load& load) {
  __m512 acc[R][2 * NC];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < 2 * NC; ++c) acc[r][c] = _mm512_load_ps(o + r * ldo + 16 * c);
  for (std::int64_t j = j0; j < j1; j += 2) {
    if constexpr (NC == 1) {  // each weight used once: taken where it is used (PFloats: broadcast from memory)
      const typename Mac::Pairs w = Mac::pairs(load(j, 0), load(j + 1, 0));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) Mac::mac_pv(acc[r][0], acc[r][1], ws.at(r, j), w);
      continue;
    }
    typename Mac::Weights x[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) x[r] = ws.at(r, j);
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) {  // the two rows' chunk c, as Mac::pairs arranges them, into every row
      const typename Mac::Pairs w = Mac::pairs(load(j, c), load(j + 1, c));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) Mac::mac_pv(acc[r][2 * c], acc[r][2 * c + 1], x[r], w);
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

// Each 32 columns of O's R rows: in order <-> the 16 even columns, then the 16 odd ones (kSplit).
template <int R, bool kSplit>
void permute_o(const DecodePv& t) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int r = 0; r < R; ++r)
    for (std::int64_t h = 0; h < t.Hp; h += 32) {
      float* o = t.o + r * t.ldo + h;
      const __m512 a = _mm512_load_ps(o), b = _mm512_load_ps(o + 16);
      if constexpr (kSplit) {
        _mm512_store_ps(o, _mm512_permutex2var_ps(a, even, b));
        _mm512_store_ps(o + 16, _mm512_permutex2var_ps(a, _mm512_add_epi32(even, _mm512_set1_epi32(1)), b));
      } else {
        _mm512_store_ps(o, _mm512_permutex2var_ps(a, lo, b));
        _mm512_store_ps(o + 16, _mm512_permutex2var_ps(a, _mm512_add_epi32(lo, _mm512_set1_epi32(8)), b));
      }
    }
}

// The generic path: keys [j_begin, nkeys) (j_begin even), any dtype and H.
template <typename Mac, int R, bool kPlain>
void pv_rows(const DecodePv& t, std::int64_t j_begin) {
  const KeyRows rows{static_cast<const char*>(t.v), t.v_pieces, t.ldv * elem_bytes(t.v_dtype)};
  const PWords<Mac> p{static_cast<const word_t*>(t.p), t.ldp / 2};
  // Up to 4 rows: 64 columns per pass (16 accumulators), so each broadcast P word feeds 4 multiply-adds.
  constexpr int kWide = R <= 4 ? 2 : 1;
  for (std::int64_t j0 = j_begin; j0 < t.nkeys; j0 += kPvGroup) {
    const std::int64_t j1 = j0 + kPvGroup < t.nkeys ? j0 + kPvGroup : t.nkeys;
    std::int64_t h0 = 0;
    const auto load = [&](std::int64_t j, int c) __attribute__((always_inline)) {
      const float* vs = t.v_scale != nullptr ? t.v_scale + j * t.ld_scale : nullptr;
      return j < t.n ? load_row32<Mac, kPlain>(rows.row(j), t.v_dtype, h0 + 32 * c, t.H, vs)
                     : _mm512_setzero_si512();
    };
    for (; h0 + 32 * kWide <= t.Hp; h0 += 32 * kWide) pv_pass<Mac, R, kWide>(t.o + h0, t.ldo, p, j0, j1, load);
    for (; h0 < t.Hp; h0 += 32) pv_pass<Mac, R, 1>(t.o + h0, t.ldo, p, j0, j1, load);
  }
}

// Rows [0, R) in passes of RP rows over all HC chunks (2 HC RP <= 16 accumulators): each pass reads
// the group's V rows whole, in address order (the second from L1). kAhead: the first pass prefetches
// each line it loads `ahead` bytes on (Mac::kPrefetchRows: Bf16RowsAhead).
template <typename Mac, int R, int RP, int HC, bool kAhead, typename Weights, typename Rows>
inline __attribute__((always_inline)) void pv_row_passes(float* o, std::int64_t ldo, const Weights& ws,
                                                        std::int64_t j0, std::int64_t j1, const Rows& v0,
                                                        std::int64_t ahead) {
  constexpr int kRows = R < RP ? R : RP;
  pv_pass<Mac, kRows, HC>(o, ldo, ws, j0, j1, [&](std::int64_t j, int c) __attribute__((always_inline)) {
    if constexpr (kAhead) return Bf16RowsAhead{v0.base, v0.ld_bytes, ahead}.chunk(j, c);
    else return v0.chunk(j, c);
  });
  if constexpr (R > RP)
    pv_row_passes<Mac, R - RP, RP, HC, false>(o + RP * ldo, ldo, ws.from_row(RP), j0, j1, v0, 0);
}

// The fast path for bf16 rows with H = Hp = 32 HC: groups of kPvFastGroupBytes of V whose keys are all
// present, then the generic path for the rest. Where the accumulators of RP = 8 / HC rows over whole
// rows fit 16 registers and R <= RP, or R <= 2 RP at H <= 128 (G = 1..4 at H = 128) for bf16 rows, the
// group goes in one or two passes over whole V rows, each read in address order (two passes only at
// H <= 128, where they pay: docs/performance.md, decode J). Two passes form each chunk's operands twice:
// int8 rows, converted per pass, went 1.15x faster in column passes (session 11), and so did FmaPairs'
// bf16 rows, split into fp32 by two vector operations per chunk (4 rows at H = 128: 40 operations a key
// on the FMA ports instead of 48, T = 1 1.07x faster in L2, session 44): those take two passes never.
// Otherwise the columns go in passes of 64 (32 when R > 4 or HC is odd) over the group, the later
// passes from L1. Same sums in the same order as the generic path, so the same bits.
template <typename Mac, int R, int HC, typename Rows>
void pv_rows_fast(const DecodePv& t, const Rows& v0) {
  constexpr int kRowsPerPass = 8 / HC;
  // int8 rows and FmaPairs' split bf16 rows: whole rows only when one pass holds every row.
  constexpr bool kInt8 = !std::is_same_v<Rows, Bf16Rows>;
  constexpr bool kWholeRows = R <= kRowsPerPass || (!kInt8 && !Mac::kSplitO && R <= 2 * kRowsPerPass && HC <= 4);
  constexpr int kWide = R <= 4 && HC % 2 == 0 ? 2 : 1;  // 32-column chunks per column pass
  // Keys per group: kPvFastGroupBytes of V, whole pieces (32 keys at H = 96 and 128).
  constexpr std::int64_t kGroup = kPvFastGroupBytes / (64 * HC) / kDecodePieceKeys * kDecodePieceKeys;
  static_assert(HC % kWide == 0 && kGroup % 2 == 0 && kGroup % kDecodePieceKeys == 0);
  const auto* p = static_cast<const word_t*>(t.p);
  float* const o = t.o;
  const std::int64_t ldo = t.ldo, ldp_words = t.ldp / 2;
  const std::int64_t full = (t.nkeys < t.n ? t.nkeys : t.n) / kGroup * kGroup;
  // Keys [j0, j1) of rows, their weights from ws (PWords or PFloats, which count keys as rows does).
  // kAhead: bf16 rows whose passes prefetch each line they load `ahead` bytes on (Mac::kPrefetchRows,
  // Bf16RowsAhead). A column pass loads kWide of each row's HC lines and prefetches those: one
  // prefetch per load in every pass (the first pass prefetching all of a row's lines, HC / kWide per
  // load, was slower: on Emerald Rapids T = 1 1.05x, T = 2 1.1x from DRAM, docs/performance.md,
  // session 45).
  const auto group = [&]<bool kAhead>(const auto& ws, const Rows& rows, std::int64_t j0, std::int64_t j1,
                                      std::int64_t ahead) {
    if constexpr (kWholeRows) {
      pv_row_passes<Mac, R, kRowsPerPass, HC, kAhead>(o, ldo, ws, j0, j1, rows, ahead);
    } else {
#pragma GCC unroll 8
      for (std::int64_t c0 = 0; c0 < HC; c0 += kWide)
        pv_pass<Mac, R, kWide>(o + 32 * c0, ldo, ws, j0, j1, [&](std::int64_t j, int c) __attribute__((always_inline)) {
          if constexpr (kAhead) return Bf16RowsAhead{rows.base, rows.ld_bytes, ahead}.chunk(j, c0 + c);
          else return rows.chunk(j, c0 + c);
        });
    }
  };
  // Mac::kSplitWeights (FmaPairs): each group's weights split into fp32 once, for all its passes.
  constexpr std::int64_t kWeightsLd = (kGroup / 2 + 15) / 16 * 32;
  alignas(64) float wf[Mac::kSplitWeights ? R * kWeightsLd : 1];
  const std::int64_t row_bytes = t.H * elem_bytes(t.v_dtype);
  for (std::int64_t j0 = 0; j0 < full; j0 += kGroup) {
    if constexpr (Mac::kSplitWeights) split_weights<R>(wf, kWeightsLd, p + j0 / 2, ldp_words, kGroup / 2);
    // The weights of keys from j (counted from 0 at j).
    const auto weights_from = [&](std::int64_t j) {
      if constexpr (Mac::kSplitWeights) return PFloats<Mac>{wf, kWeightsLd, j0 - j};
      else return PWords<Mac>{p + j / 2, ldp_words};
    };
    if (t.v_pieces != nullptr) {  // each piece's 16 keys as rows of their own (the same sums in order)
      for (std::int64_t j = j0; j < j0 + kGroup; j += kDecodePieceKeys) {
        if constexpr (Mac::kPrefetchRows && !kInt8) {
          const Bf16RowsAhead piece = piece_rows_ahead(t.v_pieces, v0.ld_bytes, row_bytes, j, t.n);
          group.template operator()<true>(weights_from(j), Rows{piece.base, piece.ld_bytes}, 0, kDecodePieceKeys,
                                          piece.ahead);
        } else {
          group.template operator()<false>(
              weights_from(j), v0.at(j, step_rows_ahead(nullptr, t.v_pieces, v0.ld_bytes, row_bytes, j, t.n)), 0,
              kDecodePieceKeys, 0);
        }
      }
      continue;
    }
    const auto ws = weights_from(j0);  // (keys counted from j0: the rows' too)
    group.template operator()<Mac::kPrefetchRows && !kInt8>(ws, v0.at(j0), 0, kGroup, kDecodeAheadBytes);
  }
  if constexpr (std::is_same_v<Rows, Bf16Rows>) pv_rows<Mac, R, true>(t, full);
  else pv_rows<Mac, R, false>(t, full);
}

template <typename Mac, int R, int HC>
void pv_rows_fast_any(const DecodePv& t) {
  const char* v0 = static_cast<const char*>(t.v);
  if (t.v_dtype == DType::i8) return pv_rows_fast<Mac, R, HC>(t, Int8Rows<Mac>{v0, t.ldv, t.v_scale, t.ld_scale});
  pv_rows_fast<Mac, R, HC>(t, Bf16Rows{v0, t.ldv * 2});
}

template <typename Mac, int R>
void pv_rows_any(const DecodePv& t) {
  if (t.corr) rescale_o<R>(t);
  if constexpr (Mac::kSplitO) permute_o<R, true>(t);
  if ((t.v_dtype != DType::bf16 && t.v_dtype != DType::i8) || t.H != t.Hp) {
    pv_rows<Mac, R, false>(t, 0);
  } else {
    switch (t.Hp) {
      case 64: pv_rows_fast_any<Mac, R, 2>(t); break;
      case 96: pv_rows_fast_any<Mac, R, 3>(t); break;
      case 128: pv_rows_fast_any<Mac, R, 4>(t); break;
      case 256: pv_rows_fast_any<Mac, R, 8>(t); break;
      default:
        if (t.v_dtype == DType::bf16) pv_rows<Mac, R, true>(t, 0);
        else pv_rows<Mac, R, false>(t, 0);
    }
  }
  if constexpr (Mac::kSplitO) permute_o<R, false>(t);
}

#ifdef __AVX512VNNI__
// int8 V on vpdpwssd (the avx512bf16 set: FlashKernels::int8_on_integers; contract in
// microkernels.hpp). Rows go in blocks of up to 4; per block the weights go in slices of kI16Slice
// keys, each quantized once (i16_slice: one joint max for the block's rows per group), then used by
// passes of 64 columns: per group of kI16Group keys, RB x 4 int32 accumulators take vpdpwssd of each
// row's int16 weight pair (broadcast from memory) with the two keys' rows sign-extended (vpmovsxbw,
// plain loads where the pass's columns are all below H) and interleaved into pairs in-lane
// (vpunpck{l,h}wd, one uop where vpermt2w took three: the columns then in to_unpacked_columns'
// order, put back by one vpermt2d per 16 sums); then O = fma(W / 32767, float(sum), O) (O in L1).
// Each V chunk is converted in one instruction per block of rows. In L2 at 4 rows (H = 128) this took
// P.V from 10.7 to 7.9 ns a key (docs/performance.md, session 22).
constexpr int kI16Group = 16;
constexpr int kI16Slice = 2 * kI16Group;
constexpr int kI16Rows = 4;                  // rows per block
constexpr float kI16MinWeight = 0x1p-100f;  // a group whose W is below this goes key by key

struct I16Slice {
  alignas(64) std::int16_t q[kI16Rows][kI16Slice];  // the weights as int16
  alignas(64) float w[kI16Rows][kI16Slice];         // as fp32 (for a group taken key by key)
  float f[2][16];                                   // W / 32767 per group, lane r
  bool bad[2][kI16Rows];                            // a NaN or infinite weight, or W < kI16MinWeight: key by key
  int keys[2];                                      // keys of each group read (the rest count as zero rows)
};

// Lane r (r < 4) of every 128-bit lane: the largest lane of v[r].
inline __m512 max4(const __m512 v[4]) {
  const __m512 t0 = _mm512_max_ps(_mm512_unpacklo_ps(v[0], v[1]), _mm512_unpackhi_ps(v[0], v[1]));
  const __m512 t1 = _mm512_max_ps(_mm512_unpacklo_ps(v[2], v[3]), _mm512_unpackhi_ps(v[2], v[3]));
  const __m512 u = _mm512_max_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))));
  const __m512 w = _mm512_max_ps(u, _mm512_shuffle_f32x4(u, u, 0x4e));
  return _mm512_max_ps(w, _mm512_shuffle_f32x4(w, w, 0xb1));
}

// The weights of keys [j0, j0 + kI16Slice) for rows [r0, r0 + RB): w = P * s (keys past those read:
// 0), and per group W = max |w|, q = round(w * (32767 / W)).
template <int RB>
inline void i16_slice(const DecodePv& t, int r0, std::int64_t j0, I16Slice& sl) {
  const std::int64_t read_end = t.nkeys < t.n ? t.nkeys : t.n;
  for (int g = 0; g < 2; ++g) {
    const std::int64_t jg = j0 + g * kI16Group;
    const std::int64_t read = read_end - jg < 0 ? 0 : read_end - jg > kI16Group ? kI16Group : read_end - jg;
    sl.keys[g] = static_cast<int>(read);
    if (read == 0) return;
    const __mmask16 m = first_lanes16(read);
    const __m512 sc = load_scales16(t.v_scale + jg * t.ld_scale, t.ld_scale, m);
    __m512 w[kI16Rows], a[kI16Rows];
#pragma GCC unroll 4
    for (int r = 0; r < kI16Rows; ++r) {
      if (r >= RB) {
        a[r] = _mm512_setzero_ps();
        continue;
      }
      w[r] = _mm512_mul_ps(load16_f32(static_cast<const std::uint16_t*>(t.p) + (r0 + r) * t.ldp + jg, DType::bf16, 0, read), sc);
      a[r] = _mm512_abs_ps(w[r]);
      _mm512_store_ps(&sl.w[r][g * kI16Group], w[r]);
      sl.bad[g][r] = _mm512_fpclass_ps_mask(w[r], 0x99) != 0;  // NaN, +-inf
    }
    const __m512 W = max4(a);
    const __m512 c = _mm512_div_ps(_mm512_set1_ps(32767.0f), W);
    _mm512_storeu_ps(sl.f[g], _mm512_div_ps(W, _mm512_set1_ps(32767.0f)));
    const __mmask16 small = _mm512_cmp_ps_mask(W, _mm512_set1_ps(kI16MinWeight), _CMP_LT_OQ) &
                            _mm512_cmp_ps_mask(W, _mm512_setzero_ps(), _CMP_GT_OQ);
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) {
      sl.bad[g][r] = sl.bad[g][r] || ((small >> r) & 1);
      // W = 0: every w is 0, and so is q (0 * inf would be NaN).
      const __m512 x = _mm512_maskz_mul_ps(_mm512_cmp_ps_mask(w[r], _mm512_setzero_ps(), _CMP_NEQ_UQ), w[r],
                                           _mm512_permutexvar_ps(_mm512_set1_epi32(r), c));
      _mm256_store_si256(reinterpret_cast<__m256i*>(&sl.q[r][g * kI16Group]),
                         _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(x)));
    }
  }
}

// One group's sums into O's rows [r0, r0 + RB) at columns [h0, h0 + 32 NC) (in L1); kFull: 16 keys,
// and all 32 NC columns are below H (whole chunks: plain loads, no masks).
// kAhead: with each key pair's first chunk, the lines of the group's columns of the two rows
// kDecodeInt8AheadKeys keys on into L2 (decode_pv_rows_i8<true>; in pieces, the rows of the piece
// that holds those keys).
template <int RB, int NC, bool kFull, bool kAhead = false>
inline __attribute__((always_inline)) void i16_group(const DecodePv& t, const I16Slice& sl, int r0, int g,
                                                    std::int64_t jg, std::int64_t h0) {
  // The group's 16 keys lie in one piece (jg is a multiple of 16).
  const KeyRows rows{static_cast<const char*>(t.v), t.v_pieces, t.ldv};
  const char* v0 = rows.row(jg) + h0;
  // kAhead: the same columns of the rows kDecodeInt8AheadKeys keys on (in pieces: of the piece that
  // holds them, none past the call's keys).
  const char* ahead = nullptr;
  if constexpr (kAhead) {
    if (t.v_pieces == nullptr) ahead = v0 + kDecodeInt8AheadKeys * t.ldv;
    else if (jg + kDecodeInt8AheadKeys < t.n) ahead = rows.row(jg + kDecodeInt8AheadKeys) + h0;
  }
  const int read = kFull ? kI16Group : sl.keys[g];
  const __m512i from0 = from_unpacked_columns(0), from1 = from_unpacked_columns(1);
  __m512i acc[RB][2 * NC];
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
    for (int i = 0; i < 2 * NC; ++i) acc[r][i] = _mm512_setzero_si512();
  const auto row = [&](int j, int c) {  // key jg + j's values h0 + 32c .. + 32, sign-extended (zero past those read)
    if constexpr (kFull) return DotI16::i8_chunk<true>(v0 + j * t.ldv, 32 * c, 0, _mm512_setzero_ps());
    if (j >= read) return _mm512_setzero_si512();
    return DotI16::i8_chunk<false>(v0 + j * t.ldv, 32 * c, t.H - h0, _mm512_setzero_ps());
  };
#pragma GCC unroll 8
  for (int j = 0; j < (kFull ? kI16Group : read); j += 2) {
    // Each row's weight pair broadcast straight from memory (a load, not a shuffle port uop).
    __m512i x[RB];
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) x[r] = _mm512_broadcastd_epi32(_mm_loadu_si32(&sl.q[r][g * kI16Group + j]));
#pragma GCC unroll 2
    for (int c = 0; c < NC; ++c) {
      // The two keys' int16 values as pairs, in the column order of to_unpacked_columns
      // (avx512_helpers.hpp).
      if constexpr (kAhead)  // this pass's columns of the two rows kDecodeInt8AheadKeys keys on
        if (c == 0 && ahead != nullptr)
          prefetch_rows_l2(ahead + j * t.ldv, t.ldv, t.H - h0 < 32 * NC ? t.H - h0 : 32 * NC, 2);
      const __m512i a = row(j, c), b = row(j + 1, c);
      const __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
#pragma GCC unroll 4
      for (int r = 0; r < RB; ++r) {
        acc[r][2 * c] = _mm512_dpwssd_epi32(acc[r][2 * c], x[r], lo);
        acc[r][2 * c + 1] = _mm512_dpwssd_epi32(acc[r][2 * c + 1], x[r], hi);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r) {
    float* o = t.o + (r0 + r) * t.ldo + h0;
    if (__builtin_expect(sl.bad[g][r], 0)) {  // key by key in fp32: NaN and infinities reach O as in the float path
      for (int j = 0; j < read; ++j) {
        const __m512 w = _mm512_set1_ps(sl.w[r][g * kI16Group + j]);
        for (int i = 0; i < 2 * NC; ++i)  // the row's int8 values as fp32, zero past H
          _mm512_store_ps(o + 16 * i, _mm512_fmadd_ps(w, load16_f32(v0 + j * t.ldv, DType::i8, 16 * i, t.H - h0),
                                                      _mm512_load_ps(o + 16 * i)));
      }
      continue;
    }
    const __m512 f = _mm512_set1_ps(sl.f[g][r]);
#pragma GCC unroll 2
    for (int c = 0; c < NC; ++c)
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        const __m512i sum = _mm512_permutex2var_epi32(acc[r][2 * c], half ? from1 : from0, acc[r][2 * c + 1]);
        float* oc = o + 32 * c + 16 * half;
        _mm512_store_ps(oc, _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(sum), _mm512_load_ps(oc)));
      }
  }
}

static_assert(kI16Slice == kDecodeInt8AheadKeys);

// Rows [r0, r0 + RB) over all keys: passes of 64 columns (each V line read whole in one pass: in
// passes of 32 this ran 1.15x slower from DRAM), the last one of 32 where Hp is an odd multiple of 32.
// The first block of rows prefetches the next slice's V rows into L2 as each slice starts: the passes
// read each row's lines out of address order, and from DRAM this path took 3x its in-cache time per
// key (with it, dense int8 decode 1.21x and page 256 1.16x faster on Sapphire Rapids,
// docs/performance.md, session 19; on Zen 4, 8 sequences at T = 1, 1.12x, session 32).
// kSpread (the fma set, Intel cores): the first block of rows prefetches each key pair's rows
// kDecodeInt8AheadKeys keys on instead, in every pass the columns that pass reads (i16_group's kAhead;
// with Q.K's rows the same way, DotI16Ahead, int8 decode on Emerald Rapids 1.1x faster, session 41;
// in every pass rather than all columns in the first, and in pieces too, not the slice's burst: dense
// 1.03-1.1x, page 16 1.14x faster from DRAM, session 45).
template <int RB, bool kSpread>
void pv_block_i16(const DecodePv& t, int r0) {
  I16Slice sl;
  const KeyRows rows{static_cast<const char*>(t.v), t.v_pieces, t.ldv};
  const bool spread = kSpread && r0 == 0;
  for (std::int64_t j0 = 0; j0 < t.nkeys; j0 += kI16Slice) {
    if constexpr (!kSpread)  // the next slice's rows as it starts (kSpread: i16_group's kAhead instead)
      if (r0 == 0 && j0 + 2 * kI16Slice <= t.n)
        for (int j = 0; j < kI16Slice; ++j)
          for (std::int64_t b = 0; b < t.H; b += 64) _mm_prefetch(rows.row(j0 + kI16Slice + j) + b, _MM_HINT_T1);
    i16_slice<RB>(t, r0, j0, sl);
    for (std::int64_t h0 = 0; h0 < t.Hp; h0 += 64)
      for (int g = 0; g < 2 && sl.keys[g] > 0; ++g) {
        const std::int64_t jg = j0 + g * kI16Group;
        const bool full = sl.keys[g] == kI16Group && t.H - h0 >= (t.Hp - h0 >= 64 ? 64 : 32);
        if (t.Hp - h0 >= 64) {
          if (full && spread) i16_group<RB, 2, true, true>(t, sl, r0, g, jg, h0);
          else if (full) i16_group<RB, 2, true>(t, sl, r0, g, jg, h0);
          else i16_group<RB, 2, false>(t, sl, r0, g, jg, h0);
        } else {
          if (full && spread) i16_group<RB, 1, true, true>(t, sl, r0, g, jg, h0);
          else if (full) i16_group<RB, 1, true>(t, sl, r0, g, jg, h0);
          else i16_group<RB, 1, false>(t, sl, r0, g, jg, h0);
        }
      }
  }
}

template <int R, bool kSpread>
void pv_rows_i16(const DecodePv& t) {
  if (t.corr) rescale_o<R>(t);
  int r0 = 0;
  for (; r0 + kI16Rows <= R; r0 += kI16Rows) pv_block_i16<kI16Rows, kSpread>(t, r0);
  if constexpr (R % kI16Rows == 3) pv_block_i16<3, kSpread>(t, r0);
  if constexpr (R % kI16Rows == 2) pv_block_i16<2, kSpread>(t, r0);
  if constexpr (R % kI16Rows == 1) pv_block_i16<1, kSpread>(t, r0);
}

// decode_pv_rows for int8 V on int16 weights; false (nothing done) for the other dtypes. kSpread: see
// pv_block_i16.
template <bool kSpread = false>
inline bool decode_pv_rows_i8(const DecodePv& t) {
  if (t.v_dtype != DType::i8) return false;
  with_rows<kDecodeMaxRows>(t.rows, [&](auto r) { pv_rows_i16<decltype(r)::value, kSpread>(t); });
  return true;
}
#endif

// decode_pv_rows with Mac.
template <typename Mac>
void decode_pv_rows(const DecodePv& t) {
  with_rows<kDecodeMaxRows>(t.rows, [&](auto r) { pv_rows_any<Mac, decltype(r)::value>(t); });
}

}  // namespace decode_avx512
}  // namespace
}  // namespace flashgqa
