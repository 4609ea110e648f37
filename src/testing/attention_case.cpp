#include "testing/attention_case.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

#include "core/dtype.hpp"

namespace flashgqa::testing {
namespace {

constexpr std::int64_t kPad = 3;  // elements of gap per row / head in Layout::padded

TensorView strided(std::vector<std::byte>& buf, DType dtype, int rank,
                   std::array<std::int64_t, 5> shape, std::array<std::int64_t, 5> stride,
                   std::int64_t elements) {
  buf.assign(static_cast<std::size_t>(elements) * dtype_size(dtype) + 1, std::byte{0});
  TensorView t;
  t.data = buf.data();
  t.dtype = dtype;
  t.rank = rank;
  t.shape = shape;
  t.stride = stride;
  return t;
}

// q-like [B,K,G,T,H] view in `layout`.
TensorView q_like(std::vector<std::byte>& buf, DType dtype, const Shape& s, Layout layout) {
  const auto [B, K, G, T, S, H] = s;
  (void)S;
  switch (layout) {
    case Layout::contiguous:
      return strided(buf, dtype, 5, {B, K, G, T, H}, {K * G * T * H, G * T * H, T * H, H, 1}, B * K * G * T * H);
    case Layout::fa:
      return strided(buf, dtype, 5, {B, K, G, T, H}, {T * K * G * H, G * H, H, K * G * H, 1}, B * K * G * T * H);
    case Layout::padded: {
      const std::int64_t row = H + kPad, head = T * row + kPad, kv = G * head + kPad, batch = K * kv + kPad;
      return strided(buf, dtype, 5, {B, K, G, T, H}, {batch, kv, head, row, 1}, B * batch);
    }
  }
  return {};
}

// k-like [B,K,S,H] view in `layout`.
TensorView kv_like(std::vector<std::byte>& buf, DType dtype, const Shape& s, Layout layout) {
  const auto [B, K, G, T, S, H] = s;
  (void)G, (void)T;
  switch (layout) {
    case Layout::contiguous:
      return strided(buf, dtype, 4, {B, K, S, H}, {K * S * H, S * H, H, 1}, B * K * S * H);
    case Layout::fa:
      return strided(buf, dtype, 4, {B, K, S, H}, {S * K * H, H, K * H, 1}, B * K * S * H);
    case Layout::padded: {
      const std::int64_t row = H + kPad, head = S * row + kPad, batch = K * head + kPad;
      return strided(buf, dtype, 4, {B, K, S, H}, {batch, head, row, 1}, B * batch);
    }
  }
  return {};
}

std::int64_t offset(const TensorView& t, std::initializer_list<std::int64_t> index) {
  std::int64_t o = 0;
  std::size_t d = 0;
  for (std::int64_t i : index) o += i * t.stride[d++];
  return o;
}

void store(const TensorView& t, std::int64_t off, float x) {
  store_row(static_cast<char*>(t.data) + off * static_cast<std::int64_t>(dtype_size(t.dtype)), t.dtype, &x, 1);
}

float load(const TensorView& t, std::int64_t off) {
  return load_element(static_cast<const char*>(t.data) + off * static_cast<std::int64_t>(dtype_size(t.dtype)),
                      t.dtype, 0);
}

}  // namespace

std::string to_string(const Shape& s) {
  std::ostringstream os;  // (operator+ chains trip GCC 12's false -Wrestrict, PR 105651)
  os << 'B' << s.B << "_K" << s.K << "_G" << s.G << "_T" << s.T << "_S" << s.S << "_H" << s.H;
  return os.str();
}

AttentionCase make_case(const Shape& shape, DType dtype, DType out_dtype, Layout layout,
                        std::uint64_t seed, float input_scale) {
  AttentionCase c;
  c.shape = shape;
  c.q = q_like(c.q_buf, dtype, shape, layout);
  c.k = kv_like(c.k_buf, dtype, shape, layout);
  c.v = kv_like(c.v_buf, dtype, shape, layout);
  c.out = q_like(c.out_buf, out_dtype, shape, layout);
  c.lse_buf.assign(static_cast<std::size_t>(shape.B * shape.K * shape.G * shape.T) + 1,
                   std::numeric_limits<float>::quiet_NaN());
  c.lse = contiguous_view(c.lse_buf.data(), DType::f32, {shape.B, shape.K, shape.G, shape.T});
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto [B, K, G, T, S, H] = shape;
  // Logical order, so every layout gets the same values for the same seed.
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t kh = 0; kh < K; ++kh) {
      for (std::int64_t g = 0; g < G; ++g)
        for (std::int64_t t = 0; t < T; ++t)
          for (std::int64_t h = 0; h < H; ++h) {
            store(c.q, offset(c.q, {b, kh, g, t, h}), normal(rng) * input_scale);
            store(c.out, offset(c.out, {b, kh, g, t, h}), std::numeric_limits<float>::quiet_NaN());
          }
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < H; ++h) {
          store(c.k, offset(c.k, {b, kh, s, h}), normal(rng) * input_scale);
          store(c.v, offset(c.v, {b, kh, s, h}), normal(rng));
        }
    }
  return c;
}

float AttentionCase::out_at(std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t,
                            std::int64_t h) const {
  return load(out, offset(out, {b, kh, g, t, h}));
}

float AttentionCase::lse_at(std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t) const {
  return lse_buf[static_cast<std::size_t>(((b * shape.K + kh) * shape.G + g) * shape.T + t)];
}

void AttentionCase::set_q(std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t,
                          std::int64_t h, float x) {
  store(q, offset(q, {b, kh, g, t, h}), x);
}

void AttentionCase::set_k(std::int64_t b, std::int64_t kh, std::int64_t s, std::int64_t h, float x) {
  store(k, offset(k, {b, kh, s, h}), x);
}

void AttentionCase::set_v(std::int64_t b, std::int64_t kh, std::int64_t s, std::int64_t h, float x) {
  store(v, offset(v, {b, kh, s, h}), x);
}

std::vector<float> AttentionCase::out_values() const {
  std::vector<float> values;
  for (std::int64_t b = 0; b < shape.B; ++b)
    for (std::int64_t kh = 0; kh < shape.K; ++kh)
      for (std::int64_t g = 0; g < shape.G; ++g)
        for (std::int64_t t = 0; t < shape.T; ++t)
          for (std::int64_t h = 0; h < shape.H; ++h) values.push_back(out_at(b, kh, g, t, h));
  return values;
}

std::vector<float> AttentionCase::out_and_lse_values() const {
  std::vector<float> values = out_values();
  values.insert(values.end(), lse_buf.begin(), lse_buf.end() - 1);  // the last element is a guard
  return values;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace flashgqa::testing
