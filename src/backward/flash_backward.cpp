// Design (what moves where, and why):
//
// Two passes, so that no two threads ever add into the same gradient element (no atomics, and the bits
// do not depend on the thread count):
//   1. dK, dV: a task is (b, kv head, KV block of bkv keys). It packs its K block twice (as K panels
//      for S = scale Q K^T, and its V block as K panels for dP = dO V^T), keeps dK and dV of the block
//      in fp32 (bkv x Hp each, L2), and walks every (G head, q block) that sees a key of the block:
//      per q block it packs Q and dO rows, recomputes S and dP tile by tile (qk_tile), P = exp(S - lse)
//      and dS = P (dP - D), then accumulates dV += P^T dO and dK += dS^T Q with pv_tile, P^T and dS^T
//      as the weight tiles and dO and Q packed as V panels. All G heads of the kv head pass through
//      the task, so each K/V byte serves the whole group (the forward's GQA reuse).
//   2. dQ: a task is (b, kv head, G head, q block of bq positions). It walks the KV blocks its rows
//      see, recomputes S, dP, P, dS and accumulates dQ += dS K (pv_tile, K packed as V panels).
// The price of determinism is the recomputation: S and dP are computed in both passes, 7 matmuls per
// (query, key) instead of FlashAttention-2's 5 (which adds dQ with atomics).
// D = rowsum(dO * O) is computed once per row, in fp32, before both passes.
#include "backward/flash_backward.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/dtype.hpp"
#include "core/int_math.hpp"
#include "flash/run_tasks.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa {
namespace {

constexpr std::int64_t kDefaultBlockQ = 64;    // query positions per q block (S, dP tiles: L2)
constexpr std::int64_t kDefaultBlockKV = 128;  // keys per KV block

struct Setup {
  const FlashKernels* kern = nullptr;
  std::int64_t Hp = 0, operand_bytes = 0, mr = 0, bq = 0, bkv = 0;
  std::int64_t q_pad = 0, kv_pad = 0;  // bq and bkv padded to whole panels
  bool round = false;
  std::vector<float> D;  // [B,K,G,T] rowsum(dO * O)
  std::int64_t row(const Problem& p, std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t) const {
    return ((b * p.K + kh) * p.G + g) * p.T + t;
  }
};

// One operand of a weight tile (P^T, dS^T, dS): bf16 bits (rounded to nearest even) or fp32 (rounded
// to bf16 under Precision::bf16).
void put_operand(void* tile, std::int64_t i, float x, const Setup& s) {
  if (s.operand_bytes == 2)
    static_cast<std::uint16_t*>(tile)[i] = float_to_bf16_bits(x);
  else
    static_cast<float*>(tile)[i] = s.round ? round_to_bf16(x) : x;
}

// One thread's buffers.
struct Workspace {
  AlignedBuffer q, dout, q_v, dout_v;  // Q and dO rows (pack_q_row) and as V panels (pack_v)
  AlignedBuffer k, v_k, k_v;           // K as K panels, V as K panels, K as V panels
  AlignedBuffer logits, dp, w, x;      // S, dP (fp32), one weight tile (operand), exp arguments
  AlignedBuffer acc1, acc2;            // dK and dV (pass 1) or dQ (pass 2) accumulators, fp32
  std::vector<float> row;              // H floats for writing a row
  explicit Workspace(const Problem& p, const Setup& s) : row(static_cast<std::size_t>(p.H)) {
    const std::int64_t ob = s.operand_bytes, rows = std::max(s.q_pad, s.kv_pad) + s.mr;
    for (AlignedBuffer* b : {&q, &dout, &q_v, &dout_v}) b->reset(static_cast<std::size_t>(rows * s.Hp * ob));
    for (AlignedBuffer* b : {&k, &v_k, &k_v}) b->reset(static_cast<std::size_t>(rows * s.Hp * ob));
    for (AlignedBuffer* b : {&logits, &dp}) b->reset(static_cast<std::size_t>(rows * rows * 4));
    w.reset(static_cast<std::size_t>(rows * rows * ob));
    x.reset(static_cast<std::size_t>(rows * 4));
    acc1.reset(static_cast<std::size_t>(rows * s.Hp * 4));
    acc2.reset(static_cast<std::size_t>(rows * s.Hp * 4));
  }
};

// S[i][j] = scale q_i.k_j and dP[i][j] = dO_i.v_j for the nq packed rows against the packed block
// (npad keys), tile by tile; ld = npad.
void logits_and_dp(const Problem& p, const Setup& s, Workspace& w, std::int64_t nq, std::int64_t npad) {
  const FlashKernels& kern = *s.kern;
  const std::int64_t ob = s.operand_bytes;
  for (std::int64_t r0 = 0; r0 < nq; r0 += s.mr) {
    const int nr = static_cast<int>(std::min(s.mr, nq - r0));
    for (std::int64_t c = 0; c < npad; c += kPanelKeys) {
      kern.qk_tile({w.logits.as<float>() + r0 * npad + c, npad, w.q.as<char>() + r0 * s.Hp * ob, s.Hp,
                    w.k.as<char>() + c * s.Hp * ob, s.Hp, p.scale, nr});
      kern.qk_tile({w.dp.as<float>() + r0 * npad + c, npad, w.dout.as<char>() + r0 * s.Hp * ob, s.Hp,
                    w.v_k.as<char>() + c * s.Hp * ob, s.Hp, 1.0f, nr});
    }
  }
}

// In place: S <- P = exp(S - lse_t) (0 outside each row's keys, and for rows with lse = -inf) and
// dP <- dS = P (dP - D_t), for rows t0 + i of head g against keys [s0, s0 + n).
void softmax_grad(const BackwardProblem& bp, const Setup& s, Workspace& w, std::int64_t b, std::int64_t kh,
                  std::int64_t g, std::int64_t t0, std::int64_t nq, std::int64_t s0, std::int64_t n,
                  std::int64_t npad) {
  const Problem& p = bp.fwd;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float* x = w.x.as<float>();
  for (std::int64_t i = 0; i < nq; ++i) {
    float* srow = w.logits.as<float>() + i * npad;
    float* dprow = w.dp.as<float>() + i * npad;
    const std::int64_t t = t0 + i;
    const float lse = *p.lse_at(b, kh, g, t);
    const KeyRange keys = p.visible_keys(t).clamp_to(s0, s0 + n, s0);
    if (lse == kNegInf || keys.empty()) {  // no key seen here (or at all): no gradient
      std::fill(srow, srow + npad, 0.0f);
      std::fill(dprow, dprow + npad, 0.0f);
      continue;
    }
    for (std::int64_t j = 0; j < npad; ++j) x[j] = j >= keys.begin && j < keys.end ? srow[j] - lse : kNegInf;
    s.kern->exp_n(srow, x, npad);
    const float D = s.D[static_cast<std::size_t>(s.row(p, b, kh, g, t))];
    for (std::int64_t j = 0; j < npad; ++j) dprow[j] = srow[j] * (dprow[j] - D);
  }
}

// Packs nq rows of head g from t0 into Q rows and, when `as_v`, V panels too (for P^T dO, dS^T Q).
void pack_q_rows(const BackwardProblem& bp, const Setup& s, Workspace& w, std::int64_t b, std::int64_t kh,
                 std::int64_t g, std::int64_t t0, std::int64_t nq, bool as_v) {
  const Problem& p = bp.fwd;
  const FlashKernels& kern = *s.kern;
  for (std::int64_t i = 0; i < nq; ++i) {
    kern.pack_q_row(w.q.as<char>() + i * s.Hp * s.operand_bytes,
                    {p.q_row(b, kh, g, t0 + i), p.q_dtype, 0, 0, p.H, s.Hp, s.round});
    kern.pack_q_row(w.dout.as<char>() + i * s.Hp * s.operand_bytes,
                    {bp.dout_row(b, kh, g, t0 + i), bp.dout_dtype, 0, 0, p.H, s.Hp, s.round});
  }
  if (!as_v) return;
  kern.pack_v(w.q_v.data(), {p.q_row(b, kh, g, t0), p.q_dtype, p.q_stride[3], nq, p.H, s.Hp, s.round});
  kern.pack_v(w.dout_v.data(),
              {bp.dout_row(b, kh, g, t0), bp.dout_dtype, bp.dout_stride[3], nq, p.H, s.Hp, s.round});
}

// Packs keys [s0, s0 + n): K and V as K panels, and K as V panels when `k_as_v`.
void pack_kv(const Problem& p, const Setup& s, Workspace& w, std::int64_t b, std::int64_t kh, std::int64_t s0,
             std::int64_t n, bool k_as_v) {
  const FlashKernels& kern = *s.kern;
  kern.pack_k(w.k.data(), {p.k_row(b, kh, s0), p.k_dtype, p.k_stride[2], n, p.H, s.Hp, s.round});
  kern.pack_k(w.v_k.data(), {p.v_row(b, kh, s0), p.v_dtype, p.v_stride[2], n, p.H, s.Hp, s.round});
  if (k_as_v) kern.pack_v(w.k_v.data(), {p.k_row(b, kh, s0), p.k_dtype, p.k_stride[2], n, p.H, s.Hp, s.round});
}

// acc [rows][Hp] += W [rows][ldw] (operands) . V panels of `vpanel_keys` keys, over `keys` keys.
void accumulate(const Setup& s, float* acc, std::int64_t rows, const void* W, std::int64_t ldw, const void* V,
                std::int64_t vpanel_keys, std::int64_t keys) {
  const std::int64_t ob = s.operand_bytes;
  for (std::int64_t r0 = 0; r0 < rows; r0 += s.mr) {
    const int nr = static_cast<int>(std::min(s.mr, rows - r0));
    for (std::int64_t c = 0; c < s.Hp; c += kHTile)
      s.kern->pv_tile({acc + r0 * s.Hp + c, s.Hp, static_cast<const char*>(W) + r0 * ldw * ob, ldw,
                       static_cast<const char*>(V) + c * vpanel_keys * ob, round_up(keys, 2), nullptr, nr});
  }
}

// Writes `rows` accumulator rows times `scale` to dst rows (row(i) gives the address).
template <typename RowAt>
void write_rows(const Problem& p, const Setup& s, Workspace& w, const float* acc, std::int64_t rows, float scale,
                DType dtype, RowAt row_at) {
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t h = 0; h < p.H; ++h) w.row[static_cast<std::size_t>(h)] = scale * acc[i * s.Hp + h];
    store_row(row_at(i), dtype, w.row.data(), p.H);
  }
}

