// The AVX2 + FMA kernel set (fp32 operand family, contract in microkernels.hpp), for x86-64 CPUs
// without AVX-512. Compiled with -mavx2 -mfma -mf16c (CMakeLists.txt). avx2_decode_kernels() below is
// the path's decode set (its kernels in kernels_avx2_decode_qk.cpp, _pv.cpp).
//
// Register tile 6 x 32, computed as two 6 x 16 halves: 12 ymm accumulators + 2 panel vectors + 1
// broadcast fit the 16 ymm registers; per reduction step 2 loads and 6 broadcasts feed 12 FMAs.
// Everything is in an anonymous namespace and no standard-library templates are instantiated, so no
// AVX2 code can be linked into a portable caller.
#include <immintrin.h>

#include <cstdint>

#include "kernels/avx2_helpers.hpp"
#include "kernels/exp_poly.hpp"
#include "kernels/microkernels.hpp"
#include "kernels/tanh_poly.hpp"
#include "kernels/row_count.hpp"

namespace flashgqa {
namespace {

constexpr int kMR = 6;

__m256 load8_operand(const void* row, const PackSource& s, std::int64_t h0) {
  const __m256 x = load8_f32(row, s.dtype, h0, s.H);
  return s.round_bf16 ? round_bf16(x) : x;
}

// 2^x with the polynomial of exp_poly.hpp: n = floor(x), f = x - n in [0, 1), P(f) * 2^n with 2^n
// applied as two exact power-of-two factors (n in [-150, 129] after clamping; NaN passes the clamps).
// N vectors at once, step by step across them: one vector's ~20 dependent operations (~45 cycles)
// alone fill the FP scheduler and leave the pipes idle; N independent chains in program order keep
// them busy (the softmax at N = 4: 1.2-1.3 -> 0.94-0.99 ns per element in L1 on Zen 3). The same
// operations per vector, so the same bits.
//   kNormal: for x whose every lane lies in [-126, 128), where 2^n is a normal float: no clamps, and
// p 2^n as one product. The same bits: p is in [1, 2], so p 2^n1 is exact and so is p 2^n (normal),
// or both overflow to +inf. 7 operations fewer a vector.
template <int N, bool kNormal = false>
inline __attribute__((always_inline)) void exp2_poly_n(__m256 (&x)[N]) {
  using namespace exp_poly;
  __m256 f[N], p[N];
  __m256i ni[N];
#pragma GCC unroll 4
  for (int i = 0; i < N; ++i) {
    if constexpr (!kNormal) {
      x[i] = _mm256_max_ps(_mm256_set1_ps(kMinExp2), x[i]);  // NaN passes (second operand)
      x[i] = _mm256_min_ps(_mm256_set1_ps(kMaxExp2), x[i]);
    }
    const __m256 n = _mm256_round_ps(x[i], _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    f[i] = _mm256_sub_ps(x[i], n);
    ni[i] = _mm256_cvtps_epi32(n);
  }
#pragma GCC unroll 4
  for (int i = 0; i < N; ++i) p[i] = _mm256_fmadd_ps(_mm256_set1_ps(kC5), f[i], _mm256_set1_ps(kC4));
  const float coefficients[4] = {kC3, kC2, kC1, 1.0f};  // (a plain array: no library template here)
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c)
#pragma GCC unroll 4
    for (int i = 0; i < N; ++i) p[i] = _mm256_fmadd_ps(p[i], f[i], _mm256_set1_ps(coefficients[c]));
  const __m256i bias = _mm256_set1_epi32(127);
#pragma GCC unroll 4
  for (int i = 0; i < N; ++i) {
    if constexpr (kNormal) {
      x[i] = _mm256_mul_ps(p[i], _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni[i], bias), 23)));
    } else {
      const __m256i n1 = _mm256_srai_epi32(ni[i], 1);
      const __m256i n2 = _mm256_sub_epi32(ni[i], n1);
      const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
      const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
      x[i] = _mm256_mul_ps(_mm256_mul_ps(p[i], s1), s2);
    }
  }
}

