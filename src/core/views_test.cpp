// The public views: split_heads maps every element of SDPA's [B, Hq, T, H] (any strides) to the same
// address as [B, K, G, T, H] with head h = k*G + g, and rejects what it cannot split; the named
// layouts (sdpa_q_view, fa_q_view, fa_kv_view) describe the layouts their comments name.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "flashgqa/flashgqa.hpp"

namespace flashgqa {
namespace {

// A rank-4 (or rank-3) view with the given shape and strides; no memory behind it.
TensorView strided(std::initializer_list<std::int64_t> shape, std::initializer_list<std::int64_t> stride) {
  TensorView t;
  t.rank = static_cast<int>(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    t.shape[d] = shape.begin()[d];
    t.stride[d] = stride.begin()[d];
  }
  return t;
}

// Element offset of index `i` (t.rank entries) in t.
std::int64_t offset(const TensorView& t, std::initializer_list<std::int64_t> i) {
  std::int64_t o = 0;
  for (std::size_t d = 0; d < i.size(); ++d) o += i.begin()[d] * t.stride[d];
  return o;
}

// Every element (b, k, g, t, h) of split_heads(heads, K) sits where (b, k*G + g, t, h) of `heads`
// does, and the split view keeps the data pointer and dtype.
void expect_same_elements(const TensorView& heads, std::int64_t K) {
  const TensorView s = split_heads(heads, K, "q");
  ASSERT_EQ(s.rank, 5);
  const std::int64_t G = heads.shape[1] / K;
  EXPECT_EQ(s.data, heads.data);
  EXPECT_EQ(s.dtype, heads.dtype);
  EXPECT_EQ(s.shape[0], heads.shape[0]);
  EXPECT_EQ(s.shape[1], K);
  EXPECT_EQ(s.shape[2], G);
  EXPECT_EQ(s.shape[3], heads.shape[2]);
  EXPECT_EQ(s.shape[4], heads.shape[3]);
  for (std::int64_t b = 0; b < s.shape[0]; ++b)
    for (std::int64_t kh = 0; kh < K; ++kh)
      for (std::int64_t g = 0; g < G; ++g)
        for (std::int64_t t = 0; t < s.shape[3]; ++t)
          for (std::int64_t h = 0; h < s.shape[4]; ++h)
            ASSERT_EQ(offset(s, {b, kh, g, t, h}), offset(heads, {b, kh * G + g, t, h}))
                << "at b " << b << " k " << kh << " g " << g << " t " << t << " h " << h;
}

// Expects split_heads(heads, K) to throw an Error whose message contains every fragment.
void expect_split_error(const TensorView& heads, std::int64_t K,
                        std::initializer_list<const char*> fragments) {
  try {
    split_heads(heads, K, "q");
    ADD_FAILURE() << "no error; expected one mentioning " << *fragments.begin();
  } catch (const Error& e) {
    for (const char* f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

TEST(SplitHeads, ContiguousIsTheContiguousFiveDView) {
  int dummy = 0;
  const TensorView q4 = contiguous_view(&dummy, DType::bf16, {2, 12, 5, 8});
  const TensorView s = split_heads(q4, 3);
  const TensorView q5 = contiguous_view(&dummy, DType::bf16, {2, 3, 4, 5, 8});
  EXPECT_EQ(s.rank, q5.rank);
  EXPECT_EQ(s.shape, q5.shape);
  EXPECT_EQ(s.stride, q5.stride);
  expect_same_elements(q4, 3);
  // sdpa_q_view is this split of the contiguous [B, K*G, T, H] view.
  const TensorView sdpa = sdpa_q_view(&dummy, DType::bf16, 2, 3, 4, 5, 8);
  EXPECT_EQ(sdpa.shape, q5.shape);
  EXPECT_EQ(sdpa.stride, q5.stride);
}

TEST(SplitHeads, OddStrides) {
  // FlashAttention's memory [B, T, Hq, H] seen as [B, Hq, T, H] (q.transpose(1, 2)).
  expect_same_elements(strided({2, 6, 5, 4}, {5 * 6 * 4, 4, 6 * 4, 1}), 2);
  // Padded rows and heads, and every head its own kv head (G = 1) or one kv head (K = 1).
  const TensorView padded = strided({3, 8, 7, 4}, {1000, 100, 9, 1});
  expect_same_elements(padded, 8);
  expect_same_elements(padded, 1);
  expect_same_elements(padded, 4);
  // Negative strides (a flipped head or batch axis) and a broadcast head axis (stride 0).
  expect_same_elements(strided({2, 6, 3, 4}, {-72, -12, 4, 1}), 3);
  const TensorView broadcast = split_heads(strided({1, 6, 3, 4}, {12, 0, 4, 1}), 2);
  EXPECT_EQ(broadcast.stride[1], 0);
  EXPECT_EQ(broadcast.stride[2], 0);
  // The head axis of stride s becomes (G*s, s).
  const TensorView s = split_heads(strided({1, 12, 3, 4}, {0, 7, 84, 1}), 4);
  EXPECT_EQ(s.stride[1], 3 * 7);
  EXPECT_EQ(s.stride[2], 7);
  // No query heads: G = 0, an empty view.
  const TensorView none = split_heads(strided({1, 0, 3, 4}, {0, 12, 4, 1}), 2);
  EXPECT_EQ(none.shape[1], 2);
  EXPECT_EQ(none.shape[2], 0);
  EXPECT_EQ(none.numel(), 0);
}

TEST(SplitHeads, LseRankThree) {
  // lse [B, Hq, T] with padded strides -> [B, K, G, T].
  const TensorView lse = strided({2, 6, 5}, {100, 7, 1});
  const TensorView s = split_heads(lse, 3, "lse");
  ASSERT_EQ(s.rank, 4);
  EXPECT_EQ(s.shape[0], 2);
  EXPECT_EQ(s.shape[1], 3);
  EXPECT_EQ(s.shape[2], 2);
  EXPECT_EQ(s.shape[3], 5);
  for (std::int64_t kh = 0; kh < 3; ++kh)
    for (std::int64_t g = 0; g < 2; ++g)
      for (std::int64_t t = 0; t < 5; ++t)
        EXPECT_EQ(offset(s, {1, kh, g, t}), offset(lse, {1, kh * 2 + g, t}));
}

TEST(SplitHeads, BadInputs) {
  const TensorView q = strided({1, 6, 3, 4}, {72, 12, 4, 1});
  expect_split_error(q, 4, {"q: shape [1,6,3,4] [B,Hq,T,H] has Hq = 6 query heads",
                            "expected a multiple of K = 4 kv heads"});
  expect_split_error(q, 0, {"q: K = 0 kv heads", "expected K >= 1"});
  expect_split_error(q, -2, {"q: K = -2 kv heads", "expected K >= 1"});
  expect_split_error(strided({1, 2, 3, 4, 5}, {120, 60, 20, 5, 1}), 1,
                     {"q: rank 5", "expected 4 [B,Hq,T,H]"});
  expect_split_error(strided({6, 4}, {4, 1}), 1, {"q: rank 2", "expected 4"});
  expect_split_error(strided({1, -4, 3, 4}, {72, 12, 4, 1}), 2, {"q: negative dimension", "[1,-4,3,4]"});
  expect_split_error(strided({1, 8, 3, 4}, {0, std::int64_t{1} << 62, 4, 1}), 2,
                     {"q: head stride", "overflows", "expected smaller strides"});
  expect_split_error(strided({1, 5, 3}, {15, 3, 1}), 2, {"[B,Hq,T] has Hq = 5", "K = 2"});
  // The name defaults to the function's.
  try {
    split_heads(q, 4);
    ADD_FAILURE() << "no error for Hq = 6, K = 4";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("split_heads: ", 0), 0u) << e.what();
  }
  // sdpa_q_view throws as split_heads does.
  EXPECT_THROW(sdpa_q_view(nullptr, DType::f32, 1, 0, 4, 3, 8), Error);
}

TEST(LayoutViews, DescribeTheSameElements) {
  // FlashAttention's q [B, T, K*G, H]: element (b, k, g, t, h) at ((b*T + t)*K*G + k*G + g)*H + h.
  const TensorView q = fa_q_view(nullptr, DType::f32, 2, 3, 4, 5, 8);
  const std::int64_t b = 1, kh = 2, g = 3, t = 4, h = 7;
  EXPECT_EQ(b * q.stride[0] + kh * q.stride[1] + g * q.stride[2] + t * q.stride[3] + h,
            ((b * 5 + t) * 12 + kh * 4 + g) * 8 + h);
  const TensorView k = fa_kv_view(nullptr, DType::f32, 2, 3, 6, 8);
  EXPECT_EQ(b * k.stride[0] + kh * k.stride[1] + 5 * k.stride[2] + h, ((b * 6 + 5) * 3 + kh) * 8 + h);
}

}  // namespace
}  // namespace flashgqa
