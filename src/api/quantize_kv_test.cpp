// quantize_kv: the bound of flashgqa.hpp on random rows of every magnitude (and rows of zeros, and
// subnormal rows), every float dtype, strided views of several ranks; bad input refused before any
// write.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "flashgqa/flashgqa.hpp"

namespace flashgqa {
namespace {

// The bound: |x - x8 * scale| <= scale (1/2 + 127 2^-23) + 2^-143, with the product in fp32.
void expect_within_bound(float x, std::int8_t x8, float scale, const std::string& what) {
  const double back = static_cast<double>(static_cast<float>(x8) * scale);
  const double bound = static_cast<double>(scale) * (0.5 + 127 * 0x1p-23) + 0x1p-143;
  EXPECT_LE(std::fabs(static_cast<double>(x) - back), bound) << what << ": x " << x << " x8 " << int{x8} << " scale " << scale;
}

TEST(QuantizeKv, MeetsItsBoundOnEveryMagnitudeAndDtype) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal;
  const std::int64_t R = 4, C = 3, H = 77;  // x [R, C, H] viewed with a padded row stride
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (const float magnitude : {1.0f, 1e-3f, 3e4f, 1e-38f, 0.0f}) {
      if (dtype == DType::f16 && (magnitude > 1e3f || (magnitude < 1e-3f && magnitude > 0.0f))) continue;
      const std::int64_t ld = H + 5, es = static_cast<std::int64_t>(dtype_size(dtype));
      std::vector<std::byte> xb(static_cast<std::size_t>(R * C * ld * es));
      std::vector<float> x(static_cast<std::size_t>(R * C * ld));
      for (std::int64_t i = 0; i < R * C * ld; ++i) {
        float f = normal(rng) * magnitude;
        if (i % ld == 3 && i / ld == 1) f = 0.0f;
        store_row(xb.data() + i * es, dtype, &f, 1);
        x[static_cast<std::size_t>(i)] = load_element(xb.data(), dtype, i);  // the value quantized
      }
      TensorView xv{xb.data(), dtype, 3, {R, C, H}, {C * ld, ld, 1}};
      std::vector<std::int8_t> q(static_cast<std::size_t>(R * C * H), 99);
      std::vector<float> scale(static_cast<std::size_t>(R * C * 2), -1.0f);  // every other float
      TensorView qv{q.data(), DType::i8, 3, {R, C, H}, {C * H, H, 1}};
      TensorView sv{scale.data(), DType::f32, 2, {R, C}, {C * 2, 2}};
      quantize_kv(xv, qv, sv);
      for (std::int64_t r = 0; r < R * C; ++r) {
        const float s = scale[static_cast<std::size_t>(2 * r)];
        float amax = 0.0f;
        for (std::int64_t h = 0; h < H; ++h) amax = std::max(amax, std::fabs(x[static_cast<std::size_t>(r * ld + h)]));
        EXPECT_EQ(s, amax / 127.0f);
        EXPECT_EQ(scale[static_cast<std::size_t>(2 * r + 1)], -1.0f);  // not written
        for (std::int64_t h = 0; h < H; ++h) {
          const std::int8_t v = q[static_cast<std::size_t>(r * H + h)];
          EXPECT_GE(v, -127);
          expect_within_bound(x[static_cast<std::size_t>(r * ld + h)], v, s,
                              std::string(dtype_name(dtype)) + " magnitude " + std::to_string(magnitude));
        }
      }
    }
}

// Rows so small that the scale (max |x| / 127) is subnormal or 0: the bound's absolute term.
TEST(QuantizeKv, SubnormalScales) {
  for (const float amax : {0x1p-140f, 50 * 0x1p-149f, 0x1p-149f, 0x1p-126f, 0x1.8p-120f}) {
    std::vector<float> x = {amax, -amax / 3, amax / 7, 0.0f, -amax};
    std::vector<std::int8_t> q(x.size());
    float s = -1;
    quantize_kv(contiguous_view(x.data(), DType::f32, {5}), contiguous_view(q.data(), DType::i8, {5}),
                contiguous_view(&s, DType::f32, {}));
    for (std::size_t h = 0; h < x.size(); ++h) expect_within_bound(x[h], q[h], s, "amax " + std::to_string(amax));
  }
}

TEST(QuantizeKv, RowsOfOneValueAndOfZeros) {
  float x[4] = {-3.5f, 0.0f, 0.0f, 0.0f};  // rows [2, 2]: (-3.5, 0) and (0, 0)
  std::int8_t q[4] = {1, 1, 1, 1};
  float s[2] = {-1.0f, -1.0f};
  quantize_kv(contiguous_view(x, DType::f32, {2, 2}), contiguous_view(q, DType::i8, {2, 2}),
              contiguous_view(s, DType::f32, {2}));
  EXPECT_EQ(q[0], -127);
  EXPECT_EQ(q[1], 0);
  EXPECT_EQ(s[0], 3.5f / 127.0f);
  EXPECT_EQ(q[2], 0);
  EXPECT_EQ(q[3], 0);
  EXPECT_EQ(s[1], 0.0f);
}

TEST(QuantizeKv, RejectsBadInputBeforeWriting) {
  float x[6] = {1, 2, 3, 4, 5, 6};
  std::int8_t q[6] = {7, 7, 7, 7, 7, 7};
  float s[3] = {9, 9, 9};
  auto expect_error = [&](TensorView xv, TensorView qv, TensorView sv, const std::string& fragment) {
    try {
      quantize_kv(xv, qv, sv);
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    for (std::int8_t v : q) EXPECT_EQ(v, 7) << fragment;
    for (float v : s) EXPECT_EQ(v, 9.0f) << fragment;
  };
  const TensorView xv = contiguous_view(x, DType::f32, {3, 2}), qv = contiguous_view(q, DType::i8, {3, 2}),
                   sv = contiguous_view(s, DType::f32, {3});
  expect_error(xv, qv, contiguous_view(s, DType::f32, {2}), "scale: shape");
  expect_error(xv, contiguous_view(q, DType::i8, {2, 3}), sv, "x_int8: shape");
  expect_error(xv, contiguous_view(x, DType::f32, {3, 2}), sv, "x_int8: dtype float32, expected int8");
  expect_error(contiguous_view(q, DType::i8, {3, 2}), qv, sv, "x: dtype int8");
  expect_error(xv, qv, contiguous_view(x, DType::f32, {3}), "overlaps");
  x[4] = std::numeric_limits<float>::quiet_NaN();
  expect_error(xv, qv, sv, "x: row [2] has a non-finite value at 0");
  x[4] = std::numeric_limits<float>::infinity();
  expect_error(xv, qv, sv, "non-finite");
}

// attention() takes no int8 tensor: an int8 k is an Error naming it.
TEST(QuantizeKv, AttentionRefusesInt8Inputs) {
  std::vector<float> q(8), out(8);
  std::vector<std::int8_t> k(8), v(8);
  try {
    attention(contiguous_view(out.data(), DType::f32, {1, 1, 1, 1, 8}),
              contiguous_view(q.data(), DType::f32, {1, 1, 1, 1, 8}),
              contiguous_view(k.data(), DType::i8, {1, 1, 1, 8}), contiguous_view(v.data(), DType::i8, {1, 1, 1, 8}));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k: dtype int8, expected float32, bfloat16 or float16"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace flashgqa
