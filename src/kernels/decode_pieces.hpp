// Rows of a decode call in pieces (DecodeQk::k_pieces, DecodePv::v_pieces; contract in
// microkernels.hpp): where key j's row is, and the prefetch of the next piece. Shared by the AVX-512
// decode kernels (avx512_decode_common.hpp), the avx2 ones (avx2_decode_common.hpp) and the amx set's
// tiles (kernels_amx_decode.cpp).
//
// Include ONLY from x86-64 translation units (prefetch_l2's instruction): everything here is in an
// anonymous namespace, so each unit gets its own copy.
#pragma once

#include <cstdint>

#include "core/prefetch.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa {
namespace {

// Where key j's row of a call is: base + j ld_bytes, or in pieces
// pieces[j / kDecodePieceKeys] + (j % kDecodePieceKeys) ld_bytes.
struct KeyRows {
  const char* base;
  const void* const* pieces;
  std::int64_t ld_bytes;
  const char* row(std::int64_t j) const {
    if (pieces == nullptr) return base + j * ld_bytes;
    return static_cast<const char*>(pieces[j / kDecodePieceKeys]) + j % kDecodePieceKeys * ld_bytes;
  }
};

// In pieces, the hardware prefetchers do not cross from one piece into the next, which lies anywhere:
// as piece j / kDecodePieceKeys starts (of a call of n keys), the first line of the piece `ahead`
// pieces on goes to L2 (prefetch_l2: a prefetch-only helper GCC cannot find pure), which starts its
// page walk and DRAM access early (page 16 1.12x faster on Sapphire Rapids than without;
// docs/performance.md, session 19).
inline void prefetch_next_piece(const void* const* pieces, std::int64_t n, std::int64_t j, int ahead = 1) {
  const std::int64_t next = j / kDecodePieceKeys + ahead;
  if (next * kDecodePieceKeys < n) prefetch_l2(pieces[next]);
}

// Key j's row (n keys in all), in pieces or not; with `prefetch`, where j starts a piece, the first
// line of the piece `ahead` pieces on prefetched.
inline const char* step_rows(const void* rows, const void* const* pieces, std::int64_t ld_bytes, std::int64_t j,
                             std::int64_t n, bool prefetch = true, int ahead = 1) {
  if (pieces != nullptr && prefetch) prefetch_next_piece(pieces, n, j, ahead);
  return KeyRows{static_cast<const char*>(rows), pieces, ld_bytes}.row(j);
}

// Every line of `count` rows of row_bytes from `first`, ld_bytes apart, through kPrefetch (rows that
// follow one another as one span, so a misaligned row's lines are not fetched twice). Written with
// _mm_prefetch, GCC deleted this loop where it inlined it into the kernels (session 32).
template <void (*kPrefetch)(const void*)>
inline __attribute__((always_inline)) void prefetch_row_lines(const char* first, std::int64_t ld_bytes,
                                                              std::int64_t row_bytes, int count) {
  const auto lines = [](const char* from, std::int64_t bytes) {
    const std::int64_t skip = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(from) % 64);
    for (std::int64_t b = 0; b < skip + bytes; b += 64) kPrefetch(from - skip + b);
  };
  if (ld_bytes == row_bytes) {
    lines(first, count * row_bytes);
  } else {
    for (int r = 0; r < count; ++r) lines(first + r * ld_bytes, row_bytes);
  }
}

// Into L2 (prefetch_l2).
inline __attribute__((always_inline)) void prefetch_rows_l2(const char* first, std::int64_t ld_bytes,
                                                            std::int64_t row_bytes, int count) {
  prefetch_row_lines<prefetch_l2>(first, ld_bytes, row_bytes, count);
}

// As step_rows, for the vector kernels (AVX-512 and avx2): where j starts a piece, every line of the
// next piece's rows (kDecodePieceKeys rows of row_bytes, ld_bytes apart) into L2, and the first line of
// the piece after it, whose page walk then starts a piece early. Small pages lie anywhere, so each
// piece starts with a TLB miss and a cold stream. On Zen 4 (8 sequences, T = 1, page 16 bf16) the first
// line alone left the core waiting on each piece; the whole piece and the early page walk read it
// 1.8-1.9x faster (docs/performance.md, session 31). On the avx2 set (Zen 4 with AVX-512 hidden),
// pieces read this way instead of copied together first: page 16 1.28-1.30x faster, bf16 and int8
// (session 34).
inline const char* step_rows_ahead(const void* rows, const void* const* pieces, std::int64_t ld_bytes,
                                   std::int64_t row_bytes, std::int64_t j, std::int64_t n) {
  if (pieces != nullptr && j % kDecodePieceKeys == 0) {
    const std::int64_t next = j / kDecodePieceKeys + 1;
    if (next * kDecodePieceKeys < n)
      prefetch_rows_l2(static_cast<const char*>(pieces[next]), ld_bytes, row_bytes, kDecodePieceKeys);
    prefetch_next_piece(pieces, n, j, 2);
  }
  return KeyRows{static_cast<const char*>(rows), pieces, ld_bytes}.row(j);
}

}  // namespace
}  // namespace flashgqa
