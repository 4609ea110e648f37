// Design (what moves where, and why):
//
// Work goes by groups of (b, kv head) pairs, like the forward's packing. For each head of a group a
// prepare step packs, once, everything the tasks read: Q and dO rows (for S = scale Q K^T and
// dP = dO V^T), Q^T and dO^T (the weight tiles of dK^T and dV^T), K and V as K panels and K as V
// panels (for dQ += dS K), D = rowsum(dO * O) per row in fp32, and zeroes the dK, dV rows of keys no
// query sees. A task is (head, a piece of its keys): the pieces come from the forward's split planner
// (flash/kv_splits.hpp, with one q block of all T positions), so there are enough tasks for the
// threads and their number depends on the shapes only. A task walks its KV blocks in order; per block,
// for every (G head, q block) that sees a key of it:
//   S and dP tile by tile (qk_tile; with a softcap c, S = c tanh(S / c) by softcap_n); P = exp(S - lse)
//   and dS = P (dP - D) (times the cap's slope 1 - (S / c)^2 with a softcap);
//   P and dS packed as V panels over the q block's rows (pack_v: pairs along queries), and
//   dV^T += dO^T P, dK^T += Q^T dS (pv_tile, accumulators [Hp][keys] of the block);
//   dS rows packed as weights (pack_q_row) and dQ += dS K (pv_tile) into the task's dQ rows.
// Five matmuls per (query, key), as FlashAttention-2, and no atomics: a block's dK, dV belong to one
// task and are written when it leaves the block; dQ accumulates over the task's blocks in key order,
// into the thread's rows when the head is one task, or into the piece's slot, and the slots are summed
// in slot order afterwards (a fixed order: the bits do not depend on the thread count). All G heads of
// the kv head pass through the task, so each packed K/V block serves the whole group.
#include "backward/flash_backward.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/dtype.hpp"
#include "core/int_math.hpp"
#include "flash/block_sizes.hpp"
#include "flash/kv_splits.hpp"
#include "flash/run_tasks.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa {
namespace {

constexpr std::int64_t kDefaultBlockQ = 192;   // query positions per q block (a multiple of 32 and of MR = 12)
// Keys per KV block by default (docs/performance.md, "Backward"). With softmax_grad_pack (S and dP a
// register tile of rows at a time): the largest of 2048, 1024, 512 that still gives every thread two
// KV blocks' worth of work (a task never splits a block). Without it the q block's whole S and dP
// tiles are held, and 512 is B4's measured choice.
constexpr std::int64_t kDefaultBlockKV = 512;
constexpr std::int64_t kFusedMaxBlockKV = 2048;
// Bytes of packed operands a group of heads aims at: the buffers are reused group after group, so a
// small group touches fewer fresh pages per call (48 MB rather than 512 MB measured 3% faster at K = 8,
// T = S = 4096); a group still takes as many heads as it needs to have a task for every thread, up to
// kMaxPackedGroupBytes (at least one head is always allowed).
constexpr std::int64_t kPackedGroupBytes = std::int64_t{48} << 20;
constexpr std::int64_t kMaxPackedGroupBytes = std::int64_t{512} << 20;

struct Plan {
  const FlashKernels* kern = nullptr;
  std::int64_t Hp = 0, operand_bytes = 0, mr = 0;
  std::int64_t bq = 0, bkv = 0, nq = 0, nkv = 0;
  std::int64_t Tpad = 0;        // T padded to whole q blocks
  std::int64_t kv_block = 0;    // bkv padded to whole panels
  bool round = false;
  bool fused = false;  // P, dS and their packs by the kernel set's softmax_grad_pack (gradient_weights)
  // Per head of a group, in elements of the operand type (D in floats):
  std::int64_t rows_size = 0;   // Q (or dO) rows [G][Tpad][Hp]
  std::int64_t trans_size = 0;  // Q^T (or dO^T) [G][Hp][Tpad]
  std::int64_t kv_size = 0;     // one of K panels, V as K panels, K as V panels: [nkv][kv_block x Hp]
  std::int64_t heads_per_group = 1;
  TaskPlan work;                // tasks (head, piece of keys): one q block of all T positions
  std::int64_t dq_rows = 0;     // G Tpad: the dQ rows of a head, [G][Tpad][Hp] fp32
  bool any_unsplit = false;     // some task keeps its head's dQ in the thread's workspace
};

// The packed operands of one group of heads (head i of the group at offset i * size of each part).
struct Packed {
  AlignedBuffer q, dout, qt, doutt, k, vk, kv;
  std::vector<float> D;      // [heads][G][T]
  std::vector<float> zeros;  // H zeros (allocated before the parallel region)
};

// One operand: bf16 bits (rounded to nearest even), or fp32 (rounded to bf16 under Precision::bf16).
void put_operand(void* dst, std::int64_t i, float x, const Plan& plan) {
  if (plan.operand_bytes == 2)
    static_cast<std::uint16_t*>(dst)[i] = float_to_bf16_bits(x);
  else
    static_cast<float*>(dst)[i] = plan.round ? round_to_bf16(x) : x;
}

template <typename T>
T* part(const AlignedBuffer& buf, std::int64_t elements, const Plan& plan) {
  return reinterpret_cast<T*>(buf.as<char>() + elements * plan.operand_bytes);
}

// Prepare step i of a group: head i (b, kh) of the group packs its operands and D.
void prepare_head(const BackwardProblem& bp, const Plan& plan, Packed& pk, std::int64_t head_in_group,
                  std::int64_t b, std::int64_t kh) {
  const Problem& p = bp.fwd;
  const FlashKernels& kern = *plan.kern;
  const std::int64_t Hp = plan.Hp, ob = plan.operand_bytes;
  char* q = part<char>(pk.q, head_in_group * plan.rows_size, plan);
  char* dout = part<char>(pk.dout, head_in_group * plan.rows_size, plan);
  void* qt = part<char>(pk.qt, head_in_group * plan.trans_size, plan);
  void* doutt = part<char>(pk.doutt, head_in_group * plan.trans_size, plan);
  if (plan.rows_size > 0) {  // T = 0: nothing to pack (and the buffers are empty)
    std::memset(q, 0, static_cast<std::size_t>(plan.rows_size * ob));
    std::memset(dout, 0, static_cast<std::size_t>(plan.rows_size * ob));
    std::memset(qt, 0, static_cast<std::size_t>(plan.trans_size * ob));
    std::memset(doutt, 0, static_cast<std::size_t>(plan.trans_size * ob));
  }
  float* D = pk.D.data() + head_in_group * p.G * p.T;
  for (std::int64_t g = 0; g < p.G; ++g)
    for (std::int64_t t = 0; t < p.T; ++t) {
      const std::int64_t row = g * plan.Tpad + t;
      const void* qrow = p.q_row(b, kh, g, t);
      const void* drow = bp.dout_row(b, kh, g, t);
      kern.pack_q_row(q + row * Hp * ob, {qrow, p.q_dtype, 0, 0, p.H, Hp, plan.round});
      kern.pack_q_row(dout + row * Hp * ob, {drow, bp.dout_dtype, 0, 0, p.H, Hp, plan.round});
      float d = 0.0f;  // D = rowsum(dO * O) in fp32, from dO and O as stored
      const void* orow = bp.out_row(b, kh, g, t);
      for (std::int64_t h = 0; h < p.H; ++h) {
        const float dh = load_element(drow, bp.dout_dtype, h);
        d += dh * load_element(orow, p.out_dtype, h);
        put_operand(qt, (g * Hp + h) * plan.Tpad + t, load_element(qrow, p.q_dtype, h), plan);
        put_operand(doutt, (g * Hp + h) * plan.Tpad + t, dh, plan);
      }
      D[g * p.T + t] = d;
    }
  // dK, dV of the keys outside every task's blocks (no query sees them): zero.
  const KeyRange all = p.T > 0 ? p.visible_keys(0, p.T) : KeyRange{};
  const std::int64_t first = all.empty() ? p.S : all.begin / plan.bkv * plan.bkv;
  const std::int64_t last = all.empty() ? p.S : std::min(p.S, round_up(all.end, plan.bkv));
  for (std::int64_t s = 0; s < p.S; ++s)
    if (s < first || s >= last) {
      store_row(bp.dk_row(b, kh, s), bp.dk_dtype, pk.zeros.data(), p.H);
      store_row(bp.dv_row(b, kh, s), bp.dv_dtype, pk.zeros.data(), p.H);
    }
  for (std::int64_t j = 0; j < plan.nkv; ++j) {
    const std::int64_t s0 = j * plan.bkv, n = std::min(plan.bkv, p.S - s0);
    const std::int64_t at = head_in_group * plan.kv_size + j * plan.kv_block * Hp;
    kern.pack_k(part<char>(pk.k, at, plan), {p.k_row(b, kh, s0), p.k_dtype, p.k_stride[2], n, p.H, Hp, plan.round});
    kern.pack_k(part<char>(pk.vk, at, plan), {p.v_row(b, kh, s0), p.v_dtype, p.v_stride[2], n, p.H, Hp, plan.round});
    kern.pack_v(part<char>(pk.kv, at, plan), {p.k_row(b, kh, s0), p.k_dtype, p.k_stride[2], n, p.H, Hp, plan.round});
  }
}

// One thread's buffers.
struct Workspace {
  AlignedBuffer logits, dp, x, w1, w2, w3, acc1, acc2, dq;
  std::vector<float> row;
  std::vector<float> lse, D;              // a q block's rows (softmax_grad_pack)
  std::vector<std::int32_t> lo, hi;
  Workspace(const Problem& p, const Plan& plan)
      : row(static_cast<std::size_t>(std::max(p.H, plan.kv_block))), lse(static_cast<std::size_t>(plan.bq)),
        D(lse.size()), lo(lse.size()), hi(lse.size()) {
    const std::int64_t qk = plan.bq * plan.kv_block;  // one S (or dP) tile of a q block and a KV block
    const std::int64_t s_rows = plan.fused ? plan.mr : plan.bq;  // fused: one register tile of rows
    logits.reset(static_cast<std::size_t>(s_rows * plan.kv_block * 4));
    dp.reset(static_cast<std::size_t>(s_rows * plan.kv_block * 4));
    x.reset(static_cast<std::size_t>(plan.kv_block * 4));
    w1.reset(static_cast<std::size_t>(qk * plan.operand_bytes));
    w2.reset(static_cast<std::size_t>(qk * plan.operand_bytes));
    w3.reset(static_cast<std::size_t>(qk * plan.operand_bytes));
    acc1.reset(static_cast<std::size_t>(plan.Hp * plan.kv_block * 4));
    acc2.reset(static_cast<std::size_t>(plan.Hp * plan.kv_block * 4));
    if (plan.any_unsplit) dq.reset(static_cast<std::size_t>(plan.dq_rows * plan.Hp * 4));
  }
};

// The S and dP rows [r0, r0 + nr) (one register tile) of the q block at row t0 of head g against KV
// block j (keys from s0), into s and dp [nr][npad], only over the panels some of these rows see (the
// rest is left unwritten: neither softmax_grad nor softmax_grad_pack reads it).
void tile_logits_and_dp(const Problem& p, const Plan& plan, const Packed& pk, std::int64_t hg, std::int64_t g,
                        std::int64_t t0, std::int64_t r0, int nr, std::int64_t j, std::int64_t s0, std::int64_t npad,
                        float* s, float* dp) {
  const FlashKernels& kern = *plan.kern;
  const std::int64_t Hp = plan.Hp, ob = plan.operand_bytes;
  const std::int64_t row = hg * plan.rows_size + (g * plan.Tpad + t0 + r0) * Hp;
  const char* q = part<char>(pk.q, row, plan);
  const char* dout = part<char>(pk.dout, row, plan);
  const std::int64_t at = hg * plan.kv_size + j * plan.kv_block * Hp;
  const char* k = part<char>(pk.k, at, plan);
  const char* vk = part<char>(pk.vk, at, plan);
  const KeyRange seen = p.visible_keys(t0 + r0, t0 + r0 + nr).clamp_to(s0, s0 + npad, s0);
  for (std::int64_t c = seen.begin / kPanelKeys * kPanelKeys; c < seen.end; c += kPanelKeys) {
    kern.qk_tile({s + c, npad, q, Hp, k + c * Hp * ob, Hp, p.scale, nr});
    kern.qk_tile({dp + c, npad, dout, Hp, vk + c * Hp * ob, Hp, 1.0f, nr});
  }
  if (p.softcap != 0.0f && !seen.empty()) {  // S = c tanh(S / c) over the same panels
    const std::int64_t c0 = seen.begin / kPanelKeys * kPanelKeys, c1 = padded_keys(seen.end);
    for (int i = 0; i < nr; ++i) kern.softcap_n(s + i * npad + c0, c1 - c0, p.softcap);
  }
}

// The S and dP tiles [nq][npad] of the q block (rows [t0, t0 + nq) of head g) against KV block j.
void logits_and_dp(const Problem& p, const Plan& plan, const Packed& pk, Workspace& w, std::int64_t hg,
                   std::int64_t g, std::int64_t t0, std::int64_t nq, std::int64_t j, std::int64_t s0,
                   std::int64_t npad) {
  for (std::int64_t r0 = 0; r0 < nq; r0 += plan.mr)
    tile_logits_and_dp(p, plan, pk, hg, g, t0, r0, static_cast<int>(std::min(plan.mr, nq - r0)), j, s0, npad,
                       w.logits.as<float>() + r0 * npad, w.dp.as<float>() + r0 * npad);
}

// In place: S <- P = exp(S - lse_t), 0 outside each row's keys and for rows with lse = -inf (they saw
// no key), and dP <- dS = P (dP - D_t) (with a softcap c, S holds c tanh(s / c) and dS = P ((dP - D_t)
// (1 - (S / c)^2))); rows t0 + i of head g of (b, kh), keys [s0, s0 + n).
void softmax_grad(const BackwardProblem& bp, const Plan& plan, const Packed& pk, Workspace& w, std::int64_t hg,
                  std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t0, std::int64_t nq,
                  std::int64_t s0, std::int64_t n, std::int64_t npad) {
  const Problem& p = bp.fwd;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float* x = w.x.as<float>();
  for (std::int64_t i = 0; i < nq; ++i) {
    float* srow = w.logits.as<float>() + i * npad;
    float* dprow = w.dp.as<float>() + i * npad;
    const std::int64_t t = t0 + i;
    const float lse = *p.lse_at(b, kh, g, t);
    const KeyRange keys = p.visible_keys(t).clamp_to(s0, s0 + n, s0);
    if (lse == kNegInf || keys.empty()) {
      std::fill(srow, srow + npad, 0.0f);
      std::fill(dprow, dprow + npad, 0.0f);
      continue;
    }
    std::fill(x, x + keys.begin, kNegInf);
    for (std::int64_t j = keys.begin; j < keys.end; ++j) x[j] = srow[j] - lse;
    std::fill(x + keys.end, x + npad, kNegInf);
    const float D = pk.D[static_cast<std::size_t>((hg * p.G + g) * p.T + t)];
    if (p.softcap != 0.0f) {  // S holds c tanh(s / c): dP - D times the cap's slope 1 - tanh^2, before P
      const float inv = 1.0f / p.softcap;
      for (std::int64_t j = keys.begin; j < keys.end; ++j) {
        const float th = srow[j] * inv;
        dprow[j] = (dprow[j] - D) * (1.0f - th * th);
      }
    }
    plan.kern->exp_n(srow, x, npad);
    std::fill(dprow, dprow + keys.begin, 0.0f);
    if (p.softcap != 0.0f)
      for (std::int64_t j = keys.begin; j < keys.end; ++j) dprow[j] = srow[j] * dprow[j];
    else
      for (std::int64_t j = keys.begin; j < keys.end; ++j) dprow[j] = srow[j] * (dprow[j] - D);
    std::fill(dprow + keys.end, dprow + npad, 0.0f);
  }
}

// The weight tiles of the q block (rows t0 + i of head g) against KV block j (keys [s0, s0 + n)):
// w1 = P and w2 = dS as V panels over the rows (pairs along queries, for dV^T and dK^T), w3 = dS rows
// (for dQ). Where the kernel set has softmax_grad_pack (and no softcap), one register tile of rows at a
// time: its S and dP rows, then P, dS and the three packs from them while they are in L1 (the q
// block's whole fp32 S and dP tiles, 768 KB at 192 x 512, pushed the K panels out of L2). Otherwise
// the whole tiles, softmax_grad in place and the three packs (the same bits but for values below 2^-126,
// which the kernel flushes to zero).
void gradient_weights(const BackwardProblem& bp, const Plan& plan, const Packed& pk, Workspace& w, std::int64_t hg,
                      std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t0, std::int64_t nq,
                      std::int64_t j, std::int64_t s0, std::int64_t n, std::int64_t npad) {
  const Problem& p = bp.fwd;
  const FlashKernels& kern = *plan.kern;
  const std::int64_t ob = plan.operand_bytes;
  if (!plan.fused) {
    logits_and_dp(p, plan, pk, w, hg, g, t0, nq, j, s0, npad);
    softmax_grad(bp, plan, pk, w, hg, b, kh, g, t0, nq, s0, n, npad);
    kern.pack_v(w.w1.data(), {w.logits.data(), DType::f32, npad, nq, npad, npad, plan.round});
    kern.pack_v(w.w2.data(), {w.dp.data(), DType::f32, npad, nq, npad, npad, plan.round});
    for (std::int64_t i = 0; i < nq; ++i)
      kern.pack_q_row(w.w3.as<char>() + i * npad * ob,
                      {w.dp.as<float>() + i * npad, DType::f32, 0, 0, npad, npad, plan.round});
    return;
  }
  for (std::int64_t i = 0; i < nq; ++i) {
    const std::int64_t t = t0 + i;
    const float lse = *p.lse_at(b, kh, g, t);
    const KeyRange keys = p.visible_keys(t).clamp_to(s0, s0 + n, s0);
    const bool none = lse == -std::numeric_limits<float>::infinity() || keys.empty();  // P = 0
    w.lse[i] = lse;
    w.D[i] = pk.D[static_cast<std::size_t>((hg * p.G + g) * p.T + t)];
    w.lo[i] = none ? 0 : static_cast<std::int32_t>(keys.begin);
    w.hi[i] = none ? 0 : static_cast<std::int32_t>(keys.end);
  }
  const std::int64_t rpad = padded_keys(nq);  // rows of the V panels (pack_v's zero padding)
  float* s = w.logits.as<float>();
  float* dp = w.dp.as<float>();
  for (std::int64_t r0 = 0; r0 < nq; r0 += plan.mr) {
    const int nr = static_cast<int>(std::min(plan.mr, nq - r0));
    tile_logits_and_dp(p, plan, pk, hg, g, t0, r0, nr, j, s0, npad, s, dp);
    const int rows_out = static_cast<int>(r0 + nr == nq ? rpad - r0 : nr);
    kern.softmax_grad_pack({s, dp, npad, w.lse.data() + r0, w.D.data() + r0, w.lo.data() + r0, w.hi.data() + r0,
                            npad, w.w1.as<char>() + r0 * kHTile * ob, w.w2.as<char>() + r0 * kHTile * ob,
                            rpad * kHTile, w.w3.as<char>() + r0 * npad * ob, npad, nr, rows_out});
  }
}

// acc [rows][ldo] fp32 += W [rows][ldw] (operands) . V panels of `panel_keys` keys, columns
// [col0, cols) (col0 a multiple of 32) in 32-wide panels, over `keys` keys.
void accumulate(const Plan& plan, float* acc, std::int64_t ldo, std::int64_t rows, std::int64_t col0,
                std::int64_t cols, const void* W, std::int64_t ldw, const void* V, std::int64_t panel_keys,
                std::int64_t keys) {
  const std::int64_t ob = plan.operand_bytes;
  for (std::int64_t r0 = 0; r0 < rows; r0 += plan.mr) {
    const int nr = static_cast<int>(std::min(plan.mr, rows - r0));
    for (std::int64_t c = col0; c < cols; c += kHTile)
      plan.kern->pv_tile({acc + r0 * ldo + c, ldo, static_cast<const char*>(W) + r0 * ldw * ob, ldw,
                          static_cast<const char*>(V) + c * panel_keys * ob, round_up(keys, 2), nullptr, nr});
  }
}

// dK and dV of KV block j of head (b, kh) (group slot hg), and its dQ contributions into dq [G][Tpad][Hp].
void block_gradients(const BackwardProblem& bp, const Plan& plan, const Packed& pk, Workspace& w, std::int64_t hg,
                     std::int64_t b, std::int64_t kh, std::int64_t j, float* dq) {
  const Problem& p = bp.fwd;
  const std::int64_t Hp = plan.Hp;
  const std::int64_t s0 = j * plan.bkv, n = std::min(plan.bkv, p.S - s0), npad = padded_keys(n);
  float* dkt = w.acc1.as<float>();  // [Hp][npad]
  float* dvt = w.acc2.as<float>();
  std::memset(dkt, 0, static_cast<std::size_t>(Hp * npad) * 4);
  std::memset(dvt, 0, static_cast<std::size_t>(Hp * npad) * 4);
  const char* k_as_v = part<char>(pk.kv, hg * plan.kv_size + j * plan.kv_block * Hp, plan);
  for (std::int64_t g = 0; g < p.G; ++g)
    for (std::int64_t t0 = 0; t0 < p.T; t0 += plan.bq) {
      const std::int64_t nq = std::min(plan.bq, p.T - t0);
      const KeyRange seen = p.visible_keys(t0, t0 + nq);
      if (seen.end <= s0 || seen.begin >= s0 + n) continue;  // no row of the q block sees these keys
      gradient_weights(bp, plan, pk, w, hg, b, kh, g, t0, nq, j, s0, n, npad);
      const std::int64_t tt = (g * Hp) * plan.Tpad + t0;  // column t0 of head g's transposed rows
      // Only the key columns some row of the q block sees (the others' P and dS are 0).
      const KeyRange cols = seen.clamp_to(s0, s0 + n, s0);
      const std::int64_t col0 = cols.begin / kPanelKeys * kPanelKeys, col1 = padded_keys(cols.end);
      accumulate(plan, dvt, npad, Hp, col0, col1, part<char>(pk.doutt, hg * plan.trans_size + tt, plan), plan.Tpad,
                 w.w1.data(), padded_keys(nq), nq);  // dV^T += dO^T P
      accumulate(plan, dkt, npad, Hp, col0, col1, part<char>(pk.qt, hg * plan.trans_size + tt, plan), plan.Tpad,
                 w.w2.data(), padded_keys(nq), nq);  // dK^T += Q^T dS
      // dQ += dS K (w3: dS rows as weights [nq][npad]).
      accumulate(plan, dq + (g * plan.Tpad + t0) * Hp, Hp, nq, 0, Hp, w.w3.data(), npad, k_as_v, npad, cols.end);
    }
  float* row = w.row.data();
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t h = 0; h < p.H; ++h) row[h] = p.scale * dkt[h * npad + i];
    store_row(bp.dk_row(b, kh, s0 + i), bp.dk_dtype, row, p.H);
    for (std::int64_t h = 0; h < p.H; ++h) row[h] = dvt[h * npad + i];
    store_row(bp.dv_row(b, kh, s0 + i), bp.dv_dtype, row, p.H);
  }
}

