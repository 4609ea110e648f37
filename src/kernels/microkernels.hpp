// The micro-kernels and their contract. One set per instruction set, each in its own translation unit
// with its own compiler flags (kernels_<isa>.cpp); kernels_for() below is the one place that chooses
// between them. Blocking, threading, masking and packing policy live in portable C++ (the flash paths
// in src/flash/, the ladder's rungs through src/ladder/rung_kernels.cpp, the backward in
// src/backward/); the kernels only touch the small tiles described here.
//
// ---------------------------------------------------------------------------------------------------
// Contract
//
// Two operand families; a kernel set implements exactly one (FlashKernels::operand_bytes):
//   bf16 pairs (2 bytes): operands are bfloat16 bit patterns, stored so that the two values a
//              `vdpbf16ps` (or BFDOT, or tdpbf16ps) lane multiplies together (consecutive along the
//              reduction dimension) sit in one 32-bit word. Used by avx512bf16, amx and neon-bf16 for
//              Precision::bf16.
//   fp32 (4 bytes):  operands are floats. Under Precision::bf16 they hold bf16-rounded values (exact
//              in fp32); under Precision::f32 the input values themselves. Used by avx512f, avx2,
//              neon, portable, and by every set for Precision::f32.
//
// Sizes: Hp = H rounded up to kHTile; a KV block of n keys is padded to npad = n rounded up to
// kPanelKeys. Padding is always zeros (never garbage: 0 * NaN would poison a row).
//
// Layouts (element = one operand, 2 or 4 bytes; "word" = 32 bits):
//   Q rows   [rows][ldq]   row r holds q[r][0..Hp), natural order (so bf16 pairs along h are words).
//   K panel  kPanelKeys keys x Hp, one panel after another (panel c = keys 32c..32c+31):
//              bf16:  [Hp/2][32][2]  word (p, j) = (k[j][2p], k[j][2p+1])
//              fp32:  [Hp][32]       k[j][h] at h*32 + j
//   V panel  one per h tile of kHTile columns, each covering npad keys; panel c at c*npad*32 elements:
//              bf16:  [npad/2][32][2] word (i, c') = (v[2i][32c+c'], v[2i+1][32c+c'])
//              fp32:  [npad][32]      v[j][32c+c'] at j*32 + c'
//   S tile   [rows][lds] fp32 logits.
//   P tile   [rows][ldp] softmax weights in the operand type (bf16: rounded to nearest even, pairs
//            along keys are words; fp32: bf16-rounded values when round_p, else exact).
//   O rows   [rows][ldo] fp32 accumulators, Hp columns.
//
// Register tile: MR = FlashKernels::mr rows by 32 columns (keys for qk_tile, h for pv_tile). Every
// tile kernel takes rows in [1, MR] (the last row tile of a block is partial); columns are always a
// full 32 because the packed operands are zero padded. Leading dimensions are in elements and every
// buffer the policy passes is 64-byte aligned with 64-byte multiple leading dimensions.
// MR per set: avx512bf16 12 (24 zmm accumulators), amx 32 (four 16x16 accumulator tiles), avx512f 12,
// avx2 6 (as two 6x16 halves), neon and neon-bf16 5 (as two 5x16 halves), portable 8.
// vdpbf16ps, tdpbf16ps, vcvtne2ps2bf16 and BFDOT treat bf16/fp32 subnormals as zero: differences below 2^-126 in an
// operand or a weight are allowed (the tests bound them).
//
//   qk_tile:      S[r][0..32) = scale * sum_{h<Hp} Q[r][h] K[j][h]       (overwrites; fp32 accumulate)
//   pv_tile:      O[r][0..32) = O[r][0..32) * corr[r] + sum_{j<nkeys} P[r][j] V[j][c]
//                 (corr null: no rescale; nkeys even, <= npad; accumulate into O)
//   pv_tile_rows: (optional: null in a set that has none) pv_tile on the h tile at column h0 of the V
//                 panels pack_v would write from the PackSource v, with V's rows read where they lie
//                 instead (src or pieces; keys j >= v.n read as zeros, columns >= v.H as zeros): the
//                 bits of pack_v then this set's pv_tile, with no packed copy. nkeys even,
//                 <= round_up(v.n, 2). The decode path's packed blocks use it where a set has it.
//   softmax_tile: for each row r, over the keys j < n of the S tile, the keys outside [lo[r], hi[r])
//                 masked (0 <= lo[r], hi[r] <= n; lo[r] >= hi[r] masks the whole row; lo and hi both
//                 null: none masked). Masked entries of S are never read as values (the policy may
//                 leave them unwritten). m_new = max(m[r], max_j S[r][j]) over the unmasked j;
//                 P[r][j] = exp(S[r][j] - m_new) for unmasked j, exactly 0 for masked j;
//                 l[r] = l[r] * corr[r] + sum_j P[r][j] (summed in fp32 before rounding P);
//                 corr[r] = exp(m[r] - m_new), m[r] = m_new. A row whose m_new is -inf uses 0 in place
//                 of m_new (so masked-so-far rows give corr 0, P 0, never NaN). Returns whether any
//                 corr[r] != 1 (whether the O rows must be rescaled). NaN logits are not dropped:
//                 exp(NaN) is NaN and reaches P and l.
//   exp_n:        dst[i] = exp(src[i]) with the vectorised polynomial the softmax uses (the rungs' and
//                 the backward's exps).
//                 Relative error <= kExpMaxRelError + |x| 2^-23 for results above 2^-126 (the second
//                 term is x log2(e) in fp32: the rounding of the product and of log2(e) itself, the
//                 size of a rounding of the logit, which the tolerances already count);
//                 0 below about 2^-150; exp(0) = 1 exactly; exp(-inf) = 0; NaN stays NaN.
//   softcap_n:    x[i] = cap tanh(x[i] / cap), in place (the logit softcap; cap > 0 with 1/cap a
//                 finite float). y = x * (1/cap) (1/cap rounded to fp32), t = tanh(y) by the rational
//                 of tanh_poly.hpp, result cap * t. |t - tanh(y)| <= kTanhMaxRelError |tanh(y)|; y's two
//                 roundings (2^-23 |y|) move tanh by at most (1 - t^2) |y| 2^-23 <= |tanh(y)| 2^-23, and
//                 the product adds u32, so |result - cap tanh(x / cap)| <= |result| (kTanhMaxRelError
//                 + 3 * 2^-24) (within 2^-22 of c tanh(x/c) relative to it). tanh(y) = y for tiny y; NaN
//                 stays NaN; +-inf gives +-cap (within the bound). The policies apply it to the S tile
//                 between qk_tile (or decode_qk_rows) and softmax_tile when Problem::softcap is set, to
//                 the columns some row may see (softmax_tile then masks as always); never otherwise, so
//                 calls without a softcap run exactly the code and bits they ran before.
//
// Packing (each reads rows of q/k/v in any dtype; with round_bf16 the values are rounded to nearest
// even bf16 exactly as round_to_bf16 in core/dtype.hpp does):
//   pack_q_row:   dst[0..Hp) <- src[0..H), zero padded.
//   pack_k:       K panels for keys 0..n of src (key j at src + j*ld elements), npad/32 panels.
//   pack_v:       V panels for keys 0..n of src, Hp/32 panels of npad keys.
//
// Decode kernels (optional: null in a set that has none; the policy then takes the packed path).
// For tasks whose rows fit one small tile (G*T <= kDecodeMaxRows, src/flash/flash_decode.cpp): K and V
// are read straight from their source rows (any dtype, rounded to bf16 as the packers do, ld elements
// between keys), whole rows in address order, never packed; the bf16-pair family only (Q rows as
// pack_q_row writes them, P as softmax_tile writes it; Q and O 64-byte aligned with ldq, ldo multiples
// of 32). The decode path takes its set from decode_kernels_for(): a bf16-pair path's own set, or for
// avx512f and avx2 (fp32 family) avx512f_decode_kernels() and avx2_decode_kernels(), bf16-pair sets of
// their own that only decode. `rows` is
// 1..decode_max_rows (kDecodeMaxRows; amx: kAmxDecodeMaxRows, its row groups). The kernels issue no
// software prefetch: reading the rows line after line lets the hardware prefetchers run the stream
// (docs/performance.md, decode I); the policy prefetches where they cannot (small pages it gathers,
// the overlap of flash_decode.cpp, and each phase's first rows and int8 scales a phase early). A set
// with decode_row_pieces also takes bf16 and int8 rows in pieces of kDecodePieceKeys keys, each at its
// own address (k_pieces, v_pieces; int8 scales where they always are, k_scale/v_scale; the pieces of
// one call give the bits of the same rows together), and
// there, as each piece starts, prefetches a piece ahead into L2, as the hardware prefetchers do not
// cross into it (decode_pieces.hpp: on the vector kernels, AVX-512 and avx2, every line of the next
// piece and the first line of the one after it, on the amx tiles the first line of the piece after
// next).
// The AVX-512 and avx2 sets' int8 P.V in the integers form prefetches the V rows of its next
// kDecodeInt8AheadKeys keys, which its passes read out of order (avx2: on dense rows), and their int8
// Q.K on dense rows the K rows kDecodeInt8AheadKeys keys on as each 16 keys start (on Intel cores the
// avx512bf16 set's fma kernels prefetch each such line as they first load the line kDecodeInt8AheadKeys
// keys before it instead, and the FmaPairs kernels (those and avx512f's) each bf16 line ~8 KiB on,
// session 41; int8's in-cache time
// per byte is twice bf16's, and the hardware prefetchers alone left part of each row's DRAM time
// exposed; on the avx2 set the same prefetches of bf16 rows were slower, session 36); the avx2 set's
// bf16 P.V on dense rows prefetches the next group's V rows spread over the current group's passes
// (session 37); the policy
// prefetches the first keys of every call a phase early (flash_decode.cpp). The amx set's
// kernels (kernels_amx_decode.cpp) run calls of 4 rows or more on the tile unit, whose tiles read 16
// K rows a column chunk at a time (not address order) and sum P V per 32 keys of the call (below).
//   decode_qk_rows: S[r][j] = scale * sum_{h<H} Q[r][h] K[j][h] for j < n, S[r][j] = 0 for
//                   n <= j < round_up(n, 16) (overwrites; fp32 accumulate in the kernel's own fixed
//                   order; lds >= round_up(n, 16)).
//   decode_pv_rows: O[r][h] = O[r][h] * corr[r] + sum_{j<nkeys} P[r][j] V[j][h] for h < Hp (corr null:
//                   no rescale; nkeys even, <= round_up(n, 2); keys j >= n are not read and count
//                   as zero rows; V is zero past H, and a set may leave those products out, which only
//                   a NaN or infinite weight (or a -0 in O) would tell apart, in O's columns [H, Hp)
//                   that are never output; each O element accumulates its keys in increasing j: one by one,
//                   or on the amx tiles in steps of 32 keys of the call (kAmxDecodePvKeys), each step's
//                   sum as tdpbf16ps forms it, so calls cut at multiples of the set's
//                   decode_pv_step_keys give the bits of one).
// The operands decide the bits: a bf16 or f16 row gives the bits of the f32 row holding its bf16
// operands (each set takes the same path for every float dtype).
// int8 rows (the KV-cache API's quantized cache, x_j the int8 row of key j, s_j = scale[j * ld_scale];
// scale is null for the float dtypes), in one of two forms, as the set's int8_on_integers says:
//   products (false): key j's operand is the fp32 product x_j[h] * s_j, rounded to bf16
//     (vcvtne2ps2bf16 or BFCVT, nearest even; a subnormal product may flush to zero, within the
//     subnormal allowance above): the value a float32 row holding that product would give.
//   integers (true: avx512bf16, which requires AVX512_VNNI, on vpdpwssd; avx2 on vpmaddwd; amx as
//     avx512bf16; all the same bits):
//     nothing is rounded before the sums, which are exact int32.
//     decode_qk_rows (H <= 256; wider rows, whose sums could pass 2^31, take the products form): each Q row is quantized once per call against its largest |q|, m:
//       q_int[h] = round(q[h] * fl(32767 / m)) (int16, nearest even; all 0 when m = 0), and
//       S[r][j] = fl(fl(float(sum_h q_int[h] x_j[h]) * fl(scale * fl(m / 32767))) * s_j).
//       A call whose Q rows hold a NaN or an infinity, or a row with 0 < m < kI16MinQ (2^-100), takes
//       the products form.
//     decode_pv_rows: per row and group of 16 keys (keys 0..15, 16..31, ... of the call):
//       w_j = fl(P[r][j] * s_j) (0 for keys j >= n), W = max |w_j|, q_j = round(w_j * fl(32767 / W))
//       (int16; 0 when W = 0), and each O element becomes fma(fl(W / 32767), float(sum_j q_j x_j[h]), O).
//       A group with a NaN or infinite w_j, or with 0 < W < 2^-100, adds fma(w_j, float(x_j[h]), O)
//       key by key instead. Groups start at multiples of 16 keys of the call, so calls cut at
//       multiples of 16 (pages, the overlap's pieces) give the bits of one call.
//     The error these add is in reference/tolerance.hpp (ExtraError).
//
// Backward kernel (optional, bf16-pair family only: null in a set that has none; then
// src/backward/flash_backward.cpp runs exp_n, its own elementwise loop and pack_v / pack_q_row).
//   softmax_grad_pack: the backward's elementwise step and its three packs in one pass over S and dP
//                   tiles ([rows][lds] fp32, n keys, n a multiple of kPanelKeys; rows >= 1) of rows
//                   that start at an even row r0 of their q block. For row r and key j in [lo[r], hi[r])
//                   (0 <= lo, hi <= n; lo >= hi: none):
//                     P[r][j] = exp(S[r][j] - lse[r])  (fp32 subtraction, then exp_n's polynomial)
//                     dS[r][j] = P[r][j] * (dP[r][j] - D[r])   (fp32)
//                   and P = dS = 0 outside [lo, hi) (S and dP there are not read as values). Writes,
//                   every value rounded to nearest even bf16 as softmax_tile rounds P (vcvtne2ps2bf16:
//                   values below 2^-126 become 0, which the subnormal note above allows; so its bits
//                   may differ from the fallback's there):
//                     pt: P as pack_v writes it for the q block's rows, rows r0.. of it: pt points at
//                         row r0 of panel 0 (the words of rows r0 + 2i and r0 + 2i + 1 at 64 i
//                         elements), panel c (keys 32c..32c+31) at c * panel_stride elements; rows
//                         rows..rows_out (rows_out >= rows, even) are written as zeros (the q block's
//                         padding rows);
//                     dst: dS the same way;
//                     dsr: dS rows [rows][lddsr] as pack_q_row writes them (n columns).
// ---------------------------------------------------------------------------------------------------
#pragma once

