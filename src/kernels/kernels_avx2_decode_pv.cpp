// The avx2 decode PV kernel (contract in microkernels.hpp; design in avx2_decode_common.hpp).
//   decode_pv_rows, float rows: O's rows are rescaled, then each of their 16-column chunks is kept as
//     its 8 even columns then its 8 odd ones for the call (permute_o), which is how a V chunk's halves
//     come. Per group of keys, the rows' P weights are widened to fp32 once (weights); then rows go
//     in blocks of RB = 4, 2, 1 and columns in passes of NC = 1, 2, 4 chunks (2 RB NC = 8
//     accumulators, loaded from O and stored back once per group and pass), and per key each row's
//     weight, broadcast, multiplies the key's V chunk into the row's accumulators: each O element
//     takes its keys one by one in increasing j. The fast path (bf16 rows: the ceil(H / 16) chunks
//     that hold a value of the row, the last one read masked where H is not a multiple of 16, every
//     size a constant at H = 64, 96, 128, 256; groups of about 8 KiB of V whose keys are all present,
//     the last any multiple of 16 keys) first touches the group's rows line by
//     line in address order (one load per line), so the passes, which read the rows strided, find them
//     in L1: without it the hardware prefetchers did not keep up (a prefetch of the group took the
//     bench's T = 1 bf16 row from 50 to 35 ms on Zen 3; loads measured the same). The next group's
//     rows are prefetched meanwhile, a share before each pass (NextRows), so the touch finds them
//     there: as one burst per group the prefetches held up the group's FMAs (1.03-1.2x slower, on
//     Zen 4 with AVX-512 hidden), spread over the passes T = 1 ran 1.08x and T = 2 1.14x faster
//     (docs/performance.md, session 37). Dense rows go to L1 (to L2: T = 1 the same, T = 4 1.02x
//     slower); rows in pieces (the next group's two pieces) to L2 (to L1: 1.1x slower), with the
//     first line of the piece kAheadPieces + 1 on touched as each piece starts, which starts its page
//     walk early. Every line of the next piece as each piece starts (step_rows_ahead), as before,
//     read page 16 1.06-1.07x slower (session 39). f16 and f32 rows up
//     to H = 256 take it on bf16 copies of 32 keys at a time (pv_rows_converted). The generic path
//     (H > 256 for f16 and f32, the keys past the last whole 16; groups of 32 keys) converts and
//     masks chunk by chunk over Hp. All give the same bits.
//   int8 rows: the integers form on vpmaddwd (pv_rows_i16 below).
#include <algorithm>

#include "kernels/avx2_decode_common.hpp"