__m256 exp2_poly(__m256 x) {
  __m256 v[1] = {x};
  exp2_poly_n<1>(v);
  return v[0];
}

// tanh(y) by the rational of tanh_poly.hpp: clamp (NaN passes: min/max return their second operand),
// y P(y^2) / Q(y^2).
__m256 tanh_rational(__m256 y) {
  using namespace tanh_poly;
  y = _mm256_min_ps(_mm256_set1_ps(kTanhClamp), y);
  y = _mm256_max_ps(_mm256_set1_ps(-kTanhClamp), y);
  const __m256 u = _mm256_mul_ps(y, y);
  __m256 num = _mm256_fmadd_ps(_mm256_set1_ps(kP4), u, _mm256_set1_ps(kP3));
  num = _mm256_fmadd_ps(num, u, _mm256_set1_ps(kP2));
  num = _mm256_fmadd_ps(num, u, _mm256_set1_ps(kP1));
  num = _mm256_fmadd_ps(num, u, _mm256_set1_ps(1.0f));
  __m256 den = _mm256_fmadd_ps(_mm256_set1_ps(kQ4), u, _mm256_set1_ps(kQ3));
  den = _mm256_fmadd_ps(den, u, _mm256_set1_ps(kQ2));
  den = _mm256_fmadd_ps(den, u, _mm256_set1_ps(kQ1));
  den = _mm256_fmadd_ps(den, u, _mm256_set1_ps(1.0f));
  return _mm256_div_ps(_mm256_mul_ps(num, y), den);
}

// x[i] = cap tanh(x[i] / cap) (softcap_n, contract in microkernels.hpp); the tail through a buffer.
void softcap_n(float* x, std::int64_t n, float cap) {
  const __m256 c = _mm256_set1_ps(cap), inv = _mm256_set1_ps(1.0f / cap);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(c, tanh_rational(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv))));
  if (i < n) {
    alignas(32) float buf[8] = {};
    for (std::int64_t k = i; k < n; ++k) buf[k - i] = x[k];
    _mm256_store_ps(buf, _mm256_mul_ps(c, tanh_rational(_mm256_mul_ps(_mm256_load_ps(buf), inv))));
    for (std::int64_t k = i; k < n; ++k) x[k] = buf[k - i];
  }
}

void exp_n(float* dst, const float* src, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     exp2_poly(_mm256_mul_ps(_mm256_loadu_ps(src + i), _mm256_set1_ps(exp_poly::kLog2e))));
  if (i < n) {
    alignas(32) float buf[8] = {};
    for (std::int64_t k = i; k < n; ++k) buf[k - i] = src[k];
    _mm256_store_ps(buf, exp2_poly(_mm256_mul_ps(_mm256_load_ps(buf), _mm256_set1_ps(exp_poly::kLog2e))));
    for (std::int64_t k = i; k < n; ++k) dst[k] = buf[k - i];
  }
}

float hsum(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// Lanes j0 + i < lim as an all-ones mask.
__m256 lanes_below(std::int64_t j0, std::int64_t lim) {
  const __m256i idx =
      _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(j0)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const std::int64_t clamped = lim < j0 ? j0 : lim > j0 + 8 ? j0 + 8 : lim;
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(clamped)), idx));
}

// All-ones lanes for keys j0 + i in [lo, hi), of 8.
__m256 lanes_in(std::int64_t j0, std::int64_t lo, std::int64_t hi) {
  return _mm256_andnot_ps(lanes_below(j0, lo), lanes_below(j0, hi));
}

// acc[r][0..1] += sum_{i<n} a[r][i] * b[i][c0 .. c0+16), b rows of 32.
template <int R>
inline void dot_rows_half(__m256 (&acc)[R][2], const float* a, std::int64_t lda, const float* b,
                          std::int64_t n) {
  const float* arow[R];
  for (int r = 0; r < R; ++r) arow[r] = a + r * lda;
  for (std::int64_t i = 0; i < n; ++i) {
    const __m256 b0 = _mm256_load_ps(b + 32 * i);
    const __m256 b1 = _mm256_load_ps(b + 32 * i + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(arow[r] + i);
      acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
    }
  }
}

