// The AVX512_BF16 kernel set (bf16-pair operand family, contract in microkernels.hpp).
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma -mf16c (CMakeLists.txt,
// this file only).
//
// Register tile 12 x 32: 24 zmm accumulators, each `vdpbf16ps` multiplies a broadcast word of the row
// operand (two bf16 along the reduction dimension) with one zmm of the packed panel (the same two
// positions for 16 columns) and adds both products to 16 fp32 lanes: 32 multiply-adds per instruction.
// Per reduction step (one word): 2 panel loads + 12 broadcasts feed 24 vdpbf16ps, so every loaded
// panel vector is used 12 times from registers and the loads stay under one per cycle.
// qk_tile and pv_tile are the same loop: (Q, K panel) and (P, V panel) are both "row words x panel".
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/avx512_helpers.hpp"
#include "kernels/microkernels.hpp"
#include "kernels/row_count.hpp"

namespace flashgqa {
namespace {

constexpr int kMR = 12;
using word_t = std::uint32_t __attribute__((may_alias));

// acc[r][0..1] += sum_{w < nwords} a[r][w] (two bf16) . b[w][0..32) (two bf16 per column).
template <int R>
inline void dot_pairs_rows(__m512 (&acc)[R][2], const word_t* a, std::int64_t lda_words,
                           const std::uint16_t* b, std::int64_t nwords) {
  const word_t* arow[R];
  for (int r = 0; r < R; ++r) arow[r] = a + r * lda_words;
  for (std::int64_t w = 0; w < nwords; ++w) {
    const __m512bh b0 = (__m512bh)_mm512_load_si512(b + 64 * w);
    const __m512bh b1 = (__m512bh)_mm512_load_si512(b + 64 * w + 32);
    for (int r = 0; r < R; ++r) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(arow[r][w]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
    }
  }
}

template <int R>
void qk_rows(const QkTile& t) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  dot_pairs_rows<R>(acc, static_cast<const word_t*>(t.q), t.ldq / 2, static_cast<const std::uint16_t*>(t.k),
                    t.Hp / 2);
  const __m512 scale = _mm512_set1_ps(t.scale);
  for (int r = 0; r < R; ++r) {
    _mm512_store_ps(t.s + r * t.lds, _mm512_mul_ps(acc[r][0], scale));
    _mm512_store_ps(t.s + r * t.lds + 16, _mm512_mul_ps(acc[r][1], scale));
  }
}

// P.V's accumulators: O's 32 columns of each row, times corr[r] where corr is not null; and back.
template <int R>
inline void load_o_tile(__m512 (&acc)[R][2], const float* o, std::int64_t ldo, const float* corr) {
  for (int r = 0; r < R; ++r) {
    acc[r][0] = _mm512_load_ps(o + r * ldo);
    acc[r][1] = _mm512_load_ps(o + r * ldo + 16);
    if (corr) {
      const __m512 c = _mm512_set1_ps(corr[r]);
      acc[r][0] = _mm512_mul_ps(acc[r][0], c);
      acc[r][1] = _mm512_mul_ps(acc[r][1], c);
    }
  }
}

template <int R>
inline void store_o_tile(const __m512 (&acc)[R][2], float* o, std::int64_t ldo) {
  for (int r = 0; r < R; ++r) {
    _mm512_store_ps(o + r * ldo, acc[r][0]);
    _mm512_store_ps(o + r * ldo + 16, acc[r][1]);
  }
}

template <int R>
void pv_rows(const PvTile& t) {
  __m512 acc[R][2];
  load_o_tile<R>(acc, t.o, t.ldo, t.corr);
  dot_pairs_rows<R>(acc, static_cast<const word_t*>(t.p), t.ldp / 2, static_cast<const std::uint16_t*>(t.v),
                    t.nkeys / 2);
  store_o_tile<R>(acc, t.o, t.ldo);
}

void qk_tile_12x32(const QkTile& t) {
  with_rows<kMR>(t.rows, [&](auto r) { qk_rows<decltype(r)::value>(t); });
}

void pv_tile_12x32(const PvTile& t) {
  with_rows<kMR>(t.rows, [&](auto r) { pv_rows<decltype(r)::value>(t); });
}

// P as bf16: keys j..j+31 of row r, one zmm, pairs along keys are words.
bool softmax_tile(const SoftmaxTile& t) {
  auto write = [&t](int r, std::int64_t j, __m512 e0, __m512 e1) {
    auto* p = static_cast<std::uint16_t*>(t.p) + r * t.ldp + j;
    _mm512_store_si512(p, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
  };
  return masks_keys(t) ? softmax_rows<true>(t, write) : softmax_rows<false>(t, write);
}

void pack_q_row(void* dst, const PackSource& s) {
  auto* d = static_cast<std::uint16_t*>(dst);
  for (std::int64_t h = 0; h < s.Hp; h += 32) _mm512_store_si512(d + h, load32_bf16(s.src, s.dtype, h, s.H));
}

// The first row of keys j0.. (j0 a multiple of 16): its 16 rows lie s.ld elements apart (one piece).
inline const char* rows16(const PackSource& s, std::int64_t j0) { return static_cast<const char*>(key_row(s, j0)); }

// K panels [Hp/2][32][2]: per 16 keys and 16 words (32 h), load the 16 rows, transpose 16x16 words.
void pack_k(void* dst, const PackSource& s) {
  auto* d = static_cast<std::uint16_t*>(dst);
  const std::int64_t npad = padded_keys(s.n);
  if (s.dtype == DType::bf16 && s.H == s.Hp) {  // plain loads, each 16 keys' rows from their first
    const std::int64_t ld_bytes = s.ld * 2;
    for (std::int64_t j0 = 0; j0 < npad; j0 += 16) {
      std::uint16_t* panel = d + (j0 / kPanelKeys) * s.Hp * kPanelKeys + 2 * (j0 % kPanelKeys);
      const std::int64_t nrows = std::min<std::int64_t>(16, s.n - j0);
      const char* rows = nrows > 0 ? rows16(s, j0) : nullptr;
      for (std::int64_t h0 = 0; h0 < s.Hp; h0 += 32) {
        __m512i r[16];
        for (int i = 0; i < 16; ++i)
          r[i] = i < nrows ? _mm512_loadu_si512(rows + i * ld_bytes + h0 * 2) : _mm512_setzero_si512();
        transpose16x16_epi32(r);
        for (int w = 0; w < 16; ++w) _mm512_store_si512(panel + (h0 / 2 + w) * 2 * kPanelKeys, r[w]);
      }
    }
    return;
  }
  for (std::int64_t j0 = 0; j0 < npad; j0 += 16) {
    std::uint16_t* panel = d + (j0 / kPanelKeys) * s.Hp * kPanelKeys + 2 * (j0 % kPanelKeys);
    for (std::int64_t h0 = 0; h0 < s.Hp; h0 += 32) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = j0 + i < s.n ? load32_bf16(key_row(s, j0 + i), s.dtype, h0, s.H) : _mm512_setzero_si512();
      transpose16x16_epi32(r);  // r[w]: word h0/2 + w of the 16 keys
      for (int w = 0; w < 16; ++w) _mm512_store_si512(panel + (h0 / 2 + w) * 2 * kPanelKeys, r[w]);
    }
  }
}

// V panels [npad/2][32][2] per h tile: rows 2i and 2i+1 interleaved along keys.
void pack_v(void* dst, const PackSource& s) {
  auto* d = static_cast<std::uint16_t*>(dst);
  const std::int64_t npad = padded_keys(s.n);
  if (s.dtype == DType::bf16 && s.H == s.Hp) {  // plain loads, each 16 keys' rows from their first
    const std::int64_t ld_bytes = s.ld * 2;
    for (std::int64_t j0 = 0; j0 < npad; j0 += 16) {
      const std::int64_t nrows = std::min<std::int64_t>(16, s.n - j0);
      const char* rows = nrows > 0 ? rows16(s, j0) : nullptr;
      for (std::int64_t i = 0; i < 16; i += 2) {
        const char* a = i < nrows ? rows + i * ld_bytes : nullptr;
        const char* b = i + 1 < nrows ? rows + (i + 1) * ld_bytes : nullptr;
        std::uint16_t* out = d + (j0 + i) * kHTile;
        for (std::int64_t h0 = 0; h0 < s.Hp; h0 += kHTile) {
          const __m512i x = a != nullptr ? _mm512_loadu_si512(a + h0 * 2) : _mm512_setzero_si512();
          const __m512i y = b != nullptr ? _mm512_loadu_si512(b + h0 * 2) : _mm512_setzero_si512();
          const RowPairs w = pair_rows(x, y);
          _mm512_store_si512(out + h0 * npad, w.lo);
          _mm512_store_si512(out + h0 * npad + 32, w.hi);
        }
      }
    }
    return;
  }
  for (std::int64_t j = 0; j < npad; j += 2) {
    for (std::int64_t h0 = 0; h0 < s.Hp; h0 += kHTile) {
      const __m512i a = j < s.n ? load32_bf16(key_row(s, j), s.dtype, h0, s.H) : _mm512_setzero_si512();
      const __m512i b =
          j + 1 < s.n ? load32_bf16(key_row(s, j + 1), s.dtype, h0, s.H) : _mm512_setzero_si512();
      std::uint16_t* out = d + (h0 / kHTile) * npad * kHTile + j * kHTile;
      const RowPairs w = pair_rows(a, b);
      _mm512_store_si512(out, w.lo);
      _mm512_store_si512(out + 32, w.hi);
    }
  }
}

// pv_tile_rows: pv_tile on the h tile at t.h0 with V's rows paired as they are read, in registers, as
// pack_v pairs them (the same words, so the same sums): no packed copy of V to write and read back.
// Each pair of rows is loaded once per row tile and h tile (from L2: the decode path's packed blocks
// prefetch them). Keys past v.n read as zeros; the generic path (other dtypes, H short of Hp) converts
// and masks as pack_v's does.
template <int R>
void pv_rows_direct(const PvRowsTile& t) {
  const PackSource& v = t.v;
  __m512 acc[R][2];
  load_o_tile<R>(acc, t.o, t.ldo, t.corr);
  const word_t* prow[R];
  for (int r = 0; r < R; ++r) prow[r] = static_cast<const word_t*>(t.p) + r * (t.ldp / 2);
  // Keys j, j + 1 (as pack_v's words) into the sums.
  const auto add_pair = [&](std::int64_t j, __m512i a, __m512i b) {
    const RowPairs w = pair_rows(a, b);
    for (int r = 0; r < R; ++r) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(prow[r][j / 2]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, (__m512bh)w.lo);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, (__m512bh)w.hi);
    }
  };
  if (v.dtype == DType::bf16 && v.H == v.Hp) {  // plain loads, each 16 keys' rows from their first
    const std::int64_t ld_bytes = v.ld * 2, whole = std::min(t.nkeys, v.n) / 16 * 16;
    std::int64_t j0 = 0;
    for (; j0 < whole; j0 += 16) {
      const char* rows = rows16(v, j0) + t.h0 * 2;
      for (std::int64_t i = 0; i < 16; i += 2)
        add_pair(j0 + i, _mm512_loadu_si512(rows + i * ld_bytes), _mm512_loadu_si512(rows + (i + 1) * ld_bytes));
    }
    for (std::int64_t j = j0; j < t.nkeys; j += 2) {
      const char* rows = j < v.n ? rows16(v, j / 16 * 16) + t.h0 * 2 : nullptr;
      const std::int64_t i = j % 16;
      add_pair(j, j < v.n ? _mm512_loadu_si512(rows + i * ld_bytes) : _mm512_setzero_si512(),
               j + 1 < v.n ? _mm512_loadu_si512(rows + (i + 1) * ld_bytes) : _mm512_setzero_si512());
    }
  } else {
    for (std::int64_t j = 0; j < t.nkeys; j += 2)
      add_pair(j, j < v.n ? load32_bf16(key_row(v, j), v.dtype, t.h0, v.H) : _mm512_setzero_si512(),
               j + 1 < v.n ? load32_bf16(key_row(v, j + 1), v.dtype, t.h0, v.H) : _mm512_setzero_si512());
  }
  store_o_tile<R>(acc, t.o, t.ldo);
}