namespace flashgqa {
namespace {

using namespace decode_avx2;

constexpr int kPvGroup = 32;                 // keys per group on the generic path
constexpr int kPvFastGroupBytes = 8192;      // of bf16 V per group on the fast path (32 keys at H = 128)
constexpr int kPvMaxGroup = kPvFastGroupBytes / (2 * 64);  // the most keys of a group (H <= 64: clamped)

// One load of the byte at p, its value unused: a miss on its line that the hardware prefetchers see
// in order.
inline void touch(const char* p) {
  const char x = *p;
  __asm__ volatile("" ::"r"(x));
}

// Rows j0 .. j1 (row_bytes each, dense or in pieces) touched line by line in address order. In pieces,
// as each piece starts: with whole_next (the int8 path), every line of the next piece into L2 first
// (step_rows_ahead: the hardware prefetchers do not cross into it); without (the bf16 fast path, whose
// NextRows fetch the pieces ahead), the first line of the piece kAheadPieces + 1 on, which starts its
// page walk early. One plain loop per run of keys (dense: one run; in pieces, each piece's): a loop
// over every key, with the piece checks per key and the line loop unrolled over a run-time count, ran
// ~26 instructions a key of int8 rows.
inline void touch_rows(const KeyRows& rows, std::int64_t row_bytes, std::int64_t j0, std::int64_t j1, std::int64_t n,
                       bool whole_next) {
  for (std::int64_t j = j0; j < j1;) {
    const std::int64_t run_end =
        rows.pieces == nullptr ? j1 : std::min(j1, (j / kDecodePieceKeys + 1) * kDecodePieceKeys);
    const char* row = whole_next ? step_rows_ahead(rows.base, rows.pieces, rows.ld_bytes, row_bytes, j, n)
                                 : step_rows(rows.base, rows.pieces, rows.ld_bytes, j, n, true, kAheadPieces + 1);
    for (; j < run_end; ++j, row += rows.ld_bytes)
      for (std::int64_t b = 0; b < row_bytes; b += 64) touch(row + b);
  }
}

// Row blocks: 4, 2 or 1 rows; a block's column passes take 4 / RB chunks.
template <int RB>
constexpr int pass_chunks() {
  return 4 / RB;
}

// How many passes pv_group makes over a group of R rows and nchunks chunks.
template <int R>
inline int pv_passes(int nchunks) {
  int passes = 0;
  row_blocks<R>([&](auto rb, int) {
    constexpr int NC = pass_chunks<decltype(rb)::value>();
    passes += nchunks / NC + nchunks % NC;
  });
  return passes;
}

// The next group's rows, a share before each of this group's passes (none: left = 0): dense, into
// L1; in pieces, into L2 (see the top).
struct NextRows {
  KeyRows at{nullptr, nullptr, 0};  // where the rows lie
  std::int64_t j = 0;               // the first key not yet fetched
  std::int64_t row_bytes = 0;
  int left = 0;      // rows not yet fetched
  int per_pass = 0;  // rows fetched before each pass
  void before_pass() {
    if (left == 0) return;
    int count = left < per_pass ? left : per_pass;
    left -= count;
    if (at.pieces == nullptr) {
      prefetch_row_lines<prefetch_l1>(at.row(j), at.ld_bytes, row_bytes, count);
      j += count;
      return;
    }
    while (count > 0) {  // piece by piece
      const int run = std::min(count, static_cast<int>(kDecodePieceKeys - j % kDecodePieceKeys));
      prefetch_rows_l2(at.row(j), at.ld_bytes, row_bytes, run);
      j += run;
      count -= run;
    }
  }
};

// The P weights of keys [j0, j1) of rows [0, R) as fp32 (exact), w[r][j - j0].
template <int R>
inline void weights(const DecodePv& t, std::int64_t j0, std::int64_t j1, float (&w)[kDecodeMaxRows][kPvMaxGroup]) {
  // Whole vectors of 8 (zero past j1): at most kPvMaxGroup floats from w[r][0], as groups hold at most
  // that many keys (a multiple of 8).
  for (int r = 0; r < R; ++r)
    for (std::int64_t j = j0; j < j1; j += 8)
      _mm256_storeu_ps(&w[r][j - j0], load8_f32(static_cast<const std::uint16_t*>(t.p) + r * t.ldp, DType::bf16, j, j1));
}

// O[r0 + r][16 c0 .. 16 (c0 + NC)) (split chunks) += sum_{j0 <= j < j1} w[r0 + r][j - j0] V[j][...], key
// by key; keys j >= n are zero rows (not read). Key j's row: v.at(j, at.row(j))'s first (in pieces, each
// piece's keys in one run).
template <int RB, int NC, typename Rows>
inline __attribute__((always_inline)) void pv_pass(const DecodePv& t, const float (&w)[kDecodeMaxRows][kPvMaxGroup],
                                                   int r0, int c0, std::int64_t j0, std::int64_t j1, const Rows& v,
                                                   const KeyRows& at) {
  float* o = t.o + r0 * t.ldo + std::int64_t{kChunk} * c0;
  __m256 acc[RB][2 * NC];
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 8
    for (int i = 0; i < 2 * NC; ++i) acc[r][i] = _mm256_load_ps(o + r * t.ldo + 8 * i);
  const std::int64_t read_end = j1 < t.n ? j1 : t.n;
  std::int64_t j = j0;
  while (j < read_end) {
    const std::int64_t run_end =
        at.pieces == nullptr ? read_end : std::min(read_end, (j / kDecodePieceKeys + 1) * kDecodePieceKeys);
    const Rows vr = v.at(j, at.row(j));
    for (std::int64_t i = 0; j < run_end; ++j, ++i) {
      __m256 x[RB];
#pragma GCC unroll 4
      for (int r = 0; r < RB; ++r) x[r] = _mm256_broadcast_ss(&w[r0 + r][j - j0]);
#pragma GCC unroll 4
      for (int c = 0; c < NC; ++c) {
        const Halves vc = vr.chunk(i, c0 + c);
#pragma GCC unroll 4
        for (int r = 0; r < RB; ++r) {
          acc[r][2 * c] = _mm256_fmadd_ps(x[r], vc.even, acc[r][2 * c]);
          acc[r][2 * c + 1] = _mm256_fmadd_ps(x[r], vc.odd, acc[r][2 * c + 1]);
        }
      }
    }
  }
  for (; j < j1; ++j) {  // zero rows: O + w * 0, as a zero row read would give
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) {
      const __m256 x = _mm256_broadcast_ss(&w[r0 + r][j - j0]);
#pragma GCC unroll 8
      for (int i = 0; i < 2 * NC; ++i) acc[r][i] = _mm256_fmadd_ps(x, _mm256_setzero_ps(), acc[r][i]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 8
    for (int i = 0; i < 2 * NC; ++i) _mm256_store_ps(o + r * t.ldo + 8 * i, acc[r][i]);
}

// Rows [0, R) in blocks of 4, 2, 1, each over chunks [0, nchunks) in passes of pass_chunks<RB>() (the
// last ones one chunk at a time where they do not divide nchunks).
template <int R, typename Rows>
inline __attribute__((always_inline)) void pv_group(const DecodePv& t, const float (&w)[kDecodeMaxRows][kPvMaxGroup],
                                                    std::int64_t j0, std::int64_t j1, int nchunks, const Rows& v,
                                                    const KeyRows& at, NextRows& next) {
  row_blocks<R>([&](auto rb, int r0) __attribute__((always_inline)) {
    constexpr int RB = decltype(rb)::value, NC = pass_chunks<RB>();
    int c0 = 0;
    for (; c0 + NC <= nchunks; c0 += NC) {
      next.before_pass();
      pv_pass<RB, NC>(t, w, r0, c0, j0, j1, v, at);
    }
    for (; c0 < nchunks; ++c0) {
      next.before_pass();
      pv_pass<RB, 1>(t, w, r0, c0, j0, j1, v, at);
    }
  });
}

// O's rows: each 16-column chunk in order <-> its 8 even columns, then its 8 odd ones (kSplit).
template <int R, bool kSplit>
void permute_o(const DecodePv& t) {
  for (int r = 0; r < R; ++r)
    for (std::int64_t h = 0; h < t.Hp; h += kChunk) {
      float* o = t.o + r * t.ldo + h;
      const __m256 a = _mm256_load_ps(o), b = _mm256_load_ps(o + 8);
      if constexpr (kSplit) {  // a = columns 0..7, b = 8..15
        _mm256_store_ps(o, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8)));
        _mm256_store_ps(o + 8, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8)));
      } else {  // a = the even columns, b = the odd ones
        const __m256 lo = _mm256_unpacklo_ps(a, b), hi = _mm256_unpackhi_ps(a, b);  // 0..3 | 8..11, 4..7 | 12..15
        _mm256_store_ps(o, _mm256_permute2f128_ps(lo, hi, 0x20));
        _mm256_store_ps(o + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
      }
    }
}

template <int R>
void rescale_o(const DecodePv& t) {
  for (int r = 0; r < R; ++r) {
    const __m256 c = _mm256_set1_ps(t.corr[r]);
    for (std::int64_t h = 0; h < t.Hp; h += 8)
      _mm256_store_ps(t.o + r * t.ldo + h, _mm256_mul_ps(_mm256_load_ps(t.o + r * t.ldo + h), c));
  }
}

// The generic path: keys [j_begin, nkeys) (j_begin even), any dtype and H, in groups of kPvGroup keys.
template <int R>
void pv_rows(const DecodePv& t, std::int64_t j_begin) {
  const AnyRows v{static_cast<const char*>(t.v), t.ldv * elem_bytes(t.v_dtype), t.v_dtype, t.H, t.v_scale, t.ld_scale};
  const KeyRows at{v.base, t.v_pieces, v.ld_bytes};
  alignas(32) float w[kDecodeMaxRows][kPvMaxGroup];
  for (std::int64_t j0 = j_begin; j0 < t.nkeys; j0 += kPvGroup) {
    const std::int64_t j1 = j0 + kPvGroup < t.nkeys ? j0 + kPvGroup : t.nkeys;
    weights<R>(t, j0, j1, w);
    NextRows none;
    pv_group<R>(t, w, j0, j1, static_cast<int>(t.Hp / kChunk), v, at, none);
  }
}

// The fast path for bf16 rows of HC chunks (with_fast_chunks; HC = 0: ceil(H / 16) of them, a count at
// run time; kTail: the last one partial): groups of about kPvFastGroupBytes of V (whole vectors of 8
// weights, 8 to 64 keys: 40 at H = 96) whose keys are all present (the last one any multiple of 16
// keys: a page's), over the chunks that hold a value of the row, then the generic path for the rest.
// Same sums in the same order as the generic path, so the same bits in O's columns below H (the
// generic path adds V's zeros past H to the columns up to Hp).
template <int R, int HC, bool kTail>
void pv_rows_fast(const DecodePv& t, const Bf16Rows<kTail>& v) {
  const int nc = chunks_of<HC>(t.H);
  const std::int64_t most = kPvFastGroupBytes / (2 * kChunk * nc) / 8 * 8;
  const std::int64_t group = most < 8 ? 8 : most > kPvMaxGroup ? kPvMaxGroup : most;
  alignas(32) float w[kDecodeMaxRows][kPvMaxGroup];
  const KeyRows at{v.base, t.v_pieces, v.ld_bytes};
  const std::int64_t full = (t.nkeys < t.n ? t.nkeys : t.n) / kChunk * kChunk;
  const int passes = pv_passes<R>(nc);  // each group's (NextRows' shares)
  for (std::int64_t j0 = 0; j0 < full; j0 += group) {
    const std::int64_t j1 = j0 + group < full ? j0 + group : full;  // the last group: a multiple of 16 keys
    touch_rows(at, 2 * t.H, j0, j1, t.n, false);  // the group in address order first (see the top)
    weights<R>(t, j0, j1, w);
    const int rows = static_cast<int>((j1 + group < full ? j1 + group : full) - j1);
    NextRows next{at, j1, 2 * t.H, rows, (rows + passes - 1) / passes};  // the next group's (see the top)
    if constexpr (HC > 0) pv_group<R>(t, w, j0, j1, HC, v, at, next);
    else pv_group<R>(t, w, j0, j1, nc, v, at, next);
  }
  pv_rows<R>(t, full);
}

// The bf16 fast path's widths, then the generic path (O already rescaled and split).
template <int R>
void pv_rows_bf16(const DecodePv& t) {
  const bool fast = t.v_dtype == DType::bf16;
  if (!(fast && with_fast_chunks(t.H, [&](auto hc, auto tail) {
          constexpr bool kTail = decltype(tail)::value;
          pv_rows_fast<R, decltype(hc)::value, kTail>(t, Bf16Rows<kTail>{static_cast<const char*>(t.v), t.ldv * 2, t.H});
        })))
    pv_rows<R>(t, 0);
}

// f16 and f32 rows (converts_rows): kConvertKeys keys at a time as bf16 words, then the bf16 path.
// Pieces start at multiples of 32 keys and each O element still takes its keys one by one in
// increasing j: the bits of one call.
template <int R>
void pv_rows_converted(const DecodePv& t) {
  alignas(32) std::uint16_t rows[kConvertKeys * kConvertMaxH];
  const std::int64_t read = t.nkeys < t.n ? t.nkeys : t.n;  // keys past it count as zero rows
  for (std::int64_t j0 = 0; j0 < t.nkeys; j0 += kConvertKeys) {
    const std::int64_t nkeys = t.nkeys - j0 < kConvertKeys ? t.nkeys - j0 : kConvertKeys;
    const std::int64_t n = keys_in(read - j0, static_cast<int>(nkeys));
    rows_to_bf16(rows, converted_ld(t.H), t.v, t.v_dtype, t.ldv, j0, n, t.H);
    DecodePv piece = t;
    piece.p = static_cast<const std::uint16_t*>(t.p) + j0;
    piece.v = rows;
    piece.v_dtype = DType::bf16;
    piece.ldv = converted_ld(t.H);
    piece.n = n;
    piece.nkeys = nkeys;
    piece.corr = nullptr;
    pv_rows_bf16<R>(piece);
  }
}

template <int R>
void pv_rows_any(const DecodePv& t) {
  if (t.corr) rescale_o<R>(t);
  permute_o<R, true>(t);
  if (converts_rows(t.v_dtype, t.H, t.Hp)) pv_rows_converted<R>(t);
  else pv_rows_bf16<R>(t);
  permute_o<R, false>(t);
}

// int8 V in the integers form (contract in microkernels.hpp): per row and group of 16 keys of the
// call, the weights w = P s are quantized to int16 against their largest |w|, W (i16_weights); per
// column chunk, pairs of keys' int8 rows are interleaved and sign-extended to int16 (i16_chunk),
// vpmaddwd with the row's weight pair (broadcast) into int32 sums, exact; then
// O = fma(W / 32767, float(sum), O). A group with a NaN or infinite w, or with 0 < W < 2^-100, adds
// fma(w, float(x), O) key by key instead. The bits of the avx512bf16 set's vpdpwssd kernel
// (decode_kernels_test.cpp checks them where both run).
constexpr int kI16Group = 16;
constexpr float kI16MinWeight = 0x1p-100f;

struct I16Weights {
  alignas(32) std::int16_t q[kDecodeMaxRows][kI16Group];  // the weights as int16
  alignas(32) float w[kDecodeMaxRows][kI16Group];         // as fp32 (for a group taken key by key)
  float f[kDecodeMaxRows];                                // W / 32767 (8 floats: stored as a vector)
  bool bad[kDecodeMaxRows];                               // key by key
  bool any_bad;                                           // some row bad
  int keys;                                               // keys read (the rest count as zero rows)
};

// The weights of keys [jg, jg + 16) for rows [0, R): w = P s (keys past those read: 0), W = max |w|,
// q = round(w (32767 / W)) (nearest even; 0 where w = 0). The rows' W / 32767 and 32767 / W are
// divided as one vector (the same quotients as one row at a time).
template <int R>
inline void i16_weights(const DecodePv& t, std::int64_t jg, I16Weights& g) {
  const int read = keys_in((t.nkeys < t.n ? t.nkeys : t.n) - jg, kI16Group);
  g.keys = read;
  __m256 s0, s1;
  if (read == kI16Group && t.ld_scale == 1) {  // as quantize_kv and the gathered pieces lay them out
    s0 = _mm256_loadu_ps(t.v_scale + jg);
    s1 = _mm256_loadu_ps(t.v_scale + jg + 8);
  } else {
    alignas(32) float sc[kI16Group] = {};
    for (int j = 0; j < read; ++j) sc[j] = t.v_scale[(jg + j) * t.ld_scale];
    s0 = _mm256_load_ps(sc);
    s1 = _mm256_load_ps(sc + 8);
  }
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  static_assert(kDecodeMaxRows == 8, "the rows' W in one vector");
  alignas(32) float W[kDecodeMaxRows] = {};
  for (int r = 0; r < R; ++r) {
    const std::uint16_t* p = static_cast<const std::uint16_t*>(t.p) + r * t.ldp;  // keys jg .. jg + read
    const __m256 w0 = _mm256_mul_ps(load8_f32(p, DType::bf16, jg, jg + read), s0);
    const __m256 w1 = _mm256_mul_ps(load8_f32(p, DType::bf16, jg + 8, jg + read), s1);
    _mm256_store_ps(g.w[r], w0);
    _mm256_store_ps(g.w[r] + 8, w1);
    const __m256i inf_nan = _mm256_or_si256(inf_or_nan(w0), inf_or_nan(w1));
    W[r] = hmax(_mm256_max_ps(_mm256_and_ps(w0, abs_mask), _mm256_and_ps(w1, abs_mask)));
    g.bad[r] = !_mm256_testz_si256(inf_nan, inf_nan) || (W[r] > 0.0f && W[r] < kI16MinWeight);
  }
  g.any_bad = false;
  for (int r = 0; r < R; ++r) g.any_bad |= g.bad[r];
  const __m256 Wv = _mm256_load_ps(W);
  _mm256_storeu_ps(g.f, _mm256_div_ps(Wv, _mm256_set1_ps(32767.0f)));
  alignas(32) float to_int[kDecodeMaxRows];
  _mm256_store_ps(to_int, _mm256_div_ps(_mm256_set1_ps(32767.0f), Wv));  // W = 0: inf (every w is 0)
  for (int r = 0; r < R; ++r) {
    const __m256 c = _mm256_set1_ps(to_int[r]), w0 = _mm256_load_ps(g.w[r]), w1 = _mm256_load_ps(g.w[r] + 8);
    // W = 0: every w is 0, and so is q (0 * inf would be NaN).
    const __m256 x0 = _mm256_and_ps(_mm256_mul_ps(w0, c), _mm256_cmp_ps(w0, _mm256_setzero_ps(), _CMP_NEQ_UQ));
    const __m256 x1 = _mm256_and_ps(_mm256_mul_ps(w1, c), _mm256_cmp_ps(w1, _mm256_setzero_ps(), _CMP_NEQ_UQ));
    _mm256_store_si256(reinterpret_cast<__m256i*>(g.q[r]),
                       _mm256_permute4x64_epi64(_mm256_packs_epi32(_mm256_cvtps_epi32(x0), _mm256_cvtps_epi32(x1)), 0xd8));
  }
}

// The group's key j's int8 values at columns [16 c, 16 c + 16), its row at vg + j ldv (zero past H, and
// for keys not read): as bytes, and sign-extended to int16.
template <bool kWhole>
inline __m128i i8_bytes(const DecodePv& t, const char* vg, int j, int read, int c) {
  if (j >= read) return _mm_setzero_si128();
  return load16_bytes<kWhole>(vg + j * t.ldv, std::int64_t{kChunk} * c, t.H);
}
template <bool kWhole>
inline __m256i i8_row(const DecodePv& t, const char* vg, int j, int read, int c) {
  return _mm256_cvtepi8_epi16(i8_bytes<kWhole>(t, vg, j, read, c));
}

// The group's sums into O's rows [r0, r0 + RB) at columns [16 c, 16 c + 16) (O in L1); its first key's
// row at vg (the group's 16 keys lie in one piece of a call in pieces). kFull: all 16 keys read and no
// row bad (the pair loop unrolled, with no check of a key's count or a row's weights).
//   Per pair of keys, the two rows' bytes are interleaved (vpunpck{l,h}bw) and then sign-extended, so
// the int32 sums come in column order (0..7 and 8..15). Two things GCC 12 did to this loop are undone
// by empty asm statements, with the same sums: it reassociated the int32 adds (forming all products
// before summing them, the products on the stack), and it hoisted the weights' broadcasts out of the
// chunk loop (keeping 32 weights in general registers and the stack, each use a vmovd and a
// vpbroadcastd on the shuffle ports); the asm on the weights' address makes each use a load.
template <int RB, bool kWhole, bool kFull>
inline __attribute__((always_inline)) void i16_chunk(const DecodePv& t, const I16Weights& g, int r0, const char* vg,
                                                    int c) {
  const std::int16_t* q = g.q[r0];
  __asm__("" : "+r"(q));
  const int keys = kFull ? kI16Group : g.keys;  // i8_bytes reads no key past it
  __m256i lo[RB], hi[RB];
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
  const auto pair = [&](int j) __attribute__((always_inline)) {
    const __m128i a = i8_bytes<kWhole>(t, vg, j, keys, c), b = i8_bytes<kWhole>(t, vg, j + 1, keys, c);
    const __m256i pl = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b));  // columns 0..7, each key pair's side by side
    const __m256i ph = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(a, b));  // 8..15
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) {
      std::int32_t word;
      __builtin_memcpy(&word, q + r * kI16Group + j, 4);
      const __m256i x = _mm256_set1_epi32(word);
      lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(pl, x));
      hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(ph, x));
    }
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) __asm__("" : "+x"(lo[r]), "+x"(hi[r]));
  };
  if constexpr (kFull) {
#pragma GCC unroll 8
    for (int j = 0; j < kI16Group; j += 2) pair(j);
  } else {
    for (int j = 0; j < keys; j += 2) pair(j);
  }
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r) {
    float* o = t.o + (r0 + r) * t.ldo + kChunk * c;
    // Key by key in fp32: NaN and infinities reach O as in the float path.
    if (!kFull && __builtin_expect(g.bad[r0 + r], 0)) {
      for (int j = 0; j < g.keys; ++j) {
        const __m256 w = _mm256_set1_ps(g.w[r0 + r][j]);
        const __m256i x = i8_row<kWhole>(t, vg, j, g.keys, c);
        const __m256 x0 = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(x)));
        const __m256 x1 = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(x, 1)));
        _mm256_store_ps(o, _mm256_fmadd_ps(w, x0, _mm256_load_ps(o)));
        _mm256_store_ps(o + 8, _mm256_fmadd_ps(w, x1, _mm256_load_ps(o + 8)));
      }
      continue;
    }
    const __m256 f = _mm256_set1_ps(g.f[r0 + r]);
    _mm256_store_ps(o, _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(lo[r]), _mm256_load_ps(o)));
    _mm256_store_ps(o + 8, _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(hi[r]), _mm256_load_ps(o + 8)));
  }
}