template <int R>
void qk_rows(const QkTile& t) {
  const __m256 scale = _mm256_set1_ps(t.scale);
  for (int half = 0; half < 2; ++half) {
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    dot_rows_half<R>(acc, static_cast<const float*>(t.q), t.ldq, static_cast<const float*>(t.k) + 16 * half,
                     t.Hp);
    for (int r = 0; r < R; ++r) {
      float* s = t.s + r * t.lds + 16 * half;
      _mm256_store_ps(s, _mm256_mul_ps(acc[r][0], scale));
      _mm256_store_ps(s + 8, _mm256_mul_ps(acc[r][1], scale));
    }
  }
}

template <int R>
void pv_rows(const PvTile& t) {
  for (int half = 0; half < 2; ++half) {
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) {
      const float* o = t.o + r * t.ldo + 16 * half;
      acc[r][0] = _mm256_load_ps(o);
      acc[r][1] = _mm256_load_ps(o + 8);
      if (t.corr) {
        const __m256 c = _mm256_set1_ps(t.corr[r]);
        acc[r][0] = _mm256_mul_ps(acc[r][0], c);
        acc[r][1] = _mm256_mul_ps(acc[r][1], c);
      }
    }
    dot_rows_half<R>(acc, static_cast<const float*>(t.p), t.ldp, static_cast<const float*>(t.v) + 16 * half,
                     t.nkeys);
    for (int r = 0; r < R; ++r) {
      float* o = t.o + r * t.ldo + 16 * half;
      _mm256_store_ps(o, acc[r][0]);
      _mm256_store_ps(o + 8, acc[r][1]);
    }
  }
}

void qk_tile_6x32(const QkTile& t) {
  with_rows<kMR>(t.rows, [&](auto r) { qk_rows<decltype(r)::value>(t); });
}

void pv_tile_6x32(const PvTile& t) {
  with_rows<kMR>(t.rows, [&](auto r) { pv_rows<decltype(r)::value>(t); });
}

