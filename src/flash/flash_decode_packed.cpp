// Packed blocks: the decode path's tasks (flash_decode.cpp) on a set with decode_packed_rows
// (avx512bf16) for calls of G*T >= that many rows (16: T >= 4 at G = 4). The rows' kernels are the packed
// path's tiles (qk_tile, softmax_tile, pv_tile), at the peak where the 8-row decode kernels ran near 60%
// of it (their transpose-adds).
//
// Per block (bkv keys), in groups of up to kPackedGroupRows rows (the S and P tiles of a group):
//   - the block's rows stay where they lie, dense or paged: block_pieces gives the packers each 16
//     keys' first row (int8 rows as their bf16 products, f32 rows as their bf16 words: converted once
//     per block by flash_decode.cpp);
//   - Q.K packs one K panel of 32 keys at a time (pack_k, 8 KiB at H = 128, which stays in L1) and runs
//     every row tile of the group (the set's mr rows) on it (qk_tile);
//   - the softcap, then softmax_tile per row tile;
//   - P.V per row tile and h tile: on a set with pv_tile_rows (avx512bf16), on V's bf16 rows (or
//     converted words) where they lie, each pair of rows paired in registers as pack_v pairs them
//     (the same bits; session 29: T = 4 1.05x faster in L2, 1.1-1.15x from DRAM, T = 8 and 16 even);
//     else (f16 rows, which it would convert once per row tile) the block's V packed once (pack_v),
//     then pv_tile.
// The group runs the whole block with no K/V stream under it, so its first group prefetches the K and
// V rows the thread reads next into L2, an even share before each qk_tile and each pv_tile call
// (without: T = 4 1.3x, T = 8 1.2x slower; a share per K panel instead of per qk_tile call, session 27,
// was up to 1.03x slower, session 28): the task's next block, or in a task group (paged caches, heads
// of one sequence block by block: flash_decode.cpp) the next head's rows of the same block (before
// session 42 always the task's next block, which in a group left the other heads' rows unfetched).
// The tiles' sums do not depend on where a block's rows lie or on the thread count, so dense, paged
// and any threads give the same bits. int8 takes them from 32 rows (the set's decode_int8_convert_rows;
// at 16 rows the integers form's 8-row groups were 1.05x faster).
//
// Measured on Zen 4 against the 8-row groups (docs/performance.md, session 27; S = 32768, K 8, G 4, 2
// threads, the same runs): bf16 T = 4 1.04x dense, 1.3-1.4x paged; T = 8 1.2x dense, 1.3-1.45x paged;
// T = 16 1.25x dense, 1.4-1.5x paged; int8 T = 8 1.15-1.2x, T = 16 1.2-1.35x.
#include <algorithm>
#include <cstdint>

#include "core/int_math.hpp"
#include "flash/flash_decode_task.hpp"

