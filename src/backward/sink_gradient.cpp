#include "backward/sink_gradient.hpp"

#include <cmath>
#include <vector>

#include "core/dtype.hpp"
#include "flash/run_tasks.hpp"

namespace flashgqa {

void sink_gradient(const BackwardProblem& p) {
  if (p.dsinks == nullptr) return;
  const Problem& f = p.fwd;
  const std::int64_t heads = f.K * f.G;
  constexpr int kChains = 8;  // independent partial sums of D: the adds pipeline instead of waiting on one
  struct Rows {  // a thread's dout and out rows as fp32 (allocated before the parallel region)
    std::vector<float> dout, out;
  };
  // One task per query head (its sum is one thread's, in a fixed order: any thread count, same bits).
  run_tasks_then_merges(
      f, heads, 0,
      [&] {
        const auto n = static_cast<std::size_t>(f.H);
        return Rows{std::vector<float>(n), std::vector<float>(n)};
      },
      [&](std::int64_t head, Rows& w) {
        const std::int64_t kh = head / f.G, g = head % f.G;
        const double sink = f.sink(kh, g);
        double sum = 0.0;  // sum_{b,t} P_sink D
        for (std::int64_t b = 0; b < f.B; ++b)
          for (std::int64_t t = 0; t < f.T; ++t) {
            load_row(w.dout.data(), p.dout_row(b, kh, g, t), p.dout_dtype, f.H, Precision::f32);
            load_row(w.out.data(), p.out_row(b, kh, g, t), f.out_dtype, f.H, Precision::f32);
            double chain[kChains] = {};  // D_t = dout . out, from both as stored
            for (std::int64_t h = 0; h < f.H; ++h)
              chain[h % kChains] +=
                  static_cast<double>(w.dout[static_cast<std::size_t>(h)]) * w.out[static_cast<std::size_t>(h)];
            double d = 0.0;
            for (double c : chain) d += c;
            if (d != 0.0) sum += std::exp(sink - static_cast<double>(*f.lse_at(b, kh, g, t))) * d;
          }
        p.dsinks[head] = static_cast<float>(-sum);
      },
      [](std::int64_t, float*) {});
}

}  // namespace flashgqa
