// Rung 4, the seed's first kernel: the stable chunked computation tiled over queries as well. For each
// KV block (the outer, sequential loop) every q block of block_q queries × all G heads is a parallel
// task that reads its carries (o, denom, m) from memory, updates them with that KV block, and writes
// them back to a second set of carry buffers (the kernel may not write its inputs, as in Pallas). The
// logits of one (q block, KV block) tile stay in a thread-local buffer, but the carries make a round
// trip through memory on every KV step: 4·(G·T·H + 2·G·T) bytes read and written per block.
#include <limits>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "ladder/ladder.hpp"
#include "ladder/rung_kernels.hpp"

namespace flashgqa {
namespace {

// The carries of every query row of one kv head, laid out [G, T] (and [G, T, Hp] for o).
struct Carries {
  std::vector<float> o, denom, m;
  Carries(std::int64_t rows, std::int64_t Hp)
      : o(static_cast<std::size_t>(rows * Hp), 0.0f),
        denom(static_cast<std::size_t>(rows), 0.0f),
        m(static_cast<std::size_t>(rows), -std::numeric_limits<float>::infinity()) {}
};

// One thread's buffers for a (q block, KV block) tile.
struct Tile {
  QRows Q;
  PRows P;
  AlignedBuffer L;  // logits [rows][npad]
  AccRows O;        // this step's o rows
  void reserve(const RungKernels& kernels, std::int64_t rows, std::int64_t npad) {
    Q.data.reset(static_cast<std::size_t>(rows * kernels.Hp * kernels.operand_bytes));
    P.reserve(kernels, rows, npad);
    L.reset(static_cast<std::size_t>(rows * npad) * sizeof(float));
    O.assign_zero(rows, kernels.Hp);
  }
};

}  // namespace

void kernel1_attention(const Problem& p) {
  const RungKernels kernels(p);
  const std::int64_t bq = clamp_block(p.block_q, kKernel1BlockQ, p.T);
  const std::int64_t bkv = clamp_block(p.block_kv, kSeedBlockKV, p.S);
  const std::int64_t num_q_blocks = (p.T + bq - 1) / bq, Hp = kernels.Hp;
  KvBlock kv;
  // Each thread's tile buffers, allocated here so an allocation failure reaches the caller.
  std::vector<Tile> tiles(static_cast<std::size_t>(p.threads));
  for (Tile& w : tiles) w.reserve(kernels, p.G * bq, padded_keys(bkv));
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh) {
      Carries in(p.G * p.T, Hp), out(p.G * p.T, Hp);
      // The chunks that hold a key some query sees.
      const KeyRange keys = p.visible_keys(0, p.T);
      for (std::int64_t s0 = keys.begin / bkv * bkv; s0 < keys.end; s0 += bkv) {
        p.check_interrupt();  // between KV chunks, outside the parallel regions
        const std::int64_t n = std::min(bkv, p.S - s0);
        pack_kv_block(kv, kernels, p, b, kh, s0, n);
        const std::int64_t ldl = kv.npad;
#pragma omp parallel num_threads(p.threads)
        {
#ifdef _OPENMP
          Tile& w = tiles[static_cast<std::size_t>(omp_get_thread_num())];
#else
          Tile& w = tiles[0];
#endif
          QRows& Q = w.Q;
          PRows& P = w.P;
          P.ld = ldl;
          AlignedBuffer& L = w.L;
          AccRows& O = w.O;
#pragma omp for schedule(static)
          for (std::int64_t i = 0; i < num_q_blocks; ++i) {
            const std::int64_t t0 = i * bq, rows = std::min(bq, p.T - t0), M = p.G * rows;
            pack_q_block(Q, kernels, p, b, kh, t0, rows);
            qk_logits(L.as<float>(), ldl, kernels, Q, 0, M, kv, p.scale);
            mask_logits(L.as<float>(), ldl, p, M, t0, rows, s0, n);
            for (std::int64_t r = 0; r < M; ++r) {
              // Carry of block row r: head g = r / rows, query t0 + r % rows, row g·T + t in memory.
              const auto c = static_cast<std::size_t>((r / rows) * p.T + t0 + r % rows);
              float m = in.m[c], denom = in.denom[c];  // read the carries from memory
              float* l = L.as<float>() + r * ldl;
              const float corr = online_softmax_update(kernels, l, l, n, m, denom, p.precision);
              const float* o_in = in.o.data() + c * static_cast<std::size_t>(Hp);
              for (std::int64_t h = 0; h < Hp; ++h) O.row(r, Hp)[h] = o_in[h] * corr;
              out.m[c] = m;  // write the carries back
              out.denom[c] = denom;
            }
            pack_p_rows(P, kernels, L.as<float>(), ldl, 0, M, n);
            pv_accumulate(O.ptr(), kernels, P, 0, M, kv);
            for (std::int64_t r = 0; r < M; ++r) {
              const auto c = static_cast<std::size_t>((r / rows) * p.T + t0 + r % rows);
              std::copy_n(O.row(r, Hp), Hp, out.o.data() + c * static_cast<std::size_t>(Hp));
            }
          }
        }
        std::swap(in, out);  // this step's outputs are the next step's inputs
      }
#pragma omp parallel for num_threads(p.threads) schedule(static)
      for (std::int64_t r = 0; r < p.G * p.T; ++r) {
        const auto c = static_cast<std::size_t>(r);
        finish_row(p, b, kh, r / p.T, r % p.T, in.o.data() + c * static_cast<std::size_t>(Hp),
                         in.m[c], in.denom[c]);
      }
    }
}

}  // namespace flashgqa