void pv_tile_rows_12x32(const PvRowsTile& t) {
  with_rows<kMR>(t.rows, [&](auto r) { pv_rows_direct<decltype(r)::value>(t); });
}

// P and dS of keys j..j+31 of one row (softmax_grad_pack) in fp32: e[0..1] P, e[2..3] dS (16 keys
// each); zero outside [lo, hi) and for padding rows.
inline void grad_row32(__m512 (&e)[4], const SoftmaxGradTile& t, int r, std::int64_t j) {
  const bool pad = r >= t.rows;  // a padding row of the panels
  const std::int64_t lo = pad ? 0 : t.lo[r], hi = pad ? 0 : t.hi[r];
  if (j >= hi || j + 32 <= lo) {  // (also every padding row) no key of these 32 is seen
    for (__m512& x : e) x = _mm512_setzero_ps();
    return;
  }
  const __m512 lse = _mm512_set1_ps(t.lse[r]), D = _mm512_set1_ps(t.D[r]);
  const __m512 log2e = _mm512_set1_ps(exp_poly::kLog2e);
  const float* s = t.s + r * t.lds + j;
  const float* dp = t.dp + r * t.lds + j;
  for (int h = 0; h < 2; ++h) {
    const __mmask16 m = lanes16(lo - j - 16 * h, hi - j - 16 * h);
    // exp_n's bits: x = S - lse in fp32, then 2^(x log2e).
    const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + 16 * h), lse);
    const __m512 p = _mm512_maskz_mov_ps(m, exp2_poly(_mm512_mul_ps(x, log2e)));
    e[h] = p;
    // Masked: 0 * (0 - D) could be NaN (D infinite), so masked explicitly.
    e[2 + h] = _mm512_maskz_mul_ps(m, p, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, dp + 16 * h), D));
  }
}

