// The plain parameter struct of the backward pass: the forward's Problem (q, k, v, out, lse, scale,
// mask, precision, blocks, threads) plus dout and the three gradients. Built and validated once from
// the public views by make_backward_problem; the algorithms and the reference never see TensorView.
//
// Math (per (b, kv head), over the G query heads g and positions t, keys j the mask lets t see):
//   P[t,j]  = exp(scale q_t.k_j - lse_t)                   (recomputed from the saved lse)
//   D_t     = sum_h dout[t,h] out[t,h]                      (= sum_j P dP, from the forward's out)
//   dP[t,j] = dout_t . v_j
//   dS[t,j] = P[t,j] (dP[t,j] - D_t)
//   dq_t    = scale sum_j dS[t,j] k_j
//   dk_j    = scale sum_{g,t} dS[t,j] q_t                   (summed over the G heads of the kv head)
//   dv_j    = sum_{g,t} P[t,j] dout_t
// Under Precision::bf16 the matmul operands are rounded to bfloat16: q, k, v and dout as read, P before
// dv, dS before dq and dk; every accumulation (and D) is fp32. A row with lse = -inf (it saw no key)
// has P = 0 and so zero gradients. With sinks the saved lse includes e^sink, so P, dS and the three
// gradients above need nothing else; the sinks' own gradient is
//   dsink[k,g] = -sum_{b,t} exp(sink - lse_t) D_t          (dP/dsink = -P P_sink, summed with dP)
#pragma once

#include <cstdint>

#include "core/problem.hpp"

namespace flashgqa {

struct BackwardProblem {
  // The forward's problem: q, k, v, scale, mask, precision, blocks, threads; `out` points at the
  // forward's output (read, never written) and `lse` at its lse (read).
  Problem fwd;
  // dout [B,K,G,T,H] (strides of b, k, g, t), read.
  const void* dout = nullptr;
  DType dout_dtype = DType::f32;
  std::int64_t dout_stride[4] = {};
  // dq [B,K,G,T,H]; dk, dv [B,K,S,H] (strides of b, k, s), written.
  void* dq = nullptr;
  DType dq_dtype = DType::f32;
  std::int64_t dq_stride[4] = {};
  void* dk = nullptr;
  DType dk_dtype = DType::f32;
  std::int64_t dk_stride[3] = {};
  void* dv = nullptr;
  DType dv_dtype = DType::f32;
  std::int64_t dv_stride[3] = {};
  // The sinks' gradient [K*G] (fwd.sinks' layout), written when not null (backward/sink_gradient.hpp).
  float* dsinks = nullptr;

  const void* dout_row(std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t) const {
    return static_cast<const char*>(dout) +
           (b * dout_stride[0] + kh * dout_stride[1] + g * dout_stride[2] + t * dout_stride[3]) *
               static_cast<std::int64_t>(dtype_size(dout_dtype));
  }
  void* dq_row(std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t) const {
    return static_cast<char*>(dq) +
           (b * dq_stride[0] + kh * dq_stride[1] + g * dq_stride[2] + t * dq_stride[3]) *
               static_cast<std::int64_t>(dtype_size(dq_dtype));
  }
  void* dk_row(std::int64_t b, std::int64_t kh, std::int64_t s) const {
    return static_cast<char*>(dk) + (b * dk_stride[0] + kh * dk_stride[1] + s * dk_stride[2]) *
                                        static_cast<std::int64_t>(dtype_size(dk_dtype));
  }
  void* dv_row(std::int64_t b, std::int64_t kh, std::int64_t s) const {
    return static_cast<char*>(dv) + (b * dv_stride[0] + kh * dv_stride[1] + s * dv_stride[2]) *
                                        static_cast<std::int64_t>(dtype_size(dv_dtype));
  }
  // The forward's output row (read).
  const void* out_row(std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t) const {
    return fwd.out_row(b, kh, g, t);
  }
};

// Validates the views and options (as make_problem does for the forward: q, k, v, out, lse like the
// forward's; dout like out; dq like q; dk, dv like k; the gradients writable, distinct elements, not
// overlapping each other or any input; dsinks, when not null, needs Options::sinks and overlaps
// nothing). Throws Error naming the argument.
BackwardProblem make_backward_problem(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                      const TensorView& dout, const TensorView& q, const TensorView& k,
                                      const TensorView& v, const TensorView& out, const TensorView& lse,
                                      const Options& options, float* dsinks = nullptr);

}  // namespace flashgqa
