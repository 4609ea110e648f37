// The AMX kernel set: the avx512bf16 set (bf16-pair operand family, contract in microkernels.hpp)
// with qk_tile and pv_tile on the tile unit (tdpbf16ps). Compiled with the avx512bf16 flags plus
// -mamx-tile -mamx-bf16 (CMakeLists.txt, this file only).
//
// Register tile 32 x 32, all eight tile registers: four 16 x 16 fp32 accumulator tiles (C[i][h]: rows
// 16i.., columns 16h..), two row operand tiles A[i] (16 rows x 32 bf16 of the reduction) and two panel
// tiles B[h] (16 words of the reduction x 16 columns). The packed layouts are already the tile unit's:
// a row tile of Q or P is 16 rows of 64 bytes at the rows' stride, and a K or V panel ([.. / 2][32][2],
// 128 bytes per word row) holds B[0] at byte 0 and B[1] at byte 64 of each row, 128 bytes apart. Per 32
// of the reduction: 4 tile loads, 4 tdpbf16ps (16 x 16 x 32 multiply-adds each; one per 16 cycles per
// core). 32 rows, not 16: each panel tile comes from L2 (a packed K or V block is 64 KiB) and serves
// two row tiles, which halves the L2 traffic per FLOP (16 rows measured 2x slower per FLOP on a
// Sapphire Rapids core than 32 with the panels in L2). A tile of at most 16 rows runs the first half only.
// tdpbf16ps accumulates each word's two products into fp32 with round to nearest even, flushing
// subnormal inputs and results to zero (as vdpbf16ps does; the tolerances allow it).
//
// Edges, never read or written past the contract: a partial row tile (rows < 16) goes through a
// scratch copy (rows zero beyond `rows`), and so does a partial last chunk of pv_tile's keys (P
// columns and V word rows beyond nkeys zero, so a NaN there is never multiplied).
//
// The tile configuration (all eight tiles 16 rows x 64 bytes) is per thread and costs ~250 cycles to
// load, as much as a whole qk_tile: each thread loads it at its first tile kernel after the set is
// handed out by amx_kernels(), which every call does at its start (kernels_for), so another library's
// tile code that ran on the thread between two flashgqa calls cannot leave a foreign configuration.
#include <immintrin.h>

#include <atomic>
#include <cstdint>

#include "kernels/amx_tiles.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa {
namespace amx {
namespace {

struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
  TileConfig() {
    for (int i = 0; i < 8; ++i) colsb[i] = kTileBytes, rows[i] = kTileRows;
  }
};

std::atomic<std::uint64_t> g_config_epoch{1};

}  // namespace

// Once per epoch (see the file comment).
void configure_tiles() {
  static const TileConfig config;
  thread_local std::uint64_t loaded = 0;
  const std::uint64_t epoch = g_config_epoch.load(std::memory_order_relaxed);
  if (loaded != epoch) {
    _tile_loadconfig(&config);
    loaded = epoch;
  }
}

}  // namespace amx