// The online softmax over the tile (contract in microkernels.hpp); write(r, j, e) stores keys
// j .. j+8 of row r's weights, write_pair(r, j, e0, e1) keys j .. j+16 (e unrounded; the sums take it
// as it is). The writers come by value, with the destination captured by value: as a reference to
// the caller's closure, which reached the tile through t, GCC reloaded t.p and t.ldp after every store
// (a store may alias them). With that, the pairs (one 32-byte store of bf16 words), round_bf16_high
// and exp2_poly_n<kExpN, true> where a step's lanes allow it, the decode set's softmax took 0.71 ->
// 0.57 ns an element (8 rows of 512 keys in L1, Zen 4 with AVX-512 hidden; docs/performance.md,
// session 38), the same bits (Microkernels.Avx2SoftmaxGivesTheBitsOfItsScalarModel).
constexpr int kExpN = 4;  // exp vectors per step where all lanes are visible (see exp2_poly_n)
static_assert(kExpN % 2 == 0, "a step's weights are written in pairs");
template <typename Write, typename WritePair>
bool softmax_rows(const SoftmaxTile& t, Write write, WritePair write_pair) {
  const __m256 log2e = _mm256_set1_ps(exp_poly::kLog2e);
  const float neg_inf = -__builtin_inff();
  alignas(32) float m_old[8] = {}, m_use[8] = {}, sums[8] = {};
  for (int r = 0; r < t.rows; ++r) {
    const float* s = t.s + r * t.lds;
    const std::int64_t lo = t.lo ? t.lo[r] : 0, hi = t.lo ? t.hi[r] : t.n;
    // Running max over the unmasked keys [lo, hi).
    __m256 mx = _mm256_set1_ps(neg_inf);
    for (std::int64_t j = lo / 8 * 8; j < hi; j += 8) {
      __m256 x = _mm256_load_ps(s + j);
      if (j < lo || j + 8 > hi) x = _mm256_blendv_ps(_mm256_set1_ps(neg_inf), x, lanes_in(j, lo, hi));
      mx = _mm256_max_ps(mx, x);
    }
    const float mb = hmax(mx);
    m_old[r] = t.m[r];
    const float mn = m_old[r] > mb ? m_old[r] : mb;
    t.m[r] = mn;
    m_use[r] = mn == neg_inf ? 0.0f : mn;
    const __m256 neg_m = _mm256_set1_ps(-m_use[r] * exp_poly::kLog2e);
    __m256 sum = _mm256_setzero_ps();
    for (std::int64_t j = 0; j < t.n;) {
      if (j >= lo && j + 8 * kExpN <= hi) {  // kExpN vectors of visible keys at once (see exp2_poly_n)
        __m256 e[kExpN];
#pragma GCC unroll 4
        for (int i = 0; i < kExpN; ++i) e[i] = _mm256_fmadd_ps(_mm256_load_ps(s + j + 8 * i), log2e, neg_m);
        // Where every lane lies in [-126, 128), the normal-range exp gives the same bits. (x <= ~0, as
        // every s <= the row's max, but m log2 e is rounded: for a huge max x may be far above 0, and
        // there the clamps of exp2_poly_n give +inf.) A NaN lane, which min and max may drop, gives
        // the same NaN either way: both scale p by 2^0 there (cvtps2dq's 0x80000000 shifted out).
        __m256 lowest = e[0], highest = e[0];
#pragma GCC unroll 4
        for (int i = 1; i < kExpN; ++i) lowest = _mm256_min_ps(lowest, e[i]), highest = _mm256_max_ps(highest, e[i]);
        const __m256 normal = _mm256_and_ps(_mm256_cmp_ps(lowest, _mm256_set1_ps(-126.0f), _CMP_GE_OQ),
                                            _mm256_cmp_ps(highest, _mm256_set1_ps(128.0f), _CMP_LT_OQ));
        if (_mm256_movemask_ps(normal) == 0xff)
          exp2_poly_n<kExpN, true>(e);
        else
          exp2_poly_n<kExpN>(e);
#pragma GCC unroll 4
        for (int i = 0; i < kExpN; ++i) sum = _mm256_add_ps(sum, e[i]);
#pragma GCC unroll 4
        for (int i = 0; i < kExpN; i += 2) write_pair(r, j + 8 * i, e[i], e[i + 1]);
        j += 8 * kExpN;
        continue;
      }
      __m256 e = _mm256_setzero_ps();
      if (j + 8 > lo && j < hi) {
        e = exp2_poly(_mm256_fmadd_ps(_mm256_load_ps(s + j), log2e, neg_m));
        if (j < lo || j + 8 > hi) e = _mm256_and_ps(e, lanes_in(j, lo, hi));
        sum = _mm256_add_ps(sum, e);
      }
      write(r, j, e);
      j += 8;
    }
    sums[r] = hsum(sum);
  }
  bool moved = false;
  const __m256 c =
      exp2_poly(_mm256_mul_ps(_mm256_sub_ps(_mm256_load_ps(m_old), _mm256_load_ps(m_use)), log2e));
  alignas(32) float corr[8];
  _mm256_store_ps(corr, c);
  for (int r = 0; r < t.rows; ++r) {
    t.corr[r] = corr[r];
    t.l[r] = t.l[r] * corr[r] + sums[r];
    moved |= !(corr[r] == 1.0f);
  }
  return moved;
}

// P as fp32, rounded to bf16 under Precision::bf16.
bool softmax_tile(const SoftmaxTile& t) {
  float* const p = static_cast<float*>(t.p);
  const std::int64_t ldp = t.ldp;
  const bool round_p = t.round_p;
  const auto write = [=](int r, std::int64_t j, __m256 e) {
    _mm256_store_ps(p + r * ldp + j, round_p ? round_bf16(e) : e);
  };
  return softmax_rows(t, write, [write](int r, std::int64_t j, __m256 e0, __m256 e1) {
    write(r, j, e0);
    write(r, j + 8, e1);
  });
}

