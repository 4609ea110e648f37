// The avx2 decode QK kernel (contract in microkernels.hpp; design in avx2_decode_common.hpp).
//   decode_qk_rows: the Q rows are split once per call into fp32 halves (split_q_rows; rows wider
//     than kSplitMaxHp split each chunk as they use it: the same values). Rows go in blocks of RB = 8,
//     4, 2, 1; per block and per 8 / RB keys, 8 accumulators (one per (row, key)) take, for each chunk
//     of 16 h, fma(q even, k even, fma(q odd, k odd, acc)), chunk by chunk across the keys (whose rows
//     lie side by side); then an 8x8 transpose-add turns them into 8 logits ((l0 + l1) + (l2 + l3)) +
//     ((l4 + l5) + (l6 + l7)) of each accumulator's lanes: one fixed order whatever the slot). The
//     fast path (bf16 rows, or int8 rows in the products form, Hp <= kSplitMaxHp: the ceil(H / 16)
//     chunks that hold a value of the row, the last one read masked where H is not a multiple of 16,
//     every size a constant at H = 64, 96, 128, 256; whole groups of 8 keys); f16 and f32 rows up to
//     H = 256 take it on bf16 copies of 32 keys at a time (qk_rows_converted). The generic path (any
//     dtype and H, the last partial group, the zero keys up to round_up(n, 16)) converts and masks
//     chunk by chunk over Hp. All give the same bits.
//   int8 rows take the integers form on vpmaddwd (decode_qk_rows_i8 below) where H <= 256 and the Q
//     rows are finite, the products form above otherwise.
#include "kernels/avx2_decode_common.hpp"

