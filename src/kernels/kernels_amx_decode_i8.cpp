// The AMX set's Q.K for int8 K rows (contract in microkernels.hpp: the integers form) on the tile
// unit's int8 dot products (AMX-INT8), for calls of kTileMinRows rows or more. The integers form sums
// int8 values times int16 ones exactly in int32, so the tiles give the bits of the vector kernels'
// vpdpwssd (the avx512bf16 set's, whose quantization of Q this file calls: the same int16 values)
// whatever the order of the sums. A tile multiplies bytes, so each int16 value v is split in two,
// v = 256 hi + lo with hi = v >> 8 (signed) and lo = v & 255 (unsigned), and sum v x = 256 sum hi x +
// sum lo x: tdpbssd for hi, tdpbsud for lo, each exact in int32 (|sum hi x| <= 128 * 128 * 256 and
// |sum lo x| <= 255 * 128 * 256 at H = 256), and their total, the exact sum, below 2^30 (the contract's
// bound).
//   S^T = K Q^T: A is 16 int8 K rows (64 bytes of each, straight from the rows), B the Q rows' hi (or
//   lo) bytes, column r row r's; C hi and lo per 16 keys, combined as 256 hi + lo, transposed in
//   registers to S's rows, then the contract's fp32 steps.
// Where, measured (docs/performance.md, session 21; 8 sequences over 1k..32k keys, G = 4, H = 128, 2
// threads, against the vector kernels): in L2, 4 rows 6.1 -> 3.4 ns a key (an earlier form of B for up
// to 7 rows), 8 rows 13.7 -> 4.6, 16 rows 13.7 -> 5.3 (two vector calls of 8); from DRAM, T = 1 (4 rows)
// 1.05-1.1x and T = 2 (8 rows) 1.03-1.07x slower, T = 4 (16 rows) 1.11x and T = 8 1.16x faster. The tile
// loads hold up the stream where one group reads K from DRAM and the saving is small; at 16 rows the
// saving wins. Hence kTileMinRows.
// Compiled with the amx flags plus -mavx512vnni -mamx-int8 (CMakeLists.txt), in kernels_amx.cpp's tile
// configuration; used only where the CPU has AMX-INT8 (amx_int8_supported()).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/amx_tiles.hpp"
#include "kernels/avx512_decode_common.hpp"
#include "kernels/cpu_features.hpp"
#include "kernels/decode_pieces.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa {
namespace {

using amx::kTileBytes;
using amx::kTileRows;
constexpr int kMaxHp = 256;               // the widest rows on the tiles (the integers form's bound)
constexpr int kMaxChunks = kMaxHp / 64;   // 64-byte chunks of an int8 row
constexpr int kKeys = 16;                 // keys per Q.K tile step
constexpr int kTileMinRows = 16;          // fewer rows a call take the vector kernels (above)
static_assert(kKeys == kDecodePieceKeys, "a tile step's keys lie in one piece");

// ---- Q.K ----

struct alignas(64) I8QkScratch {
  std::int8_t b[2][kMaxChunks][kTileRows][kTileBytes];  // B per part (hi, lo) and chunk
  std::uint16_t q[kTileRows][kMaxHp];                   // the Q rows b was built from
  alignas(64) float factor[kTileRows];                  // each row's factor (quantize_q_rows)
  float scale = 0.0f;
  int rows = 0, Hp = 0;                                  // 0: b not built
  alignas(64) std::int8_t k[kTileRows * kMaxHp];       // a partial last A tile, zero padded
  alignas(64) std::int32_t c[2][kTileRows][16];         // C hi, lo: [key][column] (aligned vector loads)
};
__attribute__((noinline)) I8QkScratch& i8_qk_scratch() {  // (as qk_scratch in kernels_amx_decode.cpp)
  thread_local I8QkScratch w;
  return w;
}

// Builds B from the call's Q rows unless it holds them already (pieces of one block share them); false
// where the integers form does not take the rows (quantize_q_rows: a NaN or an infinity, or a tiny
// row), and the caller takes the vector kernels.
bool load_q_i8(const DecodeQk& t, I8QkScratch& w) {
  const auto* q = static_cast<const std::uint16_t*>(t.q);
  bool same = w.rows == t.rows && w.Hp == t.Hp && w.scale == t.scale;
  for (int r = 0; r < t.rows && same; ++r) same = std::memcmp(w.q[r], q + r * t.ldq, t.Hp * 2) == 0;
  if (same) return true;
  w.rows = 0;
  alignas(64) std::int16_t qi[kTileRows * kMaxHp];
  if (!decode_avx512::quantize_q_rows(qi, w.factor, t.q, t.ldq, t.Hp, t.rows, t.scale)) return false;
  // Each part's bytes, column r row r's; then per chunk the 16 columns' words transposed (B's row i:
  // bytes 4i .. 4i + 3 of each column).
  alignas(64) std::int8_t part[2][kTileRows][kMaxHp];
  std::memset(part, 0, sizeof(part));
  for (int r = 0; r < t.rows; ++r)
    for (std::int64_t h = 0; h < t.Hp; h += 32) {
      const __m512i v = _mm512_load_si512(qi + r * t.Hp + h);
      _mm256_store_si256(reinterpret_cast<__m256i*>(&part[0][r][h]), _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(&part[1][r][h]), _mm512_cvtepi16_epi8(v));  // v & 255
    }
  for (int hl = 0; hl < 2; ++hl)
    for (std::int64_t c = 0; c < t.Hp / 64; ++c) {
      __m512i x[16];
      for (int r = 0; r < kTileRows; ++r) x[r] = _mm512_load_si512(&part[hl][r][64 * c]);
      transpose16x16_epi32(x);
      for (int i = 0; i < kTileRows; ++i) _mm512_store_si512(w.b[hl][c][i], x[i]);
    }
  for (int r = 0; r < t.rows; ++r) std::memcpy(w.q[r], q + r * t.ldq, t.Hp * 2);
  w.scale = t.scale, w.rows = t.rows, w.Hp = static_cast<int>(t.Hp);
  return true;
}

// S[r][j0 + i] = fl(fl(float(256 C_hi[i][r] + C_lo[i][r]) factor[r]) s_(j0 + i)) for the 16 keys of
// one step (keys at or past n: 0), as the vector kernels' logits.
inline void store_s_i8(const DecodeQk& t, const I8QkScratch& w, std::int64_t j0) {
  __m512i x[16];
  for (int i = 0; i < 16; ++i)
    x[i] = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(w.c[0][i]), 8), _mm512_load_si512(w.c[1][i]));
  transpose16x16_epi32(x);  // x[r]: row r's sums over the 16 keys
  const __mmask16 live = first_lanes16(t.n - j0);
  const __m512 keys = decode_avx512::load_scales16(t.k_scale + j0 * t.ld_scale, t.ld_scale, live);
  for (int r = 0; r < t.rows; ++r)
    _mm512_storeu_ps(t.s + r * t.lds + j0,
                     _mm512_maskz_mul_ps(live, _mm512_mul_ps(_mm512_cvtepi32_ps(x[r]), _mm512_set1_ps(w.factor[r])),
                                         keys));
}

