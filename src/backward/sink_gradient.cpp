#include "backward/sink_gradient.hpp"

#include <cmath>

#include "core/dtype.hpp"

namespace flashgqa {

void sink_gradient(const BackwardProblem& p) {
  if (p.dsinks == nullptr) return;
  const Problem& f = p.fwd;
  const std::int64_t heads = f.K * f.G;
#pragma omp parallel for num_threads(f.threads) schedule(static)
  for (std::int64_t head = 0; head < heads; ++head) {
    const std::int64_t kh = head / f.G, g = head % f.G;
    const double sink = f.sink(kh, g);
    double sum = 0.0;  // sum_{b,t} P_sink D
    for (std::int64_t b = 0; b < f.B; ++b)
      for (std::int64_t t = 0; t < f.T; ++t) {
        const void* dout = p.dout_row(b, kh, g, t);
        const void* out = p.out_row(b, kh, g, t);
        double d = 0.0;  // D_t = dout . out, from both as stored
        for (std::int64_t h = 0; h < f.H; ++h)
          d += static_cast<double>(load_element(dout, p.dout_dtype, h)) * load_element(out, f.out_dtype, h);
        if (d != 0.0) sum += std::exp(sink - static_cast<double>(*f.lse_at(b, kh, g, t))) * d;
      }
    p.dsinks[head] = static_cast<float>(-sum);
  }
}

}  // namespace flashgqa