// dq = scale * the sum of `count` partial dQ row sets (each [G][Tpad][Hp], `stride` floats apart), in
// order, for head (b, kh).
void write_dq(const BackwardProblem& bp, const Plan& plan, float* row, std::int64_t b, std::int64_t kh,
              const float* parts, std::int64_t count, std::int64_t stride) {
  const Problem& p = bp.fwd;
  for (std::int64_t g = 0; g < p.G; ++g)
    for (std::int64_t t = 0; t < p.T; ++t) {
      const float* at = parts + (g * plan.Tpad + t) * plan.Hp;
      for (std::int64_t h = 0; h < p.H; ++h) {
        float sum = at[h];
        for (std::int64_t i = 1; i < count; ++i) sum += at[i * stride + h];
        row[h] = p.scale * sum;
      }
      store_row(bp.dq_row(b, kh, g, t), bp.dq_dtype, row, p.H);
    }
}

// A task: the KV blocks of its piece of keys, in order; dQ into the thread's rows (a whole head:
// written at the end) or into the piece's slot.
void run_task(const BackwardProblem& bp, const Plan& plan, const Packed& pk, Workspace& w, AlignedBuffer& slots,
              const FlashTask& task) {
  const Problem& p = bp.fwd;
  const std::int64_t hg = (task.b * p.K + task.kh) % plan.heads_per_group;
  const std::int64_t dq_size = plan.dq_rows * plan.Hp;
  float* dq = task.slot < 0 ? w.dq.as<float>() : slots.as<float>() + task.slot * dq_size;
  std::memset(dq, 0, static_cast<std::size_t>(dq_size) * 4);
  if (!task.keys.empty())
    for (std::int64_t j = task.keys.begin / plan.bkv; j * plan.bkv < task.keys.end; ++j)
      block_gradients(bp, plan, pk, w, hg, task.b, task.kh, j, dq);
  if (task.slot < 0) write_dq(bp, plan, w.row.data(), task.b, task.kh, dq, 1, 0);
}

