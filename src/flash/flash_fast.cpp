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
//      the tile may see), the online softmax (softmax_tile: running max, P = exp(S - m) rounded to
//      bf16, fp32 denominators, masking only where the diagonal or the block end cuts the tile),
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
#include "flash/flash_fast.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.hpp"
#include "flash/aligned_buffer.hpp"
#include "flash/block_sizes.hpp"
#include "flash/finish_rows.hpp"
#include "flash/run_tasks.hpp"
#include "flash/flash_decode.hpp"
#include "kernels/microkernels.hpp"


namespace flashgqa {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Below this many (b, kv head, q block) tasks the KV ranges are split, aiming at this many tasks.
// A constant, not the thread count: the split changes rounding, and results must not depend on threads.
constexpr std::int64_t kMinTasks = 16;
// A split covers at least this many KV blocks.
constexpr std::int64_t kMinBlocksPerSplit = 2;

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }
std::int64_t ceil_div(std::int64_t x, std::int64_t m) { return (x + m - 1) / m; }

struct Task {
  std::int64_t b, kh, qb;
  std::int64_t kv_begin, kv_end;  // keys [kv_begin, kv_end)
  std::int64_t slot;              // partial-result slot, or -1: write the output directly
  std::int64_t work;              // rows x keys, for scheduling only
};

struct Merge {
  std::int64_t b, kh, qb, first_slot, count;
};

struct Plan {
  const FlashKernels* kern = nullptr;
  FlashBlocks blocks;
  std::int64_t Hp = 0, M = 0, Mpad = 0, npad = 0;  // M: rows of a full q block
  std::vector<Task> tasks;  // grouped by kv head group, largest first within a group
  std::vector<Merge> merges;
  std::int64_t slots = 0;
  // K/V are packed once per kv head, for all its q blocks, a group of heads at a time.
  std::int64_t kv_all = 0;       // keys any query sees: [0, kv_all)
  std::int64_t kv_blocks = 0;    // KV blocks of a head
  std::int64_t block_bytes = 0;  // one packed K (or V) block, npad keys x Hp
  std::int64_t heads_per_group = 1;
  std::vector<std::int64_t> group_first;  // tasks of group g: [group_first[g], group_first[g + 1])
  std::int64_t head_group(const Task& t, std::int64_t K) const { return (t.b * K + t.kh) / heads_per_group; }
};

// Bytes of packed K and V that one group of heads may hold (at least one head is always allowed).
constexpr std::int64_t kPackedGroupBytes = std::int64_t{256} << 20;

// Keys query block qb may see at all: [0, kv_end).
std::int64_t block_kv_end(const Problem& p, const FlashBlocks& bl, std::int64_t qb) {
  const std::int64_t t_last = std::min(p.T, (qb + 1) * bl.bq) - 1;
  return p.visible_keys(t_last);
}