namespace {

using amx::configure_tiles;
using amx::kTileBytes;
using amx::kTileRows;
constexpr int kMR = 32;  // rows per register tile
// Tile registers (GCC's tile intrinsics take literal register numbers): tmm0, tmm1 C[0][0..1];
// tmm2, tmm3 C[1][0..1]; tmm4, tmm5 A[0..1]; tmm6, tmm7 B[0..1].

// Per-thread scratch tiles for partial row tiles and key chunks.
struct alignas(64) Scratch {
  std::uint16_t a[2][kTileRows * 32];  // A[i]: 16 rows x 32 bf16
  std::uint16_t b[kTileRows * 64];     // a V panel's 16 word rows x 32 columns (both B tiles)
  float c[kMR * 32];                   // the 32 x 32 accumulators
};
thread_local Scratch t_scratch;

// Rows [16i, 16i + 16) of a row operand whose row r is at src + r stride (rows < `rows` exist; of
// each, `bytes` bytes), as a tile: straight from src when all are there, else a zero-padded copy.
struct RowTile {
  const void* at;
  std::int64_t stride;
};
inline RowTile row_tile(const char* src, std::int64_t stride, int rows, int i, std::int64_t bytes = kTileBytes) {
  const int have = rows - kTileRows * i;
  src += kTileRows * i * stride;
  if (have >= kTileRows && bytes == kTileBytes) return {src, stride};
  const __mmask64 m = bytes >= 64 ? ~__mmask64(0) : (__mmask64(1) << bytes) - 1;
  std::uint16_t* a = t_scratch.a[i];
  for (int r = 0; r < kTileRows; ++r)
    _mm512_store_si512(a + r * 32, r < have ? _mm512_maskz_loadu_epi8(m, src + r * stride) : _mm512_setzero_si512());
  return {a, kTileBytes};
}

// C[i][h] += A[i] x B[h] for one 32-deep step of the reduction: the row tiles of `a` (rows < `rows`,
// `bytes` of each; see row_tile) and the panel's two B tiles (16 word rows, 128 bytes apart). Each B
// tile serves both row tiles back to back (measured ~20% faster than loading both B tiles first).
template <bool kTwo>
inline void tile_step(const char* a, std::int64_t lda, int rows, std::int64_t bytes, const char* panel) {
  const RowTile a0 = row_tile(a, lda, rows, 0, bytes);
  _tile_loadd(4, a0.at, a0.stride);
  if (kTwo) {
    const RowTile a1 = row_tile(a, lda, rows, 1, bytes);
    _tile_loadd(5, a1.at, a1.stride);
  }
  _tile_loadd(6, panel, 128);
  _tile_dpbf16ps(0, 4, 6);
  if (kTwo) _tile_dpbf16ps(2, 5, 6);
  _tile_loadd(7, panel + kTileBytes, 128);
  _tile_dpbf16ps(1, 4, 7);
  if (kTwo) _tile_dpbf16ps(3, 5, 7);
}

// S[r][0..32) = scale sum_h Q[r][h] K[j][h]: C = sum over the 32-h chunks of A (Q) x B (K panel).
template <bool kTwo>
void qk_rows(const QkTile& t) {
  const char* q = static_cast<const char*>(t.q);
  const char* k = static_cast<const char*>(t.k);
  const std::int64_t ldq = t.ldq * 2;
  _tile_zero(0);
  _tile_zero(1);
  if (kTwo) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (std::int64_t c = 0; c < t.Hp / 32; ++c)  // K word rows 16c .. 16c + 15 of the panel
    tile_step<kTwo>(q + c * kTileBytes, ldq, t.rows, kTileBytes, k + c * 16 * 128);
  float* c = t_scratch.c;
  _tile_stored(0, c, 128);
  _tile_stored(1, c + 16, 128);
  if (kTwo) {
    _tile_stored(2, c + 16 * 32, 128);
    _tile_stored(3, c + 16 * 32 + 16, 128);
  }
  const __m512 scale = _mm512_set1_ps(t.scale);
  for (int r = 0; r < t.rows; ++r) {
    _mm512_store_ps(t.s + r * t.lds, _mm512_mul_ps(_mm512_load_ps(c + r * 32), scale));
    _mm512_store_ps(t.s + r * t.lds + 16, _mm512_mul_ps(_mm512_load_ps(c + r * 32 + 16), scale));
  }
}

void qk_tile_32x32(const QkTile& t) {
  configure_tiles();
  if (t.rows > kTileRows)
    qk_rows<true>(t);
  else
    qk_rows<false>(t);
}

// O[r][0..32) = O[r][0..32) corr[r] + sum_{j < nkeys} P[r][j] V[j][..]: C = O (rescaled first when
// corr; a partial row tile through the scratch), then per 32 keys A (P) x B (the V panel's 16 word rows).
template <bool kTwo>
void pv_rows(const PvTile& t) {
  const bool direct = t.rows == kMR;  // C straight from and to O (rescaled there first when corr)
  float* c = t_scratch.c;
  const std::int64_t ldo = t.ldo * 4;
  if (direct) {
    if (t.corr)
      for (int r = 0; r < kMR; ++r) {
        const __m512 f = _mm512_set1_ps(t.corr[r]);
        _mm512_store_ps(t.o + r * t.ldo, _mm512_mul_ps(_mm512_load_ps(t.o + r * t.ldo), f));
        _mm512_store_ps(t.o + r * t.ldo + 16, _mm512_mul_ps(_mm512_load_ps(t.o + r * t.ldo + 16), f));
      }
    _tile_loadd(0, t.o, ldo);
    _tile_loadd(1, t.o + 16, ldo);
    if (kTwo) {
      _tile_loadd(2, t.o + 16 * t.ldo, ldo);
      _tile_loadd(3, t.o + 16 * t.ldo + 16, ldo);
    }
  } else {
    for (int r = 0; r < (kTwo ? kMR : kTileRows); ++r) {
      __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
      if (r < t.rows) {
        lo = _mm512_load_ps(t.o + r * t.ldo);
        hi = _mm512_load_ps(t.o + r * t.ldo + 16);
        if (t.corr) {
          const __m512 f = _mm512_set1_ps(t.corr[r]);
          lo = _mm512_mul_ps(lo, f);
          hi = _mm512_mul_ps(hi, f);
        }
      }
      _mm512_store_ps(c + r * 32, lo);
      _mm512_store_ps(c + r * 32 + 16, hi);
    }
    _tile_loadd(0, c, 128);
    _tile_loadd(1, c + 16, 128);
    if (kTwo) {
      _tile_loadd(2, c + 16 * 32, 128);
      _tile_loadd(3, c + 16 * 32 + 16, 128);
    }
  }
  const char* p = static_cast<const char*>(t.p);
  const char* v = static_cast<const char*>(t.v);
  const std::int64_t ldp = t.ldp * 2;
  for (std::int64_t j0 = 0; j0 < t.nkeys; j0 += 32) {
    const std::int64_t keys = t.nkeys - j0 < 32 ? t.nkeys - j0 : 32;  // even
    const char* panel = v + j0 * 64;  // word row j0 / 2, 128 bytes per word row
    if (keys < 32) {  // word rows beyond the keys zero
      for (int w = 0; w < kTileRows; ++w)
        for (int h = 0; h < 2; ++h)
          _mm512_store_si512(t_scratch.b + w * 64 + 32 * h,
                             2 * w < keys ? _mm512_load_si512(panel + w * 128 + 64 * h) : _mm512_setzero_si512());
      panel = reinterpret_cast<const char*>(t_scratch.b);
    }
    tile_step<kTwo>(p + j0 * 2, ldp, t.rows, keys * 2, panel);
  }
  if (direct) {
    _tile_stored(0, t.o, ldo);
    _tile_stored(1, t.o + 16, ldo);
    if (kTwo) {
      _tile_stored(2, t.o + 16 * t.ldo, ldo);
      _tile_stored(3, t.o + 16 * t.ldo + 16, ldo);
    }
    return;
  }
  _tile_stored(0, c, 128);
  _tile_stored(1, c + 16, 128);
  if (kTwo) {
    _tile_stored(2, c + 16 * 32, 128);
    _tile_stored(3, c + 16 * 32 + 16, 128);
  }
  for (int r = 0; r < t.rows; ++r) {
    _mm512_store_ps(t.o + r * t.ldo, _mm512_load_ps(c + r * 32));
    _mm512_store_ps(t.o + r * t.ldo + 16, _mm512_load_ps(c + r * 32 + 16));
  }
}

void pv_tile_32x32(const PvTile& t) {
  configure_tiles();
  if (t.rows > kTileRows)
    pv_rows<true>(t);
  else
    pv_rows<false>(t);
}

}  // namespace

