// Design (what moves where, and why):
//
// A decode task is (b, kv head, KV split): all M = G*T <= kDecodeMaxRows query rows of the kv head
// (row r = t*G + g, as in flash_fast.cpp) against one contiguous range of keys. The task packs its Q
// rows once (bf16, H padded to Hp) and walks its keys in blocks of bkv:
//   1. S = scale Q K^T: decode_qk_rows reads the block's K rows in address order from their source
//      (no packed copy);
//   2. the online softmax over the block (softmax_tile: running max, P = exp(S - m) rounded to bf16,
//      fp32 sums of the unrounded P, keys at or beyond each row's visible limit masked);
//   3. O = O corr + P V: decode_pv_rows reads the block's V rows in address order, likewise.
// S and P (M x bkv) and O (M x Hp fp32) stay in L1; K and V stream from DRAM once each. The block only
// bounds S and P: the two streams alternate per block, and a long block means few switches.
//
// Few (b, kv head) pairs leave threads idle, so each pair's key range is split into up to kMinTasks /
// (B K) pieces (at least kMinBlocksPerSplit blocks each); the partial (O, m, l) are merged by
// log-sum-exp in split order. The split depends on the shapes and bkv only, so the result is bitwise
// the same for any number of threads.
#include "flash/flash_decode.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.hpp"
#include "flash/aligned_buffer.hpp"
#include "flash/finish_rows.hpp"
#include "flash/run_tasks.hpp"


namespace flashgqa {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr std::int64_t kMinTasks = 16;           // as flash_fast.cpp: a constant, never the thread count
constexpr std::int64_t kMinBlocksPerSplit = 2;   // a split covers at least this many blocks
constexpr std::int64_t kDecodeBlockKeys = 512;   // bkv unless block_kv is set (see docs/performance.md)

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }
std::int64_t ceil_div(std::int64_t x, std::int64_t m) { return (x + m - 1) / m; }

struct Task {
  std::int64_t b, kh, kv_begin, kv_end;  // keys [kv_begin, kv_end)
  std::int64_t slot;                     // partial-result slot, or -1: write the output directly
};

struct Plan {
  const FlashKernels* kern = nullptr;
  std::int64_t M = 0, Hp = 0, bkv = 0, nsplit = 1;
  std::vector<Task> tasks;  // (b, kh) major, split minor; slot = task index when split
};

Plan make_plan(const Problem& p, const FlashKernels& k) {
  Plan plan;
  plan.kern = &k;
  plan.M = p.G * p.T;
  plan.Hp = round_up(p.H, kHTile);
  // A block longer than the keys only costs memory: clamp it (same result, one block either way).
  plan.bkv = std::min(p.block_kv > 0 ? p.block_kv : kDecodeBlockKeys, round_up(std::max<std::int64_t>(p.S, 1), kPanelKeys));
  const std::int64_t kv_end = p.visible_keys(p.T - 1);  // the last position sees the most keys
  const std::int64_t nblocks = ceil_div(kv_end, plan.bkv), pairs = p.B * p.K;
  if (pairs < kMinTasks)
    plan.nsplit = std::clamp<std::int64_t>(ceil_div(kMinTasks, pairs), 1,
                                           std::max<std::int64_t>(nblocks / kMinBlocksPerSplit, 1));
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh)
      for (std::int64_t i = 0; i < plan.nsplit; ++i) {
        if (plan.nsplit == 1) {
          plan.tasks.push_back({b, kh, 0, kv_end, -1});
          continue;
        }
        const std::int64_t lo = nblocks * i / plan.nsplit * plan.bkv;
        const std::int64_t hi = std::min(kv_end, nblocks * (i + 1) / plan.nsplit * plan.bkv);
        plan.tasks.push_back({b, kh, lo, hi, static_cast<std::int64_t>(plan.tasks.size())});
      }
  return plan;
}

// One thread's buffers (64-byte aligned, leading dimensions multiples of 64 bytes).
struct Workspace {
  AlignedBuffer q, o, m, l, corr, limit, s, p;
  std::int64_t ld = 0;  // of S and P, in elements
  explicit Workspace(const Plan& plan) : ld(round_up(plan.bkv, kPanelKeys)) {
    q.reset(static_cast<std::size_t>(plan.M * plan.Hp * 2));
    o.reset(static_cast<std::size_t>(plan.M * plan.Hp * 4));
    for (AlignedBuffer* b : {&m, &l, &corr, &limit}) b->reset(static_cast<std::size_t>(plan.M * 4));
    s.reset(static_cast<std::size_t>(plan.M * ld * 4));
    p.reset(static_cast<std::size_t>(plan.M * ld * 2));
    std::memset(s.data(), 0, s.bytes());
  }
};

// Partial results of split tasks: per slot O [M][Hp], m [M], l [M].
struct Partials {
  std::vector<float> o, m, l;
  explicit Partials(const Plan& plan) {
    const std::size_t slots = plan.nsplit > 1 ? plan.tasks.size() : 0;
    o.resize(slots * static_cast<std::size_t>(plan.M * plan.Hp));
    m.resize(slots * static_cast<std::size_t>(plan.M));
    l.resize(slots * static_cast<std::size_t>(plan.M));
  }
};

// out = O / l in out's dtype, lse = m + log l; rows that see no key: 0 and -inf.