// The backward's elementwise step and its packs (contract in microkernels.hpp), two rows at a time:
// vcvtne2ps2bf16 of (row r1's 16 values, row r0's 16) then one permute that interleaves them gives the
// 16 V-panel words (P[r0][c], P[r1][c]); of a row's two halves, its 32 bf16 along keys.
void softmax_grad_pack(const SoftmaxGradTile& t) {
  auto* pt = static_cast<std::uint16_t*>(t.pt);
  auto* dst = static_cast<std::uint16_t*>(t.dst);
  auto* dsr = static_cast<std::uint16_t*>(t.dsr);
  const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                         6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  auto words = [&pairs](__m512 r0, __m512 r1) {
    return _mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(r1, r0));
  };
  for (std::int64_t i = 0; i < t.rows_out; i += 2) {
    const int r0 = static_cast<int>(i), r1 = r0 + 1;
    for (std::int64_t j = 0; j < t.n; j += kPanelKeys) {
      __m512 a[4], b[4];
      grad_row32(a, t, r0, j);
      grad_row32(b, t, r1, j);
      const std::int64_t at = (j / kPanelKeys) * t.panel_stride + i * kPanelKeys;
      for (int h = 0; h < 2; ++h) {
        _mm512_store_si512(pt + at + 32 * h, words(a[h], b[h]));
        _mm512_store_si512(dst + at + 32 * h, words(a[2 + h], b[2 + h]));
      }
      if (r0 < t.rows) _mm512_store_si512(dsr + r0 * t.lddsr + j, (__m512i)_mm512_cvtne2ps_pbh(a[3], a[2]));
      if (r1 < t.rows) _mm512_store_si512(dsr + r1 * t.lddsr + j, (__m512i)_mm512_cvtne2ps_pbh(b[3], b[2]));
    }
  }
}

}  // namespace