namespace flashgqa {
namespace {

using namespace decode_avx2;

constexpr int kQkAcc = 8;                 // accumulators per transpose-add
constexpr std::int64_t kSplitMaxHp = 256;  // Q rows split once per call up to this width

// Where a call's Q rows lie once split (SplitQ) or quantized (the integers form): a call of 8 rows (one
// block whose Q operands of a chunk are 8 rows') lays them kSplitMaxHp apart, a constant, so that each
// operand is one address plus a constant; with Hp, a run-time stride, GCC 12 kept a pointer per row on
// the stack and rebuilt them chunk by chunk (8-row Q.K 1.13x slower in L2, session 35). Fewer rows lay
// them Hp apart: there the constant made Q.K 1.1x slower (4 rows, GCC then interleaved the chunks).
constexpr bool fixed_split(int rows) { return rows == kDecodeMaxRows; }
inline std::int64_t split_ld(int rows, std::int64_t Hp) { return fixed_split(rows) ? kSplitMaxHp : Hp; }

// Q rows split once: chunk c of row r is its 8 odd elements then its 8 even ones (fp32), at
// q + r ld + 16 c, ld = split_ld (kFixed: the constant).
template <bool kFixed>
struct SplitQ {
  const float* q;
  std::int64_t run_ld;  // ld where not kFixed
  std::int64_t ld() const { return kFixed ? kSplitMaxHp : run_ld; }
  // The same rows, their address hidden from the compiler (no load through it moves above this).
  SplitQ opaque() const {
    SplitQ x = *this;
    __asm__("" : "+r"(x.q));
    return x;
  }
  Halves chunk(int r, int c) const {
    const float* x = q + r * ld() + kChunk * c;
    return {_mm256_load_ps(x + 8), _mm256_load_ps(x)};
  }
};

// The split Q rows of a call of R rows (with_rows).
template <int R>
using SplitQFor = SplitQ<fixed_split(R)>;

// Q rows as pack_q_row writes them (bf16 words), split as they are used.
struct WordQ {
  const std::uint16_t* q;
  std::int64_t ld;
  WordQ opaque() const {
    WordQ x = *this;
    __asm__("" : "+r"(x.q));
    return x;
  }
  Halves chunk(int r, int c) const {
    return split(_mm256_load_si256(reinterpret_cast<const __m256i*>(q + r * ld + kChunk * c)));
  }
};

inline void split_q_rows(float* qs, const DecodeQk& t) {
  for (int r = 0; r < t.rows; ++r)
    for (std::int64_t c = 0; c < t.Hp / kChunk; ++c) {
      const Halves h =
          split(_mm256_load_si256(reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(t.q) + r * t.ldq + kChunk * c)));
      _mm256_store_ps(qs + r * split_ld(t.rows, t.Hp) + kChunk * c, h.odd);
      _mm256_store_ps(qs + r * split_ld(t.rows, t.Hp) + kChunk * c + 8, h.even);
    }
}

// The rows a call reads after its own (DecodeQk::k_ahead): keys(j, count) sends the rows of keys
// [j, j + count) there to L2 (nothing where there are none).
struct RowsAhead {
  const char* at = nullptr;  // key 0's row
  std::int64_t ld_bytes = 0, row_bytes = 0;
  void keys(std::int64_t j, int count) const {
    if (at != nullptr) prefetch_rows_l2(at + j * ld_bytes, ld_bytes, row_bytes, count);
  }
};

inline RowsAhead rows_ahead(const DecodeQk& t) {
  return {static_cast<const char*>(t.k_ahead), t.ldk * elem_bytes(t.k_dtype), t.H * elem_bytes(t.k_dtype)};
}

// Lane i = the sum of the lanes of v[i]: ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
inline __m256 transpose_add8(const __m256 (&v)[kQkAcc]) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  // a: v0..v3's sums of lanes 0..3, then of lanes 4..7; b likewise for v4..v7.
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

// Lane r KG + j of v (KG = 8 / RB) to s[r lds + j]: the RB x KG logits of one transpose-add.
template <int RB>
inline __attribute__((always_inline)) void store_logits(float* s, std::int64_t lds, __m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  if constexpr (RB == 1) {
    _mm256_storeu_ps(s, v);
  } else if constexpr (RB == 2) {
    _mm_storeu_ps(s, lo);
    _mm_storeu_ps(s + lds, hi);
  } else if constexpr (RB == 4) {
    _mm_storel_pi(reinterpret_cast<__m64*>(s), lo);
    _mm_storeh_pi(reinterpret_cast<__m64*>(s + lds), lo);
    _mm_storel_pi(reinterpret_cast<__m64*>(s + 2 * lds), hi);
    _mm_storeh_pi(reinterpret_cast<__m64*>(s + 3 * lds), hi);
  } else {
    static_assert(RB == 8);
    alignas(32) float x[8];
    _mm256_store_ps(x, v);
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) s[r * lds] = x[r];
  }
}