// Keys [j, j + 16)'s A rows: straight from the rows when all 16 are there, else staged in w.k with the
// rows past n zero.
struct KeyTile {
  const char* at;
  std::int64_t ld;
};
inline KeyTile key_tile(const DecodeQk& t, std::int64_t j, I8QkScratch& w) {
  const char* at = step_rows(t.k, t.k_pieces, t.ldk, j, t.n);
  if (j + kKeys <= t.n) return {at, t.ldk};
  std::memset(w.k, 0, static_cast<std::size_t>(kTileRows * t.Hp));
  for (std::int64_t i = 0; i < t.n - j; ++i) std::memcpy(w.k + i * t.Hp, at + i * t.ldk, static_cast<std::size_t>(t.H));
  return {reinterpret_cast<const char*>(w.k), t.Hp};
}

// One step's chunks: per chunk A in tmm2 or tmm3, C hi (tmm0) += A B_hi, C lo (tmm1) += A B_lo; up to
// two chunks (H <= 128) B stays in tmm4..7 for the call, more load it chunk by chunk. (GCC's tile
// intrinsics take literal register numbers, hence the macro.)
#define FLASHGQA_I8_CHUNK(a, bh, bl, c)                 \
  do {                                                  \
    _tile_loadd(a, k.at + (c) * kTileBytes, k.ld);      \
    _tile_dpbssd(0, a, bh);                             \
    _tile_dpbsud(1, a, bl);                             \
  } while (0)
template <int kNc>
inline void qk_step_i8(KeyTile k, const I8QkScratch& w) {
  if constexpr (kNc <= 2) {
    FLASHGQA_I8_CHUNK(2, 4, 5, 0);
    if constexpr (kNc > 1) FLASHGQA_I8_CHUNK(3, 6, 7, 1);
  } else {
    for (int c = 0; c < kNc; c += 2) {
      _tile_loadd(4, w.b[0][c], kTileBytes);
      _tile_loadd(5, w.b[1][c], kTileBytes);
      FLASHGQA_I8_CHUNK(2, 4, 5, c);
      if (c + 1 < kNc) {
        _tile_loadd(6, w.b[0][c + 1], kTileBytes);
        _tile_loadd(7, w.b[1][c + 1], kTileBytes);
        FLASHGQA_I8_CHUNK(3, 6, 7, c + 1);
      }
    }
  }
}
#undef FLASHGQA_I8_CHUNK

template <int kNc>
void qk_rows_i8(const DecodeQk& t, I8QkScratch& w) {
  if constexpr (kNc <= 2) {
    _tile_loadd(4, w.b[0][0], kTileBytes);
    _tile_loadd(5, w.b[1][0], kTileBytes);
    if constexpr (kNc > 1) {
      _tile_loadd(6, w.b[0][1], kTileBytes);
      _tile_loadd(7, w.b[1][1], kTileBytes);
    }
  }
  for (std::int64_t j = 0; j < t.n; j += kKeys) {
    _tile_zero(0);
    _tile_zero(1);
    qk_step_i8<kNc>(key_tile(t, j, w), w);
    _tile_stored(0, w.c[0], kTileBytes);
    _tile_stored(1, w.c[1], kTileBytes);
    store_s_i8(t, w, j);
  }
}

}  // namespace

bool amx_decode_qk_rows_i8(const DecodeQk& t) {
  if (t.k_dtype != DType::i8 || t.rows < kTileMinRows || t.H != t.Hp || t.H % 64 != 0 || t.H > kMaxHp ||
      !amx_int8_supported())
    return false;
  I8QkScratch& w = i8_qk_scratch();
  if (!load_q_i8(t, w)) return false;
  amx::configure_tiles();
  switch (t.Hp / 64) {
    case 1: qk_rows_i8<1>(t, w); break;
    case 2: qk_rows_i8<2>(t, w); break;
    case 3: qk_rows_i8<3>(t, w); break;
    default: qk_rows_i8<4>(t, w); break;
  }
  return true;
}

}  // namespace flashgqa
