#include "ladder/rung_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.hpp"
#include "core/int_math.hpp"

namespace flashgqa {

RungKernels::RungKernels(const Problem& p)
    : kern(&kernels_for(active_isa(), p.precision)),
      H(p.H),
      Hp((p.H + kHTile - 1) / kHTile * kHTile),
      operand_bytes(kern->operand_bytes),
      round_bf16(p.precision == Precision::bf16),
      softcap(p.softcap) {}

namespace {

PackSource row_source(const RungKernels& kernels, const void* src, DType dtype) {
  PackSource s{};
  s.src = src;
  s.dtype = dtype;
  s.H = kernels.H;
  s.Hp = kernels.Hp;
  s.round_bf16 = kernels.round_bf16;
  return s;
}

char* row_at(const AlignedBuffer& buf, const RungKernels& kernels, std::int64_t ld, std::int64_t r) {
  return buf.as<char>() + r * ld * kernels.operand_bytes;
}

}  // namespace

void pack_q_block(QRows& dst, const RungKernels& kernels, const Problem& p, std::int64_t b, std::int64_t kh,
                  std::int64_t t0, std::int64_t rows) {
  dst.M = p.G * rows;
  if (dst.data.bytes() < static_cast<std::size_t>(dst.M * kernels.Hp * kernels.operand_bytes))
    dst.data.reset(static_cast<std::size_t>(dst.M * kernels.Hp * kernels.operand_bytes));
  for (std::int64_t g = 0; g < p.G; ++g)
    for (std::int64_t r = 0; r < rows; ++r)
      kernels.kern->pack_q_row(row_at(dst.data, kernels, kernels.Hp, g * rows + r),
                          row_source(kernels, p.q_row(b, kh, g, t0 + r), p.q_dtype));
}

void pack_q_head(QRows& dst, const RungKernels& kernels, const Problem& p, std::int64_t b, std::int64_t kh,
                 std::int64_t g) {
  dst.M = p.T;
  if (dst.data.bytes() < static_cast<std::size_t>(dst.M * kernels.Hp * kernels.operand_bytes))
    dst.data.reset(static_cast<std::size_t>(dst.M * kernels.Hp * kernels.operand_bytes));
  for (std::int64_t t = 0; t < p.T; ++t)
    kernels.kern->pack_q_row(row_at(dst.data, kernels, kernels.Hp, t), row_source(kernels, p.q_row(b, kh, g, t), p.q_dtype));
}

void pack_kv_block(KvBlock& dst, const RungKernels& kernels, const Problem& p, std::int64_t b, std::int64_t kh,
                   std::int64_t s0, std::int64_t n) {
  dst.n = n;
  dst.npad = padded_keys(n);
  const auto bytes = static_cast<std::size_t>(std::max<std::int64_t>(dst.npad, kPanelKeys) * kernels.Hp * kernels.operand_bytes);
  if (dst.k.bytes() < bytes) dst.k.reset(bytes), dst.v.reset(bytes);
  PackSource k = row_source(kernels, p.k_row(b, kh, s0), p.k_dtype);
  k.ld = p.k_stride[2];
  k.n = n;
  PackSource v = row_source(kernels, p.v_row(b, kh, s0), p.v_dtype);
  v.ld = p.v_stride[2];
  v.n = n;
  kernels.kern->pack_k(dst.k.data(), k);
  kernels.kern->pack_v(dst.v.data(), v);
}

void qk_logits(float* L, std::int64_t ldl, const RungKernels& kernels, const QRows& Q, std::int64_t r0,
               std::int64_t r1, const KvBlock& kv, float scale) {
  const std::int64_t panel_elems = kernels.Hp * kPanelKeys;
  for (std::int64_t r = r0; r < r1; r += kernels.kern->mr)
    for (std::int64_t c = 0; c < kv.npad / kPanelKeys; ++c) {
      QkTile t{};
      t.s = L + r * ldl + c * kPanelKeys;
      t.lds = ldl;
      t.q = row_at(Q.data, kernels, kernels.Hp, r);
      t.ldq = kernels.Hp;
      t.k = kv.k.as<char>() + c * panel_elems * kernels.operand_bytes;
      t.Hp = kernels.Hp;
      t.scale = scale;
      t.rows = static_cast<int>(std::min<std::int64_t>(kernels.kern->mr, r1 - r));
      kernels.kern->qk_tile(t);
    }
  if (kernels.softcap != 0.0f)  // L = c tanh(L / c)
    for (std::int64_t r = r0; r < r1; ++r) kernels.kern->softcap_n(L + r * ldl, kv.npad, kernels.softcap);
}

void AccRows::assign_zero(std::int64_t M, std::int64_t Hp) {
  const auto bytes = static_cast<std::size_t>(M * Hp) * sizeof(float);
  if (data.bytes() < bytes) data.reset(bytes);
  if (bytes > 0) std::memset(data.data(), 0, bytes);
}

void PRows::reserve(const RungKernels& kernels, std::int64_t rows, std::int64_t npad) {
  ld = npad;
  const auto bytes = static_cast<std::size_t>(rows * npad * kernels.operand_bytes);
  if (data.bytes() < bytes) data.reset(bytes);
}

void pack_p_rows(PRows& dst, const RungKernels& kernels, const float* W, std::int64_t ldw, std::int64_t r0,
                 std::int64_t r1, std::int64_t n) {
  for (std::int64_t r = r0; r < r1; ++r) {
    PackSource s{};
    s.src = W + r * ldw;
    s.dtype = DType::f32;
    s.H = n;
    s.Hp = dst.ld;
    s.round_bf16 = kernels.round_bf16;
    kernels.kern->pack_q_row(row_at(dst.data, kernels, dst.ld, r), s);
  }
}

void pv_accumulate(float* O, const RungKernels& kernels, const PRows& P, std::int64_t r0, std::int64_t r1,
                   const KvBlock& kv) {
  alignas(64) float chain[kMaxTileRows * kHTile];  // one register tile's chain sums [rows][kHTile]
  for (std::int64_t r = r0; r < r1; r += kernels.kern->mr) {
    const int rows = static_cast<int>(std::min<std::int64_t>(kernels.kern->mr, r1 - r));
    for (std::int64_t c = 0; c < kernels.Hp / kHTile; ++c)
      for (std::int64_t j0 = 0; j0 < kv.npad; j0 += kSumKeys) {
        std::fill(chain, chain + rows * kHTile, 0.0f);
        PvTile t{};
        t.o = chain;
        t.ldo = kHTile;
        t.p = row_at(P.data, kernels, P.ld, r) + j0 * kernels.operand_bytes;
        t.ldp = P.ld;
        t.v = kv.v.as<char>() + (c * kv.npad + j0) * kHTile * kernels.operand_bytes;
        t.nkeys = std::min(kSumKeys, kv.npad - j0);
        t.corr = nullptr;
        t.rows = rows;
        kernels.kern->pv_tile(t);  // chain = P[r, j0..) V[j0.., c]
        for (int i = 0; i < rows; ++i) {
          float* o = O + (r + i) * kernels.Hp + c * kHTile;
          for (int h = 0; h < kHTile; ++h) o[h] += chain[i * kHTile + h];  // O += chain
        }
      }
  }
}

float blocked_sum(const float* x, std::int64_t n) {
  float total = 0.0f;
  for (std::int64_t j0 = 0; j0 < n; j0 += kSumKeys) {
    float chain = 0.0f;
    for (std::int64_t j = j0; j < std::min(n, j0 + kSumKeys); ++j) chain += x[j];
    total += chain;
  }
  return total;
}

KeySums rung_key_sums(const Problem& p, std::int64_t bkv, bool rescaled) {
  const std::int64_t S = std::max<std::int64_t>(p.S, 1);
  bkv = std::clamp<std::int64_t>(bkv, 1, S);
  const std::int64_t blocks = ceil_div(S, bkv);
  const std::int64_t chains = blocks * ceil_div(bkv, kSumKeys);
  // P·V: min(bkv, kSumKeys) in a chain, then one addition per chain into O. Denominators: blocked_sum
  // (min(bkv, kSumKeys) + ceil(bkv / kSumKeys)), then one addition per block: no more than P·V's + 1.
  return {std::min(bkv, kSumKeys) + chains + 1, rescaled ? blocks : 0};
}

void mask_logits(float* L, std::int64_t ldl, const Problem& p, std::int64_t M, std::int64_t t0,
                 std::int64_t rows, std::int64_t s0, std::int64_t N) {
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  for (std::int64_t m = 0; m < M; ++m) {
    // Keys [s0 + begin, s0 + end) of the block are visible; the rest of [0, N) is masked.
    const KeyRange keys = p.visible_keys(t0 + m % rows).clamp_to(s0, s0 + N, s0);
    std::fill(L + m * ldl, L + m * ldl + keys.begin, kMinusInf);
    std::fill(L + m * ldl + keys.end, L + m * ldl + N, kMinusInf);
  }
}

float round_weight(float w, Precision precision) {
  return precision == Precision::bf16 ? round_to_bf16(w) : w;
}

float online_softmax_update(const RungKernels& kernels, float* p, const float* l, std::int64_t n, float& m,
                            float& l_sum, Precision precision) {
  float m_new = m;
  for (std::int64_t j = 0; j < n; ++j)
    if (l[j] > m_new) m_new = l[j];
  // While every logit so far is -inf (masked), subtract 0 so exp gives 0, not NaN.
  const float base = std::isinf(m_new) && m_new < 0 ? 0.0f : m_new;
  for (std::int64_t j = 0; j < n; ++j) p[j] = l[j] - base;
  exp_row(kernels, p, p, n);
  float corr = m - base;
  exp_row(kernels, &corr, &corr, 1);
  const float sum = blocked_sum(p, n);
  for (std::int64_t j = 0; j < n; ++j) p[j] = round_weight(p[j], precision);
  l_sum = l_sum * corr + sum;
  m = m_new;
  return corr;
}

}  // namespace flashgqa
