// Design (what moves where, and why):
//
// K and V of each kv head are packed once per call, in blocks of bkv keys, into the layouts the
// micro-kernels read (K as panels of 32 keys, V in pairs along keys; see kernels/microkernels.hpp), a
// group of heads at a time (bounded memory), and every q block and G head of that kv head reads them.
// Work is split into tasks over (b, kv head, q block [, KV split]). A q block is bq query positions of
// all G heads of one kv head: M = G*bq rows, ordered position-major (row = ti*G + g) so a register
// tile of rows spans as few positions as possible and the causal diagonal cuts few tiles. Each task:
//   1. packs its Q rows once (bf16-rounded, H zero padded to Hp): M x Hp, stays in L2;
//   2. walks its KV range block by block; each packed block serves every row tile of the task: G*bq
//      rows reuse each K/V byte brought into cache, so DRAM/L3 traffic is (K+V) / (G*bq) per row;
//   3. per row tile of MR rows: S = scale Q K^T (qk_tile, panel by panel, only the panels some row of
//      the tile may see; with a softcap, S = c tanh(S / c) by softcap_n), the online softmax
//      (softmax_tile: running max, P = exp(S - m) rounded to bf16, fp32 denominators, masking only
//      where the diagonal, a window's edge, a sequence's edge or the block end cuts the tile),
//      O = O * corr + P V (pv_tile, the rescale folded into the accumulator load, skipped when no
//      max moved). S and P of a tile stay in L1; O rows stay in L2 for the whole task;
//   4. writes out = O / l once in out's dtype, and lse = m + log l.
// KV blocks above the diagonal of every query are never packed; above a task's diagonal, never computed.
//
// Threads take tasks dynamically (largest first). When there are few tasks (small T, decode), each
// q block's KV range is split into pieces whose partial (O, m, l) are merged by log-sum-exp in a fixed
// order afterwards; the split count depends on the shapes only, so the result is bitwise the same for
// any number of threads.
//
// Problems with at most kDecodeMaxRows query rows per kv head (decode) on a kernel set with decode
// kernels go to flash_decode.cpp instead: K and V rows streamed in address order, nothing packed.
#include "flash/flash_packed.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.hpp"
#include "core/int_math.hpp"
#include "core/aligned_buffer.hpp"
#include "flash/block_sizes.hpp"
#include "flash/flash_decode.hpp"
#include "flash/kv_splits.hpp"
#include "flash/run_tasks.hpp"
#include "kernels/microkernels.hpp"


