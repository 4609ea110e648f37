#include "backward/sink_gradient.hpp"

#include <cmath>
#include <vector>

#include "core/dtype.hpp"

namespace flashgqa {

void sink_gradient(const BackwardProblem& p) {
  if (p.dsinks == nullptr) return;
  const Problem& f = p.fwd;
  const std::int64_t heads = f.K * f.G;
  constexpr int kChains = 8;  // independent partial sums of D: the adds pipeline instead of waiting on one
#pragma omp parallel num_threads(f.threads)
  {
    std::vector<float> dout(static_cast<std::size_t>(f.H)), out(dout.size());
#pragma omp for schedule(static)
    for (std::int64_t head = 0; head < heads; ++head) {
      const std::int64_t kh = head / f.G, g = head % f.G;
      const double sink = f.sink(kh, g);
      double sum = 0.0;  // sum_{b,t} P_sink D
      for (std::int64_t b = 0; b < f.B; ++b)
        for (std::int64_t t = 0; t < f.T; ++t) {
          load_row(dout.data(), p.dout_row(b, kh, g, t), p.dout_dtype, f.H, Precision::f32);
          load_row(out.data(), p.out_row(b, kh, g, t), f.out_dtype, f.H, Precision::f32);
          double chain[kChains] = {};  // D_t = dout . out, from both as stored
          for (std::int64_t h = 0; h < f.H; ++h)
            chain[h % kChains] += static_cast<double>(dout[static_cast<std::size_t>(h)]) * out[static_cast<std::size_t>(h)];
          double d = 0.0;
          for (double c : chain) d += c;
          if (d != 0.0) sum += std::exp(sink - static_cast<double>(*f.lse_at(b, kh, g, t))) * d;
        }
      p.dsinks[head] = static_cast<float>(-sum);
    }
  }
}

}  // namespace flashgqa