// Pass 1: dK, dV of keys [s0, s0 + n) of (b, kh).
void dkdv_task(const BackwardProblem& bp, const Setup& s, Workspace& w, std::int64_t b, std::int64_t kh,
               std::int64_t s0, std::int64_t n) {
  const Problem& p = bp.fwd;
  const std::int64_t npad = padded_keys(n);
  float* dk = w.acc1.as<float>();
  float* dv = w.acc2.as<float>();
  std::memset(dk, 0, static_cast<std::size_t>(n * s.Hp) * 4);
  std::memset(dv, 0, static_cast<std::size_t>(n * s.Hp) * 4);
  pack_kv(p, s, w, b, kh, s0, n, false);
  for (std::int64_t g = 0; g < p.G; ++g)
    for (std::int64_t t0 = 0; t0 < p.T; t0 += s.bq) {
      const std::int64_t nq = std::min(s.bq, p.T - t0);
      const KeyRange seen = p.visible_keys(t0, t0 + nq);
      if (seen.end <= s0 || seen.begin >= s0 + n) continue;  // no row of the block sees these keys
      pack_q_rows(bp, s, w, b, kh, g, t0, nq, true);
      logits_and_dp(p, s, w, nq, npad);
      softmax_grad(bp, s, w, b, kh, g, t0, nq, s0, n, npad);
      // acc [n][Hp] += from^T V: the transposed weights as an [n][qpad] operand tile.
      const std::int64_t qpad = padded_keys(nq);
      auto transposed_accumulate = [&](const float* from, float* acc, const void* v_panels) {
        void* wt = w.w.data();
        for (std::int64_t j = 0; j < n; ++j)
          for (std::int64_t i = 0; i < qpad; ++i) put_operand(wt, j * qpad + i, i < nq ? from[i * npad + j] : 0.0f, s);
        accumulate(s, acc, n, wt, qpad, v_panels, qpad, nq);
      };
      transposed_accumulate(w.logits.as<float>(), dv, w.dout_v.data());  // dV += P^T dO
      transposed_accumulate(w.dp.as<float>(), dk, w.q_v.data());         // dK += dS^T Q (scaled at the end)
    }
  write_rows(p, s, w, dk, n, p.scale, bp.dk_dtype, [&](std::int64_t j) { return bp.dk_row(b, kh, s0 + j); });
  write_rows(p, s, w, dv, n, 1.0f, bp.dv_dtype, [&](std::int64_t j) { return bp.dv_row(b, kh, s0 + j); });
}