// S[r0 + r][j0 .. j0 + KG) for RB rows, KG = 8 / RB keys: keys j0 + j with j < nj are read, nc chunks
// each (kNc when it is not 0: the fast path, its chunk loop unrolled); the others are 0. Chunk by chunk
// across the KG keys (their rows lie side by side), so each Q chunk loaded serves every key: with RB <= 2
// the block's Q chunks stay in registers while the keys come one by one, with RB >= 4 the keys' K
// chunks do while the rows come one by one (Q as memory operands once per FMA pair was bound by the
// loads: 18.7 ns per key at 4 rows, H = 128).
template <int RB, int kNc, typename Q, typename Rows>
inline __attribute__((always_inline)) void qk_block(const DecodeQk& t, const Q& q, const Rows& k, int r0,
                                                    std::int64_t j0, int nj, int nc) {
  constexpr int KG = kQkAcc / RB;
  __m256 acc[kQkAcc];
#pragma GCC unroll 8
  for (int i = 0; i < kQkAcc; ++i) acc[i] = _mm256_setzero_ps();
  const auto mac = [&acc](int r, int j, const Halves& qc, const Halves& kc) __attribute__((always_inline)) {
    acc[r * KG + j] = _mm256_fmadd_ps(qc.even, kc.even, _mm256_fmadd_ps(qc.odd, kc.odd, acc[r * KG + j]));
  };
  const auto chunk = [&](int c) __attribute__((always_inline)) {
    // The Q chunks are loaded here, not earlier: GCC 12 otherwise hoists the loads of all chunks out
    // of the loop and spills them (50 ns per key at 4 rows, H = 128); they are L1 loads either way.
    const Q qh = q.opaque();
    if constexpr (RB <= 2) {
      Halves qc[RB];
#pragma GCC unroll 2
      for (int r = 0; r < RB; ++r) qc[r] = qh.chunk(r0 + r, c);
#pragma GCC unroll 8
      for (int j = 0; j < KG; ++j) {
        if (j >= nj) break;
        const Halves kc = k.chunk(j0 + j, c);
#pragma GCC unroll 2
        for (int r = 0; r < RB; ++r) mac(r, j, qc[r], kc);
      }
    } else {
      Halves kc[KG];
#pragma GCC unroll 2
      for (int j = 0; j < KG; ++j) kc[j] = j < nj ? k.chunk(j0 + j, c) : Halves{_mm256_setzero_ps(), _mm256_setzero_ps()};
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r) {
        const Halves qc = qh.chunk(r0 + r, c);
#pragma GCC unroll 2
        for (int j = 0; j < KG; ++j)
          if (j < nj) mac(r, j, qc, kc[j]);
      }
    }
  };
  if (nj > 0) {
    if constexpr (kNc > 0) {
#pragma GCC unroll 16
      for (int c = 0; c < kNc; ++c) chunk(c);
    } else {
      for (int c = 0; c < nc; ++c) chunk(c);
    }
  }
  store_logits<RB>(t.s + r0 * t.lds + j0, t.lds, _mm256_mul_ps(transpose_add8(acc), _mm256_set1_ps(t.scale)));
}

// S[r][j0 .. j0 + 8) for the R rows in blocks of 8, 4, 2, 1; keys j0 + j with j < nj are read.
template <int R, int kNc, typename Q, typename Rows>
inline __attribute__((always_inline)) void qk_group(const DecodeQk& t, const Q& q, const Rows& k, std::int64_t j0,
                                                    int nj, int nc) {
  row_blocks<R, 8>([&](auto rb, int r0) __attribute__((always_inline)) {
    constexpr int RB = decltype(rb)::value, KG = kQkAcc / RB;
#pragma GCC unroll 8
    for (int jj = 0; jj < kQkAcc; jj += KG) qk_block<RB, kNc>(t, q, k, r0, j0 + jj, nj - jj, nc);
  });
}

// The generic path: S[r][j] for j in [j_begin, round_up(n, 16)) (j_begin a multiple of 8), any dtype
// and H: Hp / 16 chunks per key (Q is zero past H, the loads zero K there).
template <int R, typename Q>
void qk_rows(const DecodeQk& t, const Q& q, std::int64_t j_begin) {
  const AnyRows k{static_cast<const char*>(t.k), t.ldk * elem_bytes(t.k_dtype), t.k_dtype, t.H, t.k_scale, t.ld_scale};
  const int nc = static_cast<int>(t.Hp / kChunk);
  const std::int64_t end = (t.n + 15) / 16 * 16;
  const RowsAhead ahead = rows_ahead(t);
  for (std::int64_t j0 = j_begin; j0 < end; j0 += kQkAcc) {
    ahead.keys(j0, kQkAcc);
    qk_group<R, 0>(t, q, k, j0, keys_in(t.n - j0, kQkAcc), nc);
  }
}

// The fast path for bf16 or int8 rows of HC chunks (with_fast_chunks; HC = 0: ceil(H / 16) of them, a
// count at run time; kTail: the last one partial): whole groups of 8 keys over the chunks that hold a
// value of the row, then the generic path for the rest. The same sums in the same order (the generic
// path's chunks past them add Q's zeros): the same bits.
template <int R, int HC, typename Q, typename Rows>
void qk_rows_fast(const DecodeQk& t, const Q& q, const Rows& k) {
  const std::int64_t full = t.n / kQkAcc * kQkAcc;
  const int nc = chunks_of<HC>(t.H);
  const RowsAhead ahead = rows_ahead(t);
  for (std::int64_t j0 = 0; j0 < full; j0 += kQkAcc) {
    ahead.keys(j0, kQkAcc);
    qk_group<R, HC>(t, q, k, j0, kQkAcc, nc);
  }
  qk_rows<R>(t, q, full);
}

