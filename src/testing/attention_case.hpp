// Test inputs for attention: random q, k, v of a given shape, dtype and memory layout, with out and
// lse buffers, all as TensorViews. The same seed gives the same logical values in every layout, so
// layouts can be compared bit for bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashgqa/flashgqa.hpp"

namespace flashgqa::testing {

struct Shape {
  std::int64_t B, K, G, T, S, H;
};
std::string to_string(const Shape& s);

enum class Layout {
  contiguous,  // q [B,K,G,T,H] (= PyTorch SDPA's [B, K*G, T, H]), k/v [B,K,S,H]
  fa,          // FlashAttention's q [B,T,K*G,H], k/v [B,S,K,H]
  padded,      // contiguous order with gaps after every row and every head
};

struct AttentionCase {
  Shape shape{};
  std::vector<std::byte> q_buf, k_buf, v_buf, out_buf;
  std::vector<float> lse_buf;
  TensorView q, k, v, out, lse;  // lse [B,K,G,T] contiguous fp32

  // out[b,k,g,t,h] as float.
  float out_at(std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t, std::int64_t h) const;
  float lse_at(std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t) const;
  // Logical element setters (for planting NaN or large values).
  void set_q(std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t, std::int64_t h, float x);
  void set_k(std::int64_t b, std::int64_t kh, std::int64_t s, std::int64_t h, float x);
  void set_v(std::int64_t b, std::int64_t kh, std::int64_t s, std::int64_t h, float x);
  // All of out in logical [B,K,G,T,H] order, as float (for bitwise comparisons across layouts).
  std::vector<float> out_values() const;
  // out_values() followed by lse [B,K,G,T].
  std::vector<float> out_and_lse_values() const;
};

// Whether two float vectors hold the same bits (NaN payloads included).
bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b);

// Normal(0, 1) * input_scale values, rounded to `dtype`; out in `out_dtype`, filled with a NaN
// sentinel so an element left unwritten is caught.
AttentionCase make_case(const Shape& shape, DType dtype, DType out_dtype, Layout layout,
                        std::uint64_t seed, float input_scale = 1.0f);

}  // namespace flashgqa::testing