#include <atomic>
#include <cstdint>

#include "core/int_math.hpp"
#include "flashgqa/flashgqa.hpp"
#include "kernels/cpu_features.hpp"

namespace flashgqa {

constexpr int kPanelKeys = 32;  // keys per K panel (qk_tile's NR); KV blocks are padded to a multiple
constexpr int kHTile = 32;      // columns per V panel (pv_tile's NR); H is padded to a multiple
constexpr int kMaxTileRows = 32;  // the largest FlashKernels::mr (amx's)
// npad: a KV block of n keys as packed (zero padded to whole panels).
constexpr std::int64_t padded_keys(std::int64_t n) { return round_up(n, kPanelKeys); }
// The bound exp_n and softmax_tile's exp meet (tested in microkernels_test.cpp).
constexpr double kExpMaxRelError = 2.5e-7;
// The bound softcap_n's tanh meets, relative to tanh (tested in microkernels_test.cpp).
constexpr double kTanhMaxRelError = 0x1p-21;

struct QkTile {
  float* s;  // S tile, row stride lds
  std::int64_t lds;
  const void* q;  // Q rows, row stride ldq (elements)
  std::int64_t ldq;
  const void* k;    // one K panel
  std::int64_t Hp;  // reduction depth, a multiple of kHTile
  float scale;
  int rows;  // 1..mr
};

struct PvTile {
  float* o;  // O rows at the h tile's first column, row stride ldo
  std::int64_t ldo;
  const void* p;  // P tile, row stride ldp (elements)
  std::int64_t ldp;
  const void* v;       // the h tile's V panel
  std::int64_t nkeys;  // even, <= npad
  const float* corr;   // [rows] rescale factors, or null
  int rows;            // 1..mr
};

struct SoftmaxTile {
  const float* s;  // S tile [rows][lds]
  std::int64_t lds;
  void* p;  // P tile [rows][ldp] (operand type)
  std::int64_t ldp;
  float* m;                   // [rows] running max, in/out
  float* l;                   // [rows] running denominator, in/out
  float* corr;                // [rows] out
  const std::int32_t* lo;     // [rows] keys j < lo[r] are masked, or null (with hi)
  const std::int32_t* hi;     // [rows] keys j >= hi[r] are masked, or null (with lo)
  std::int64_t n;             // keys in the tile, a multiple of kPanelKeys
  int rows;                   // 1..mr
  bool round_p;               // fp32 family: round P to bf16 (Precision::bf16)
};

struct PackSource {
  const void* src;  // first row (q row, or key 0 of the block)
  DType dtype;
  std::int64_t ld;  // elements between keys (pack_k/pack_v)
  std::int64_t n;   // keys (pack_k/pack_v)
  std::int64_t H, Hp;
  bool round_bf16;
  // Or (pack_k/pack_v, every set; the decode path's packed blocks) key j's row at
  // pieces[j / kDecodePieceKeys] + (j % kDecodePieceKeys) * ld elements, src unused (packed_key_row).
  const void* const* pieces = nullptr;
};

struct PvRowsTile {
  float* o;  // O rows at the h tile's first column, row stride ldo
  std::int64_t ldo;
  const void* p;  // P tile, row stride ldp (elements)
  std::int64_t ldp;
  PackSource v;         // V's rows, as pack_v takes them (n keys, H, Hp)
  std::int64_t h0;      // the h tile's first column, a multiple of kHTile
  std::int64_t nkeys;   // even, <= round_up(v.n, 2)
  const float* corr;    // [rows] rescale factors, or null
  int rows;             // 1..mr
};

// Decode (see the contract above).
constexpr int kDecodeMaxRows = 8;
// Keys per piece of a decode call's pieces (DecodeQk::k_pieces, DecodePv::v_pieces).
constexpr int kDecodePieceKeys = 16;
// How far ahead the AVX-512 and avx2 int8 decode kernels prefetch dense rows (see the contract above).
constexpr int kDecodeInt8AheadKeys = 32;

// Key j's row of a pack source whose elements are esize bytes: at src, or in its piece (PackSource::pieces).
inline const void* packed_key_row(const PackSource& s, std::int64_t j, std::int64_t esize) {
  if (s.pieces != nullptr)
    return static_cast<const char*>(s.pieces[j / kDecodePieceKeys]) + (j % kDecodePieceKeys) * s.ld * esize;
  return static_cast<const char*>(s.src) + j * s.ld * esize;
}

constexpr int kAmxDecodeMaxRows = 16;
// Keys per step of the amx set's P.V tiles: one tdpbf16ps sums 32 keys (FlashKernels::decode_pv_step_keys).
constexpr int kAmxDecodePvKeys = 32;
// The integers form's Q.K: a call with a Q row whose largest |q| is below this takes the products form
// (the factor 32767 / max|q| would overflow fp32 below about 2^-113).
constexpr float kI16MinQ = 0x1p-100f;

struct DecodeQk {
  float* s;  // [rows][lds] fp32 logits
  std::int64_t lds;
  const void* q;  // [rows][ldq] bf16 Q rows (pack_q_row)
  std::int64_t ldq;
  const void* k;  // key 0 of the block
  DType k_dtype;
  std::int64_t ldk;  // elements between keys
  std::int64_t n;    // keys
  std::int64_t H, Hp;
  float scale;
  int rows;  // 1..the set's decode_max_rows
  const float* k_scale = nullptr;  // int8 K: key j's scale at k_scale[j * ld_scale]; else null
  std::int64_t ld_scale = 0;
  // Where the set has decode_row_pieces and the rows are bf16 or int8: key j's row at
  // k_pieces[j / kDecodePieceKeys] + (j % kDecodePieceKeys) * ldk elements (k unused); else null.
  const void* const* k_pieces = nullptr;
  // Hint, the same bits either way: rows read after these (key j's at k_ahead + j * ldk elements, in
  // the dtype and layout of the rows here), which a set may prefetch as it reads key j; or null. The
  // avx2 set's calls per piece set it to a later piece of the call (kernels_avx2_decode_qk.cpp).
  const void* k_ahead = nullptr;
};

struct DecodePv {
  float* o;  // [rows][ldo] fp32 accumulators, Hp columns
  std::int64_t ldo;
  const void* p;  // [rows][ldp] bf16 weights, pairs along keys are words
  std::int64_t ldp;
  const void* v;  // key 0 of the block
  DType v_dtype;
  std::int64_t ldv;    // elements between keys
  std::int64_t n;      // keys that may be read
  std::int64_t nkeys;  // keys to accumulate: even, <= round_up(n, 2)
  std::int64_t H, Hp;
  const float* corr;  // [rows] rescale factors, or null
  int rows;           // 1..the set's decode_max_rows
  const float* v_scale = nullptr;  // int8 V: key j's scale at v_scale[j * ld_scale]; else null
  std::int64_t ld_scale = 0;
  // As DecodeQk::k_pieces: key j's row at v_pieces[j / kDecodePieceKeys] + (j % kDecodePieceKeys) * ldv.
  const void* const* v_pieces = nullptr;
  // Hints, the same bits either way (the decode path's row groups, which take one block in turn):
  // keep_v: the next call on this thread may set same_v, so a set may keep what it forms from the V
  // rows; same_v: the V operands (v or v_pieces and the rows there, v_dtype, ldv, n, nkeys, H, Hp,
  // v_scale) are those of the previous call on this thread, which had keep_v.
  bool keep_v = false, same_v = false;
};

// The backward's elementwise step and packs (see the contract above).
struct SoftmaxGradTile {
  const float* s;  // S tile [rows][lds] (logits, scale applied)
  const float* dp;  // dP tile [rows][lds]
  std::int64_t lds;
  const float* lse;  // [rows]
  const float* D;    // [rows] rowsum(dO * O)
  const std::int32_t* lo;  // [rows] first visible key
  const std::int32_t* hi;  // [rows] one past the last visible key
  std::int64_t n;          // keys, a multiple of kPanelKeys
  void* pt;                // P as V panels over the rows, at row r0
  void* dst;               // dS as V panels over the rows, at row r0
  std::int64_t panel_stride;  // elements between two key panels of pt (and of dst)
  void* dsr;               // dS rows [rows][lddsr] (operand type)
  std::int64_t lddsr;
  int rows;
  int rows_out;            // rows of pt and dst written (>= rows, even; the extra ones zero)
};

struct FlashKernels {
  const char* name;
  int operand_bytes;  // 2: bf16 pairs, 4: fp32
  int mr;             // rows per register tile
  void (*qk_tile)(const QkTile& t);
  void (*pv_tile)(const PvTile& t);
  bool (*softmax_tile)(const SoftmaxTile& t);
  void (*exp_n)(float* dst, const float* src, std::int64_t n);
  void (*softcap_n)(float* x, std::int64_t n, float cap);
  void (*pack_q_row)(void* dst, const PackSource& src);
  void (*pack_k)(void* dst, const PackSource& src);
  void (*pack_v)(void* dst, const PackSource& src);
  void (*pv_tile_rows)(const PvRowsTile& t) = nullptr;  // optional (bf16-pair family: avx512bf16)
  void (*decode_qk_rows)(const DecodeQk& t) = nullptr;  // optional (bf16-pair family)
  void (*decode_pv_rows)(const DecodePv& t) = nullptr;
  // Optional, with the decode kernels: rows 0..n of src (f16 or f32, ld elements between rows, H values
  // each) as bf16 words at dst, ldd per row (a multiple of 16, >= H; zero in [H, ldd); dst 32-byte
  // aligned): round_to_bf16's words, the operands the decode kernels form from those rows, so a call on
  // dst as bf16 rows gives the bits of the call on src. The decode path converts a block once with it
  // when it has row groups (flash_decode.cpp); a set whose kernels form the operands cheaply may leave
  // it null (every x86 decode set has it: avx2_decode_rows_to_bf16, avx512_decode_rows_to_bf16).
  void (*decode_rows_to_bf16)(std::uint16_t* dst, std::int64_t ldd, const void* src, DType dtype, std::int64_t ld,
                              std::int64_t n, std::int64_t H) = nullptr;
  // Optional, likewise for int8 rows (row j's scale at scale[j * ld_scale]): the products form's operands,
  // x_j[h] * s_j in fp32 rounded to bf16 (nearest even; subnormals kept), zero in [H, ldd). The decode
  // path converts an int8 block once with it when the call has decode_int8_convert_rows rows or more
  // (G T), so such calls take the products form (kvcache_int8_form) on the bf16 kernels (amx) or tiles
  // (the packed blocks of avx512bf16 and of avx512f's decode set); a set without it (the others) runs
  // its own int8 kernels in every group.
  void (*decode_int8_rows_to_bf16)(std::uint16_t* dst, std::int64_t ldd, const std::int8_t* src, std::int64_t ld,
                                   const float* scale, std::int64_t ld_scale, std::int64_t n,
                                   std::int64_t H) = nullptr;
  void (*softmax_grad_pack)(const SoftmaxGradTile& t) = nullptr;  // optional (the backward)
  // The decode kernels take int8 K/V in the integers form (see the decode contract above).
  bool int8_on_integers = false;
  // The most rows a decode kernel call takes (the decode path's row groups): kDecodeMaxRows, or
  // kAmxDecodeMaxRows for the amx set, whose tiles hold 16.
  int decode_max_rows = kDecodeMaxRows;
  // The decode path's overlap (flash_decode.cpp: a dense block's first row group in pieces, each
  // prefetching the rows the next phase reads) from this many rows in a group; 0: never. It paid on
  // Zen 4 (avx512 sets; T = 2 1.33x) and cost on Zen 3 (avx2; T = 2 1.2x slower) and on Sapphire
  // Rapids' amx tiles (T = 2 1.39x slower), and on Emerald Rapids' FMA sets, whose kernels prefetch
  // their rows line by line (T = 2 1.15x slower): docs/performance.md, sessions 10, 15, 20 and 42.
  int decode_overlap_rows = 8;
  // The decode kernels take bf16 and int8 rows in pieces of kDecodePieceKeys keys, each at its own address
  // (DecodeQk::k_pieces, DecodePv::v_pieces): small pages are then read where they lie, in one call
  // per block, instead of copied together first (flash_decode.cpp).
  bool decode_row_pieces = false;
  // decode_pv_rows calls cut at multiples of this many keys give the bits of one call on the same keys
  // (the vector kernels sum key by key, their int8 integers form per 16 keys; the amx tiles per 32).
  // The decode path cuts a block's calls only there: pages of another size go in one call per block
  // (flash_decode.cpp).
  int decode_pv_step_keys = kDecodePieceKeys;
  // The decode path's packed blocks (flash_decode.cpp) from this many rows a call (G T) on; 0: never.
  // Each block's K and V rows (float dtypes from where they lie, PackSource::pieces; int8 rows from
  // their products, decode_int8_rows_to_bf16) go through pack_k and pack_v (V's bf16 rows, and the
  // converted words, through pv_tile_rows instead where the set has it), and the rows run on qk_tile,
  // softmax_tile and pv_tile. avx512bf16: 16 (docs/performance.md, session 27); its fma decode set and
  // avx512f's decode set, on avx512f's tiles (decode_tiles): 64 (session 42).
  int decode_packed_rows = 0;
  // The set whose tiles and packers the packed blocks run on (mr, operand_bytes, qk_tile, pv_tile,
  // pv_tile_rows, softmax_tile, pack_q_row, pack_k, pack_v; decode_tile_set); null: this set's own.
  // avx512bf16 where vdpbf16ps is half rate (avx512bf16_fma_decode_kernels) and avx512f's decode set:
  // avx512f_kernels(), the fp32 tiles on operands widened as they are packed, the packed path's there
  // (docs/performance.md, session 42).
  const FlashKernels* decode_tiles = nullptr;
  // From how many rows a call (G T) decode_int8_rows_to_bf16 converts int8 rows: amx 16 (where the
  // integers form would run its vector P.V in four blocks of 4 rows, session 26), avx512bf16 32 (the
  // packed blocks; at 16 rows the integers form was 1.05x faster, session 27), avx512f's decode set 64
  // (its packed blocks, session 42).
  int decode_int8_convert_rows = 16;
};

// The set whose tiles a decode set's packed blocks run on: k.decode_tiles, or k itself.
inline const FlashKernels& decode_tile_set(const FlashKernels& k) {
  return k.decode_tiles != nullptr ? *k.decode_tiles : k;
}

// The set the decode path (src/flash/flash_decode.cpp) runs for a path and precision: kernels_for's
// when it has decode kernels; under Precision::bf16 for avx512f, avx512f_decode_kernels(), for avx2,
// avx2_decode_kernels(), and for
// avx512bf16 where bf16_dot_half_rate(), avx512bf16_fma_decode_kernels(); otherwise kernels_for's
// (no decode kernels: the packed path runs). Never given to the packed path.
const FlashKernels& decode_kernels_for(Isa isa, Precision precision);

// The kernel set for a path and precision: amx / avx512bf16 / neon-bf16 for bf16, otherwise the fp32
// family of the path (amx and avx512bf16 run Precision::f32 on the avx512f kernels, neon-bf16 on the
// neon ones). Where bf16_dot_half_rate() (vdpbf16ps at half the FMA rate: Intel without AMX tiles in
// use), avx512bf16 runs the packed path and the backward on the avx512f set too: its tiles, on
// operands widened once when packed, ran flash 1.43x (causal 1.49x) faster than vdpbf16ps's on such
// a Xeon (docs/performance.md, sessions 8 and 9); its decode stays on bf16 pairs
// (decode_kernels_for) but for packed blocks, which run on the avx512f tiles (decode_tiles). The
// avx512bf16 set itself is still tested there (microkernels_test.cpp). The path must be compiled in and
// supported (see cpu_features.hpp); throws Error otherwise.
const FlashKernels& kernels_for(Isa isa, Precision precision);

// Per-ISA sets, defined in their translation units (the avx ones only on x86-64, neon only on aarch64).
const FlashKernels& portable_kernels();
const FlashKernels& avx2_kernels();
const FlashKernels& avx512f_kernels();
const FlashKernels& avx512bf16_kernels();
// avx512bf16's set with qk_tile and pv_tile on the AMX tile unit (kernels_amx.cpp). Each call loads
// the tile configuration anew on every thread at its first tile kernel: hand it out once per call.
const FlashKernels& amx_kernels();
const FlashKernels& neon_kernels();
const FlashKernels& neon_bf16_kernels();
// The avx512f path's decode set: bf16 pairs (pack_q_row, softmax_tile's P) and decode kernels that
// multiply-add each pair with two fp32 FMAs (kernels_avx512f_decode_qk.cpp, _pv.cpp); its tile kernels
// and K/V packers are null. Every AVX-512 CPU runs it.
const FlashKernels& avx512f_decode_kernels();
void avx512f_decode_qk_rows(const DecodeQk& t);
void avx512f_decode_pv_rows(const DecodePv& t);
// The avx2 path's decode set: bf16 pairs (pack_q_row, softmax_tile's P) and decode kernels that
// multiply-add the halves of each pair with fp32 FMAs, and int8 rows on vpmaddwd (the integers form)
// (kernels_avx2_decode_qk.cpp, _pv.cpp); its tile kernels and K/V packers are null. Every AVX2 + FMA +
// F16C CPU runs it.
const FlashKernels& avx2_decode_kernels();
void avx2_decode_qk_rows(const DecodeQk& t);
void avx2_decode_pv_rows(const DecodePv& t);
void avx2_decode_rows_to_bf16(std::uint16_t* dst, std::int64_t ldd, const void* src, DType dtype, std::int64_t ld,
                              std::int64_t n, std::int64_t H);
// The avx512bf16 set's decode kernels (kernels_avx512bf16_decode_qk.cpp, kernels_avx512bf16_decode_pv.cpp):
// vdpbf16ps, and (_fma_) two fp32 FMAs per pair, the same bits above 2^-126 where vdpbf16ps rounds
// each of its two steps (Intel's definition). decode_kernels_for() gives the _fma_ ones where
// bf16_dot_half_rate(); avx512bf16_fma_decode_kernels() is the avx512bf16 set with them.
void avx512bf16_decode_qk_rows(const DecodeQk& t);
void avx512bf16_decode_pv_rows(const DecodePv& t);
// FlashKernels::decode_rows_to_bf16 of the avx512f set (kernels_avx512f.cpp: AVX-512F code, rounding on
// integers).
void avx512_decode_rows_to_bf16(std::uint16_t* dst, std::int64_t ldd, const void* src, DType dtype, std::int64_t ld,
                                std::int64_t n, std::int64_t H);
// The same for int8 rows (kernels_avx512f.cpp: AVX-512F code), which the one below takes for rows whose
// scale could give a subnormal or NaN product.
void avx512_decode_int8_rows_to_bf16(std::uint16_t* dst, std::int64_t ldd, const std::int8_t* src, std::int64_t ld,
                                     const float* scale, std::int64_t ld_scale, std::int64_t n, std::int64_t H);
// Whether this CPU's vcvtne2ps2bf16 writes every NaN as round_to_bf16 does (its high half with the quiet
// bit set, as Intel defines it): false until probe_bf16_cvt_nan() has converted a set of NaNs and found
// so, which avx512bf16_kernels() does before that set (and amx's, built on it) is first handed out
// (kernels_avx512bf16_rows_to_bf16.cpp). A flag, not a call, for the kernels' inner loops.
extern std::atomic<bool> g_bf16_cvt_nan_exact;
void probe_bf16_cvt_nan();  // only where AVX512_BF16 runs
inline bool bf16_cvt_nan_exact() { return g_bf16_cvt_nan_exact.load(std::memory_order_relaxed); }
// The same words on AVX512_BF16's vcvtne2ps2bf16 (kernels_avx512bf16_rows_to_bf16.cpp): decode_rows_to_bf16
// of the avx512bf16 and amx sets, decode_int8_rows_to_bf16 of the avx512bf16 and amx sets (not of the
// avx512bf16 fma decode set).
void avx512bf16_decode_rows_to_bf16(std::uint16_t* dst, std::int64_t ldd, const void* src, DType dtype,
                                    std::int64_t ld, std::int64_t n, std::int64_t H);
void avx512bf16_decode_int8_rows_to_bf16(std::uint16_t* dst, std::int64_t ldd, const std::int8_t* src,
                                         std::int64_t ld, const float* scale, std::int64_t ld_scale, std::int64_t n,
                                         std::int64_t H);
void avx512bf16_fma_decode_qk_rows(const DecodeQk& t);
void avx512bf16_fma_decode_pv_rows(const DecodePv& t);
const FlashKernels& avx512bf16_fma_decode_kernels();
// The amx set's decode kernels (kernels_amx_decode.cpp): bf16 K/V rows with H a multiple of 32 (at most
// 256, 160 and 224 excepted) on the tile unit, the rest on avx512bf16_decode_qk_rows / _pv_rows.
void amx_decode_qk_rows(const DecodeQk& t);
void amx_decode_pv_rows(const DecodePv& t);
// The neon-bf16 set's decode kernels (kernels_neon_bf16_decode_qk.cpp, kernels_neon_bf16_decode_pv.cpp).
void neon_bf16_decode_qk_rows(const DecodeQk& t);
void neon_bf16_decode_pv_rows(const DecodePv& t);

}  // namespace flashgqa
