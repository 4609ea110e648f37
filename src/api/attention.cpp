// The public entry points: validate once into a Problem, then hand it to the chosen rung. flash with
// both block sizes automatic takes the blocks `flashgqa tune` stored for the shape's class, if any.
#include "flashgqa/flashgqa.hpp"
#include "kernels/cpu_features.hpp"
#include "ladder/ladder.hpp"
#include "study/tune_cache.hpp"

namespace flashgqa {
namespace {

void run(Problem p, Algorithm algorithm) {
  if (p.B * p.K * p.G * p.T == 0) return;  // nothing to write
  if (algorithm == Algorithm::flash) study::apply_tuned_blocks(p, isa_name(active_isa()));
  run_algorithm(p, algorithm);
}

}  // namespace

void attention(const TensorView& out, const TensorView& q, const TensorView& k, const TensorView& v,
               const Options& options) {
  run(make_problem(out, nullptr, q, k, v, options), options.algorithm);
}

void attention(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
               const TensorView& v, const Options& options) {
  run(make_problem(out, &lse, q, k, v, options), options.algorithm);
}

void linear_attention(const TensorView& out, const TensorView& q, const TensorView& k,
                      const TensorView& v, const Options& options) {
  Options o = options;
  o.algorithm = Algorithm::chunked;  // validate blocks as the chunked rung takes them
  const Problem p = make_problem(out, nullptr, q, k, v, o);
  if (p.B * p.K * p.G * p.T > 0) linear_attention_chunked(p);
}

}  // namespace flashgqa