Plan make_plan(const Problem& p, Isa isa) {
  Plan plan;
  plan.kern = &kernels_for(isa, p.precision);
  plan.blocks = choose_flash_blocks(p, *plan.kern);
  const FlashBlocks& bl = plan.blocks;
  plan.Hp = round_up(p.H, kHTile);
  plan.M = p.G * bl.bq;
  plan.Mpad = round_up(plan.M, plan.kern->mr);
  plan.npad = round_up(bl.bkv, kPanelKeys);
  const std::int64_t nq = ceil_div(p.T, bl.bq);
  const std::int64_t base_tasks = p.B * p.K * nq;
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh)
      for (std::int64_t qb = 0; qb < nq; ++qb) {
        const std::int64_t kv_end = block_kv_end(p, bl, qb);
        const std::int64_t nblocks = ceil_div(kv_end, bl.bkv);
        const std::int64_t rows = p.G * (std::min(p.T, (qb + 1) * bl.bq) - qb * bl.bq);
        std::int64_t nsplit = 1;
        if (base_tasks < kMinTasks)
          nsplit = std::clamp<std::int64_t>(ceil_div(kMinTasks, base_tasks), 1,
                                            std::max<std::int64_t>(nblocks / kMinBlocksPerSplit, 1));
        if (nsplit == 1) {
          plan.tasks.push_back({b, kh, qb, 0, kv_end, -1, rows * kv_end});
          continue;
        }
        plan.merges.push_back({b, kh, qb, plan.slots, nsplit});
        for (std::int64_t i = 0; i < nsplit; ++i) {
          const std::int64_t lo = nblocks * i / nsplit * bl.bkv;
          const std::int64_t hi = std::min(kv_end, nblocks * (i + 1) / nsplit * bl.bkv);
          plan.tasks.push_back({b, kh, qb, lo, hi, plan.slots++, rows * (hi - lo)});
        }
      }
  // Heads per group: enough tasks to keep every thread busy, within the packed-memory budget. (Only
  // the order of work and the memory change with the thread count, never a result.)
  const std::int64_t heads = p.B * p.K;
  plan.kv_all = p.visible_keys(p.T - 1);
  plan.kv_blocks = ceil_div(plan.kv_all, bl.bkv);
  plan.block_bytes = plan.npad * plan.Hp * plan.kern->operand_bytes;
  const std::int64_t tasks_per_head = std::max<std::int64_t>(static_cast<std::int64_t>(plan.tasks.size()) / heads, 1);
  plan.heads_per_group = std::clamp<std::int64_t>(ceil_div(4 * std::max(p.threads, 1), tasks_per_head), 1, heads);
  while (plan.heads_per_group > 1 && plan.heads_per_group * 2 * plan.kv_blocks * plan.block_bytes > kPackedGroupBytes)
    --plan.heads_per_group;
  // By group, then largest first, so each group's dynamic schedule ends with small tasks.
  std::stable_sort(plan.tasks.begin(), plan.tasks.end(), [&](const Task& x, const Task& y) {
    const std::int64_t gx = plan.head_group(x, p.K), gy = plan.head_group(y, p.K);
    return gx != gy ? gx < gy : x.work > y.work;
  });
  const std::int64_t ngroups = ceil_div(heads, plan.heads_per_group);
  plan.group_first.assign(static_cast<std::size_t>(ngroups + 1), 0);
  for (const Task& t : plan.tasks) ++plan.group_first[static_cast<std::size_t>(plan.head_group(t, p.K) + 1)];
  for (std::int64_t g = 0; g < ngroups; ++g)
    plan.group_first[static_cast<std::size_t>(g + 1)] += plan.group_first[static_cast<std::size_t>(g)];
  return plan;
}

// The packed K and V blocks of one group of heads: head i of the group, block j at
// (i * kv_blocks + j) * block_bytes. Block j holds keys [j bkv, j bkv + n_j), n_j = min(bkv, kv_all - j bkv),
// zero padded to a multiple of 32 keys; its V panels are laid out for that padded length.
struct PackedKV {
  AlignedBuffer k, v;
  explicit PackedKV(const Plan& plan) {
    const auto bytes = static_cast<std::size_t>(plan.heads_per_group * plan.kv_blocks * plan.block_bytes);
    k.reset(bytes);
    v.reset(bytes);
  }
  std::int64_t offset(const Plan& plan, std::int64_t head_in_group, std::int64_t block) const {
    return (head_in_group * plan.kv_blocks + block) * plan.block_bytes;
  }
};

// Packs block j of head `head` (b * K + kh) into its place in the group's buffers.
void pack_block(const Problem& p, const Plan& plan, PackedKV& kv, std::int64_t head, std::int64_t j) {
  const FlashKernels& kern = *plan.kern;
  const bool round = p.precision == Precision::bf16;
  const std::int64_t b = head / p.K, kh = head % p.K, s0 = j * plan.blocks.bkv;
  const std::int64_t n = std::min(plan.blocks.bkv, plan.kv_all - s0);
  const std::int64_t at = kv.offset(plan, head % plan.heads_per_group, j);
  kern.pack_k(kv.k.as<char>() + at, {p.k_row(b, kh, s0), p.k_dtype, p.k_stride[2], n, p.H, plan.Hp, round});
  kern.pack_v(kv.v.as<char>() + at, {p.v_row(b, kh, s0), p.v_dtype, p.v_stride[2], n, p.H, plan.Hp, round});
}

// One thread's buffers (64-byte aligned; leading dimensions are multiples of 64 bytes).
struct Workspace {
  AlignedBuffer q, o, m, l, s, p, corr, limit;
  std::int64_t ldq = 0, ldo = 0, lds = 0, ldp = 0;

  explicit Workspace(const Plan& plan) {
    const std::int64_t ob = plan.kern->operand_bytes, mr = plan.kern->mr;
    ldq = ldo = plan.Hp;
    lds = ldp = plan.npad;
    q.reset(static_cast<std::size_t>(plan.Mpad * ldq * ob));
    o.reset(static_cast<std::size_t>(plan.Mpad * ldo * 4));
    m.reset(static_cast<std::size_t>(plan.Mpad * 4));
    l.reset(static_cast<std::size_t>(plan.Mpad * 4));
    s.reset(static_cast<std::size_t>(mr * lds * 4));
    p.reset(static_cast<std::size_t>(mr * ldp * ob));
    corr.reset(static_cast<std::size_t>(mr * 4));
    limit.reset(static_cast<std::size_t>(mr * 4));
  }
};

