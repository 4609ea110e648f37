// AVX-512 helpers shared by kernels_avx512f.cpp and kernels_avx512bf16.cpp: loads that convert any
// input dtype, exact bf16 rounding, the 16x16 transpose the K packing uses, the vector exp.
//
// Include ONLY from translation units compiled with -mavx512f -mavx512bw -mavx512vl: everything here
// is in an anonymous namespace, so each unit gets its own copy and no AVX-512 code can be linked into
// a portable caller. No standard-library templates are used for the same reason.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/exp_poly.hpp"
#include "kernels/microkernels.hpp"
#include "kernels/tanh_poly.hpp"

namespace flashgqa {
namespace {

inline __mmask16 first_lanes16(std::int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u);
}

inline __mmask32 first_lanes32(std::int64_t n) {
  return n >= 32 ? __mmask32(0xffffffffu) : n <= 0 ? __mmask32(0) : __mmask32((1u << n) - 1u);
}

// Lanes i with lo <= i < hi (of 16).
inline __mmask16 lanes16(std::int64_t lo, std::int64_t hi) {
  return static_cast<__mmask16>(first_lanes16(hi) & ~first_lanes16(lo));
}

// 16 values src[h0 .. h0+16) as fp32, lanes at or beyond H zero.
inline __m512 load16_f32(const void* row, DType dtype, std::int64_t h0, std::int64_t H) {
  const __mmask16 m = first_lanes16(H - h0);
  switch (dtype) {
    case DType::f32: return _mm512_maskz_loadu_ps(m, static_cast<const float*>(row) + h0);
    case DType::bf16: {
      const __m256i b = _mm256_maskz_loadu_epi16(m, static_cast<const std::uint16_t*>(row) + h0);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    }
    case DType::f16: {
      const __m256i b = _mm256_maskz_loadu_epi16(m, static_cast<const std::uint16_t*>(row) + h0);
      return _mm512_cvtph_ps(b);
    }
    case DType::i8:  // unscaled values (the decode kernels apply the scales: load32_i8_bf16)
      return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, static_cast<const std::int8_t*>(row) + h0)));
  }
  return _mm512_setzero_ps();
}

// The two halves of 16 bf16 pairs as fp32: the odd elements (the high half of each word) and the even
// ones (the low half).
inline __m512 odd_half(__m512i w) { return _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(int(0xffff0000u)))); }
inline __m512 even_half(__m512i w) { return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)); }

// x rounded to nearest even bf16, as 32-bit lanes whose high half holds the bf16 bits (low half 0);
// NaN becomes a quiet NaN. Identical to float_to_bf16_bits in core/dtype.hpp, subnormals included.
inline __m512i round_bf16_hi(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x00400000)));
}

// The operand value of 16 values of a row of dtype D as fp32 (rounded to bf16 when asked), the dtype
// known when compiled (the packers' loops: one switch a call, not one per 16 values). bf16 values are
// their own rounding, so a bf16 row only has its NaNs quieted, as round_bf16_hi quiets them.
template <DType D>
inline __m512 load16_operand_as(const void* row, std::int64_t H, bool round, std::int64_t h0) {
  const __m512 x = load16_f32(row, D, h0, H);
  if (!round) return x;
  if constexpr (D == DType::bf16)
    return _mm512_castsi512_ps(_mm512_mask_or_epi32(_mm512_castps_si512(x), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q),
                                                    _mm512_castps_si512(x), _mm512_set1_epi32(0x00400000)));
  else
    return _mm512_castsi512_ps(round_bf16_hi(x));
}

template <DType D>
struct DTypeTag {
  static constexpr DType value = D;
};

// fn(DTypeTag<d>{}): a loop over rows of dtype d compiled once per dtype.
template <class Fn>
inline void with_operand_dtype(DType d, Fn&& fn) {
  switch (d) {
    case DType::f32: return fn(DTypeTag<DType::f32>{});
    case DType::f16: return fn(DTypeTag<DType::f16>{});
    case DType::i8: return fn(DTypeTag<DType::i8>{});
    case DType::bf16: break;
  }
  fn(DTypeTag<DType::bf16>{});
}

// lo (lanes 0..15) and hi (16..31) rounded to nearest even bf16 by round_bf16_hi, as 32 bf16 lanes
// (without AVX512_BF16's vcvtne2ps2bf16, which gives the same bits above 2^-126).
inline __m512i round2_bf16(__m512 lo, __m512 hi) {
  const __m512i l = _mm512_srli_epi32(round_bf16_hi(lo), 16), h = _mm512_srli_epi32(round_bf16_hi(hi), 16);
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(l)), _mm512_cvtepi32_epi16(h), 1);
}

