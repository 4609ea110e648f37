// The AVX-512F kernel set (fp32 operand family, contract in microkernels.hpp): for CPUs with AVX-512
// but no AVX512_BF16, for Precision::bf16 where vdpbf16ps is half rate (bf16_dot_half_rate()), and for
// Precision::f32 on every AVX-512 CPU. avx512f_decode_kernels() below is the path's decode set.
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c (CMakeLists.txt, this file
// only).
//
// Register tile 12 x 32: 24 zmm accumulators; per reduction step 2 panel loads feed 24 FMAs whose
// row operand is an embedded broadcast from memory. Operands were widened to fp32 (bf16-rounded under
// Precision::bf16) when packed, so the inner loop is pure FMA: half the multiply-adds of vdpbf16ps per
// instruction, the same fp32 accumulation.
#include <immintrin.h>

#include <cstdint>

#include "kernels/avx512_helpers.hpp"
#include "kernels/microkernels.hpp"
#include "kernels/row_count.hpp"

namespace flashgqa {
namespace {

constexpr int kMR = 12;

// acc[r][0..1] += sum_{i < n} a[r][i] * b[i][0..32).
template <int R>
inline void dot_rows(__m512 (&acc)[R][2], const float* a, std::int64_t lda, const float* b, std::int64_t n) {
  const float* arow[R];
  for (int r = 0; r < R; ++r) arow[r] = a + r * lda;
  for (std::int64_t i = 0; i < n; ++i) {
    const __m512 b0 = _mm512_load_ps(b + 32 * i);
    const __m512 b1 = _mm512_load_ps(b + 32 * i + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(arow[r][i]);
      acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
    }
  }
}

template <int R>
void qk_rows(const QkTile& t) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  dot_rows<R>(acc, static_cast<const float*>(t.q), t.ldq, static_cast<const float*>(t.k), t.Hp);
  const __m512 scale = _mm512_set1_ps(t.scale);
  for (int r = 0; r < R; ++r) {
    _mm512_store_ps(t.s + r * t.lds, _mm512_mul_ps(acc[r][0], scale));
    _mm512_store_ps(t.s + r * t.lds + 16, _mm512_mul_ps(acc[r][1], scale));
  }
}

template <int R>
void pv_rows(const PvTile& t) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) {
    acc[r][0] = _mm512_load_ps(t.o + r * t.ldo);
    acc[r][1] = _mm512_load_ps(t.o + r * t.ldo + 16);
    if (t.corr) {
      const __m512 c = _mm512_set1_ps(t.corr[r]);
      acc[r][0] = _mm512_mul_ps(acc[r][0], c);
      acc[r][1] = _mm512_mul_ps(acc[r][1], c);
    }
  }
  dot_rows<R>(acc, static_cast<const float*>(t.p), t.ldp, static_cast<const float*>(t.v), t.nkeys);
  for (int r = 0; r < R; ++r) {
    _mm512_store_ps(t.o + r * t.ldo, acc[r][0]);
    _mm512_store_ps(t.o + r * t.ldo + 16, acc[r][1]);
  }
}

void qk_tile_12x32(const QkTile& t) {
  with_rows<kMR>(t.rows, [&](auto r) { qk_rows<decltype(r)::value>(t); });
}

void pv_tile_12x32(const PvTile& t) {
  with_rows<kMR>(t.rows, [&](auto r) { pv_rows<decltype(r)::value>(t); });
}

// P as fp32, rounded to bf16 under Precision::bf16.
bool softmax_tile(const SoftmaxTile& t) {
  auto write = [&t](int r, std::int64_t j, __m512 e0, __m512 e1) {
    float* p = static_cast<float*>(t.p) + r * t.ldp + j;
    if (t.round_p) {
      e0 = _mm512_castsi512_ps(round_bf16_hi(e0));
      e1 = _mm512_castsi512_ps(round_bf16_hi(e1));
    }
    _mm512_store_ps(p, e0);
    _mm512_store_ps(p + 16, e1);
  };
  return masks_keys(t) ? softmax_rows<true>(t, write) : softmax_rows<false>(t, write);
}

void pack_q_row(void* dst, const PackSource& s) {
  with_operand_dtype(s.dtype, [&](auto tag) {
    auto* d = static_cast<float*>(dst);
    for (std::int64_t h = 0; h < s.Hp; h += 16)
      _mm512_store_ps(d + h, load16_operand_as<decltype(tag)::value>(s.src, s.H, s.round_bf16, h));
  });
}