// Partial results of split tasks: per slot O [Mpad][Hp], m [Mpad], l [Mpad].
struct Partials {
  AlignedBuffer o, m, l;
  std::int64_t per_o = 0, per_row = 0;
  Partials(const Plan& plan) : per_o(plan.Mpad * plan.Hp), per_row(plan.Mpad) {
    o.reset(static_cast<std::size_t>(plan.slots * per_o * 4));
    m.reset(static_cast<std::size_t>(plan.slots * per_row * 4));
    l.reset(static_cast<std::size_t>(plan.slots * per_row * 4));
  }
};

// Row r of a q block starting at position t0: position t0 + r / G, head r % G.
struct RowMap {
  std::int64_t G, t0;
  std::int64_t t(std::int64_t r) const { return t0 + r / G; }
  std::int64_t g(std::int64_t r) const { return r % G; }
};

void run_task(const Problem& p, const Plan& plan, const Task& task, const PackedKV& kv, Workspace& w,
              Partials* parts, std::vector<float>& tmp) {
  const FlashKernels& kern = *plan.kern;
  const std::int64_t ob = kern.operand_bytes, mr = kern.mr, Hp = plan.Hp, G = p.G;
  const std::int64_t bq = plan.blocks.bq, bkv = plan.blocks.bkv;
  const std::int64_t t0 = task.qb * bq, nt = std::min(p.T, t0 + bq) - t0, M = G * nt;
  const RowMap rows{G, t0};
  const bool round = p.precision == Precision::bf16;
  auto* q = w.q.as<char>();
  auto* o = w.o.as<float>();
  auto* m = w.m.as<float>();
  auto* l = w.l.as<float>();
  auto* limit = w.limit.as<std::int32_t>();

  // Q rows, packed once per task; O, m, l initialised.
  for (std::int64_t r = 0; r < M; ++r) {
    const PackSource src{p.q_row(task.b, task.kh, rows.g(r), rows.t(r)), p.q_dtype, 0, 0, p.H, Hp, round};
    kern.pack_q_row(q + r * w.ldq * ob, src);
  }
  std::memset(o, 0, static_cast<std::size_t>(M * w.ldo) * sizeof(float));
  std::fill(m, m + M, kNegInf);
  std::fill(l, l + M, 0.0f);

  for (std::int64_t s0 = task.kv_begin; s0 < task.kv_end; s0 += bkv) {
    // The task's keys of this block, and the block as packed for every q block of the head (it may
    // hold more keys, which the masks below never let through).
    const std::int64_t n = std::min(bkv, task.kv_end - s0), npad = round_up(n, kPanelKeys);
    const std::int64_t at = kv.offset(plan, (task.b * p.K + task.kh) % plan.heads_per_group, s0 / bkv);
    const char* kblock = kv.k.as<char>() + at;
    const char* vblock = kv.v.as<char>() + at;
    const std::int64_t vpad = round_up(std::min(bkv, plan.kv_all - s0), kPanelKeys);  // V panel length
    for (std::int64_t r0 = 0; r0 < M; r0 += mr) {
      const int nr = static_cast<int>(std::min(mr, M - r0));
      // Keys of this block the tile's rows may see: the first row sees fewest, the last most.
      const std::int64_t lim_hi = std::clamp<std::int64_t>(p.visible_keys(rows.t(r0 + nr - 1)) - s0, 0, n);
      if (lim_hi == 0) continue;  // above the diagonal: nothing to do for this tile
      const std::int64_t lim_lo = std::clamp<std::int64_t>(p.visible_keys(rows.t(r0)) - s0, 0, n);
      const std::int32_t* lim = nullptr;
      if (lim_lo < npad) {  // the diagonal or the block end cuts the tile: mask per row
        for (int i = 0; i < nr; ++i)
          limit[i] =
              static_cast<std::int32_t>(std::clamp<std::int64_t>(p.visible_keys(rows.t(r0 + i)) - s0, 0, n));
        lim = limit;
      }
      const std::int64_t nk = round_up(lim_hi, kPanelKeys), nkeys = round_up(lim_hi, 2);
      float* s = w.s.as<float>();
      // S = scale Q K^T over the panels some row may see.
      for (std::int64_t c = 0; c < nk; c += kPanelKeys)
        kern.qk_tile(
            {s + c, w.lds, q + r0 * w.ldq * ob, w.ldq, kblock + c * Hp * ob, Hp, p.scale, nr});
      // Running max, P = exp(S - m) (bf16), l = l corr + sum P.
      const bool moved = kern.softmax_tile(
          {s, w.lds, w.p.data(), w.ldp, m + r0, l + r0, w.corr.as<float>(), lim, nk, nr, round});
      // O = O corr + P V, one h tile at a time (the rescale only when some row's max moved).
      for (std::int64_t c = 0; c < Hp; c += kHTile)
        kern.pv_tile({o + r0 * w.ldo + c, w.ldo, w.p.data(), w.ldp, vblock + c * vpad * ob, nkeys,
                      moved ? w.corr.as<float>() : nullptr, nr});
    }
  }

  if (task.slot < 0) {
    for (std::int64_t r = 0; r < M; ++r)
      write_flash_row(p, task.b, task.kh, rows.g(r), rows.t(r), o + r * w.ldo, m[r], l[r], tmp.data());
    return;
  }
  float* po = parts->o.as<float>() + task.slot * parts->per_o;
  std::memcpy(po, o, static_cast<std::size_t>(M * w.ldo) * sizeof(float));
  std::memcpy(parts->m.as<float>() + task.slot * parts->per_row, m, static_cast<std::size_t>(M) * 4);
  std::memcpy(parts->l.as<float>() + task.slot * parts->per_row, l, static_cast<std::size_t>(M) * 4);
}