#ifdef __AVX512BF16__
// round2_bf16's words from one vcvtne2ps2bf16 where that gives them (~10 instructions fewer per 16
// values). Intel defines it as round_bf16_hi for every value but the subnormals, which it takes as
// signed zeros: the same nearest even rounding on the integer bits, infinities kept, a NaN as its high
// half with the quiet bit set. So 32 values with a subnormal or a NaN among them take round2_bf16 (one
// vfpclassps checks both); values widened from f16 are never subnormal floats, and their NaNs take
// round2_bf16 only where this CPU's NaN words were found to differ (bf16_cvt_nan_exact).
// For units compiled with AVX512_BF16 (the avx512bf16 and amx sets).
inline __m512i round2_bf16_cvt(__m512 lo, __m512 hi) {
  constexpr int kNotPlain = 0x20 | 0x01 | 0x80;  // vfpclassps: subnormal, quiet NaN, signalling NaN
  if ((_mm512_fpclass_ps_mask(lo, kNotPlain) | _mm512_fpclass_ps_mask(hi, kNotPlain)) != 0)
    return round2_bf16(lo, hi);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// The same for values widened from f16 (vcvtph2ps).
inline __m512i round2_bf16_cvt_from_f16(__m512 lo, __m512 hi) {
  if (!bf16_cvt_nan_exact()) return round2_bf16_cvt(lo, hi);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// Columns [h, h + 32) of a row of the dtype with all 32 there (no mask) as bf16, rounded as load32_bf16
// does; kDtype bf16, f16 or f32. (The amx tiles' rows, H = Hp; the converters' whole chunks.)
template <DType kDtype>
inline __m512i load32_whole(const char* row, std::int64_t h) {
  if constexpr (kDtype == DType::bf16) {
    return _mm512_loadu_si512(row + h * 2);
  } else if constexpr (kDtype == DType::f16) {
    const auto* x = reinterpret_cast<const __m256i*>(row + h * 2);
    return round2_bf16_cvt_from_f16(_mm512_cvtph_ps(_mm256_loadu_si256(x)), _mm512_cvtph_ps(_mm256_loadu_si256(x + 1)));
  } else {
    const auto* x = reinterpret_cast<const float*>(row) + h;
    return round2_bf16_cvt(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16));
  }
}

// f(the load32_whole of the call's float dtype).
template <typename F>
inline void with_whole_loads(DType dtype, F f) {
  using std::int64_t;
  if (dtype == DType::bf16) return f([](const char* row, int64_t h) { return load32_whole<DType::bf16>(row, h); });
  if (dtype == DType::f16) return f([](const char* row, int64_t h) { return load32_whole<DType::f16>(row, h); });
  f([](const char* row, int64_t h) { return load32_whole<DType::f32>(row, h); });
}
#endif

// 32 values src[h0 .. h0+32) rounded to bf16, as 32 bf16 lanes (pairs along h are the 16 words).
inline __m512i load32_bf16(const void* row, DType dtype, std::int64_t h0, std::int64_t H) {
  if (dtype == DType::bf16) {
    return _mm512_maskz_loadu_epi16(first_lanes32(H - h0), static_cast<const std::uint16_t*>(row) + h0);
  }
#ifdef __AVX512BF16__
  if (dtype == DType::f16) return round2_bf16_cvt_from_f16(load16_f32(row, dtype, h0, H), load16_f32(row, dtype, h0 + 16, H));
  return round2_bf16_cvt(load16_f32(row, dtype, h0, H), load16_f32(row, dtype, h0 + 16, H));
#else
  return round2_bf16(load16_f32(row, dtype, h0, H), load16_f32(row, dtype, h0 + 16, H));
#endif
}

// Two rows' 32 bf16 columns as the 32-bit words (a[c], b[c]) that vdpbf16ps sums along keys: lo for
// columns 0..15, hi for 16..31 (two vpermt2w). pack_v's V panels, pv_tile_rows and the decode P.V.
struct RowPairs {
  __m512i lo, hi;
};
inline RowPairs pair_rows(__m512i a, __m512i b) {
  const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                          37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  return {_mm512_permutex2var_epi16(a, lo_idx, b),
          _mm512_permutex2var_epi16(a, _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16)), b)};
}