// Query positions and keys per block (p.block_q / block_kv when set): bq a multiple of 32, so each
// q block's columns of Q^T and dO^T start 64-byte aligned. Throws Error when a thread's tiles would
// exceed kMaxWorkspaceBytes (block_sizes.hpp), as the forward does.
struct BackwardBlocks {
  std::int64_t bq = 0, bkv = 0;
};
BackwardBlocks backward_blocks(const Problem& p, bool fused) {
  BackwardBlocks bl;
  bl.bq = round_up(std::clamp<std::int64_t>(p.block_q > 0 ? p.block_q : kDefaultBlockQ, 1, std::max<std::int64_t>(p.T, 1)), 32);
  std::int64_t bkv = p.block_kv;
  if (bkv <= 0) {
    bkv = fused ? kFusedMaxBlockKV : kDefaultBlockKV;
    while (bkv > kDefaultBlockKV && p.B * p.K * ceil_div(p.S, bkv) < 2 * std::int64_t{std::max(p.threads, 1)})
      bkv /= 2;
  }
  bl.bkv = std::clamp<std::int64_t>(bkv, 1, std::max<std::int64_t>(p.S, 1));
  const std::int64_t tile = bl.bq * padded_keys(bl.bkv);  // S, dP (fp32) and three weight tiles
  if (tile * (8 + 3 * 4) > kMaxWorkspaceBytes)
    throw Error("block_q/block_kv: " + std::to_string(p.block_q) + "/" + std::to_string(p.block_kv) + " needs " +
                std::to_string(tile * 20 >> 20) + " MiB of backward tiles per thread, expected sizes that need at most " +
                std::to_string(kMaxWorkspaceBytes >> 20) + " MiB");
  return bl;
}

