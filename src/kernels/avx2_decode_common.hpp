// Shared by the avx2 decode kernels, kernels_avx2_decode_qk.cpp and _pv.cpp (contract in
// microkernels.hpp): K and V read straight from their rows, for tasks of at most kDecodeMaxRows query
// rows. Included only by those two translation units, which are compiled with
// the flags of kernels_avx2.cpp (-mavx2 -mfma -mf16c, CMakeLists.txt); everything here is in an
// anonymous namespace.
//
// AVX2 has no bf16 arithmetic, so the operands go to fp32 FMAs as the halves of bf16 words: a chunk is
// 16 operands (one ymm of bf16 words), split by one AND and one shift into its 8 even elements and its
// 8 odd ones as fp32 (exact). The Q rows are split once per call, so the per-key loop splits only the K
// or V chunk; P.V keeps O's columns as each chunk's even columns then its odd ones for the call. As on
// AVX-512 (avx512_decode_common.hpp), decode does ~G FLOPs per K/V byte, so it is bound by the DRAM
// stream where the FMAs keep up: no packed copy (f16 and f32 rows only: a bf16 copy of 32 keys at a
// time in L1, rows_to_bf16 below), and the rows read about in address order (Q.K chunk by chunk across
// a few adjacent keys; P.V, whose passes read a group's rows strided, touches them line by line in
// order first). Of dense bf16 rows only P.V prefetches: the next group's rows, a share before each of
// a group's passes (in one burst per group, or in Q.K, 32 to 256 keys ahead, prefetches of bf16 rows
// did not help on Zen 3, docs/performance.md, sessions 13 and 14, and were up to 1.12x slower on
// Zen 4, sessions 36 and 37; spread over the passes, T = 1 1.08x and T = 2 1.14x faster, session 37).
// Dense int8 rows are prefetched kDecodeInt8AheadKeys keys ahead in both kernels (Zen 4: 8
// sequences at T = 1 1.02x faster dense, 1.07x at page 256, session 36). bf16 and int8 rows may come in
// pieces of 16 keys, each at its own address (DecodeQk::k_pieces, DecodePv::v_pieces: small pages read
// where they lie): Q.K runs one call per piece, P.V's passes rebase each piece's run of keys onto its
// first row (the rows types' at(j, row); KeyRows gives the row, decode_pieces.hpp). The hardware
// prefetchers do not cross from one piece into the next, which lies anywhere (session 34: reading the
// pieces where they lie, every line of the next one to L2 as each starts, page 16 1.28-1.30x faster
// than copying them together first, on Zen 4 with AVX-512 hidden). Since session 39 the bf16 and int8
// Q.K and the bf16 P.V spread those prefetches over the work instead: the rows kAheadPieces pieces on
// (Q.K, DecodeQk::k_ahead) or the next group's (P.V, NextRows) a few keys at a time, and at each
// piece's start only the first line of the piece after them (its page walk). A plain loop with page
// 16's pattern read 1.35x faster that way than with a burst of 64 prefetches per piece, and the
// kernels read page 16 1.12-1.16x faster (bf16, 8 sequences, T = 1). int8 P.V keeps the burst (its
// rows spread were 1.02-1.07x slower). The lambdas inside the kernels' loops (a chunk, a block of
// rows) are always_inline: GCC 12 inlines them by its size budget, and once the Q.K file had grown it
// made the bf16 chunk a call at 3, 5 and 6 rows (its accumulators then in memory: 2.3x slower,
// session 35).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "kernels/avx2_helpers.hpp"
#include "kernels/decode_pieces.hpp"
#include "kernels/microkernels.hpp"
#include "kernels/row_count.hpp"