// In-register transpose of a 16x16 matrix of 32-bit elements: r[i] lane j <-> r[j] lane i. (Where it
// inlines into a loop over arrays, GCC 12 warns that its headers' own _mm512_undefined_epi32 is
// uninitialized, GCC bug 105593: silenced here.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
inline void transpose16x16_epi32(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // r[4g + c]: rows 4g..4g+3 of column 4L + c in 128-bit lane L
    r[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    r[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    r[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i x = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44);
    const __m512i y = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xee);
    const __m512i z = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
    const __m512i w = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xee);
    t[c] = _mm512_shuffle_i32x4(x, z, 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(x, z, 0xdd);
    t[8 + c] = _mm512_shuffle_i32x4(y, w, 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(y, w, 0xdd);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// vpunpcklwd / vpunpckhwd of two rows' 32 int16 (or bf16) columns pair them in-lane, leaving the
// columns of the pairs in the order: lane l of the low result is column 8 (l / 4) + l % 4, of the high
// one that plus 4. to_unpacked_columns(half): those columns as indices (32-bit lanes, for
// vpermt2d/vpermt2ps over the 16 natural columns of half 0 and 1); from_unpacked_columns(half): the
// inverse, lane l the position of natural column 16 half + l in (low, high) (16 + i: the high's lane i).
inline __m512i to_unpacked_columns(int half) {
  alignas(64) std::int32_t idx[16];
  for (int l = 0; l < 16; ++l) idx[l] = 8 * (l / 4) + l % 4 + 4 * half;
  return _mm512_load_si512(idx);
}
inline __m512i from_unpacked_columns(int half) {
  alignas(64) std::int32_t idx[16];
  for (int l = 0; l < 16; ++l) {
    const int c = 16 * half + l;
    idx[l] = (c % 8 < 4 ? 0 : 16) + 4 * (c / 8) + c % 4;
  }
  return _mm512_load_si512(idx);
}
#pragma GCC diagnostic pop

// 2^x, the polynomial of exp_poly.hpp: f = x - floor(x) (vreduceps, round-down mode), P(f), and
// vscalefps multiplies by 2^floor(x). x = -inf gives f = 0 and 2^-inf = 0; NaN stays NaN; overflow
// gives +inf and deep underflow 0, with no clamping.
inline __m512 exp2_poly(__m512 x) {
  using namespace exp_poly;
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(kC5);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kC4));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kC3));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kC2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kC1));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, x);
}

inline void exp_n(float* dst, const float* src, std::int64_t n) {
  for (std::int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes16(n - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, src + i);
    _mm512_mask_storeu_ps(dst + i, m, exp2_poly(_mm512_mul_ps(x, _mm512_set1_ps(exp_poly::kLog2e))));
  }
}

// tanh(y) by the rational of tanh_poly.hpp: clamp (NaN passes: min/max return their second operand),
// y P(y^2) / Q(y^2).
inline __m512 tanh_rational(__m512 y) {
  using namespace tanh_poly;
  y = _mm512_min_ps(_mm512_set1_ps(kTanhClamp), y);
  y = _mm512_max_ps(_mm512_set1_ps(-kTanhClamp), y);
  const __m512 u = _mm512_mul_ps(y, y);
  __m512 num = _mm512_fmadd_ps(_mm512_set1_ps(kP4), u, _mm512_set1_ps(kP3));
  num = _mm512_fmadd_ps(num, u, _mm512_set1_ps(kP2));
  num = _mm512_fmadd_ps(num, u, _mm512_set1_ps(kP1));
  num = _mm512_fmadd_ps(num, u, _mm512_set1_ps(1.0f));
  __m512 den = _mm512_fmadd_ps(_mm512_set1_ps(kQ4), u, _mm512_set1_ps(kQ3));
  den = _mm512_fmadd_ps(den, u, _mm512_set1_ps(kQ2));
  den = _mm512_fmadd_ps(den, u, _mm512_set1_ps(kQ1));
  den = _mm512_fmadd_ps(den, u, _mm512_set1_ps(1.0f));
  return _mm512_div_ps(_mm512_mul_ps(num, y), den);
}

// x[i] = cap tanh(x[i] / cap) (softcap_n, contract in microkernels.hpp).
inline void softcap_n(float* x, std::int64_t n, float cap) {
  const __m512 c = _mm512_set1_ps(cap), inv = _mm512_set1_ps(1.0f / cap);
  for (std::int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = first_lanes16(n - i);
    const __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(c, tanh_rational(y)));
  }
}

inline const void* key_row(const PackSource& s, std::int64_t j) {
  return packed_key_row(s, j, s.dtype == DType::f32 ? 4 : 2);
}