template <int R, int HC, bool kTail, typename Q>
void qk_rows_fast_any(const DecodeQk& t, const Q& q) {
  const char* k0 = static_cast<const char*>(t.k);
  if (t.k_dtype == DType::i8) return qk_rows_fast<R, HC>(t, q, Int8Rows<kTail>{k0, t.ldk, t.k_scale, t.ld_scale, t.H});
  qk_rows_fast<R, HC>(t, q, Bf16Rows<kTail>{k0, t.ldk * 2, t.H});
}

template <int R, typename Q>
void qk_rows_any(const DecodeQk& t, const Q& q) {
  const bool fast = t.k_dtype == DType::bf16 || t.k_dtype == DType::i8;
  if (!(fast && with_fast_chunks(t.H, [&](auto hc, auto tail) {
          qk_rows_fast_any<R, decltype(hc)::value, decltype(tail)::value>(t, q);
        })))
    qk_rows<R>(t, q, 0);
}

// f(call) for a call in pieces (DecodeQk::k_pieces) as one call per piece, on its 16 keys' rows where
// they lie (the same logits: each is its own key's; the last piece's zeros up to round_up(n, 16)); f(t)
// for rows together. So the kernels' loops are those of rows together: with the piece checks and the
// prefetch inside them, GCC's combiner took 2.6x this file's compile time (session 34). The hardware
// prefetchers do not cross from one piece into the next, which lies anywhere: each piece's call takes
// the piece kAheadPieces on as its k_ahead, whose rows go to L2 a group of 8 keys at a time as the
// call reads its own (qk_rows_fast, qk_rows, qk_rows_i8), and as each piece starts the first line of
// the piece after that goes to L2, which starts its page walk early. Every line of the next piece at
// each piece's start instead (step_rows_ahead, as the AVX-512 kernels do) read page 16 1.06-1.07x
// slower at T = 1 (docs/performance.md, session 39). The prefetch stays outside qk_group: inside its
// loop over row blocks (a block's keys at a time) GCC 12 allocated the dense loop's registers otherwise
// and dense T = 1 ran 1.15x slower from DRAM, though no slower in L2.
template <typename F>
void for_each_piece_call(const DecodeQk& t, F f) {
  if (t.k_pieces == nullptr) return f(t);
  for (std::int64_t j0 = 0; j0 < t.n; j0 += kDecodePieceKeys) {
    DecodeQk piece = t;
    piece.s = t.s + j0;
    const std::int64_t i = j0 / kDecodePieceKeys;
    piece.k = t.k_pieces[i];
    piece.k_ahead = (i + kAheadPieces) * kDecodePieceKeys < t.n ? t.k_pieces[i + kAheadPieces] : nullptr;
    prefetch_next_piece(t.k_pieces, t.n, j0, kAheadPieces + 1);
    piece.n = t.n - j0 < kDecodePieceKeys ? t.n - j0 : kDecodePieceKeys;
    if (t.k_scale != nullptr) piece.k_scale = t.k_scale + j0 * t.ld_scale;
    piece.k_pieces = nullptr;
    f(piece);
  }
}