namespace flashgqa {
namespace {
namespace decode_avx2 {

constexpr int kChunk = 16;  // operands per chunk

// Rows in pieces: how many pieces ahead of the one read the kernels prefetch (see the top). A call's
// first two pieces are those the decode path prefetches a phase early (kPhaseAheadKeys,
// flash/decode_rows.hpp).
constexpr int kAheadPieces = 2;

inline std::int64_t elem_bytes(DType d) { return static_cast<std::int64_t>(dtype_size(d)); }

// The keys of a group of at most `most` that are there when `left` keys are left (0 when none are).
inline int keys_in(std::int64_t left, int most) {
  return left >= most ? most : left > 0 ? static_cast<int>(left) : 0;
}

// A chunk's operands as fp32: the even elements (0, 2, .., 14) and the odd ones (1, 3, .., 15).
struct Halves {
  __m256 even, odd;
};

inline Halves split(__m256i w) { return {even_half(w), odd_half(w)}; }

// The rows the kernels read, chunk by chunk: chunk c of key j (operands 16c .. 16c+16) as Halves.
// bf16 rows: plain loads, except, where kTail (H not a multiple of 16), for the last chunk (c = H / 16),
// which load16_bf16 reads (zero past H, nothing past H read).
template <bool kTail = false>
struct Bf16Rows {
  const char* base;
  std::int64_t ld_bytes;
  std::int64_t H = 0;  // kTail only
  Bf16Rows at(std::int64_t, const char* row) const { return {row, ld_bytes, H}; }  // key j's row at `row` (a piece's)
  Halves chunk(std::int64_t j, int c) const {
    if constexpr (kTail)
      if (c == H / kChunk) return split(load16_bf16(base + j * ld_bytes, DType::bf16, std::int64_t{kChunk} * c, H, 1.0f));
    return split(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + j * ld_bytes + 32 * c)));
  }
};

// int8 rows, each value times its key's scale and rounded to bf16 (the products form): the even and
// odd bytes sign-extended straight into their halves, so no bf16 words are formed. The values
// load16_bf16 gives, split (which reads the last chunk where kTail, as Bf16Rows).
template <bool kTail = false>
struct Int8Rows {
  const char* base;
  std::int64_t ld_bytes;  // = elements between keys
  const float* scale;
  std::int64_t ld_scale;
  std::int64_t H = 0;  // kTail only
  Halves chunk(std::int64_t j, int c) const {
    if constexpr (kTail)
      if (c == H / kChunk)
        return split(load16_bf16(base + j * ld_bytes, DType::i8, std::int64_t{kChunk} * c, H, scale[j * ld_scale]));
    const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + j * ld_bytes + 16 * c)));
    const __m256i even = _mm256_srai_epi32(_mm256_slli_epi32(w, 16), 16), odd = _mm256_srai_epi32(w, 16);
    const __m256 s = _mm256_broadcast_ss(scale + j * ld_scale);
    return {round_bf16(_mm256_mul_ps(_mm256_cvtepi32_ps(even), s)), round_bf16(_mm256_mul_ps(_mm256_cvtepi32_ps(odd), s))};
  }
};

// Bytes h0 .. h0 + 16 of an int8 row, zero from H on; no byte past row + H is read. kWhole: the
// caller knows all 16 are inside the row (a chunk that ends at or before H), and H is not looked at.
// A partial chunk of a row of 16 values or more is read as the 16 bytes that end at row + H, shifted
// down (bytes_ending_at). The integers form's loads.
template <bool kWhole>
inline __m128i load16_bytes(const char* row, std::int64_t h0, std::int64_t H) {
  const std::int64_t left = H - h0;
  if (kWhole || left >= kChunk) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + h0));
  if (left > 0 && H >= kChunk) return bytes_ending_at(row + H, left);
  alignas(16) char buf[kChunk] = {};
  for (std::int64_t h = 0; h < left; ++h) buf[h] = row[h0 + h];
  return _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
}

// The same values sign-extended to int16.
template <bool kWhole>
inline __m256i load16_i8(const char* row, std::int64_t h0, std::int64_t H) {
  return _mm256_cvtepi8_epi16(load16_bytes<kWhole>(row, h0, H));
}

// The fast paths take rows of any H <= Hp (Q is zero past H, so the chunks past it add nothing):
// ceil(H / 16) chunks, the last one read masked where H is not a multiple of 16 (kTail: load16_bf16,
// or load16_i8 in the integers form; Q.K's fast path only where Hp <= 256, the rows it splits once per
// call). with_fast_chunks(H, fn)
// calls fn(std::integral_constant<int, HC>{}, std::bool_constant<kTail>{}): HC = H / 16 for the widths
// whose chunk loop is unrolled (H = 64, 96, 128, 256: every size a constant), HC = 0 for the others
// (the count at run time, chunks_of), and returns false, calling nothing, for H <= 0. The one list of
// them. (On the generic path, which converts and masks chunk by chunk over all of Hp, T = 16 took 3x
// the time at H = 96 on Zen 3, and T = 1 2.4x at H = 72: docs/performance.md, sessions 16 and 17.)
template <typename Fn>
inline bool with_fast_chunks(std::int64_t H, Fn&& fn) {
  switch (H) {
    case 64: fn(std::integral_constant<int, 4>{}, std::false_type{}); return true;
    case 96: fn(std::integral_constant<int, 6>{}, std::false_type{}); return true;
    case 128: fn(std::integral_constant<int, 8>{}, std::false_type{}); return true;
    case 256: fn(std::integral_constant<int, 16>{}, std::false_type{}); return true;
    default:
      if (H <= 0) return false;
      if (H % kChunk == 0) fn(std::integral_constant<int, 0>{}, std::false_type{});
      else fn(std::integral_constant<int, 0>{}, std::true_type{});
      return true;
  }
}