// Pass 2: dQ of positions [t0, t0 + nq) of head g of (b, kh).
void dq_task(const BackwardProblem& bp, const Setup& s, Workspace& w, std::int64_t b, std::int64_t kh,
             std::int64_t g, std::int64_t t0, std::int64_t nq) {
  const Problem& p = bp.fwd;
  float* dq = w.acc1.as<float>();
  std::memset(dq, 0, static_cast<std::size_t>(nq * s.Hp) * 4);
  pack_q_rows(bp, s, w, b, kh, g, t0, nq, false);
  const KeyRange seen = p.visible_keys(t0, t0 + nq);
  for (std::int64_t s0 = seen.begin / s.bkv * s.bkv; s0 < seen.end; s0 += s.bkv) {
    const std::int64_t n = std::min(s.bkv, p.S - s0), npad = padded_keys(n);
    pack_kv(p, s, w, b, kh, s0, n, true);
    logits_and_dp(p, s, w, nq, npad);
    softmax_grad(bp, s, w, b, kh, g, t0, nq, s0, n, npad);
    // dQ += dS K: dS as the weight tile [nq][npad].
    void* wt = w.w.data();
    const float* ds = w.dp.as<float>();
    for (std::int64_t i = 0; i < nq * npad; ++i) put_operand(wt, i, ds[i], s);
    accumulate(s, dq, nq, wt, npad, w.k_v.data(), npad, n);
  }
  write_rows(p, s, w, dq, nq, p.scale, bp.dq_dtype, [&](std::int64_t i) { return bp.dq_row(b, kh, g, t0 + i); });
}

}  // namespace