const FlashKernels& amx_kernels() {
  static const FlashKernels k = [] {
    FlashKernels s = avx512bf16_kernels();  // packers, softmax, decode and backward kernels
    s.name = "amx";
    s.mr = kMR;
    s.qk_tile = qk_tile_32x32;
    s.pv_tile = pv_tile_32x32;
    s.pv_tile_rows = nullptr;  // avx512bf16's gives the bits of its own pv_tile, not the tiles'
    s.decode_qk_rows = amx_decode_qk_rows;
    s.decode_pv_rows = amx_decode_pv_rows;
    // int8 rows of calls of 16 rows or more as their bf16 products once per block, for the bf16 tiles
    // (G = 4: T = 4 1.05-1.3x, T = 8 1.45-1.65x, T = 16 1.3-1.6x faster than the integers form; at 8
    // rows slower; on the vector sets, whose int8 kernels are faster than their bf16 ones, slower at
    // every T: docs/performance.md, sessions 25 and 26).
    s.decode_int8_rows_to_bf16 = avx512bf16_decode_int8_rows_to_bf16;
    s.decode_int8_convert_rows = 16;
    s.decode_max_rows = kAmxDecodeMaxRows;
    s.decode_pv_step_keys = kAmxDecodePvKeys;
    // No overlap: with the tiles, its prefetches stalled the core more than they hid (T = 2 1.39x,
    // T = 16 1.24x faster without; docs/performance.md, session 20).
    s.decode_overlap_rows = 0;
    s.decode_packed_rows = 0;  // its own tiles take the rows (kAmxDecodeMaxRows a group)
    return s;
  }();
  amx::g_config_epoch.fetch_add(1, std::memory_order_relaxed);
  return k;
}

}  // namespace flashgqa