// Every group of 16 keys of the call: its weights, on dense rows the prefetch of the group
// kDecodeInt8AheadKeys keys on (microkernels.hpp), its rows touched in address order (as the float
// fast path does), then per column chunk the rows in blocks of 4, 2, 1.
template <int R>
void pv_rows_i16(const DecodePv& t) {
  if (t.corr) rescale_o<R>(t);
  I16Weights g;
  const bool whole = t.H % kChunk == 0;  // every chunk's 16 values inside the row (else all but the last's)
  // The chunks that hold a value of the row: those past H would add V's zeros (left out, as the contract
  // allows, in columns never output).
  const int nc = chunks_of<0>(t.H);
  const KeyRows at{static_cast<const char*>(t.v), t.v_pieces, t.ldv};
  for (std::int64_t jg = 0; jg < t.nkeys; jg += kI16Group) {
    i16_weights<R>(t, jg, g);
    if (t.v_pieces == nullptr && jg + kDecodeInt8AheadKeys + kI16Group <= t.n)  // dense: the rows 32 keys on
      prefetch_rows_l2(static_cast<const char*>(t.v) + (jg + kDecodeInt8AheadKeys) * t.ldv, t.ldv, t.H, kI16Group);
    touch_rows(at, t.H, jg, jg + g.keys, t.n, true);
    const char* vg = at.row(jg);  // (the pieces hold key round_up(nkeys, 16) - 1's row)
    for (int c = 0; c < nc; ++c)
      row_blocks<R>([&](auto rb, int r0) __attribute__((always_inline)) {
        constexpr int RB = decltype(rb)::value;
        if (!(whole || c + 1 < nc)) i16_chunk<RB, false, false>(t, g, r0, vg, c);
        else if (g.keys == kI16Group && !g.any_bad) i16_chunk<RB, true, true>(t, g, r0, vg, c);
        else i16_chunk<RB, true, false>(t, g, r0, vg, c);
      });
  }
}

}  // namespace

void avx2_decode_pv_rows(const DecodePv& t) {
  if (t.v_dtype == DType::i8)
    return with_rows<kDecodeMaxRows>(t.rows, [&](auto r) { pv_rows_i16<decltype(r)::value>(t); });
  with_rows<kDecodeMaxRows>(t.rows, [&](auto r) { pv_rows_any<decltype(r)::value>(t); });
}

// The words both kernels form for f16 and f32 rows (qk_rows_converted, pv_rows_converted), for any H.
void avx2_decode_rows_to_bf16(std::uint16_t* dst, std::int64_t ldd, const void* src, DType dtype, std::int64_t ld,
                              std::int64_t n, std::int64_t H) {
  rows_to_bf16(dst, ldd, src, dtype, ld, 0, n, H);
}

}  // namespace flashgqa