BackwardBlocks backward_blocks(const Problem& p) {
  BackwardBlocks bl;
  bl.bq = std::clamp<std::int64_t>(p.block_q > 0 ? p.block_q : kDefaultBlockQ, 1, std::max<std::int64_t>(p.T, 1));
  bl.bkv = std::clamp<std::int64_t>(p.block_kv > 0 ? p.block_kv : kDefaultBlockKV, 1, std::max<std::int64_t>(p.S, 1));
  return bl;
}

void flash_backward(const BackwardProblem& bp, Isa isa) {
  const Problem& p = bp.fwd;
  Setup s;
  s.kern = &kernels_for(isa, p.precision);
  s.Hp = round_up(p.H, kHTile);
  s.operand_bytes = s.kern->operand_bytes;
  s.mr = s.kern->mr;
  s.round = p.precision == Precision::bf16;
  const BackwardBlocks bl = backward_blocks(p);
  s.bq = bl.bq;
  s.bkv = bl.bkv;
  s.q_pad = padded_keys(s.bq);
  s.kv_pad = padded_keys(s.bkv);
  // D = rowsum(dO * O) in fp32, from dO and O as stored.
  s.D.assign(static_cast<std::size_t>(p.B * p.K * p.G * p.T), 0.0f);
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh)
      for (std::int64_t g = 0; g < p.G; ++g)
        for (std::int64_t t = 0; t < p.T; ++t) {
          float d = 0.0f;
          const void* o = bp.out_row(b, kh, g, t);
          const void* dout = bp.dout_row(b, kh, g, t);
          for (std::int64_t h = 0; h < p.H; ++h)
            d += load_element(dout, bp.dout_dtype, h) * load_element(o, p.out_dtype, h);
          s.D[static_cast<std::size_t>(s.row(p, b, kh, g, t))] = d;
        }
  // Pass 1 over (b, kh, KV block), then pass 2 over (b, kh, g, q block).
  const std::int64_t nkv = ceil_div(p.S, s.bkv), nq = ceil_div(p.T, s.bq);
  const std::int64_t pass1 = p.B * p.K * nkv, pass2 = p.B * p.K * p.G * nq;
  run_tasks_then_merges(
      p.threads, p.H, pass1 + pass2, 0, [&] { return Workspace(p, s); },
      [&](std::int64_t i, Workspace& w) {
        if (i < pass1) {
          const std::int64_t head = i / nkv, s0 = i % nkv * s.bkv;
          return dkdv_task(bp, s, w, head / p.K, head % p.K, s0, std::min(s.bkv, p.S - s0));
        }
        const std::int64_t j = i - pass1, head = j / (p.G * nq), g = j / nq % p.G, t0 = j % nq * s.bq;
        dq_task(bp, s, w, head / p.K, head % p.K, g, t0, std::min(s.bq, p.T - t0));
      },
      [](std::int64_t, float*) {});
}

}  // namespace flashgqa