// corr[r] = exp(m_old[r] - m_use[r]) for r < rows (<= kMaxTileRows), 16 at a time; returns whether any != 1.
inline bool rescale_factors(float* corr, const float* m_old, const float* m_use, int rows) {
  bool moved = false;
  for (int r0 = 0; r0 < rows; r0 += 16) {
    const __mmask16 m = first_lanes16(rows - r0);
    const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, m_old + r0), _mm512_maskz_loadu_ps(m, m_use + r0));
    const __m512 c = exp2_poly(_mm512_mul_ps(d, _mm512_set1_ps(exp_poly::kLog2e)));
    _mm512_mask_storeu_ps(corr + r0, m, c);
    // NEQ_UQ: true for NaN too, so a NaN factor forces the rescale that spreads it.
    moved = moved || _mm512_mask_cmp_ps_mask(m, c, _mm512_set1_ps(1.0f), _CMP_NEQ_UQ) != 0;
  }
  return moved;
}

// Whether t's lo and hi mask any key: false where they are null or every row sees keys [0, n), so
// that a tile the bounds leave whole takes softmax_rows<false> (the same bits, without a mask per
// vector: T = 8 at G = 4 in L2 1.02x faster, docs/performance.md, session 30).
inline bool masks_keys(const SoftmaxTile& t) {
  if (t.lo == nullptr) return false;
  for (int r = 0; r < t.rows; ++r)
    if (t.lo[r] > 0 || t.hi[r] < t.n) return true;
  return false;
}

// softmax_tile (contract in microkernels.hpp) for 16-lane vectors; write_p(p_row, j, e0, e1) stores
// the weights of keys j..j+31 (e0: j..j+15, e1: j+16..j+31) in the set's operand type.
template <bool kMasked, typename WriteP>
bool softmax_rows(const SoftmaxTile& t, WriteP write_p) {
  float m_old[kMaxTileRows], m_use[kMaxTileRows], sums[kMaxTileRows];
  const __m512 log2e = _mm512_set1_ps(exp_poly::kLog2e);
  for (int r = 0; r < t.rows; ++r) {
    const float* s = t.s + r * t.lds;
    const std::int64_t lo = kMasked ? t.lo[r] : 0, hi = kMasked ? t.hi[r] : t.n;
    // Running max over the unmasked keys [lo, hi).
    __m512 mx = _mm512_set1_ps(-__builtin_inff());
    for (std::int64_t j = lo / 16 * 16; j < hi; j += 16) {
      if (kMasked)
        mx = _mm512_mask_max_ps(mx, lanes16(lo - j, hi - j), mx, _mm512_load_ps(s + j));
      else
        mx = _mm512_max_ps(mx, _mm512_load_ps(s + j));
    }
    const float mb = _mm512_reduce_max_ps(mx);
    m_old[r] = t.m[r];
    const float mn = m_old[r] > mb ? m_old[r] : mb;
    t.m[r] = mn;
    m_use[r] = mn == -__builtin_inff() ? 0.0f : mn;
    // P = exp(s - m) = 2^(s log2e - m log2e); masked keys exactly 0; the sum before rounding. Panels
    // wholly outside [lo, hi) are written as zeros without reading S.
    const __m512 neg_m = _mm512_set1_ps(-m_use[r] * exp_poly::kLog2e);
    __m512 sum = _mm512_setzero_ps();
    const std::int64_t jbegin = kMasked ? std::min(lo / 32 * 32, t.n) : 0;
    const std::int64_t jend = kMasked ? std::max((hi + 31) / 32 * 32, jbegin) : t.n;
    for (std::int64_t j = 0; j < jbegin; j += 32) write_p(r, j, _mm512_setzero_ps(), _mm512_setzero_ps());
    for (std::int64_t j = jbegin; j < jend; j += 32) {
      __m512 e0 = exp2_poly(_mm512_fmadd_ps(_mm512_load_ps(s + j), log2e, neg_m));
      __m512 e1 = exp2_poly(_mm512_fmadd_ps(_mm512_load_ps(s + j + 16), log2e, neg_m));
      if (kMasked) {
        e0 = _mm512_maskz_mov_ps(lanes16(lo - j, hi - j), e0);
        e1 = _mm512_maskz_mov_ps(lanes16(lo - j - 16, hi - j - 16), e1);
      }
      sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
      write_p(r, j, e0, e1);
    }
    for (std::int64_t j = jend; j < t.n; j += 32) write_p(r, j, _mm512_setzero_ps(), _mm512_setzero_ps());
    sums[r] = _mm512_reduce_add_ps(sum);
  }
  const bool moved = rescale_factors(t.corr, m_old, m_use, t.rows);
  for (int r = 0; r < t.rows; ++r) t.l[r] = t.l[r] * t.corr[r] + sums[r];
  return moved;
}

}  // namespace
}  // namespace flashgqa