Plan make_plan(const BackwardProblem& bp, Isa isa) {
  const Problem& p = bp.fwd;
  Plan plan;
  plan.kern = &kernels_for(isa, p.precision);
  plan.Hp = round_up(p.H, kHTile);
  plan.operand_bytes = plan.kern->operand_bytes;
  plan.mr = plan.kern->mr;
  plan.round = p.precision == Precision::bf16;
  // The fused step takes rows from even offsets (pairs of rows make the V-panel words).
  plan.fused = plan.kern->softmax_grad_pack != nullptr && p.softcap == 0.0f && plan.mr % 2 == 0;
  const BackwardBlocks bl = backward_blocks(p, plan.fused);
  plan.bq = bl.bq;
  plan.bkv = bl.bkv;
  plan.nq = ceil_div(p.T, plan.bq);
  plan.nkv = ceil_div(p.S, plan.bkv);
  plan.Tpad = plan.nq * plan.bq;
  plan.kv_block = padded_keys(plan.bkv);
  plan.rows_size = p.G * plan.Tpad * plan.Hp;
  plan.trans_size = p.G * plan.Hp * plan.Tpad;
  plan.kv_size = plan.nkv * plan.kv_block * plan.Hp;
  plan.work = plan_tasks(p, std::max<std::int64_t>(p.T, 1), plan.bkv, /*whole_rows=*/true);
  plan.dq_rows = p.G * plan.Tpad;
  for (const FlashTask& t : plan.work.tasks) plan.any_unsplit |= t.slot < 0;
  const std::int64_t head_bytes = (2 * plan.rows_size + 2 * plan.trans_size + 3 * plan.kv_size) * plan.operand_bytes;
  const std::int64_t heads = p.B * p.K;
  const std::int64_t bytes = std::max<std::int64_t>(head_bytes, 1);
  const std::int64_t tasks = std::max<std::int64_t>(static_cast<std::int64_t>(plan.work.tasks.size()), 1);
  const std::int64_t for_threads = ceil_div(std::int64_t{std::max(p.threads, 1)} * heads, tasks);
  plan.heads_per_group = std::clamp<std::int64_t>(std::min(std::max(kPackedGroupBytes / bytes, for_threads), kMaxPackedGroupBytes / bytes),
                                                  1, std::max<std::int64_t>(heads, 1));
  return plan;
}

}  // namespace

