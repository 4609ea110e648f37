// Rows of a decode call in pieces (DecodeQk::k_pieces, DecodePv::v_pieces; contract in
// microkernels.hpp): where key j's row is, and the prefetch of the next piece. Shared by the AVX-512
// decode kernels (avx512_decode_common.hpp) and the amx set's tiles (kernels_amx_decode.cpp).
//
// Include ONLY from x86-64 translation units with the AVX-512 flags: everything here is in an
// anonymous namespace, so each unit gets its own copy.
#pragma once

#include <immintrin.h>

#include <cstdint>

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
// as piece j / kDecodePieceKeys starts (of a call of n keys), the next one's first `lines` lines go to
// L2 (prefetcht1), which starts its page walk and DRAM access early (page 16 1.12x faster on Sapphire
// Rapids than without, with one line; docs/performance.md, session 19).
inline void prefetch_next_piece(const void* const* pieces, std::int64_t n, std::int64_t j, int lines = 1,
                                int ahead = 1) {
  const std::int64_t next = j / kDecodePieceKeys + ahead;
  if (next * kDecodePieceKeys < n)
    for (int l = 0; l < lines; ++l) _mm_prefetch(static_cast<const char*>(pieces[next]) + 64 * l, _MM_HINT_T1);
}

// The lines of the next piece the AVX-512 Q.K fast path prefetches for int8 rows: its first KiB (half
// a piece at H = 128). One line left int8 page 16 1.2x slower; on bf16 rows and the amx tiles, more
// than one line was slower (docs/performance.md, session 22).
constexpr int kInt8PieceLines = 16;

// Key j's row (n keys in all), in pieces or not; with `prefetch`, where j starts a piece, the next
// piece's first `lines` lines prefetched.
inline const char* step_rows(const void* rows, const void* const* pieces, std::int64_t ld_bytes, std::int64_t j,
                             std::int64_t n, bool prefetch = true, int lines = 1, int ahead = 1) {
  if (pieces != nullptr && prefetch) prefetch_next_piece(pieces, n, j, lines, ahead);
  return KeyRows{static_cast<const char*>(rows), pieces, ld_bytes}.row(j);
}

}  // namespace
}  // namespace flashgqa