namespace flashgqa {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Plan {
  const FlashKernels* kern = nullptr;
  FlashBlocks blocks;
  std::int64_t Hp = 0, M = 0, Mpad = 0, block_keys = 0;  // M: rows of a full q block; block_keys: bkv padded to panels
  TaskPlan work;  // tasks grouped by kv head group, largest first within a group
  // K/V are packed once per kv head, for all its q blocks, a group of heads at a time: the blocks
  // [first_block, first_block + kv_blocks) that hold the keys some query sees, keys [0, kv_end).
  std::int64_t first_block = 0, kv_blocks = 0, kv_end = 0;
  std::int64_t block_bytes = 0;  // one packed K (or V) block, block_keys keys x Hp
  std::int64_t heads_per_group = 1;
  std::vector<std::int64_t> group_first;  // tasks of group g: [group_first[g], group_first[g + 1])
  std::int64_t head_group(const FlashTask& t, std::int64_t K) const { return (t.b * K + t.kh) / heads_per_group; }
};

// Bytes of packed K and V that one group of heads may hold (at least one head is always allowed).
constexpr std::int64_t kPackedGroupBytes = std::int64_t{256} << 20;

Plan make_plan(const Problem& p, Isa isa) {
  Plan plan;
  plan.kern = &kernels_for(isa, p.precision);
  plan.blocks = choose_flash_blocks(p, *plan.kern);
  const FlashBlocks& bl = plan.blocks;
  plan.Hp = round_up(p.H, kHTile);
  plan.M = p.G * bl.bq;
  plan.Mpad = round_up(plan.M, plan.kern->mr);
  plan.block_keys = padded_keys(bl.bkv);
  plan.work = plan_tasks(p, bl.bq, bl.bkv);
  std::vector<FlashTask>& tasks = plan.work.tasks;
  // The blocks any query of a head sees.
  const KeyRange all = p.visible_keys(0, p.T);
  plan.first_block = all.begin / bl.bkv;
  plan.kv_blocks = all.empty() ? 0 : ceil_div(all.end, bl.bkv) - plan.first_block;
  plan.kv_end = all.end;
  plan.block_bytes = plan.block_keys * plan.Hp * plan.kern->operand_bytes;
  // Heads per group: enough tasks to keep every thread busy, within the packed-memory budget. (Only
  // the order of work and the memory change with the thread count, never a result.)
  const std::int64_t heads = p.B * p.K;
  const std::int64_t tasks_per_head = std::max<std::int64_t>(static_cast<std::int64_t>(tasks.size()) / heads, 1);
  plan.heads_per_group = std::clamp<std::int64_t>(ceil_div(4 * std::max(p.threads, 1), tasks_per_head), 1, heads);
  while (plan.heads_per_group > 1 && plan.heads_per_group * 2 * plan.kv_blocks * plan.block_bytes > kPackedGroupBytes)
    --plan.heads_per_group;
  // By group, then largest first, so each group's dynamic schedule ends with small tasks.
  std::stable_sort(tasks.begin(), tasks.end(), [&](const FlashTask& x, const FlashTask& y) {
    const std::int64_t gx = plan.head_group(x, p.K), gy = plan.head_group(y, p.K);
    return gx != gy ? gx < gy : x.work > y.work;
  });
  const std::int64_t ngroups = ceil_div(heads, plan.heads_per_group);
  plan.group_first.assign(static_cast<std::size_t>(ngroups + 1), 0);
  for (const FlashTask& t : tasks) ++plan.group_first[static_cast<std::size_t>(plan.head_group(t, p.K) + 1)];
  for (std::int64_t g = 0; g < ngroups; ++g)
    plan.group_first[static_cast<std::size_t>(g + 1)] += plan.group_first[static_cast<std::size_t>(g)];
  return plan;
}

// The packed K and V blocks of one group of heads: head i of the group, block j (absolute block
// first_block + j) at (i * kv_blocks + j) * block_bytes. A block holds keys [s0, s0 + n),
// s0 = (first_block + j) bkv, n = min(bkv, kv_end - s0), zero padded to whole panels; its V panels are
// laid out for that padded length.
struct PackedKV {
  AlignedBuffer k, v;
  explicit PackedKV(const Plan& plan) {
    const auto bytes = static_cast<std::size_t>(plan.heads_per_group * plan.kv_blocks * plan.block_bytes);
    k.reset(bytes);
    v.reset(bytes);
  }
  std::int64_t offset(const Plan& plan, std::int64_t head_in_group, std::int64_t block) const {
    return (head_in_group * plan.kv_blocks + block - plan.first_block) * plan.block_bytes;
  }
  // Keys in absolute block j as packed.
  static std::int64_t keys(const Plan& plan, std::int64_t j) {
    return std::min(plan.blocks.bkv, plan.kv_end - j * plan.blocks.bkv);
  }
};

// Packs absolute block j of head `head` (b * K + kh) into its place in the group's buffers.
void pack_block(const Problem& p, const Plan& plan, PackedKV& kv, std::int64_t head, std::int64_t j) {
  const FlashKernels& kern = *plan.kern;
  const bool round = p.precision == Precision::bf16;
  const std::int64_t b = head / p.K, kh = head % p.K, s0 = j * plan.blocks.bkv;
  const std::int64_t n = PackedKV::keys(plan, j);
  const std::int64_t at = kv.offset(plan, head % plan.heads_per_group, j);
  kern.pack_k(kv.k.as<char>() + at, {p.k_row(b, kh, s0), p.k_dtype, p.k_stride[2], n, p.H, plan.Hp, round});
  kern.pack_v(kv.v.as<char>() + at, {p.v_row(b, kh, s0), p.v_dtype, p.v_stride[2], n, p.H, plan.Hp, round});
}

// One thread's buffers (64-byte aligned; leading dimensions are multiples of 64 bytes).
struct Workspace {
  AlignedBuffer q, o, m, l, s, p, corr, lo, hi;
  std::int64_t ldq = 0, ldo = 0, lds = 0, ldp = 0;