// int8 K in the integers form (contract in microkernels.hpp): each Q row quantized once per call to
// int16 against its largest |q| (quantize_q_rows), K chunks sign-extended to int16 as they are loaded,
// vpmaddwd into int32 accumulators (exact: |sum| <= 256 * 32767 * 128 < 2^31), added as integers by
// the transpose-add, then each logit is float(sum) times its row's factor times its key's scale: the
// bits of the avx512bf16 set's vpdpwssd kernels (decode_kernels_test.cpp checks them where both run).
// Q rows [0, rows) of t (pack_q_row's bf16) as int16, split_ld apart, and each row's factor
// scale * max|q| / 32767. False (nothing usable written) when a row holds an infinity or a NaN, or when
// its largest |q| is below kI16MinQ: the caller then takes the products form, whose sums carry them.
inline bool quantize_q_rows(std::int16_t* qi, float* factor, const DecodeQk& t) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int r = 0; r < t.rows; ++r) {
    const auto* row = static_cast<const std::uint16_t*>(t.q) + r * t.ldq;
    __m256 mx = _mm256_setzero_ps();
    for (std::int64_t h = 0; h < t.Hp; h += kChunk) {
      const Halves x = split(_mm256_load_si256(reinterpret_cast<const __m256i*>(row + h)));
      const __m256i bad = _mm256_or_si256(inf_or_nan(x.even), inf_or_nan(x.odd));
      if (!_mm256_testz_si256(bad, bad)) return false;  // NaN, +-inf
      mx = _mm256_max_ps(mx, _mm256_max_ps(_mm256_and_ps(x.even, magnitude), _mm256_and_ps(x.odd, magnitude)));
    }
    const float m = hmax(mx);
    if (m > 0.0f && m < kI16MinQ) return false;  // 32767 / m could overflow
    const __m256 to_int = _mm256_set1_ps(m > 0.0f ? 32767.0f / m : 0.0f);
    factor[r] = t.scale * (m / 32767.0f);
    for (std::int64_t h = 0; h < t.Hp; h += kChunk) {  // rounded to nearest even (MXCSR's default)
      const __m256 lo = load8_f32(row, DType::bf16, h, t.Hp), hi = load8_f32(row, DType::bf16, h + 8, t.Hp);
      const __m256i packed = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(lo, to_int)),
                                                _mm256_cvtps_epi32(_mm256_mul_ps(hi, to_int)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(qi + r * split_ld(t.rows, t.Hp) + h),
                         _mm256_permute4x64_epi64(packed, 0xd8));
    }
  }
  return true;
}

// Lane l of a transpose-add's logits is row l / KG's and key l % KG's (store_logits). The rows' factors
// by lane: factor[l / KG] (factor: 8 floats readable).
template <int KG>
inline __attribute__((always_inline)) __m256 lane_factors(const float* factor) {
  const __m256i row = _mm256_setr_epi32(0 / KG, 1 / KG, 2 / KG, 3 / KG, 4 / KG, 5 / KG, 6 / KG, 7 / KG);
  return _mm256_permutevar8x32_ps(_mm256_loadu_ps(factor), row);
}

// The keys' scales by lane: key j0 + l % KG's, 0 for keys j >= nj (not read). Vector loads where the
// KG scales lie together and all are there, as quantize_kv and the gathered pieces lay them out.
template <int KG>
inline __attribute__((always_inline)) __m256 lane_scales(const DecodeQk& t, std::int64_t j0, int nj) {
  const float* s = t.k_scale + j0 * t.ld_scale;
  if (nj >= KG && t.ld_scale == 1) {
    if constexpr (KG == 8) {
      return _mm256_loadu_ps(s);
    } else if constexpr (KG == 4) {
      return _mm256_broadcast_ps(reinterpret_cast<const __m128*>(s));
    } else if constexpr (KG == 2) {  // the two scales as one 64-bit lane, broadcast
      std::int64_t pair;
      __builtin_memcpy(&pair, s, sizeof pair);
      return _mm256_castsi256_ps(_mm256_set1_epi64x(pair));
    } else {
      return _mm256_broadcast_ss(s);
    }
  }
  alignas(32) float keys[kQkAcc];
#pragma GCC unroll 8
  for (int l = 0; l < kQkAcc; ++l) keys[l] = l % KG < nj ? s[(l % KG) * t.ld_scale] : 0.0f;
  return _mm256_load_ps(keys);
}