const FlashKernels& avx512bf16_kernels() {
  static const bool probed = (probe_bf16_cvt_nan(), true);  // before the set's first use (microkernels.hpp)
  (void)probed;
  static const FlashKernels k{.name = "avx512bf16",
                              .operand_bytes = 2,
                              .mr = kMR,
                              .qk_tile = qk_tile_12x32,
                              .pv_tile = pv_tile_12x32,
                              .softmax_tile = softmax_tile,
                              .exp_n = exp_n,
                              .softcap_n = softcap_n,
                              .pack_q_row = pack_q_row,
                              .pack_k = pack_k,
                              .pack_v = pack_v,
                              .pv_tile_rows = pv_tile_rows_12x32,
                              .decode_qk_rows = avx512bf16_decode_qk_rows,
                              .decode_pv_rows = avx512bf16_decode_pv_rows,
                              .decode_rows_to_bf16 = avx512bf16_decode_rows_to_bf16,
                              .decode_int8_rows_to_bf16 = avx512bf16_decode_int8_rows_to_bf16,
                              .softmax_grad_pack = softmax_grad_pack,
                              .int8_on_integers = true,
                              .decode_row_pieces = true,
                              .decode_packed_rows = 16,
                              .decode_int8_convert_rows = 32};
  return k;
}

}  // namespace flashgqa