void run_task(const Problem& p, const Plan& plan, const Task& task, Workspace& w, Partials& parts,
              std::vector<float>& tmp) {
  const FlashKernels& kern = *plan.kern;
  const std::int64_t M = plan.M, Hp = plan.Hp, G = p.G;
  auto* q = w.q.as<std::uint16_t>();
  auto* o = w.o.as<float>();
  auto* m = w.m.as<float>();
  auto* l = w.l.as<float>();
  auto* limit = w.limit.as<std::int32_t>();
  for (std::int64_t r = 0; r < M; ++r)
    kern.pack_q_row(q + r * Hp, {p.q_row(task.b, task.kh, r % G, r / G), p.q_dtype, 0, 0, p.H, Hp, true});
  std::fill(o, o + M * Hp, 0.0f);
  std::fill(m, m + M, kNegInf);
  std::fill(l, l + M, 0.0f);

  for (std::int64_t s0 = task.kv_begin; s0 < task.kv_end; s0 += plan.bkv) {
    const std::int64_t n = std::min(plan.bkv, task.kv_end - s0);
    // Keys of the block each row sees; the last row (latest position) sees the most.
    for (std::int64_t r = 0; r < M; ++r)
      limit[r] = static_cast<std::int32_t>(std::clamp<std::int64_t>(p.visible_keys(r / G) - s0, 0, n));
    const std::int64_t nk = limit[M - 1];
    if (nk == 0) continue;
    // S = scale Q K^T over the keys some row sees.
    kern.decode_qk_rows({w.s.as<float>(), w.ld, q, Hp, p.k_row(task.b, task.kh, s0), p.k_dtype, p.k_stride[2],
                         nk, p.H, Hp, p.scale, static_cast<int>(M)});
    // Running max, P = exp(S - m) (bf16), l = l corr + sum P; keys >= limit[r] masked.
    const bool moved = kern.softmax_tile({w.s.as<float>(), w.ld, w.p.data(), w.ld, m, l, w.corr.as<float>(),
                                          limit, round_up(nk, kPanelKeys), static_cast<int>(M), true});
    // O = O corr + P V (the rescale only when some row's max moved).
    kern.decode_pv_rows({o, Hp, w.p.data(), w.ld, p.v_row(task.b, task.kh, s0), p.v_dtype, p.v_stride[2], nk,
                         round_up(nk, 2), p.H, Hp, moved ? w.corr.as<float>() : nullptr, static_cast<int>(M)});
  }

  if (task.slot < 0) {
    for (std::int64_t r = 0; r < M; ++r)  // row r is query r / G of head r % G
      write_flash_row(p, task.b, task.kh, r % p.G, r / p.G, o + r * Hp, m[r], l[r], tmp.data());
    return;
  }
  const auto slot = static_cast<std::size_t>(task.slot);
  std::memcpy(parts.o.data() + slot * static_cast<std::size_t>(M * Hp), o, static_cast<std::size_t>(M * Hp) * 4);
  std::memcpy(parts.m.data() + slot * static_cast<std::size_t>(M), m, static_cast<std::size_t>(M) * 4);
  std::memcpy(parts.l.data() + slot * static_cast<std::size_t>(M), l, static_cast<std::size_t>(M) * 4);
}

// Combines the splits of (b, kh) = pair in slot order: m = max_i m_i (NaN wins), l = sum_i l_i
// e^(m_i - m), O = sum_i O_i e^(m_i - m).
void merge_splits(const Problem& p, const Plan& plan, std::int64_t pair, const Partials& parts,
                  std::vector<float>& tmp) {
  const std::int64_t M = plan.M, Hp = plan.Hp, first = pair * plan.nsplit;
  std::vector<float> acc(static_cast<std::size_t>(p.H));
  for (std::int64_t r = 0; r < M; ++r) {
    const auto at = static_cast<std::size_t>(first * M + r);
    merge_flash_row(p, pair / p.K, pair % p.K, r % p.G, r / p.G, plan.nsplit, parts.m.data() + at,
                    parts.l.data() + at, M, parts.o.data() + at * static_cast<std::size_t>(Hp), M * Hp,
                    acc.data(), tmp.data());
  }
}

}  // namespace

bool flash_decode_applies(const Problem& p, const FlashKernels& k) {
  return k.decode_qk_rows && k.decode_pv_rows && k.operand_bytes == 2 && p.T >= 1 &&
         p.G * p.T <= kDecodeMaxRows;
}

void flash_attention_decode(const Problem& p, const FlashKernels& k) {
  if (p.B == 0 || p.T == 0) return;
  const Plan plan = make_plan(p, k);
  const auto ntasks = static_cast<std::int64_t>(plan.tasks.size());
  const std::int64_t nmerges = plan.nsplit > 1 ? p.B * p.K : 0;
  Partials parts(plan);
  run_tasks_then_merges(
      p.threads, p.H, ntasks, nmerges, [&] { return Workspace(plan); },
      [&](std::int64_t i, Workspace& w, std::vector<float>& tmp) {
        run_task(p, plan, plan.tasks[static_cast<std::size_t>(i)], w, parts, tmp);
      },
      [&](std::int64_t i, std::vector<float>& tmp) { merge_splits(p, plan, i, parts, tmp); });
}

int flash_decode_kv_splits(const Problem& p, const FlashKernels& k) {
  if (p.B == 0 || p.T == 0) return 1;
  return static_cast<int>(make_plan(p, k).nsplit);
}

}  // namespace flashgqa