// S[r0 + r][j0 .. j0 + KG) for RB rows, KG = 8 / RB keys (keys j >= nj: 0), kNc chunks per key (0: nc,
// counted at run time: ceil(H / 16)), keys one by one with the block's Q chunk per row from L1 (the
// quantized rows ldq apart).
template <int RB, int kNc, bool kWhole>
inline __attribute__((always_inline)) void qk_block_i8(const DecodeQk& t, const std::int16_t* qi, std::int64_t ldq,
                                                       const float* factor, int r0, std::int64_t j0, int nj, int nc) {
  constexpr int KG = kQkAcc / RB;
  const char* k = static_cast<const char*>(t.k);
  __m256i acc[kQkAcc];
#pragma GCC unroll 8
  for (int i = 0; i < kQkAcc; ++i) acc[i] = _mm256_setzero_si256();
  const auto chunk = [&](int c) __attribute__((always_inline)) {
    const std::int16_t* q = qi;
    __asm__("" : "+r"(q));  // no Q load moves above this (see qk_block)
#pragma GCC unroll 8
    for (int j = 0; j < KG; ++j) {
      if (j >= nj) break;
      const __m256i kc = load16_i8<kWhole>(k + (j0 + j) * t.ldk, std::int64_t{kChunk} * c, t.H);
#pragma GCC unroll 8
      for (int r = 0; r < RB; ++r)
        acc[r * KG + j] = _mm256_add_epi32(
            acc[r * KG + j],
            _mm256_madd_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(q + (r0 + r) * ldq + kChunk * c)), kc));
    }
    // The sums chunk by chunk, in registers: integer adds reassociate, and without this GCC 12 forms
    // every product of the block first and keeps them on the stack (2 stores and loads a vpmaddwd;
    // Q.K 1.2-1.4x slower in L2 at 3 to 8 rows, session 35).
#pragma GCC unroll 8
    for (int i = 0; i < kQkAcc; ++i) __asm__("" : "+x"(acc[i]));
  };
  if constexpr (kNc > 0) {
#pragma GCC unroll 16
    for (int c = 0; c < kNc; ++c) chunk(c);
  } else {
    for (int c = 0; c < nc; ++c) chunk(c);
  }
  // Integer transpose-add (exact in any order), then the logits' two products.
  const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[0], acc[1]), _mm256_hadd_epi32(acc[2], acc[3]));
  const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[4], acc[5]), _mm256_hadd_epi32(acc[6], acc[7]));
  const __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
  store_logits<RB>(t.s + r0 * t.lds + j0, t.lds,
                   _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sums), lane_factors<KG>(factor + r0)),
                                 lane_scales<KG>(t, j0, nj)));
}

// S[r][j] for all j < round_up(n, 16), over the HC chunks that hold a value of the row (with_fast_chunks;
// HC = 0: ceil(H / 16), a count at run time; kTail: the last one partial): whole groups of 8 keys
// whose chunks are all whole (not kTail), then the rest (the last partial group, the zero keys, every
// group where kTail) masked. The int32 sums are exact, so the chunks past H (Q's zeros) would change
// nothing.
template <int R, int HC, bool kTail>
void qk_rows_i8(const DecodeQk& t, const std::int16_t* qi, const float* factor) {
  const RowsAhead ahead = rows_ahead(t);
  const auto group = [&](std::int64_t j0, int nj, auto whole, auto kc, int nc) __attribute__((always_inline)) {
    ahead.keys(j0, kQkAcc);  // (as qk_rows_fast)
    row_blocks<R, 8>([&](auto rb, int r0) __attribute__((always_inline)) {
      constexpr int RB = decltype(rb)::value, KG = kQkAcc / RB;
#pragma GCC unroll 8
      for (int jj = 0; jj < kQkAcc; jj += KG)
        qk_block_i8<RB, decltype(kc)::value, decltype(whole)::value>(t, qi, split_ld(R, t.Hp), factor, r0, j0 + jj,
                                                                      nj - jj, nc);
    });
  };
  const int nc = chunks_of<HC>(t.H);
  std::int64_t j0 = 0;
  // With a partial last chunk every group goes as the last one: its whole groups with the key count a
  // constant took 1.3x the time (H = 72 on Zen 3, docs/performance.md, session 17).
  if constexpr (!kTail)
    for (; j0 + kQkAcc <= t.n; j0 += kQkAcc) {
      if (j0 % 16 == 0 && j0 + kDecodeInt8AheadKeys + 16 <= t.n)  // the rows 32 keys on, 16 at a time
        prefetch_rows_l2(static_cast<const char*>(t.k) + (j0 + kDecodeInt8AheadKeys) * t.ldk, t.ldk, t.H, 16);
      group(j0, kQkAcc, std::true_type{}, std::integral_constant<int, HC>{}, nc);
    }
  for (const std::int64_t end = (t.n + 15) / 16 * 16; j0 < end; j0 += kQkAcc)
    group(j0, keys_in(t.n - j0, kQkAcc), std::false_type{}, std::integral_constant<int, 0>{}, nc);
}