// bf16 K rows' 16 keys x 32 h at h0 into the panel (h0's row of it at panel + h0 kPanelKeys): the 16
// rows' words (h pairs) transposed as 32-bit lanes, then each word split into its two bf16 as fp32
// (even_half, odd_half): half the shuffles of widening first (T = 16 decode packs every block's K:
// 1.03x faster in L2, docs/performance.md, session 43). False, nothing written, where a value is a
// NaN: the caller's general loop then quiets it as load16_operand_as does.
inline bool pack_k_bf16_words(float* panel, const void* const rows[16], std::int64_t H, std::int64_t h0) {
  const __mmask32 m = first_lanes32(H - h0);
  __m512i r[16];
  __mmask32 nan = 0;
  for (int i = 0; i < 16; ++i) {
    r[i] = rows[i] != nullptr ? _mm512_maskz_loadu_epi16(m, static_cast<const std::uint16_t*>(rows[i]) + h0)
                              : _mm512_setzero_si512();
    nan |= _mm512_cmpgt_epu16_mask(_mm512_and_si512(r[i], _mm512_set1_epi16(0x7fff)), _mm512_set1_epi16(0x7f80));
  }
  if (nan != 0) return false;
  transpose16x16_epi32(r);  // r[i]: h0 + 2i (low half) and h0 + 2i + 1 (high half) of the 16 keys
  for (int i = 0; i < 16; ++i) {
    _mm512_store_ps(panel + (h0 + 2 * i) * kPanelKeys, even_half(r[i]));
    _mm512_store_ps(panel + (h0 + 2 * i + 1) * kPanelKeys, odd_half(r[i]));
  }
  return true;
}

// K panels [Hp][32]: per 16 keys and 16 h, load the 16 rows and transpose (each dtype's loop compiled
// on its own: the decode path's packed blocks pack every block's K for few rows); bf16 rows 32 h at a
// time as words (pack_k_bf16_words), the same values.
void pack_k(void* dst, const PackSource& s) {
  with_operand_dtype(s.dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* d = static_cast<float*>(dst);
    const std::int64_t npad = padded_keys(s.n);
    for (std::int64_t j0 = 0; j0 < npad; j0 += 16) {
      float* panel = d + (j0 / kPanelKeys) * s.Hp * kPanelKeys + j0 % kPanelKeys;
      const void* rows[16];
      for (int i = 0; i < 16; ++i) rows[i] = j0 + i < s.n ? key_row(s, j0 + i) : nullptr;
      for (std::int64_t h0 = 0; h0 < s.Hp; h0 += 16) {
        if constexpr (D == DType::bf16)
          if (h0 % 32 == 0 && pack_k_bf16_words(panel, rows, s.H, h0)) {
            h0 += 16;
            continue;
          }
        __m512i r[16];
        for (int i = 0; i < 16; ++i)
          r[i] = rows[i] != nullptr ? _mm512_castps_si512(load16_operand_as<D>(rows[i], s.H, s.round_bf16, h0))
                                    : _mm512_setzero_si512();
        transpose16x16_epi32(r);  // r[i]: h0 + i of the 16 keys
        for (int i = 0; i < 16; ++i) _mm512_store_si512(panel + (h0 + i) * kPanelKeys, r[i]);
      }
    }
  });
}

// V panels [npad][32] per h tile.
void pack_v(void* dst, const PackSource& s) {
  with_operand_dtype(s.dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* d = static_cast<float*>(dst);
    const std::int64_t npad = padded_keys(s.n);
    for (std::int64_t j = 0; j < npad; ++j) {
      float* out = d + j * kHTile;
      if (j >= s.n) {
        for (std::int64_t h0 = 0; h0 < s.Hp; h0 += kHTile, out += npad * kHTile)
          _mm512_store_ps(out, _mm512_setzero_ps()), _mm512_store_ps(out + 16, _mm512_setzero_ps());
        continue;
      }
      const void* row = key_row(s, j);
      for (std::int64_t h0 = 0; h0 < s.Hp; h0 += kHTile, out += npad * kHTile) {
        _mm512_store_ps(out, load16_operand_as<D>(row, s.H, s.round_bf16, h0));
        _mm512_store_ps(out + 16, load16_operand_as<D>(row, s.H, s.round_bf16, h0 + 16));
      }
    }
  });
}

// The decode set's P: bf16 (nearest even by round_bf16_hi), pairs along keys are words.
bool softmax_tile_bf16(const SoftmaxTile& t) {
  auto write = [&t](int r, std::int64_t j, __m512 e0, __m512 e1) {
    _mm512_store_si512(static_cast<std::uint16_t*>(t.p) + r * t.ldp + j, round2_bf16(e0, e1));
  };
  return masks_keys(t) ? softmax_rows<true>(t, write) : softmax_rows<false>(t, write);
}