// Combines the partial (O, m, l) of a split q block in slot order (finish_rows.hpp).
void merge_splits(const Problem& p, const Plan& plan, const Merge& mg, const Partials& parts,
                  std::vector<float>& tmp) {
  const std::int64_t t0 = mg.qb * plan.blocks.bq;
  const std::int64_t M = p.G * (std::min(p.T, t0 + plan.blocks.bq) - t0);
  const RowMap rows{p.G, t0};
  std::vector<float> acc(static_cast<std::size_t>(p.H));
  for (std::int64_t r = 0; r < M; ++r) {
    const std::int64_t first = mg.first_slot * parts.per_row + r;
    merge_flash_row(p, mg.b, mg.kh, rows.g(r), rows.t(r), mg.count, parts.m.as<float>() + first,
                    parts.l.as<float>() + first, parts.per_row,
                    parts.o.as<float>() + mg.first_slot * parts.per_o + r * plan.Hp, parts.per_o, acc.data(),
                    tmp.data());
  }
}

}  // namespace

void flash_attention_fast(const Problem& p, Isa isa) {
  if (p.B == 0 || p.T == 0) return;
  // A few query rows per kv head (decode): rows streamed in address order, no packing.
  if (const FlashKernels& kern = kernels_for(isa, p.precision); flash_decode_applies(p, kern))
    return flash_attention_decode(p, kern);
  const Plan plan = make_plan(p, isa);
  Partials parts(plan);
  PackedKV kv(plan);  // one group of heads at a time
  const std::int64_t heads = p.B * p.K;
  run_grouped_tasks_then_merges(
      p.threads, p.H, plan.group_first,
      [&](std::int64_t g) {  // the group's (head, block) pairs
        return (std::min(heads, (g + 1) * plan.heads_per_group) - g * plan.heads_per_group) * plan.kv_blocks;
      },
      [&](std::int64_t g, std::int64_t i) {
        pack_block(p, plan, kv, g * plan.heads_per_group + i / plan.kv_blocks, i % plan.kv_blocks);
      },
      [&] { return Workspace(plan); },
      [&](std::int64_t i, Workspace& w, std::vector<float>& tmp) {
        run_task(p, plan, plan.tasks[static_cast<std::size_t>(i)], kv, w, &parts, tmp);
      },
      static_cast<std::int64_t>(plan.merges.size()),
      [&](std::int64_t i, std::vector<float>& tmp) {
        merge_splits(p, plan, plan.merges[static_cast<std::size_t>(i)], parts, tmp);
      });
}

void flash_attention_fast(const Problem& p) { flash_attention_fast(p, active_isa()); }

int flash_max_kv_splits(const Problem& p, Isa isa) {
  if (p.B == 0 || p.T == 0) return 1;
  if (const FlashKernels& kern = kernels_for(isa, p.precision); flash_decode_applies(p, kern))
    return flash_decode_kv_splits(p, kern);
  const Plan plan = make_plan(p, isa);
  std::int64_t most = 1;
  for (const Merge& mg : plan.merges) most = std::max(most, mg.count);
  return static_cast<int>(most);
}

}  // namespace flashgqa