// The chunks of a row on a fast path: HC, or ceil(H / 16) where HC is 0.
template <int HC>
inline int chunks_of(std::int64_t H) {
  return HC > 0 ? HC : static_cast<int>(ceil_div(H, kChunk));
}

// f16 and f32 rows take the bf16 fast paths through an L1 buffer: kConvertKeys rows at a time become
// the bf16 words load16_bf16 forms (bf16_words: round_bf16, nearest even), and the bf16 kernels run on
// them, so the bits are those of the generic path, which forms the same operands chunk by chunk (and
// ran 4x slower than bf16 in L1 on Zen 3). Rows of up to kConvertMaxH values, converted_ld(H) words
// apart. With row groups the decode path converts each block once instead, into its workspace, through
// avx2_decode_rows_to_bf16 (the same rows_to_bf16), and calls the kernels on bf16 rows.
constexpr std::int64_t kConvertKeys = 32;
constexpr std::int64_t kConvertMaxH = 256;

inline bool converts_rows(DType dtype, std::int64_t H, std::int64_t Hp) {
  return (dtype == DType::f16 || dtype == DType::f32) && H <= Hp && H <= kConvertMaxH;
}

// The words between the converted rows: H rounded up to whole chunks.
inline std::int64_t converted_ld(std::int64_t H) { return round_up(H, kChunk); }

// Rows [j0, j0 + n) of `src` (f16 or f32, ld elements apart, H values each) as bf16 words at dst, ldd
// per row (a multiple of 16, >= H; zero in [H, ldd); dst 32-byte aligned): load16_bf16's words (its
// dtype a constant here, so its branches fold).
template <DType kDtype>
inline void rows_to_bf16(std::uint16_t* dst, std::int64_t ldd, const void* src, std::int64_t ld, std::int64_t j0,
                         std::int64_t n, std::int64_t H) {
  for (std::int64_t j = 0; j < n; ++j) {
    const char* row = static_cast<const char*>(src) + (j0 + j) * ld * elem_bytes(kDtype);
    for (std::int64_t h = 0; h < ldd; h += kChunk)
      _mm256_store_si256(reinterpret_cast<__m256i*>(dst + j * ldd + h), load16_bf16(row, kDtype, h, H, 1.0f));
  }
}

inline void rows_to_bf16(std::uint16_t* dst, std::int64_t ldd, const void* src, DType dtype, std::int64_t ld,
                         std::int64_t j0, std::int64_t n, std::int64_t H) {
  if (dtype == DType::f16) rows_to_bf16<DType::f16>(dst, ldd, src, ld, j0, n, H);
  else rows_to_bf16<DType::f32>(dst, ldd, src, ld, j0, n, H);
}

// Any dtype and H: load16_bf16's operands (zero past H), split.
struct AnyRows {
  const char* base;
  std::int64_t ld_bytes;
  DType dtype;
  std::int64_t H;
  const float* scale;  // int8: key j's at scale[j * ld_scale]; else null
  std::int64_t ld_scale;
  AnyRows at(std::int64_t j, const char* row) const {  // key j's row at `row` (a piece's)
    return {row, ld_bytes, dtype, H, scale != nullptr ? scale + j * ld_scale : nullptr, ld_scale};
  }
  Halves chunk(std::int64_t j, int c) const {
    return split(load16_bf16(base + j * ld_bytes, dtype, std::int64_t{kChunk} * c, H,
                             scale != nullptr ? scale[j * ld_scale] : 1.0f));
  }
};

}  // namespace decode_avx2
}  // namespace
}  // namespace flashgqa