  explicit Workspace(const Plan& plan) {
    const std::int64_t operand_bytes = plan.kern->operand_bytes, mr = plan.kern->mr;
    ldq = ldo = plan.Hp;
    lds = ldp = plan.block_keys;
    q.reset(static_cast<std::size_t>(plan.Mpad * ldq * operand_bytes));
    o.reset(static_cast<std::size_t>(plan.Mpad * ldo * 4));
    m.reset(static_cast<std::size_t>(plan.Mpad * 4));
    l.reset(static_cast<std::size_t>(plan.Mpad * 4));
    s.reset(static_cast<std::size_t>(mr * lds * 4));
    p.reset(static_cast<std::size_t>(mr * ldp * operand_bytes));
    for (AlignedBuffer* b : {&corr, &lo, &hi}) b->reset(static_cast<std::size_t>(mr * 4));
  }
};

void run_task(const Problem& p, const Plan& plan, const FlashTask& task, const PackedKV& kv, Workspace& w,
              SplitPartials& parts) {
  const FlashKernels& kern = *plan.kern;
  const std::int64_t operand_bytes = kern.operand_bytes, mr = kern.mr, Hp = plan.Hp;
  const std::int64_t bkv = plan.blocks.bkv;
  const std::int64_t M = plan.work.rows(p, task.qb);
  const RowOrder rows = plan.work.row_order(p, task.qb);
  const bool round = p.precision == Precision::bf16;
  auto* q = w.q.as<char>();
  auto* o = w.o.as<float>();
  auto* m = w.m.as<float>();
  auto* l = w.l.as<float>();
  auto* lo = w.lo.as<std::int32_t>();
  auto* hi = w.hi.as<std::int32_t>();

  // Q rows, packed once per task; O, m, l initialised.
  for (std::int64_t r = 0; r < M; ++r) {
    const PackSource src{p.q_row(task.b, task.kh, rows.g(r), rows.t(r)), p.q_dtype, 0, 0, p.H, Hp, round};
    kern.pack_q_row(q + r * w.ldq * operand_bytes, src);
  }
  std::memset(o, 0, static_cast<std::size_t>(M * w.ldo) * sizeof(float));
  std::fill(m, m + M, kNegInf);
  std::fill(l, l + M, 0.0f);

  for (std::int64_t j = task.keys.begin / bkv; j * bkv < task.keys.end; ++j) {
    // The task's keys of block j, [s0 + n0, s0 + n), within the block as packed for every q block of
    // the head (it may hold more keys, which the masks below never let through).
    const std::int64_t s0 = j * bkv;
    const std::int64_t n0 = std::max<std::int64_t>(task.keys.begin - s0, 0);
    const std::int64_t n = std::min(bkv, task.keys.end - s0), n_padded = padded_keys(n);
    const std::int64_t at = kv.offset(plan, (task.b * p.K + task.kh) % plan.heads_per_group, j);
    const char* kblock = kv.k.as<char>() + at;
    const char* vblock = kv.v.as<char>() + at;
    const std::int64_t v_panel_keys = padded_keys(PackedKV::keys(plan, j));  // V panel length
    // Row r's keys of the block, as offsets from s0.
    auto row_keys = [&](std::int64_t r) { return p.visible_keys(rows.t(r)).clamp_to(s0 + n0, s0 + n, s0); };
    for (std::int64_t r0 = 0; r0 < M; r0 += mr) {
      const int nr = static_cast<int>(std::min(mr, M - r0));
      // The tile's first row sees the first keys, its last row the last (visible_keys is monotone).
      const KeyRange first = row_keys(r0), last = row_keys(r0 + nr - 1);
      if (last.end <= first.begin) continue;  // no row of the tile sees a key of this block
      const std::int32_t *row_lo = nullptr, *row_hi = nullptr;
      if (last.begin > 0 || first.end < n_padded) {  // a mask edge or the block end cuts the tile
        for (int i = 0; i < nr; ++i) {
          const KeyRange keys = row_keys(r0 + i);
          lo[i] = static_cast<std::int32_t>(keys.begin);
          hi[i] = static_cast<std::int32_t>(keys.end);
        }
        row_lo = lo;
        row_hi = hi;
      }
      const std::int64_t c0 = first.begin / kPanelKeys * kPanelKeys;
      const std::int64_t s_keys = padded_keys(last.end), pv_keys = round_up(last.end, 2);
      float* s = w.s.as<float>();
      // S = scale Q K^T over the panels some row may see.
      for (std::int64_t c = c0; c < s_keys; c += kPanelKeys)
        kern.qk_tile({s + c, w.lds, q + r0 * w.ldq * operand_bytes, w.ldq, kblock + c * Hp * operand_bytes, Hp,
                      p.scale, nr});
      // Softcap: S = c tanh(S / c) over the same panels, row by row.
      if (p.softcap != 0.0f)
        for (int i = 0; i < nr; ++i) kern.softcap_n(s + i * w.lds + c0, s_keys - c0, p.softcap);
      // Running max, P = exp(S - m) (bf16), l = l corr + sum P.
      const bool moved = kern.softmax_tile(
          {s, w.lds, w.p.data(), w.ldp, m + r0, l + r0, w.corr.as<float>(), row_lo, row_hi, s_keys, nr, round});
      // O = O corr + P V, one h tile at a time (the rescale only when some row's max moved).
      for (std::int64_t c = 0; c < Hp; c += kHTile)
        kern.pv_tile({o + r0 * w.ldo + c, w.ldo, w.p.data(), w.ldp, vblock + c * v_panel_keys * operand_bytes,
                      pv_keys, moved ? w.corr.as<float>() : nullptr, nr});
    }
  }
  finish_task(p, plan.work, task, M, o, w.ldo, m, l, parts);
}

}  // namespace

