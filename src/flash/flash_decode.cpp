// Design (what moves where, and why):
//
// A decode task is (b, kv head, KV split): all M = G*T <= kDecodeMaxRows query rows of the kv head
// (row r = t*G + g, as in flash_packed.cpp) against one contiguous range of keys. The task packs its Q
// rows once (bf16, H padded to Hp) and walks its keys in blocks of bkv:
//   1. S = scale Q K^T: decode_qk_rows reads the block's K rows in address order from their source
//      (no packed copy); with a softcap, S = c tanh(S / c) (softcap_n);
//   2. the online softmax over the block (softmax_tile: running max, P = exp(S - m) rounded to bf16,
//      fp32 sums of the unrounded P, keys outside each row's visible range [lo, hi) masked);
//   3. O = O corr + P V: decode_pv_rows reads the block's V rows in address order, likewise.
// S and P (M x bkv) and O (M x Hp fp32) stay in L1; K and V stream from DRAM once each. The block only
// bounds S and P: the two streams alternate per block, and a long block means few switches.
//
// Few (b, kv head) pairs leave threads idle, so each pair's key range is split by the planner the
// packed path uses (kv_splits.hpp: a task is one q block of all T positions), and the partial
// (O, m, l) are merged in split order, so the result is bitwise the same for any number of threads.
//
// Row groups (the KV-cache API, kDecodeMaxRows < G*T <= kDecodeMaxGroupedRows): a task still holds all
// G*T rows (O, m, l for each), and runs each KV block through the rows in groups of
// decode_max_rows / G positions (kDecodeMaxRows, or 16 on the amx set's tiles), one after another:
// the block (bkv keys of K and V, 256 KiB at H = 128) comes from DRAM for the first group and from L2
// for the others, so K/V still stream once while the kernels stay the small-tile ones. With G*T <=
// decode_max_rows there is one group. f16 and f32 rows, where the set has decode_rows_to_bf16 (avx2 and
// the AVX-512 sets, amx included, whose kernels otherwise convert them on every call), become bf16
// words once per block (K and V, Hp per key, in the workspace: 256 KiB at H = 128), and every group
// runs on those as bf16 rows: the operands the kernels would form, so the same bits
// (docs/performance.md: session 15, f16 at T = 16 from 1.5x bf16's time to 1.06x on Zen 3; session
// 25, f16 and f32 at T = 16 1.2-2.4x faster on the AVX-512 sets, pages of 16 most). int8 rows, on the
// amx set, become their bf16 products the same way when the call has decode_int8_convert_rows rows or
// more, one group included (decode_int8_rows_to_bf16): those calls take the products form
// (kvcache_int8_form(G, T, H)) on the bf16 tiles instead of the integers form's vector P.V, 4 rows at a
// time, in every group (session 26, with the conversion on vcvtne2ps2bf16: T = 4 1.05-1.3x, T = 8
// 1.45-1.65x, T = 16 1.3-1.6x faster at G = 4; at 8 rows, T = 2, the integers form stays 1.2x faster on
// dense caches); on the avx512bf16 set, the packed blocks (flash_decode_packed.cpp).
// Where a group's P.V is one call (dense without the overlap, pages in one call per block, converted
// rows), every group takes the keys the block's last row sees, and the calls tell the kernels that V
// is the same as for the group before (DecodePv::keep_v, same_v): the amx tiles then pair V's rows
// once per block (T = 16 1.09x faster, session 20).
//
// Packed blocks (a set with decode_packed_rows, avx512bf16: G*T >= 16 rows, so T >= 4 at G = 4): the
// rows' kernels are the packed path's tiles, each block packed as it is used (flash_decode_packed.cpp).
//
// Paged K/V (KvPages): a block's kernel calls are cut at page boundaries, each piece a run of rows
// inside one page at its own address. Pages under kGatherPagesBelow keys, and pages whose size is not
// a multiple of the set's decode_pv_step_keys (amx: 32), are one call per block instead
// (for_each_piece, decode_rows.hpp): on the rows where they lie (bf16 and int8 rows on a set with
// decode_row_pieces, the kernels taking each 16 keys' address; int8's scales copied together), else on
// a copy of them.
// Blocks, dense or paged, start at multiples of Plan::align keys (kPageAlign and the set's decode_pv_step_keys; a task's first block is moved down to
// one, the extra keys, before a window's first, read and masked), so every piece starts at a multiple of
// 16 columns of S and P, and every cut is at a multiple of decode_pv_step_keys keys of the call;
// decode_qk_rows is per key and decode_pv_rows accumulates each O element in key order (per step of the
// set), so the pieces give the bits of one call over the same rows laid out densely, with a window too
// (before session 21 dense blocks started at the window's first key, and on the amx tiles dense and
// paged caches then differed in the last bits).
//
// Head groups (paged K/V): a page holds all kv heads' rows of its keys ([num_pages, K, page_size, H]),
// so the tasks of one sequence's split (the same rows and keys) for up to Plan::heads kv heads run in
// one thread as a group, block by block, each block through every head before the next: the heads'
// rows of the block's pages are read close together in time (why that is faster was not measured, no
// counters on that host: likely the pages' address translations still cached for the heads after the
// first, and for int8 at page 16 two heads' rows in each 4 KiB page). Each head's rows still
// go through the same blocks and kernel calls, so the bits are those of one task per head. How many
// heads a group takes: decode_group_heads (flash_decode.hpp). Measured on Sapphire Rapids, 8
// sequences, T = 1 (docs/performance.md, session 23): page 16 bf16 1.07-1.09x, int8 1.14-1.17x, page
// 256 1.03-1.10x faster; on a dense cache a head's rows lie 2 S_max H bytes from the next head's and
// groups were no faster (0.98-0.99x), so dense tasks stay one head each.
//
// int8 K/V (the KV-cache API's quantized cache, Problem::k_scale/v_scale): each piece also carries its
// keys' scales (a gathered piece, a copy of them), and the kernels scale the rows as they read them
// (the products form) or apply the scales to the logits and the weights (the integers form; its
// weights are quantized per 16 keys of a call, and pieces start at multiples of 16 keys: the bits of
// one call still).
//
// Overlap (dense K/V, groups of the set's decode_overlap_rows rows or more, the first group of a block:
// the one that reads K/V from DRAM): there the kernels' work per key is as long as its bytes' time, and
// the hardware prefetchers alone left the two one after the other (T = 2 at G = 4 took the T = 1 time
// plus its in-cache compute). So the calls go in pieces of kOverlapKeys keys, each preceded by an L2
// prefetch of the rows the next phase reads: QK's piece of K with the same keys' V rows, PV's piece of
// V with the next block's K rows. Pieces start at multiples of kOverlapKeys keys, so the bits are those
// of one call (as with pages). Measured on Zen 4: T = 2 1.33x, T = 4 1.2x, T = 16 1.06x faster; G*T = 4
// rows (T = 1 at G = 4, bound by the stream) 1.16x slower with it, hence the row threshold
// (docs/performance.md, session 10). On Zen 3 (the avx2 set, whose decode_overlap_rows is 0) the
// prefetches cost more than they hid: T = 2 1.2x, T = 4 1.1x slower with them (session 15); on
// Sapphire Rapids' amx tiles (0 too) T = 2 1.39x, T = 16 1.24x slower (session 20).
#include "flash/flash_decode.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/dtype.hpp"
#include "core/int_math.hpp"
#include "flash/decode_rows.hpp"
#include "flash/flash_decode_task.hpp"
#include "flash/kv_splits.hpp"
#include "flash/run_tasks.hpp"


