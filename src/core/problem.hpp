// The plain parameter struct every algorithm, kernel, test and benchmark takes: pointers, shapes,
// strides (in elements), scale and mask. Built and validated once from the public views by
// make_problem; algorithms never see TensorView or Options.
#pragma once

#include <algorithm>
#include <cstdint>

#include "flashgqa/flashgqa.hpp"

namespace flashgqa {

struct Problem {
  std::int64_t B = 0, K = 0, G = 0, T = 0, S = 0, H = 0;

  // q [B,K,G,T,H], out [B,K,G,T,H]: strides of b, k, g, t (h is contiguous).
  const void* q = nullptr;
  DType q_dtype = DType::f32;
  std::int64_t q_stride[4] = {};
  void* out = nullptr;
  DType out_dtype = DType::f32;
  std::int64_t out_stride[4] = {};
  // k, v [B,K,S,H]: strides of b, k, s.
  const void* k = nullptr;
  DType k_dtype = DType::f32;
  std::int64_t k_stride[3] = {};
  const void* v = nullptr;
  DType v_dtype = DType::f32;
  std::int64_t v_stride[3] = {};
  // lse [B,K,G,T] fp32, or null: strides of b, k, g, t.
  float* lse = nullptr;
  std::int64_t lse_stride[4] = {};

  float scale = 1.0f;
  bool causal = false;
  std::int64_t causal_offset = 0;  // query t sees key j iff j <= t + causal_offset (when causal)
  Precision precision = Precision::bf16;
  std::int64_t block_q = 0;   // 0 = automatic
  std::int64_t block_kv = 0;  // 0 = automatic
  int threads = 1;            // resolved: >= 1

  // Element addresses.
  const void* q_row(std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t) const {
    return static_cast<const char*>(q) +
           (b * q_stride[0] + kh * q_stride[1] + g * q_stride[2] + t * q_stride[3]) *
               static_cast<std::int64_t>(dtype_size(q_dtype));
  }
  void* out_row(std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t) const {
    return static_cast<char*>(out) +
           (b * out_stride[0] + kh * out_stride[1] + g * out_stride[2] + t * out_stride[3]) *
               static_cast<std::int64_t>(dtype_size(out_dtype));
  }
  const void* k_row(std::int64_t b, std::int64_t kh, std::int64_t s) const {
    return static_cast<const char*>(k) + (b * k_stride[0] + kh * k_stride[1] + s * k_stride[2]) *
                                             static_cast<std::int64_t>(dtype_size(k_dtype));
  }
  const void* v_row(std::int64_t b, std::int64_t kh, std::int64_t s) const {
    return static_cast<const char*>(v) + (b * v_stride[0] + kh * v_stride[1] + s * v_stride[2]) *
                                             static_cast<std::int64_t>(dtype_size(v_dtype));
  }
  float* lse_at(std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t) const {
    return lse + b * lse_stride[0] + kh * lse_stride[1] + g * lse_stride[2] + t * lse_stride[3];
  }

  // Number of keys query t may see: keys [0, visible_keys(t)).
  std::int64_t visible_keys(std::int64_t t) const {
    if (!causal) return S;
    return std::clamp<std::int64_t>(t + causal_offset + 1, 0, S);
  }
  // Whether key block [s0, ...) is fully masked for every query in [t0, t1).
  bool kv_block_masked(std::int64_t s0, std::int64_t t1) const {
    return causal && t1 > 0 && s0 >= visible_keys(t1 - 1);
  }
};

// Validates the views and options and resolves the defaults (scale, causal offset, threads).
// `lse` may be null. Throws Error naming the argument, the value found and what was expected.
Problem make_problem(const TensorView& out, const TensorView* lse, const TensorView& q,
                     const TensorView& k, const TensorView& v, const Options& options);

// The number of OpenMP threads to use for `requested` (0 = all cores).
int resolve_threads(int requested);

}  // namespace flashgqa