void flash_backward(const BackwardProblem& bp, Isa isa) {
  const Problem& p = bp.fwd;
  if (p.B == 0) return;
  const Plan plan = make_plan(bp, isa);
  const std::int64_t heads = p.B * p.K, per = plan.heads_per_group;
  Packed pk;
  for (auto [buf, size] : {std::pair{&pk.q, plan.rows_size}, {&pk.dout, plan.rows_size}, {&pk.qt, plan.trans_size},
                           {&pk.doutt, plan.trans_size}, {&pk.k, plan.kv_size}, {&pk.vk, plan.kv_size},
                           {&pk.kv, plan.kv_size}})
    buf->reset(static_cast<std::size_t>(per * size * plan.operand_bytes));
  pk.D.assign(static_cast<std::size_t>(per * p.G * p.T), 0.0f);
  pk.zeros.assign(static_cast<std::size_t>(p.H), 0.0f);
  AlignedBuffer slots(static_cast<std::size_t>(plan.work.slots * plan.dq_rows * plan.Hp) * sizeof(float));
  // Tasks by group of heads (the planner orders them by head).
  const std::int64_t ngroups = ceil_div(heads, per);
  std::vector<std::int64_t> group_first(static_cast<std::size_t>(ngroups + 1), 0);
  for (const FlashTask& t : plan.work.tasks) ++group_first[static_cast<std::size_t>((t.b * p.K + t.kh) / per + 1)];
  for (std::int64_t g = 0; g < ngroups; ++g)
    group_first[static_cast<std::size_t>(g + 1)] += group_first[static_cast<std::size_t>(g)];
  run_grouped_tasks_then_merges(
      p, group_first,
      [&](std::int64_t g) { return std::min(heads, (g + 1) * per) - g * per; },
      [&](std::int64_t g, std::int64_t i) {
        const std::int64_t head = g * per + i;
        prepare_head(bp, plan, pk, i, head / p.K, head % p.K);
      },
      [&] { return Workspace(p, plan); },
      [&](std::int64_t i, Workspace& w) {
        run_task(bp, plan, pk, w, slots, plan.work.tasks[static_cast<std::size_t>(i)]);
      },
      static_cast<std::int64_t>(plan.work.merges.size()),
      [&](std::int64_t i, float* row) {
        const SplitMerge& mg = plan.work.merges[static_cast<std::size_t>(i)];
        const std::int64_t size = plan.dq_rows * plan.Hp;
        write_dq(bp, plan, row, mg.b, mg.kh, slots.as<float>() + mg.first_slot * size, mg.count, size);
      });
}

}  // namespace flashgqa