// decode_qk_rows for int8 K in the integers form where H <= kSplitMaxHp and the Q rows are finite;
// false (nothing done) otherwise.
inline bool decode_qk_rows_i8(const DecodeQk& t) {
  if (t.k_dtype != DType::i8 || t.Hp > kSplitMaxHp || t.H <= 0) return false;
  alignas(32) std::int16_t qi[kDecodeMaxRows * kSplitMaxHp];
  float factor[2 * kDecodeMaxRows] = {};  // rows' factors, then room for lane_factors' 8-float loads
  if (!quantize_q_rows(qi, factor, t)) return false;
  for_each_piece_call(t, [&](const DecodeQk& u) {
    with_rows<kDecodeMaxRows>(u.rows, [&](auto r) {
      constexpr int R = decltype(r)::value;
      with_fast_chunks(u.H, [&](auto hc, auto tail) {
        qk_rows_i8<R, decltype(hc)::value, decltype(tail)::value>(u, qi, factor);
      });
    });
  });
  return true;
}

// S for t's rows (with_rows) on the bf16 and generic paths, the split Q rows at qs.
inline void qk_rows_split(const DecodeQk& t, const float* qs) {
  with_rows<kDecodeMaxRows>(t.rows, [&](auto r) {
    constexpr int R = decltype(r)::value;
    qk_rows_any<R>(t, SplitQFor<R>{qs, t.Hp});
  });
}

// f16 and f32 rows (converts_rows): kConvertKeys keys at a time as bf16 words, then the bf16 path.
// Pieces start at multiples of 32 keys, and each logit is its own key's: the bits of one call.
void qk_rows_converted(const DecodeQk& t, const float* qs) {
  alignas(32) std::uint16_t rows[kConvertKeys * kConvertMaxH];
  for (std::int64_t j0 = 0; j0 < t.n; j0 += kConvertKeys) {
    const std::int64_t n = t.n - j0 < kConvertKeys ? t.n - j0 : kConvertKeys;
    rows_to_bf16(rows, converted_ld(t.H), t.k, t.k_dtype, t.ldk, j0, n, t.H);
    DecodeQk piece = t;
    piece.s = t.s + j0;
    piece.k = rows;
    piece.k_dtype = DType::bf16;
    piece.ldk = converted_ld(t.H);
    piece.n = n;
    qk_rows_split(piece, qs);
  }
}

}  // namespace

void avx2_decode_qk_rows(const DecodeQk& t) {
  if (decode_qk_rows_i8(t)) return;
  if (t.Hp > kSplitMaxHp) {  // wider rows: split as used, on the generic path (the only one they take)
    const WordQ q{static_cast<const std::uint16_t*>(t.q), t.ldq};
    return for_each_piece_call(t, [&](const DecodeQk& u) {
      with_rows<kDecodeMaxRows>(u.rows, [&](auto r) { qk_rows<decltype(r)::value>(u, q, 0); });
    });
  }
  alignas(32) float qs[kDecodeMaxRows * kSplitMaxHp];
  split_q_rows(qs, t);
  if (converts_rows(t.k_dtype, t.H, t.Hp)) return qk_rows_converted(t, qs);  // (never in pieces)
  for_each_piece_call(t, [&](const DecodeQk& u) { qk_rows_split(u, qs); });
}

}  // namespace flashgqa