void pack_q_row_bf16(void* dst, const PackSource& s) {
  auto* d = static_cast<std::uint16_t*>(dst);
  for (std::int64_t h = 0; h < s.Hp; h += 32) _mm512_store_si512(d + h, load32_bf16(s.src, s.dtype, h, s.H));
}

}  // namespace

// FlashKernels::decode_rows_to_bf16 of this set (avx512bf16's and amx's: the same words on
// vcvtne2ps2bf16, kernels_avx512bf16_rows_to_bf16.cpp): rows 0..n of f16 or f32 `src` as the bf16 words
// the decode kernels form from them (load32_bf16's rounding, on integers: no AVX512_BF16 needed), ldd
// per row, zero in [H, ldd).
void avx512_decode_rows_to_bf16(std::uint16_t* dst, std::int64_t ldd, const void* src, DType dtype, std::int64_t ld,
                                std::int64_t n, std::int64_t H) {
  const std::int64_t row_bytes = ld * static_cast<std::int64_t>(dtype_size(dtype));
  for (std::int64_t j = 0; j < n; ++j) {
    const void* row = static_cast<const char*>(src) + j * row_bytes;
    for (std::int64_t h = 0; h < ldd; h += 32)
      _mm512_mask_storeu_epi16(dst + j * ldd + h, first_lanes32(ldd - h), load32_bf16(row, dtype, h, H));
  }
}

// FlashKernels::decode_int8_rows_to_bf16's words on AVX-512F (the amx set's converter takes it for rows
// whose scale could give subnormal or NaN products): each int8 row times its scale in fp32, rounded to
// bf16 as round2_bf16 rounds (no flush of subnormal products), zero in [H, ldd).
void avx512_decode_int8_rows_to_bf16(std::uint16_t* dst, std::int64_t ldd, const std::int8_t* src, std::int64_t ld,
                                     const float* scale, std::int64_t ld_scale, std::int64_t n, std::int64_t H) {
  for (std::int64_t j = 0; j < n; ++j) {
    const std::int8_t* row = src + j * ld;
    const __m512 s = _mm512_set1_ps(scale[j * ld_scale]);
    for (std::int64_t h = 0; h < ldd; h += 32) {
      const auto half = [&](std::int64_t h0) {
        const __m128i x = _mm_maskz_loadu_epi8(first_lanes16(H - h0), row + h0);
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(x)), s);
      };
      // Columns from H zero (+0, whatever the scale: 0 times a negative or infinite one is not).
      _mm512_mask_storeu_epi16(dst + j * ldd + h, first_lanes32(ldd - h),
                               _mm512_maskz_mov_epi16(first_lanes32(H - h), round2_bf16(half(h), half(h + 16))));
    }
  }
}

// The decode set (AVX-512 without AVX512_BF16: Intel cores): as avx512bf16's fma decode set
// (microkernels.cpp), packed blocks on this set's fp32 tiles from 64 rows (int8 rows as their bf16
// products there, as a float32 cache of the products would be: the products form) and no overlap (on an
// Emerald Rapids with FLASHGQA_ISA=avx512f, one sequence of 32768 keys: T = 16 57-58 -> 42-44 ms;
// docs/performance.md, session 42).
const FlashKernels& avx512f_decode_kernels() {
  static const FlashKernels k{.name = "avx512f (decode)",
                              .operand_bytes = 2,
                              .mr = 0,
                              .qk_tile = nullptr,
                              .pv_tile = nullptr,
                              .softmax_tile = softmax_tile_bf16,
                              .exp_n = exp_n,
                              .softcap_n = softcap_n,
                              .pack_q_row = pack_q_row_bf16,
                              .pack_k = nullptr,
                              .pack_v = nullptr,
                              .decode_qk_rows = avx512f_decode_qk_rows,
                              .decode_pv_rows = avx512f_decode_pv_rows,
                              .decode_rows_to_bf16 = avx512_decode_rows_to_bf16,
                              .decode_int8_rows_to_bf16 = avx512_decode_int8_rows_to_bf16,
                              .decode_overlap_rows = 0,
                              .decode_row_pieces = true,
                              .decode_packed_rows = 64,
                              .decode_tiles = &avx512f_kernels(),
                              .decode_int8_convert_rows = 64};
  return k;
}

const FlashKernels& avx512f_kernels() {
  static const FlashKernels k{.name = "avx512f",
                              .operand_bytes = 4,
                              .mr = kMR,
                              .qk_tile = qk_tile_12x32,
                              .pv_tile = pv_tile_12x32,
                              .softmax_tile = softmax_tile,
                              .exp_n = exp_n,
                              .softcap_n = softcap_n,
                              .pack_q_row = pack_q_row,
                              .pack_k = pack_k,
                              .pack_v = pack_v};
  return k;
}

}  // namespace flashgqa