// The decode set's P: bf16 (nearest even by round_bf16), pairs along keys are words.
bool softmax_tile_bf16(const SoftmaxTile& t) {
  std::uint16_t* const p = static_cast<std::uint16_t*>(t.p);
  const std::int64_t ldp = t.ldp;
  return softmax_rows(
      t,
      [=](int r, std::int64_t j, __m256 e) {
        const __m256i w = bf16_words(e, e);  // words 0..7 are e's, in order
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p + r * ldp + j), _mm256_castsi256_si128(w));
      },
      [=](int r, std::int64_t j, __m256 e0, __m256 e1) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + r * ldp + j), bf16_words(e0, e1));
      });
}

const void* key_row(const PackSource& s, std::int64_t j) { return packed_key_row(s, j, s.dtype == DType::f32 ? 4 : 2); }


void pack_q_row(void* dst, const PackSource& s) {
  auto* d = static_cast<float*>(dst);
  for (std::int64_t h = 0; h < s.Hp; h += 8) _mm256_store_ps(d + h, load8_operand(s.src, s, h));
}

// The decode set's Q rows: bf16 words, zero past H.
void pack_q_row_bf16(void* dst, const PackSource& s) {
  auto* d = static_cast<std::uint16_t*>(dst);
  for (std::int64_t h = 0; h < s.Hp; h += 16)
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + h),
                       load16_bf16(static_cast<const char*>(s.src), s.dtype, h, s.H, 1.0f));
}

// 8x8 transpose of fp32.
void transpose8x8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  __m256 u[8];
  for (int g = 0; g < 2; ++g) {
    u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xee);
    u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xee);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

// K panels [Hp][32]: per 8 keys and 8 h, load and transpose.
void pack_k(void* dst, const PackSource& s) {
  auto* d = static_cast<float*>(dst);
  const std::int64_t npad = padded_keys(s.n);
  for (std::int64_t j0 = 0; j0 < npad; j0 += 8) {
    float* panel = d + (j0 / kPanelKeys) * s.Hp * kPanelKeys + j0 % kPanelKeys;
    for (std::int64_t h0 = 0; h0 < s.Hp; h0 += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i)
        r[i] = j0 + i < s.n ? load8_operand(key_row(s, j0 + i), s, h0) : _mm256_setzero_ps();
      transpose8x8(r);
      for (int i = 0; i < 8; ++i) _mm256_store_ps(panel + (h0 + i) * kPanelKeys, r[i]);
    }
  }
}

void pack_v(void* dst, const PackSource& s) {
  auto* d = static_cast<float*>(dst);
  const std::int64_t npad = padded_keys(s.n);
  for (std::int64_t j = 0; j < npad; ++j) {
    const bool valid = j < s.n;
    const void* row = valid ? key_row(s, j) : nullptr;
    for (std::int64_t h0 = 0; h0 < s.Hp; h0 += 8) {
      float* out = d + (h0 / kHTile) * npad * kHTile + j * kHTile + h0 % kHTile;
      _mm256_store_ps(out, valid ? load8_operand(row, s, h0) : _mm256_setzero_ps());
    }
  }
}

}  // namespace

const FlashKernels& avx2_decode_kernels() {
  static const FlashKernels k{.name = "avx2 (decode)",
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
                              .decode_qk_rows = avx2_decode_qk_rows,
                              .decode_pv_rows = avx2_decode_pv_rows,
                              .decode_rows_to_bf16 = avx2_decode_rows_to_bf16,
                              .softmax_grad_pack = nullptr,
                              .int8_on_integers = true,
                              .decode_overlap_rows = 0,
                              .decode_row_pieces = true};
  return k;
}

const FlashKernels& avx2_kernels() {
  static const FlashKernels k{.name = "avx2",
                              .operand_bytes = 4,
                              .mr = kMR,
                              .qk_tile = qk_tile_6x32,
                              .pv_tile = pv_tile_6x32,
                              .softmax_tile = softmax_tile,
                              .exp_n = exp_n,
                              .softcap_n = softcap_n,
                              .pack_q_row = pack_q_row,
                              .pack_k = pack_k,
                              .pack_v = pack_v};
  return k;
}

}  // namespace flashgqa
