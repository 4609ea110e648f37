// The public entry points: validate once into a Problem, then hand it to the chosen rung. A call reads
// no files: blocks tuned for a machine come in through Options (the tools look them up, see
// src/study/tune_cache.hpp).
#include "flashgqa/flashgqa.hpp"
#include "backward/flash_backward.hpp"
#include "backward/sink_gradient.hpp"
#include "core/backward_problem.hpp"
#include "core/error_text.hpp"
#include "ladder/ladder.hpp"

namespace flashgqa {
namespace {

void run(const Problem& p, Algorithm algorithm) {
  if (p.B * p.K * p.G * p.T == 0) return;  // nothing to write
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

void attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        const TensorView& dout, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& out, const TensorView& lse,
                        const Options& options) {
  flash_backward(make_backward_problem(dq, dk, dv, dout, q, k, v, out, lse, options), active_isa());
}

void attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, float* dsinks,
                        const TensorView& dout, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& out, const TensorView& lse,
                        const Options& options) {
  if (dsinks == nullptr) fail("dsinks: null pointer, expected K*G floats to write the sinks' gradient");
  const BackwardProblem p = make_backward_problem(dq, dk, dv, dout, q, k, v, out, lse, options, dsinks);
  flash_backward(p, active_isa());
  sink_gradient(p);
}

void linear_attention(const TensorView& out, const TensorView& q, const TensorView& k,
                      const TensorView& v, const Options& options) {
  if (options.softcap != 0.0)
    throw Error("softcap: " + std::to_string(options.softcap) +
                ", expected 0: linear_attention has no softmax to cap");
  if (options.sinks != nullptr)
    throw Error("sinks: given, expected none: linear_attention has no softmax denominator to add them to");
  Options o = options;
  o.algorithm = Algorithm::chunked;  // validate blocks as the chunked rung takes them
  const Problem p = make_problem(out, nullptr, q, k, v, o);
  if (p.B * p.K * p.G * p.T == 0) return;
  check_rung_workspace(p, Algorithm::chunked);  // the same buffers as the chunked rung
  linear_attention_chunked(p);
}

}  // namespace flashgqa