namespace flashgqa {
namespace {

using namespace decode_task;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr std::int64_t kDecodeBlockKeys = 512;  // bkv unless block_kv is set (see docs/performance.md)
// Pages shorter than this go in one call per block (see for_each_piece, decode_rows.hpp).
constexpr std::int64_t kGatherPagesBelow = 64;

// The positions of the longest q block: all T, or with packed sequences the longest sequence's (the
// planner cuts q blocks at sequence boundaries: batched decode of many one-token sequences).
std::int64_t block_positions(const Problem& p) {
  if (p.sequences.empty()) return p.T;
  std::int64_t most = 0;
  for (const Problem::Sequence& s : p.sequences) most = std::max(most, s.q_end - s.q_begin);
  return most;
}

Plan make_plan(const Problem& p, const FlashKernels& k, const KvPages* pages) {
  Plan plan;
  plan.kern = &k;
  plan.pages = pages;
  plan.M = p.G * block_positions(p);  // the most rows of a q block: the workspace's
  plan.R = p.G * decode_positions(p, k);
  plan.Hp = round_up(p.H, kHTile);
  plan.tiles = &decode_tile_set(k);
  plan.packed = decode_packs_blocks(p, k);
  if (plan.packed) plan.R = std::min(plan.M, kPackedGroupRows);
  plan.convert_k = decode_converts_rows(p, k, p.k_dtype);
  plan.convert_v = decode_converts_rows(p, k, p.v_dtype);
  // Not for f16 rows: pv_tile_rows would convert them again for every row tile (T = 4 1.3x, T = 16
  // 1.4x slower than packing them once; docs/performance.md, session 29).
  plan.v_in_place =
      plan.packed && plan.tiles->pv_tile_rows != nullptr && (plan.convert_v || p.v_dtype == DType::bf16);
  // A block longer than the keys only costs memory: clamp it (same result, one block either way).
  std::int64_t bkv =
      std::min(p.block_kv > 0 ? p.block_kv : kDecodeBlockKeys, padded_keys(std::max<std::int64_t>(p.S, 1)));
  // Blocks start on page pieces' alignment, and no step of the set's P.V straddles two blocks.
  plan.align = std::lcm(kPageAlign, static_cast<std::int64_t>(k.decode_pv_step_keys));
  bkv = round_up(bkv, plan.align);
  // Small pages, and pages the set's P.V must not be cut at (its steps would differ from a dense call's).
  plan.one_call = pages != nullptr &&
                  (pages->page_size < kGatherPagesBelow || pages->page_size % k.decode_pv_step_keys != 0);
  plan.work = plan_tasks(p, p.T, bkv);
  plan.heads = pages != nullptr ? p.K : 1;  // (decode_group_heads cuts it down)
  return plan;
}

static_assert(kPageAlign % kDecodePieceKeys == 0, "blocks start on a piece");
// Overlap (see the top of the file): in pieces of this many keys.
constexpr std::int64_t kOverlapKeys = 32;

// One KV block [s0, s0 + n) for rows [r0, r0 + R) of a task (lo, hi already hold each row's keys of
// the block; block_seen the keys its last row sees; more: a group follows): S = scale Q K^T, the
// softcap, the online softmax, O = O corr + P V. v_kept: this thread's last P.V call of the block had
// keep_v (in and out). next_task's K rows from key next_s are what the thread reads after this block's
// groups (the next head of a task group on the same block, or the next block).
void run_group(const Problem& p, const Plan& plan, const FlashTask& task, std::int64_t head, Workspace& w,
               std::int64_t s0, std::int64_t r0, std::int64_t R, std::int64_t block_seen, bool more, bool& v_kept,
               const FlashTask& next_task, std::int64_t next_s) {
  const FlashKernels& kern = *plan.kern;
  const std::int64_t Hp = plan.Hp;
  const std::int32_t* lo = w.lo.as<std::int32_t>() + r0;
  const std::int32_t* hi = w.hi.as<std::int32_t>() + r0;
  if (hi[R - 1] <= lo[0]) return;  // no row of the group sees a key of this block (the last row sees the last keys)
  const std::int64_t hr = head * w.M + r0;  // the group's first row in the head's state
  const std::uint16_t* q = w.q.as<std::uint16_t>() + hr * Hp;
  float* o = w.o.as<float>() + hr * Hp;
  float* corr = w.corr.as<float>() + hr;
  // Overlap: the first group of a dense block, with enough rows (see the top of the file).
  const bool overlap =
      plan.pages == nullptr && r0 == 0 && kern.decode_overlap_rows > 0 && R >= kern.decode_overlap_rows;
  const std::int64_t piece = overlap ? kOverlapKeys : 0;
  // With one P.V call per group, every group of the block takes the keys the block's last row sees
  // (the rows past their own keys masked as always), so the V operands stay the same from group to
  // group: the kernels may keep what they form from them (DecodePv::keep_v, same_v).
  const bool one_pv = plan.convert_v || (plan.pages == nullptr ? piece == 0 : plan.one_call);
  const bool shares = one_pv && plan.M > plan.R;
  const std::int64_t keys_seen = shares ? block_seen : hi[R - 1];
  // Small pages' bf16 rows where they lie (for_each_piece), on a set that takes them.
  const void** pieces = kern.decode_row_pieces ? w.pieces.as<const void*>() : nullptr;
  // One kernel call on keys [j0, j0 + len) of the block, their rows at k (ldk apart).
  const auto qk = [&](std::int64_t j0, const void* k, DType dtype, std::int64_t len, std::int64_t ldk, PieceScales ks,
                      const void* const* in_pieces) {
    kern.decode_qk_rows({w.s.as<float>() + j0, w.ld, q, Hp, k, dtype, ldk, len, p.H, Hp, p.scale, static_cast<int>(R),
                         ks.scale, ks.ld, in_pieces});
  };
  // The group that reads the rows from DRAM (the first; not with the overlap, which prefetches the
  // other phase's rows itself, nor on converted rows): the first kPhaseAheadKeys rows of each phase
  // and the int8 scales of its block go to L2 a phase early, V's before Q.K, the next K's (next_task
  // from next_s) before P.V. On Zen 4, 8 sequences at T = 1: dense int8 1.06x faster, 1.15x with the
  // int8 kernels' own prefetch of K kDecodeInt8AheadKeys keys ahead (microkernels.hpp;
  // docs/performance.md, session 32); the rows: int8 page 256 1.07x (1.12x with for_each_piece's 32
  // rows of the next page), page 16 1.03-1.05x, bf16 page 16 1.03-1.05x, bf16 dense and page 256 no
  // slower; the scales on top: int8 page 16 1.17x (with all of it page 16 1.24x, page 256 1.14x,
  // session 33).
  const bool phase_ahead = piece == 0 && r0 == 0 && !plan.convert_k && !plan.convert_v;
  if (phase_ahead) {
    prefetch_rows(p, plan.pages, false, task.b, task.kh, s0, std::min(kPhaseAheadKeys, keys_seen));
    prefetch_scales(p, plan.pages, false, task.b, task.kh, s0, keys_seen);
  }
  // S = scale Q K^T over the first keys_seen keys (page by page when paged; the block's bf16 copy when
  // converted).
  if (plan.convert_k)
    qk(0, w.k_bf16.data(), DType::bf16, keys_seen, Hp, {}, nullptr);
  else
    for_each_piece(p, plan.pages, true, task.b, task.kh, s0, keys_seen, piece,
                   plan.one_call ? w.gather.as<char>() : nullptr,
                   w.gather_scales.as<float>(), pieces,
                   [&](std::int64_t j0, const void* k, std::int64_t len, std::int64_t ldk, PieceScales ks,
                       const void* const* in_pieces) {
                     if (piece > 0) prefetch_rows(p, nullptr, false, task.b, task.kh, s0 + j0, len);  // V, same keys
                     qk(j0, k, p.k_dtype, len, ldk, ks, in_pieces);
                   });
  // Softcap: S = c tanh(S / c) over the keys seen (the zeros past them stay 0).
  if (p.softcap != 0.0f)
    for (std::int64_t r = 0; r < R; ++r) kern.softcap_n(w.s.as<float>() + r * w.ld, keys_seen, p.softcap);
  // Running max, P = exp(S - m) (bf16), l = l corr + sum P; keys outside [lo[r], hi[r]) masked.
  const bool moved = kern.softmax_tile({w.s.as<float>(), w.ld, w.p.data(), w.ld, w.m.as<float>() + hr,
                                        w.l.as<float>() + hr, corr, lo, hi, padded_keys(keys_seen),
                                        static_cast<int>(R), true});
  // O = O corr + P V on keys [j0, j0 + len), rows at v (the rescale only when some row's max moved, by
  // the first call).
  const auto pv = [&](std::int64_t j0, const void* v, DType dtype, std::int64_t len, std::int64_t ldv, PieceScales vs,
                      const void* const* in_pieces) {
    kern.decode_pv_rows({o, Hp, w.p.as<std::uint16_t>() + j0, w.ld, v, dtype, ldv, len, round_up(len, 2), p.H, Hp,
                         moved && j0 == 0 ? corr : nullptr, static_cast<int>(R), vs.scale, vs.ld, in_pieces,
                         shares && more, shares && v_kept});
  };
  if (phase_ahead && next_s < next_task.keys.end) {
    prefetch_rows(p, plan.pages, true, next_task.b, next_task.kh, next_s,
                  std::min(kPhaseAheadKeys, next_task.keys.end - next_s));
    prefetch_scales(p, plan.pages, true, next_task.b, next_task.kh, next_s,
                    std::min(plan.work.bkv, next_task.keys.end - next_s));
  }
  if (plan.convert_v)
    pv(0, w.v_bf16.data(), DType::bf16, keys_seen, Hp, {}, nullptr);
  else
    for_each_piece(p, plan.pages, false, task.b, task.kh, s0, keys_seen, piece,
                   plan.one_call ? w.gather.as<char>() : nullptr,
                   w.gather_scales.as<float>(), pieces,
                   [&](std::int64_t j0, const void* v, std::int64_t len, std::int64_t ldv, PieceScales vs,
                       const void* const* in_pieces) {
                     const std::int64_t next = s0 + plan.work.bkv + j0;  // K of the task's next block
                     if (piece > 0)
                       prefetch_rows(p, nullptr, true, task.b, task.kh, next, std::min(len, task.keys.end - next));
                     pv(j0, v, p.v_dtype, len, ldv, vs, in_pieces);
                   });
  v_kept = shares && more;
}

// Keys [s0, s0 + n) of the task's K (is_k) or V rows as bf16 words at dst, Hp per key (page by page,
// without a gather copy).
void rows_to_bf16(const Problem& p, const Plan& plan, const FlashTask& task, bool is_k, std::int64_t s0,
                  std::int64_t n, std::uint16_t* dst) {
  for_each_piece(p, plan.pages, is_k, task.b, task.kh, s0, n, 0, nullptr, nullptr, nullptr,
                 [&](std::int64_t j0, const void* rows, std::int64_t len, std::int64_t ld, PieceScales scales,
                     const void* const*) {
                   const DType dtype = is_k ? p.k_dtype : p.v_dtype;
                   if (dtype == DType::i8)
                     plan.kern->decode_int8_rows_to_bf16(dst + j0 * plan.Hp, plan.Hp, static_cast<const std::int8_t*>(rows),
                                                         ld, scales.scale, scales.ld, len, p.H);
                   else
                     plan.kern->decode_rows_to_bf16(dst + j0 * plan.Hp, plan.Hp, rows, dtype, ld, len, p.H);
                 });
}

// A task group: tasks [first, first + count) of a plan (of `grouped`), the same rows and keys of up to
// Plan::heads kv heads of one sequence (see the top of the file).
struct TaskGroup {
  std::size_t plan, first, count;
};

void run_tasks(const Problem& p, const Plan& plan, const FlashTask* tasks, std::int64_t count, Workspace& w,
               SplitPartials& parts) {
  const FlashTask& task = tasks[0];  // b, q block and keys: the group's
  const std::int64_t M = plan.work.rows(p, task.qb), Hp = plan.Hp, bkv = plan.work.bkv;
  const RowOrder rows = plan.work.row_order(p, task.qb);
  auto* lo = w.lo.as<std::int32_t>();
  auto* hi = w.hi.as<std::int32_t>();
  // Q's rows as the kernels that take them want them: the tiles' operands (packed blocks), else bf16.
  const FlashKernels& q_set = q_row_set(plan);
  const std::int64_t q_bytes = Hp * q_set.operand_bytes;
  for (std::int64_t i = 0; i < count; ++i) {
    char* q = w.q.as<char>() + i * w.M * q_bytes;
    for (std::int64_t r = 0; r < M; ++r)
      q_set.pack_q_row(q + r * q_bytes,
                       {p.q_row(task.b, tasks[i].kh, rows.g(r), rows.t(r)), p.q_dtype, 0, 0, p.H, Hp, true});
    std::fill_n(w.o.as<float>() + i * w.M * Hp, M * Hp, 0.0f);
    std::fill_n(w.m.as<float>() + i * w.M, M, kNegInf);
    std::fill_n(w.l.as<float>() + i * w.M, M, 0.0f);
  }

  // The first block starts at a multiple of plan.align, dense or paged alike (the keys before
  // task.keys.begin, a window's first key, are masked below; split boundaries are multiples of bkv).
  const std::int64_t first = task.keys.begin / plan.align * plan.align;
  for (std::int64_t s0 = first; s0 < task.keys.end; s0 += bkv) {
    const std::int64_t n = std::min(bkv, task.keys.end - s0);
    // Keys of the block each row sees.
    for (std::int64_t r = 0; r < M; ++r) {
      const KeyRange keys = p.visible_keys(rows.t(r)).clamp_to(s0, s0 + n, s0);
      lo[r] = static_cast<std::int32_t>(keys.begin);
      hi[r] = static_cast<std::int32_t>(keys.end);
    }
    for (std::int64_t i = 0; i < count; ++i) {
      // f16/f32 rows (int8 rows: their products) as bf16 once for all the row groups: the keys some row
      // sees (the last row's).
      if (plan.convert_k) rows_to_bf16(p, plan, tasks[i], true, s0, hi[M - 1], w.k_bf16.as<std::uint16_t>());
      if (plan.convert_v) rows_to_bf16(p, plan, tasks[i], false, s0, hi[M - 1], w.v_bf16.as<std::uint16_t>());
      if (plan.packed) {
        block_pieces(p, plan, tasks[i], s0, hi[M - 1], w);
        for (std::int64_t r0 = 0; r0 < M; r0 += plan.R)
          run_group_packed(p, plan, i, w, r0, std::min(plan.R, M - r0), hi[M - 1], tasks[i + 1 < count ? i + 1 : 0],
                           i + 1 < count ? s0 : s0 + bkv);
        continue;
      }
      // The row groups one after another on the same block, which stays in L2 after the first.
      bool v_kept = false;
      for (std::int64_t r0 = 0; r0 < M; r0 += plan.R)
        run_group(p, plan, tasks[i], i, w, s0, r0, std::min(plan.R, M - r0), hi[M - 1], r0 + plan.R < M, v_kept,
                  tasks[i + 1 < count ? i + 1 : 0], i + 1 < count ? s0 : s0 + bkv);
    }
  }
  for (std::int64_t i = 0; i < count; ++i)
    finish_task(p, plan.work, tasks[i], M, w.o.as<float>() + i * w.M * Hp, Hp, w.m.as<float>() + i * w.M,
                w.l.as<float>() + i * w.M, parts);
}

}  // namespace

namespace decode_task {

// Sized for the largest of the plans (flash_decode_task.hpp).
Workspace::Workspace(const std::vector<Plan>& plans) {
  std::int64_t R = 0, Hp = 0, heads = 1, gather_bytes = 0, gather_keys = 0, k_bf16_bytes = 0, v_bf16_bytes = 0;
  std::int64_t panel_keys = 0, v_panel_keys = 0, ob = 2;  // ob: the most bytes of a Q or P operand
  for (const Plan& plan : plans) {
    ob = std::max<std::int64_t>(ob, q_row_set(plan).operand_bytes);
    if (plan.packed) panel_keys = std::max(panel_keys, padded_keys(plan.work.bkv));
    if (plan.packed && !plan.v_in_place) v_panel_keys = std::max(v_panel_keys, padded_keys(plan.work.bkv));
    M = std::max(M, plan.M), R = std::max(R, plan.R), Hp = std::max(Hp, plan.Hp);
    heads = std::max(heads, plan.heads);
    ld = std::max(ld, padded_keys(plan.work.bkv));
    if (plan.convert_k) k_bf16_bytes = std::max(k_bf16_bytes, plan.work.bkv * plan.Hp * 2);
    if (plan.convert_v) v_bf16_bytes = std::max(v_bf16_bytes, plan.work.bkv * plan.Hp * 2);
    // A block of f32 rows at most; none where both K and V are converted (never gathered).
    if (plan.one_call && !(plan.convert_k && plan.convert_v))
      gather_bytes = std::max(gather_bytes, plan.work.bkv * plan.Hp * 4),
      gather_keys = std::max(gather_keys, plan.work.bkv);
  }
  if (gather_bytes > 0) {
    gather.reset(static_cast<std::size_t>(gather_bytes));
    gather_scales.reset(static_cast<std::size_t>(gather_keys * 4));
    pieces.reset(static_cast<std::size_t>(ceil_div(gather_keys, kDecodePieceKeys)) * sizeof(const void*));
  }
  if (panel_keys > 0) {
    k_panels.reset(static_cast<std::size_t>(kPanelKeys * Hp * ob));  // one K panel
    if (v_panel_keys > 0) v_panels.reset(static_cast<std::size_t>(v_panel_keys * Hp * ob));  // the block's V panels
    for (AlignedBuffer* b : {&k_pieces, &v_pieces})
      b->reset(static_cast<std::size_t>(panel_keys / kDecodePieceKeys) * sizeof(const void*));
  }
  if (k_bf16_bytes > 0) k_bf16.reset(static_cast<std::size_t>(k_bf16_bytes));
  if (v_bf16_bytes > 0) v_bf16.reset(static_cast<std::size_t>(v_bf16_bytes));
  q.reset(static_cast<std::size_t>(heads * M * Hp * ob));
  o.reset(static_cast<std::size_t>(heads * M * Hp * 4));
  for (AlignedBuffer* b : {&m, &l, &corr}) b->reset(static_cast<std::size_t>(heads * M * 4));
  for (AlignedBuffer* b : {&lo, &hi}) b->reset(static_cast<std::size_t>(M * 4));
  s.reset(static_cast<std::size_t>(R * ld * 4));
  p.reset(static_cast<std::size_t>(R * ld * ob));
  std::memset(s.data(), 0, s.bytes());
}

}  // namespace decode_task

std::int64_t decode_group_heads(std::int64_t heads, std::int64_t M, std::int64_t Hp, std::int64_t q_bytes,
                                std::int64_t tasks, int threads) {
  const std::int64_t state = M * Hp * (q_bytes + 4) + M * 12;  // q, O, m, l, corr
  const std::int64_t fit = kHeadStateBytes / std::max<std::int64_t>(state, 1);
  const std::int64_t spread = tasks / (kGroupsPerThread * std::max(threads, 1));
  return std::max<std::int64_t>(1, std::min({heads, fit, spread}));
}

std::int64_t decode_positions(const Problem& p, const FlashKernels& k) {
  return std::clamp<std::int64_t>(k.decode_max_rows / std::max<std::int64_t>(p.G, 1), 1,
                                  std::max<std::int64_t>(block_positions(p), 1));
}

// Whether a call converts its int8 rows (a set with decode_int8_rows_to_bf16, from its
// decode_int8_convert_rows rows a call, G T; see the top of the file).
bool converts_int8(const Problem& p, const FlashKernels& k) {
  return k.decode_int8_rows_to_bf16 != nullptr && p.G * block_positions(p) >= k.decode_int8_convert_rows;
}

bool decode_packs_blocks(const Problem& p, const FlashKernels& k) {
  const bool int8 = p.k_dtype == DType::i8 || p.v_dtype == DType::i8;
  const FlashKernels& t = decode_tile_set(k);
  return k.decode_packed_rows > 0 && p.G * block_positions(p) >= k.decode_packed_rows && t.qk_tile != nullptr &&
         t.pv_tile != nullptr && t.pack_k != nullptr && t.pack_v != nullptr && (!int8 || converts_int8(p, k));
}

bool decode_converts_rows(const Problem& p, const FlashKernels& k, DType dtype) {
  // Packed blocks pack bf16 and f16 rows from where they lie; int8 rows become their products first,
  // f32 rows their bf16 words (read whole, in order: packed from where they lie, T = 4 was 1.28x slower
  // on a dense cache than converted in row groups; docs/performance.md, session 27).
  if (decode_packs_blocks(p, k)) return dtype == DType::i8 || (dtype == DType::f32 && k.decode_rows_to_bf16 != nullptr);
  // f16/f32: more than one row group; int8: the set's decode_int8_convert_rows rows or more. Rows the set
  // converts: once per block, not once per group (see the top of the file).
  const std::int64_t groups = ceil_div(std::max<std::int64_t>(block_positions(p), 1), decode_positions(p, k));
  if (dtype == DType::i8) return converts_int8(p, k);
  return groups >= 2 && k.decode_rows_to_bf16 != nullptr && (dtype == DType::f16 || dtype == DType::f32);
}

bool flash_decode_applies(const Problem& p, const FlashKernels& k) {
  return flash_decode_row_groups_apply(p, k) && p.G * block_positions(p) <= kDecodeMaxRows;
}

bool flash_decode_row_groups_apply(const Problem& p, const FlashKernels& k) {
  return k.decode_qk_rows && k.decode_pv_rows && k.operand_bytes == 2 && p.T >= 1 && p.G <= kDecodeMaxRows &&
         p.G * block_positions(p) <= kDecodeMaxGroupedRows;
}

void flash_attention_decode(const Problem& p, const FlashKernels& k, const KvPages* pages) {
  flash_attention_decode(std::vector<const Problem*>{&p}, k, std::vector<const KvPages*>{pages});
}

void flash_attention_decode(const std::vector<const Problem*>& problems, const FlashKernels& k,
                            const std::vector<const KvPages*>& pages) {
  std::vector<const Problem*> ps;
  std::vector<Plan> plans;
  std::vector<SplitPartials> parts;
  std::vector<FlashTask> grouped;  // the plans' tasks, each group's together
  std::vector<TaskGroup> groups;
  std::vector<std::pair<std::size_t, std::size_t>> merges;  // (plan, merge)
  for (std::size_t i = 0; i < problems.size(); ++i) {
    const Problem& p = *problems[i];
    if (p.B == 0 || p.T == 0) continue;
    ps.push_back(&p);
    plans.push_back(make_plan(p, k, pages[i]));
    const Plan& plan = plans.back();
    parts.emplace_back(plan.work, plan.M, plan.Hp);
    for (std::size_t m = 0; m < plan.work.merges.size(); ++m) merges.push_back({plans.size() - 1, m});
  }
  if (ps.empty()) return;
  std::int64_t ntasks = 0;
  for (const Plan& plan : plans) ntasks += static_cast<std::int64_t>(plan.work.tasks.size());
  for (std::size_t j = 0; j < plans.size(); ++j) {
    Plan& plan = plans[j];
    const std::vector<FlashTask>& tasks = plan.work.tasks;
    // Q's rows as the workspace holds them (run_tasks).
    plan.heads = decode_group_heads(plan.heads, plan.M, plan.Hp, q_row_set(plan).operand_bytes, ntasks,
                                    ps[0]->threads);
    if (plan.heads == 1) {  // a task a group, in the plan's order
      for (std::size_t t = 0; t < tasks.size(); ++t) groups.push_back({j, grouped.size() + t, 1});
      grouped.insert(grouped.end(), tasks.begin(), tasks.end());
      continue;
    }
    // Tasks of the same rows and keys (b, q block, split) next to each other, then cut into groups of
    // up to plan.heads kv heads.
    std::vector<std::size_t> order(tasks.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    const auto key = [&](std::size_t t) {
      const FlashTask& x = tasks[t];
      return std::tuple{x.b, x.qb, x.keys.begin, x.keys.end, x.kh};
    };
    std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return key(x) < key(y); });
    for (std::size_t i = 0; i < order.size(); ++i) {
      const FlashTask& x = tasks[order[i]];
      const FlashTask* prev = i > 0 ? &tasks[order[i - 1]] : nullptr;  // in groups.back() when there is one
      if (prev != nullptr && prev->b == x.b && prev->qb == x.qb && prev->keys.begin == x.keys.begin &&
          prev->keys.end == x.keys.end && static_cast<std::int64_t>(groups.back().count) < plan.heads)
        ++groups.back().count;
      else
        groups.push_back({j, grouped.size(), 1});
      grouped.push_back(x);
    }
  }
  run_tasks_then_merges(
      *ps[0], static_cast<std::int64_t>(groups.size()), static_cast<std::int64_t>(merges.size()),
      [&] { return Workspace(plans); },
      [&](std::int64_t i, Workspace& w) {
        const TaskGroup& g = groups[static_cast<std::size_t>(i)];
        run_tasks(*ps[g.plan], plans[g.plan], grouped.data() + g.first, static_cast<std::int64_t>(g.count), w,
                  parts[g.plan]);
      },
      [&](std::int64_t i, float* acc) {
        const auto [j, m] = merges[static_cast<std::size_t>(i)];
        merge_task(*ps[j], plans[j].work, plans[j].work.merges[m], parts[j], acc);
      });
}

int flash_decode_kv_splits(const Problem& p, const FlashKernels& k) {
  if (p.B == 0 || p.T == 0) return 1;
  return static_cast<int>(make_plan(p, k, nullptr).work.max_splits());
}

KeySums flash_decode_key_sums(const Problem& p, const FlashKernels& k, const KvPages* pages) {
  if (p.B == 0 || p.T == 0) return {1, 0};
  return make_plan(p, k, pages).work.key_sums();
}

}  // namespace flashgqa