void flash_attention(const Problem& p, Isa isa) {
  if (p.B == 0 || p.T == 0) return;
  // A few query rows per kv head (decode): rows streamed in address order, no packing.
  if (const FlashKernels& kern = decode_kernels_for(isa, p.precision); flash_decode_applies(p, kern))
    return flash_attention_decode(p, kern);
  const Plan plan = make_plan(p, isa);
  SplitPartials parts(plan.work, plan.Mpad, plan.Hp);
  PackedKV kv(plan);  // one group of heads at a time
  const std::int64_t heads = p.B * p.K;
  run_grouped_tasks_then_merges(
      p, plan.group_first,
      [&](std::int64_t g) {  // the group's (head, block) pairs
        return (std::min(heads, (g + 1) * plan.heads_per_group) - g * plan.heads_per_group) * plan.kv_blocks;
      },
      [&](std::int64_t g, std::int64_t i) {
        pack_block(p, plan, kv, g * plan.heads_per_group + i / plan.kv_blocks,
                   plan.first_block + i % plan.kv_blocks);
      },
      [&] { return Workspace(plan); },
      [&](std::int64_t i, Workspace& w) {
        run_task(p, plan, plan.work.tasks[static_cast<std::size_t>(i)], kv, w, parts);
      },
      static_cast<std::int64_t>(plan.work.merges.size()),
      [&](std::int64_t i, float* acc) {
        merge_task(p, plan.work, plan.work.merges[static_cast<std::size_t>(i)], parts, acc);
      });
}

int flash_max_kv_splits(const Problem& p, Isa isa) {
  if (p.B == 0 || p.T == 0) return 1;
  if (const FlashKernels& kern = decode_kernels_for(isa, p.precision); flash_decode_applies(p, kern))
    return flash_decode_kv_splits(p, kern);
  return static_cast<int>(make_plan(p, isa).work.max_splits());
}

KeySums flash_key_sums(const Problem& p, Isa isa) {
  if (p.B == 0 || p.T == 0) return {1, 0};
  if (const FlashKernels& kern = decode_kernels_for(isa, p.precision); flash_decode_applies(p, kern))
    return flash_decode_key_sums(p, kern);
  return make_plan(p, isa).work.key_sums();
}

}  // namespace flashgqa
