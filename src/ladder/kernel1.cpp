// Rung 4, the seed's first kernel: the stable chunked computation tiled over queries as well. For each
// KV block (the outer, sequential loop) every q block of block_q queries × all G heads is a parallel
// task that reads its carries (o, denom, m) from memory, updates them with that KV block, and writes
// them back to a second set of carry buffers (the kernel may not write its inputs, as in Pallas). The
// logits of one (q block, KV block) tile stay in a thread-local buffer, but the carries make a round
// trip through memory on every KV step: 4·(G·T·H + 2·G·T) bytes read and written per block.
#include <limits>
#include <utility>
#include <vector>

#include "ladder/ladder.hpp"
#include "ladder/tile_math.hpp"

namespace flashgqa {
namespace {

constexpr std::int64_t kDefaultBlockQ = 256;

// The carries of every query row of one kv head, laid out [G, T] (and [G, T, H] for o).
struct Carries {
  std::vector<float> o, denom, m;
  Carries(std::int64_t rows, std::int64_t H)
      : o(static_cast<std::size_t>(rows * H), 0.0f),
        denom(static_cast<std::size_t>(rows), 0.0f),
        m(static_cast<std::size_t>(rows), -std::numeric_limits<float>::infinity()) {}
};

}  // namespace

void kernel1_attention(const Problem& p) {
  const std::int64_t bq = block_or(p.block_q, kDefaultBlockQ);
  const std::int64_t bkv = block_or(p.block_kv, kSeedBlockKV);
  const std::int64_t num_q_blocks = (p.T + bq - 1) / bq;
  std::vector<float> Kb(static_cast<std::size_t>(bkv * p.H)), Vb(Kb.size());
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh) {
      Carries in(p.G * p.T, p.H), out(p.G * p.T, p.H);
      for (std::int64_t s0 = 0; s0 < p.S; s0 += bkv) {
        if (p.kv_block_masked(s0, p.T)) break;  // this block and all later ones are masked
        const std::int64_t n = std::min(bkv, p.S - s0);
        load_k_block(Kb.data(), p, b, kh, s0, n);
        load_v_block(Vb.data(), p, b, kh, s0, n);
#pragma omp parallel num_threads(p.threads)
        {
          std::vector<float> Q(static_cast<std::size_t>(p.G * bq * p.H)), L(static_cast<std::size_t>(p.G * bq * bkv));
#pragma omp for schedule(static)
          for (std::int64_t i = 0; i < num_q_blocks; ++i) {
            const std::int64_t t0 = i * bq, rows = std::min(bq, p.T - t0), M = p.G * rows;
            load_q_block(Q.data(), p, b, kh, t0, rows);
            qk_logits(L.data(), Q.data(), M, Kb.data(), n, p.H, p.scale);
            mask_logits(L.data(), p, M, t0, rows, s0, n);
            for (std::int64_t r = 0; r < M; ++r) {
              // Carry of block row r: head g = r / rows, query t0 + r % rows, row g·T + t in memory.
              const auto c = static_cast<std::size_t>((r / rows) * p.T + t0 + r % rows);
              float m = in.m[c], denom = in.denom[c];  // read the carries from memory
              float* l = L.data() + r * n;
              const float corr = online_softmax_update(l, l, n, m, denom, p.precision);
              const float* o_in = in.o.data() + c * static_cast<std::size_t>(p.H);
              float* o_out = out.o.data() + c * static_cast<std::size_t>(p.H);
              for (std::int64_t h = 0; h < p.H; ++h) o_out[h] = o_in[h] * corr;
              pv_accumulate(o_out, l, 1, n, Vb.data(), p.H);
              out.m[c] = m;  // write the carries back
              out.denom[c] = denom;
            }
          }
        }
        std::swap(in, out);  // this step's outputs are the next step's inputs
      }
#pragma omp parallel for num_threads(p.threads) schedule(static)
      for (std::int64_t r = 0; r < p.G * p.T; ++r) {
        const auto c = static_cast<std::size_t>(r);
        write_output_row(p, b, kh, r / p.T, r % p.T, in.o.data() + c * static_cast<std::size_t>(p.H),
                         in.m[c], in.denom[c]);
      }
    }
}

}  // namespace flashgqa