namespace flashgqa::decode_task {

// Where each 16 keys of the block [s0, s0 + n) lie, K's and V's (dense or paged; int8 rows: their bf16
// products, f32 rows their bf16 words, converted).
void block_pieces(const Problem& p, const Plan& plan, const FlashTask& task, std::int64_t s0, std::int64_t n,
                  Workspace& w) {
  for (const bool is_k : {true, false}) {
    const void** pieces = (is_k ? w.k_pieces : w.v_pieces).as<const void*>();
    const bool convert = is_k ? plan.convert_k : plan.convert_v;
    const std::uint16_t* converted = convert ? (is_k ? w.k_bf16 : w.v_bf16).as<std::uint16_t>() : nullptr;
    for (std::int64_t j0 = 0; j0 < n; j0 += kDecodePieceKeys)
      pieces[j0 / kDecodePieceKeys] =
          converted != nullptr ? static_cast<const void*>(converted + j0 * plan.Hp)
                               : static_cast<const void*>(key_row(p, plan.pages, is_k, task.b, task.kh, s0 + j0));
  }
}

// Rows [r0, r0 + R) of a task (head `head` of its group) against the block's first n keys (the keys
// its last row sees, block_pieces' rows), in row tiles of the set's mr:
//   S = scale Q K^T a panel of 32 keys at a time, each packed (pack_k, 8 KiB at H = 128: it stays in
//   L1) and then taken by every row tile;
//   the softcap; the online softmax (softmax_tile);
//   O = O corr + P V, every row tile and h tile on V's bf16 rows (pv_tile_rows), or on the block's V
//   packed once (pack_v, then pv_tile).
// The first group also fetches next_task's rows from key next_s into L2 (see the top of the file).
void run_group_packed(const Problem& p, const Plan& plan, std::int64_t head, Workspace& w, std::int64_t r0,
                      std::int64_t R, std::int64_t n, const FlashTask& next_task, std::int64_t next_s) {
  const FlashKernels& kern = *plan.tiles;
  const std::int64_t Hp = plan.Hp, npad = padded_keys(n), nk = round_up(n, 2), ld = w.ld, ob = kern.operand_bytes;
  const std::int32_t* lo = w.lo.as<std::int32_t>() + r0;
  const std::int32_t* hi = w.hi.as<std::int32_t>() + r0;
  if (hi[R - 1] <= lo[0]) return;  // no row of the group sees a key of this block
  const std::int64_t hr = head * w.M + r0;
  // Q, P and the panels in the tiles' operands (ob bytes each).
  const char* q = w.q.as<char>() + hr * Hp * ob;
  float* o = w.o.as<float>() + hr * Hp;
  float* s = w.s.as<float>();
  char* pt = w.p.as<char>();
  char* kp = w.k_panels.as<char>();
  char* vp = w.v_panels.as<char>();
  const std::int64_t mr = kern.mr, row_tiles = ceil_div(R, mr), h_tiles = Hp / kHTile;
  const auto tile_rows = [&](std::int64_t t) { return static_cast<int>(std::min(mr, R - t)); };
  // Keys [j, j + len) of the block's K or V rows, as the packers take them.
  const auto source = [&](bool is_k, std::int64_t j, std::int64_t len) {
    const bool converted = is_k ? plan.convert_k : plan.convert_v;
    PackSource src{nullptr, converted ? DType::bf16 : is_k ? p.k_dtype : p.v_dtype,
                   converted ? Hp : is_k ? p.k_stride[2] : p.v_stride[2], len, p.H, Hp, true};
    src.pieces = (is_k ? w.k_pieces : w.v_pieces).as<const void*>() + j / kDecodePieceKeys;
    return src;
  };
  // The rows the thread reads next (next_task's block from next_s: the next head of a task group on
  // this block, or the task's next block), K's then V's, an even share before each tile call.
  const std::int64_t next_n = r0 == 0 ? std::clamp<std::int64_t>(next_task.keys.end - next_s, 0, plan.work.bkv) : 0;
  const std::int64_t steps = npad / kPanelKeys * row_tiles + row_tiles * h_tiles;
  std::int64_t step = 0;
  // Rows [a, b) of those K rows then V rows, each 16 keys' int8 scales with their first row
  // (a line of their own elsewhere). (Line by line, each 16 keys' rows as one run, was slower: T = 4
  // 1.15x, T = 8 1.15x.)
  const std::int64_t k_row_bytes = p.H * static_cast<std::int64_t>(dtype_size(p.k_dtype)),
                     v_row_bytes = p.H * static_cast<std::int64_t>(dtype_size(p.v_dtype));
  const auto fetch_share = [&] {
    const std::int64_t a = ceil_div(2 * next_n * step, steps), b = ceil_div(2 * next_n * (step + 1), steps);
    ++step;
    for (std::int64_t i = a; i < b; ++i) {
      const bool is_k = i < next_n;
      const std::int64_t key = next_s + (is_k ? i : i - next_n);
      prefetch_row(key_row(p, plan.pages, is_k, next_task.b, next_task.kh, key), is_k ? k_row_bytes : v_row_bytes);
      if ((key - next_s) % kDecodePieceKeys == 0 && (is_k ? p.k_scale : p.v_scale) != nullptr)
        prefetch_l2(key_scales(p, plan.pages, is_k, next_task.b, next_task.kh, key).scale);
    }
  };
  for (std::int64_t c = 0; c < npad; c += kPanelKeys) {
    kern.pack_k(kp, source(true, c, std::min<std::int64_t>(kPanelKeys, n - c)));
    for (std::int64_t t = 0; t < R; t += mr)
      fetch_share(), kern.qk_tile({s + t * ld + c, ld, q + t * Hp * ob, Hp, kp, Hp, p.scale, tile_rows(t)});
  }
  if (p.softcap != 0.0f)
    for (std::int64_t r = 0; r < R; ++r) kern.softcap_n(s + r * ld, n, p.softcap);
  bool moved[kPackedGroupRows];  // per row tile: some row's max moved (pv_tile rescales its O rows)
  for (std::int64_t t = 0; t < R; t += mr)
    moved[t / mr] = kern.softmax_tile({s + t * ld, ld, pt + t * ld * ob, ld, w.m.as<float>() + hr + t,
                                       w.l.as<float>() + hr + t, w.corr.as<float>() + hr + t, lo + t, hi + t, npad,
                                       tile_rows(t), true});
  // P.V: on V's bf16 rows where they lie (pv_tile_rows, Plan::v_in_place), else on the block's V
  // packed once.
  const PackSource v_rows = source(false, 0, n);
  if (!plan.v_in_place) kern.pack_v(vp, v_rows);
  for (std::int64_t t = 0; t < R; t += mr)
    for (std::int64_t h = 0; h < Hp; h += kHTile) {
      fetch_share();
      const float* corr = moved[t / mr] ? w.corr.as<float>() + hr + t : nullptr;
      if (plan.v_in_place)
        kern.pv_tile_rows({o + t * Hp + h, Hp, pt + t * ld * ob, ld, v_rows, h, nk, corr, tile_rows(t)});
      else
        kern.pv_tile({o + t * Hp + h, Hp, pt + t * ld * ob, ld, vp + h * npad * ob, nk, corr, tile_rows(t)});
    }
}

}  // namespace flashgqa::decode_task
