// The AMX set's decode kernels (contract in microkernels.hpp): calls of kTileMinRows rows or more, on
// float K/V rows with H a multiple of 32 (up to kMaxHp), run on the tile unit; the rest, int8 rows
// included, go to the avx512bf16 vector kernels (the FMA ones where vdpbf16ps is half rate), at most
// kDecodeMaxRows rows a call. Compiled with the avx512bf16 flags plus -mamx-tile -mamx-bf16 (CMakeLists.txt), in the tile
// configuration of kernels_amx.cpp (all tiles 16 rows x 64 bytes); up to kAmxDecodeMaxRows (16) rows.
//
// Why: the decode path runs T >= 2 new tokens in row groups that each take the KV block again (from
// L2 after the first), and the vector kernels spend ~60 ns per key at 8 rows (H = 128) on a Sapphire
// Rapids core. A tdpbf16ps takes ~16 cycles whatever its shape (measured there), so the rows of a
// group cost the tile unit little, and a group can hold 16 rows, not 8:
//   Q.K as S^T = K Q^T: A is 16 K rows (64 bytes of each) loaded straight from bf16 rows (staged,
//     rounded to bf16, from others), B is Q^T (the word pairs of the Q rows as its columns, a
//     transpose in registers once per block: pieces of a block share it), C is 16 keys x 16 columns;
//     row r of S is column r of C (C transposed in registers, 16 keys at a time). Each key's logit is
//     computed on its own, so its bits do not depend on how the keys are cut into calls.
//   P.V as O = P V: A is P's 32 keys (a tile straight from P's rows for a whole step of 16 rows,
//     else staged with the keys past the call zero), B is the V rows of those 32 keys as word pairs
//     (interleaved here: vpunpck{l,h}wd, which leaves the columns of each 32 in the order 0-3, 8-11,
//     .., 4-7, 12-15, ..; O goes through a scratch in that order), C is O itself (4 tiles, 64 columns:
//     the columns go in groups of 64, each a pass over the call's keys). Steps of 32 keys of the call
//     (kAmxDecodePvKeys): a tdpbf16ps does not sum 32 keys as two 16-key steps would (checked on
//     Sapphire Rapids), so calls cut at multiples of 32 (the decode path cuts nowhere else:
//     FlashKernels::decode_pv_step_keys) give the bits of one call. Session 12 stepped 16 keys (half
//     of each A tile zero) to allow cuts at any page; 32 halved the tdpbf16ps and dropped P's copy.
// The operands, not their dtype, decide the bits: f16 and f32 rows take the tiles as the bf16 rows
// holding their rounded values do. Measured (docs/performance.md, sessions 12 and 20): with K/V in L2
// these kernels take ~10-11 ns per key at 8 rows, ~14 at 16 (the FMA ones ~60 at 8). Session 12 found
// the tiles slower than the vector kernels at 4 rows (T = 1 at G = 4) with K/V streaming from DRAM,
// and kept them for 8 rows or more; with 32-key P.V steps and S transposed in registers they are
// faster there too (page 16 1.19x, page 256 1.06x, dense 1.03x), so kTileMinRows is 4. At 1 and 2
// rows (G = 1, 2 at T = 1) the vector kernels stay ahead (dense 1.04-1.1x).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/aligned_buffer.hpp"
#include "core/dtype.hpp"
#include "kernels/amx_tiles.hpp"
#include "kernels/avx512_helpers.hpp"
#include "kernels/cpu_features.hpp"
#include "kernels/decode_pieces.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa {
namespace {

using amx::kTileBytes;
using amx::kTileRows;
constexpr int kMaxHp = 256;                 // the widest rows on the tile unit
constexpr int kMaxChunks = kMaxHp / 32;     // 32-column chunks of a row
constexpr int kKeys = 16;                   // keys per Q.K tile step
constexpr int kPvKeys = kAmxDecodePvKeys;   // keys per P.V tile step
constexpr int kTileMinRows = 4;  // fewer rows a call go to the vector kernels (the same for every dtype:
                                  // the operands, not the dtype, decide the bits)
using word_t = std::uint32_t __attribute__((may_alias));
// In pieces, the tiles prefetch the first line of the piece after next (step_rows): page 16 bf16 1.03x
// faster than the next one's (docs/performance.md, session 22).
constexpr int kPieceAhead = 2;
static_assert(kKeys == kDecodePieceKeys, "a tile step's keys lie in one piece");

// Float rows of a width the tiles take: 32-column chunks, an even count of them past 4 (qk_steps loads B
// two chunks at a time there). int8 rows take the vector kernels' integers form: the decode path gives
// the kernels int8 rows only for calls under 16 rows, and converts them to bf16 products from 16
// (flash_decode.cpp; an AMX-INT8 Q.K from 16 rows, session 21, was removed with that in session 26).
bool on_tiles(DType dtype, std::int64_t H, std::int64_t Hp) {
  return dtype != DType::i8 && H % 32 == 0 && H == Hp && H <= kMaxHp && H != 160 && H != 224;
}

// ---- Q.K ----

struct alignas(64) QkScratch {
  word_t qt[kMaxChunks][kTileRows][16];  // B per chunk: word w of Q row r at [w][r], columns >= rows zero
  std::uint16_t q[kTileRows][kMaxHp];       // the Q rows qt was built from
  int rows = 0, Hp = 0;                      // 0: qt not built
  // Staged K tiles (rows Hp apart): a partial last tile, zero padded, or rows of another dtype rounded
  // to bf16; four, so that a step's stores need not wait for the previous step's tile loads.
  alignas(64) std::uint16_t k[4][kTileRows * kMaxHp];
  alignas(64) float c[2][kTileRows][16];               // two C tiles: [key][row]
};
// A thread's scratch, by reference from a call the compiler cannot see through: with the
// thread_local itself in view it derived the address again (a __tls_get_addr call, PIC) inside the
// loops.
__attribute__((noinline)) QkScratch& qk_scratch() {
  thread_local QkScratch w;
  return w;
}

// Builds qt from the call's Q rows unless it holds them already (pieces of one block share them): per
// 32-column chunk, the transpose of the rows' 16 words (rows past the call's zero).
void load_q(const DecodeQk& t, QkScratch& w) {
  const auto* q = static_cast<const std::uint16_t*>(t.q);
  bool same = w.rows == t.rows && w.Hp == t.Hp;
  for (int r = 0; r < t.rows && same; ++r) same = std::memcmp(w.q[r], q + r * t.ldq, t.Hp * 2) == 0;
  if (same) return;
  for (int r = 0; r < t.rows; ++r) std::memcpy(w.q[r], q + r * t.ldq, t.Hp * 2);
  for (std::int64_t c = 0; c < t.Hp / 32; ++c) {
    __m512i x[16];
    for (int r = 0; r < kTileRows; ++r) x[r] = r < t.rows ? _mm512_loadu_si512(&w.q[r][32 * c]) : _mm512_setzero_si512();
    transpose16x16_epi32(x);
    for (int i = 0; i < 16; ++i) _mm512_store_si512(w.qt[c][i], x[i]);
  }
  w.rows = t.rows, w.Hp = static_cast<int>(t.Hp);
}

// S[r][j0 + i] = scale C[i][r] for the 16 keys of one stored C tile (transposed in registers, where
// 16 gathers took longer: docs/performance.md, session 20); columns at or past n zero.
inline void store_s(const DecodeQk& t, const float (*c)[16], std::int64_t j0) {
  __m512i x[16];
  for (int i = 0; i < 16; ++i) x[i] = _mm512_load_si512(c[i]);
  transpose16x16_epi32(x);
  const __m512 scale = _mm512_set1_ps(t.scale);
  const __mmask16 live = first_lanes16(t.n - j0);
  for (int r = 0; r < t.rows; ++r)
    _mm512_storeu_ps(t.s + r * t.lds + j0, _mm512_maskz_mul_ps(live, _mm512_castsi512_ps(x[r]), scale));
}

// The steps of the reduction for C tiles tmm0 (keys at a0) and, with kTwo, tmm1 (keys at a1): A in
// tmm2 and tmm3, B (Q^T chunk c) in tmm(4 + c) when resident, else loaded into tmm4 or tmm5. (GCC's
// tile intrinsics take literal register numbers, hence the macro.)
#define FLASHGQA_QK_STEP(B, c)                                 \
  do {                                                         \
    _tile_loadd(2, a0 + (c) * kTileBytes, ld0);                \
    if constexpr (kTwo) _tile_loadd(3, a1 + (c) * kTileBytes, ld1); \
    _tile_dpbf16ps(0, 2, B);                                   \
    if constexpr (kTwo) _tile_dpbf16ps(1, 3, B);               \
  } while (0)
template <int kNc, bool kTwo>
inline void qk_steps(const char* a0, std::int64_t ld0, const char* a1, std::int64_t ld1, const QkScratch& w) {
  if constexpr (kNc <= 4) {
    FLASHGQA_QK_STEP(4, 0);
    if constexpr (kNc > 1) FLASHGQA_QK_STEP(5, 1);
    if constexpr (kNc > 2) FLASHGQA_QK_STEP(6, 2);
    if constexpr (kNc > 3) FLASHGQA_QK_STEP(7, 3);
  } else {
    for (int c = 0; c < kNc; c += 2) {
      _tile_loadd(4, w.qt[c], kTileBytes);
      FLASHGQA_QK_STEP(4, c);
      _tile_loadd(5, w.qt[c + 1], kTileBytes);
      FLASHGQA_QK_STEP(5, c + 1);
    }
  }
}
#undef FLASHGQA_QK_STEP

// The A tile of keys [j, j + 16) (rows ldk bytes apart): straight from the rows when they are bf16
// and all there, else staged in w.k[slot] (rounded to bf16 as load32_bf16 does; rows at or past n
// zero).
struct KeyTile {
  const char* at;
  std::int64_t ld;  // bytes
};
inline KeyTile key_tile(const DecodeQk& t, std::int64_t ldk, std::int64_t j, QkScratch& w, int slot) {
  const char* rows = step_rows(t.k, t.k_pieces, ldk, j, t.n, true, kPieceAhead);
  if (t.k_dtype == DType::bf16 && j + kKeys <= t.n) return {rows, ldk};
  std::uint16_t* dst = w.k[slot];
  if (j + kKeys <= t.n) {  // 16 whole f16 or f32 rows
    with_whole_loads(t.k_dtype, [&](auto load) {
      for (int i = 0; i < kTileRows; ++i)
        for (std::int64_t h = 0; h < t.Hp; h += 32) _mm512_store_si512(dst + i * t.Hp + h, load(rows + i * ldk, h));
    });
    return {reinterpret_cast<const char*>(dst), t.Hp * 2};
  }
  for (int i = 0; i < kTileRows; ++i)
    for (std::int64_t h = 0; h < t.Hp; h += 32)
      _mm512_store_si512(dst + i * t.Hp + h,
                         j + i < t.n ? load32_bf16(rows + i * ldk, t.k_dtype, h, t.H) : _mm512_setzero_si512());
  return {reinterpret_cast<const char*>(dst), t.Hp * 2};
}

template <int kNc>
void qk_rows(const DecodeQk& t) {
  QkScratch& w = qk_scratch();
  load_q(t, w);
  const std::int64_t ldk = t.ldk * static_cast<std::int64_t>(dtype_size(t.k_dtype));
  if constexpr (kNc <= 4) {
    _tile_loadd(4, w.qt[0], kTileBytes);
    if constexpr (kNc > 1) _tile_loadd(5, w.qt[1], kTileBytes);
    if constexpr (kNc > 2) _tile_loadd(6, w.qt[2], kTileBytes);
    if constexpr (kNc > 3) _tile_loadd(7, w.qt[3], kTileBytes);
  }
  std::int64_t j = 0;
  for (int step = 0; j + 2 * kKeys <= t.n; j += 2 * kKeys, ++step) {
    const KeyTile a0 = key_tile(t, ldk, j, w, 2 * (step & 1)), a1 = key_tile(t, ldk, j + kKeys, w, 2 * (step & 1) + 1);
    _tile_zero(0);
    _tile_zero(1);
    qk_steps<kNc, true>(a0.at, a0.ld, a1.at, a1.ld, w);
    _tile_stored(0, w.c[0], kTileBytes);
    _tile_stored(1, w.c[1], kTileBytes);
    store_s(t, w.c[0], j);
    store_s(t, w.c[1], j + kKeys);
  }
  for (; j < t.n; j += kKeys) {
    const KeyTile a = key_tile(t, ldk, j, w, 0);
    _tile_zero(0);
    qk_steps<kNc, false>(a.at, a.ld, a.at, a.ld, w);
    _tile_stored(0, w.c[0], kTileBytes);
    store_s(t, w.c[0], j);
  }
}

// ---- P.V ----

struct alignas(64) PvScratch {
  float o[kTileRows][kMaxHp];           // O rows, each 32 columns in the order of the B tiles
  // Two of each, for alternate steps: a step's stores then need not wait for the previous step's
  // tile loads to read the same lines (2x faster measured).
  std::uint16_t a[2][kTileRows][32];     // A when staged: P's 32 keys of each row
  std::uint16_t b[2][4][kTileRows][32];  // B: word row i the V pairs of keys 2i, 2i + 1
  // With DecodePv::keep_v, every step's B tiles instead ([pass][step][4]), for calls with same_v.
  AlignedBuffer kept;
  const void* kept_v = nullptr;  // what they were formed from (checked again with same_v)
  std::int64_t kept_n = -1, kept_nkeys = -1, kept_Hp = -1;
};
using BTiles = std::uint16_t[4][kTileRows][32];
__attribute__((noinline)) PvScratch& pv_scratch() {  // (as qk_scratch)
  thread_local PvScratch w;
  return w;
}

// One pass over the call's keys for the columns [h0, h0 + 32 kBlocks) (C tiles tmm0 .. tmm(2 kBlocks - 1)),
// in steps of kPvKeys keys of the call.
// kept: the call's B tiles of this pass, one BTiles per step (formed here unless `formed`), or null
// (formed in w.b).
template <int kBlocks>
void pv_columns(const DecodePv& t, PvScratch& w, std::int64_t h0, BTiles* kept, bool formed) {
  constexpr std::int64_t kLdo = kMaxHp * 4;
  _tile_loadd(0, &w.o[0][h0], kLdo);
  _tile_loadd(1, &w.o[0][h0 + 16], kLdo);
  if constexpr (kBlocks > 1) {
    _tile_loadd(2, &w.o[0][h0 + 32], kLdo);
    _tile_loadd(3, &w.o[0][h0 + 48], kLdo);
  }
  const auto* p = static_cast<const std::uint16_t*>(t.p);
  const std::int64_t esize = static_cast<std::int64_t>(dtype_size(t.v_dtype)), ldv = t.ldv * esize;
  const std::int64_t have = t.n < t.nkeys ? t.n : t.nkeys;
  // 32 columns [h0 + 32 c, ..) of a V row, as bf16 (rounded as load32_bf16 does).
  const auto load = [&](const char* row, int c) {
    return t.v_dtype == DType::bf16 ? _mm512_loadu_si512(row + (h0 + 32 * c) * 2)
                                    : load32_bf16(row, t.v_dtype, h0 + 32 * c, t.H);
  };
  for (std::int64_t j0 = 0; j0 < t.nkeys; j0 += kPvKeys) {
    const int slot = static_cast<int>(j0 / kPvKeys) & 1;
    auto& b = kept != nullptr ? kept[j0 / kPvKeys] : w.b[slot];
    // A: P's keys [j0, j0 + 32) of each row, straight from P when the call has them all for 16 rows.
    const void* a = p + j0;
    std::int64_t lda = t.ldp * 2;
    if (t.rows < kTileRows || j0 + kPvKeys > t.nkeys) {
      const __mmask32 live = t.nkeys - j0 >= 32 ? ~__mmask32(0) : (__mmask32(1) << (t.nkeys - j0)) - 1;
      for (int r = 0; r < t.rows; ++r)
        _mm512_store_si512(w.a[slot][r], _mm512_maskz_loadu_epi16(live, p + r * t.ldp + j0));
      a = w.a[slot], lda = kTileBytes;
    }
    // B: word row i the pairs of keys j0 + 2i, j0 + 2i + 1 (zero rows past the keys read), unless an
    // earlier call formed it.
    if (!formed && j0 + kPvKeys <= have) {  // the common step: 32 whole rows, two pieces
      with_whole_loads(t.v_dtype, [&](auto load) {
        for (int half = 0; half < 2; ++half) {
          const char* rows = step_rows(t.v, t.v_pieces, ldv, j0 + kKeys * half, t.n, h0 == 0, kPieceAhead);
          for (int i = 0; i < kKeys / 2; ++i) {
            const char* ra = rows + 2 * i * ldv;
            for (int c = 0; c < kBlocks; ++c) {
              const __m512i x = load(ra, h0 + 32 * c), y = load(ra + ldv, h0 + 32 * c);
              _mm512_store_si512(b[2 * c][8 * half + i], _mm512_unpacklo_epi16(x, y));
              _mm512_store_si512(b[2 * c + 1][8 * half + i], _mm512_unpackhi_epi16(x, y));
            }
          }
        }
      });
    } else if (!formed) {
      const std::int64_t pairs = (have - j0 + 1) / 2;  // > 0: keys j0.. are read, up to 31 of them
      for (std::int64_t i = 0; i < kPvKeys / 2; ++i) {
        const std::int64_t j = j0 + 2 * i;
        if (i < pairs) {
          const char* ra = step_rows(t.v, t.v_pieces, ldv, j, t.n, h0 == 0 && j % kKeys == 0);
          for (int c = 0; c < kBlocks; ++c) {
            const __m512i x = load(ra, c);
            const __m512i y = j + 1 < have ? load(ra + ldv, c) : _mm512_setzero_si512();
            _mm512_store_si512(b[2 * c][i], _mm512_unpacklo_epi16(x, y));
            _mm512_store_si512(b[2 * c + 1][i], _mm512_unpackhi_epi16(x, y));
          }
        } else {
          for (int c = 0; c < 2 * kBlocks; ++c) _mm512_store_si512(b[c][i], _mm512_setzero_si512());
        }
      }
    }
    _tile_loadd(4, a, lda);
    _tile_loadd(5, b[0], kTileBytes);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, b[1], kTileBytes);
    _tile_dpbf16ps(1, 4, 6);
    if constexpr (kBlocks > 1) {
      _tile_loadd(7, b[2], kTileBytes);
      _tile_dpbf16ps(2, 4, 7);
      _tile_loadd(5, b[3], kTileBytes);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, &w.o[0][h0], kLdo);
  _tile_stored(1, &w.o[0][h0 + 16], kLdo);
  if constexpr (kBlocks > 1) {
    _tile_stored(2, &w.o[0][h0 + 32], kLdo);
    _tile_stored(3, &w.o[0][h0 + 48], kLdo);
  }
}

void pv_rows(const DecodePv& t) {
  PvScratch& w = pv_scratch();
  const __m512i to0 = to_unpacked_columns(0), to1 = to_unpacked_columns(1);
  for (int r = 0; r < t.rows; ++r) {  // O corr into the scratch, in the tiles' column order
    const __m512 f = _mm512_set1_ps(t.corr != nullptr ? t.corr[r] : 1.0f);
    for (std::int64_t h = 0; h < t.Hp; h += 32) {
      __m512 lo = _mm512_load_ps(t.o + r * t.ldo + h), hi = _mm512_load_ps(t.o + r * t.ldo + h + 16);
      if (t.corr != nullptr) lo = _mm512_mul_ps(lo, f), hi = _mm512_mul_ps(hi, f);
      _mm512_store_ps(&w.o[r][h], _mm512_permutex2var_ps(lo, to0, hi));
      _mm512_store_ps(&w.o[r][h + 16], _mm512_permutex2var_ps(lo, to1, hi));
    }
  }
  // The B tiles kept for the next calls (keep_v), or those kept by the previous one (same_v).
  const std::int64_t steps = (t.nkeys + kPvKeys - 1) / kPvKeys, passes = (t.Hp + 63) / 64;
  const void* v = t.v_pieces != nullptr ? static_cast<const void*>(t.v_pieces) : t.v;
  const bool formed = t.same_v && w.kept_v == v && w.kept_n == t.n && w.kept_nkeys == t.nkeys && w.kept_Hp == t.Hp;
  BTiles* kept = nullptr;
  if (formed || t.keep_v) {
    const std::size_t bytes = static_cast<std::size_t>(passes * steps) * sizeof(BTiles);
    if (!formed && w.kept.bytes() < bytes) w.kept.reset(bytes);
    kept = w.kept.as<BTiles>();
    w.kept_v = v, w.kept_n = t.n, w.kept_nkeys = t.nkeys, w.kept_Hp = t.Hp;
  } else {
    w.kept_v = nullptr;
  }
  std::int64_t h = 0;
  for (; h + 64 <= t.Hp; h += 64) pv_columns<2>(t, w, h, kept ? kept + h / 64 * steps : nullptr, formed);
  if (h < t.Hp) pv_columns<1>(t, w, h, kept ? kept + h / 64 * steps : nullptr, formed);
  const __m512i from0 = from_unpacked_columns(0), from1 = from_unpacked_columns(1);
  for (int r = 0; r < t.rows; ++r)
    for (std::int64_t c = 0; c < t.Hp; c += 32) {
      const __m512 x = _mm512_load_ps(&w.o[r][c]), y = _mm512_load_ps(&w.o[r][c + 16]);
      _mm512_store_ps(t.o + r * t.ldo + c, _mm512_permutex2var_ps(x, from0, y));
      _mm512_store_ps(t.o + r * t.ldo + c + 16, _mm512_permutex2var_ps(x, from1, y));
    }
}

// The vector kernels, for what the tiles do not take: the FMA ones where vdpbf16ps is half rate, on
// at most kDecodeMaxRows rows a call (each row's results are its own: the same bits either way).
void vector_qk_rows(DecodeQk t) {
  const auto kernel = bf16_dot_half_rate() ? avx512bf16_fma_decode_qk_rows : avx512bf16_decode_qk_rows;
  for (int rows = t.rows; rows > 0; rows -= kDecodeMaxRows) {
    t.rows = rows < kDecodeMaxRows ? rows : kDecodeMaxRows;
    kernel(t);
    t.s += kDecodeMaxRows * t.lds;
    t.q = static_cast<const std::uint16_t*>(t.q) + kDecodeMaxRows * t.ldq;
  }
}
void vector_pv_rows(DecodePv t) {
  const auto kernel = bf16_dot_half_rate() ? avx512bf16_fma_decode_pv_rows : avx512bf16_decode_pv_rows;
  for (int rows = t.rows; rows > 0; rows -= kDecodeMaxRows) {
    t.rows = rows < kDecodeMaxRows ? rows : kDecodeMaxRows;
    kernel(t);
    t.o += kDecodeMaxRows * t.ldo;
    t.p = static_cast<const std::uint16_t*>(t.p) + kDecodeMaxRows * t.ldp;
    if (t.corr != nullptr) t.corr += kDecodeMaxRows;
  }
}

}  // namespace

void amx_decode_qk_rows(const DecodeQk& t) {
  if (t.rows < kTileMinRows || !on_tiles(t.k_dtype, t.H, t.Hp)) return vector_qk_rows(t);
  amx::configure_tiles();
  switch (t.Hp / 32) {
    case 1: return qk_rows<1>(t);
    case 2: return qk_rows<2>(t);
    case 3: return qk_rows<3>(t);
    case 4: return qk_rows<4>(t);
    case 6: return qk_rows<6>(t);
    default: return qk_rows<8>(t);
  }
}

void amx_decode_pv_rows(const DecodePv& t) {
  if (t.rows < kTileMinRows || !on_tiles(t.v_dtype, t.H, t.Hp)) return vector_pv_rows(t);
  amx::configure_tiles();
  pv_rows(t);
}

}  // namespace flashgqa
