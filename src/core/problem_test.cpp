// Validation: every bad argument gives an Error naming it, the value found and what was expected;
// defaults resolve as documented.
#include "core/problem.hpp"

#include <gtest/gtest.h>

#include <limits>

#include <cmath>
#include <vector>

namespace flashgqa {
namespace {

// Contiguous q/out [B,K,G,T,H] and k/v [B,K,S,H] buffers.
struct Views {
  std::vector<float> q, k, v, out, lse;
  TensorView qv, kv, vv, ov, lv;
  Views(std::int64_t B, std::int64_t K, std::int64_t G, std::int64_t T, std::int64_t S, std::int64_t H)
      : q(static_cast<std::size_t>(B * K * G * T * H) + 1), k(static_cast<std::size_t>(B * K * S * H) + 1),
        v(k.size()), out(q.size()), lse(static_cast<std::size_t>(B * K * G * T) + 1) {
    qv = contiguous_view(q.data(), DType::f32, {B, K, G, T, H});
    kv = contiguous_view(k.data(), DType::f32, {B, K, S, H});
    vv = contiguous_view(v.data(), DType::f32, {B, K, S, H});
    ov = contiguous_view(out.data(), DType::f32, {B, K, G, T, H});
    lv = contiguous_view(lse.data(), DType::f32, {B, K, G, T});
  }
};

// Expects make_problem to throw an Error whose message contains every fragment.
void expect_error(const Views& w, const TensorView& out, const TensorView& q, const TensorView& k,
                  const TensorView& v, const Options& o, std::initializer_list<const char*> fragments,
                  const TensorView* lse = nullptr) {
  (void)w;
  try {
    make_problem(out, lse, q, k, v, o);
    ADD_FAILURE() << "no error; expected one mentioning " << *fragments.begin();
  } catch (const Error& e) {
    for (const char* f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

TEST(Problem, DefaultsResolve) {
  Views w(2, 3, 4, 5, 7, 64);
  Options o;
  o.causal = true;
  const Problem p = make_problem(w.ov, nullptr, w.qv, w.kv, w.vv, o);
  EXPECT_EQ(p.B, 2);
  EXPECT_EQ(p.K, 3);
  EXPECT_EQ(p.G, 4);
  EXPECT_EQ(p.T, 5);
  EXPECT_EQ(p.S, 7);
  EXPECT_EQ(p.H, 64);
  EXPECT_FLOAT_EQ(p.scale, 0.125f);
  EXPECT_EQ(p.causal_offset, 2);  // S - T: bottom-right
  EXPECT_EQ(p.visible_keys(0).end, 3);
  EXPECT_EQ(p.visible_keys(0).begin, 0);
  EXPECT_EQ(p.visible_keys(4).end, 7);
  EXPECT_EQ(p.visible_keys(2, 5).begin, 0);
  EXPECT_EQ(p.visible_keys(2, 5).end, 7);
  EXPECT_EQ(p.visible_pairs(), 3 + 4 + 5 + 6 + 7);
  EXPECT_GE(p.threads, 1);
  EXPECT_EQ(p.precision, Precision::bf16);
}

// Windows and offsets of any int64 size give the mask their formula defines (no overflow, no clamping
// that moves one side of the window): query t sees t + offset - left <= j <= t + offset + right.
TEST(Problem, ExtremeOffsetsAndWindowsKeepTheirMeaning) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max(), kMin = std::numeric_limits<std::int64_t>::min();
  Views w(1, 1, 1, 6, 9, 8);
  struct Case {
    bool causal;
    std::int64_t offset, left, right;
  };
  for (const Case& c : {Case{true, kMin, -1, -1}, Case{true, kMax, -1, -1}, Case{false, -7 - 10, -1, 5},
                        Case{false, kMax, kMax - 2, -1}, Case{false, kMin, -1, kMax}, Case{true, kMax, kMax, -1},
                        Case{false, 3, kMax, kMax}, Case{true, -7, 3, 100}}) {
    Options o;
    o.causal = c.causal;
    o.causal_offset = c.offset;
    o.window_left = c.left;
    o.window_right = c.right;
    const Problem p = make_problem(w.ov, nullptr, w.qv, w.kv, w.vv, o);
    for (std::int64_t t = 0; t < p.T; ++t) {
      const KeyRange r = p.visible_keys(t);
      for (std::int64_t j = 0; j < p.S; ++j) {
        const __int128 at = static_cast<__int128>(t) + c.offset;
        const std::int64_t right = c.causal ? 0 : c.right;
        const bool seen = (c.left < 0 || j >= at - c.left) && (right < 0 || j <= at + right);
        EXPECT_EQ(seen, j >= r.begin && j < r.end)
            << "offset " << c.offset << " window (" << c.left << ", " << c.right << ") t " << t << " j " << j;
      }
    }
  }
}

TEST(Problem, ShapeDisagreements) {
  Views w(1, 2, 3, 4, 5, 8), other(1, 2, 3, 4, 6, 16);
  Options o;
  expect_error(w, w.ov, w.qv, other.kv, w.vv, o, {"k", "H", "16", "expected 8"});
  expect_error(w, w.ov, w.qv, w.kv, other.vv, o, {"v", "shape"});
  expect_error(w, other.ov, w.qv, w.kv, w.vv, o, {"out", "shape"});
  TensorView k3 = w.kv;
  k3.rank = 3;
  expect_error(w, w.ov, w.qv, k3, w.vv, o, {"k", "rank 3", "expected 4"});
  Views longer(1, 2, 3, 5, 5, 8);
  TensorView bad_lse = longer.lv;
  expect_error(w, w.ov, w.qv, w.kv, w.vv, o, {"lse", "shape"}, &bad_lse);
  TensorView lse16 = w.lv;
  lse16.dtype = DType::bf16;
  expect_error(w, w.ov, w.qv, w.kv, w.vv, o, {"lse", "bfloat16", "float32"}, &lse16);
}

TEST(Problem, BadDimensionsStridesAndPointers) {
  Views w(1, 2, 3, 4, 5, 8), g0(1, 2, 0, 4, 5, 8);
  Options o;
  expect_error(g0, g0.ov, g0.qv, g0.kv, g0.vv, o, {"G = 0", "G >= 1"});
  TensorView q = w.qv;
  q.stride[4] = 2;
  expect_error(w, w.ov, q, w.kv, w.vv, o, {"q", "innermost stride 2", "expected 1"});
  TensorView k = w.kv;
  k.data = nullptr;
  expect_error(w, w.ov, w.qv, k, w.vv, o, {"k", "null"});
  TensorView big = w.qv;
  big.shape = {1, 2, 3, std::int64_t{1} << 62, 8};  // (2^62 - 1) · 8 overflows int64
  big.stride = {0, 0, 0, 8, 1};
  TensorView big_out = big;
  big_out.data = w.out.data();
  expect_error(w, big_out, big, w.kv, w.vv, o, {"overflows"});
  TensorView bad_dtype = w.qv;
  bad_dtype.dtype = static_cast<DType>(9);
  expect_error(w, w.ov, bad_dtype, w.kv, w.vv, o, {"q", "dtype", "9"});
}

TEST(Problem, OutMustNotOverlapInputs) {
  Views w(1, 2, 3, 4, 4, 8);
  Options o;
  TensorView out = w.ov;
  out.data = w.q.data();
  expect_error(w, out, w.qv, w.kv, w.vv, o, {"out", "overlaps q"});
  TensorView lse = w.lv;
  lse.data = w.out.data() + 3;
  expect_error(w, w.ov, w.qv, w.kv, w.vv, o, {"lse", "overlaps"}, &lse);
}

TEST(Problem, OutputElementsMustBeDistinct) {
  Views w(2, 2, 4, 3, 5, 8);
  Options o;
  TensorView out = w.ov;
  out.stride[0] = out.stride[1] = out.stride[2] = 0;  // every (b, k, g) writes the same rows
  expect_error(w, out, w.qv, w.kv, w.vv, o, {"out", "share memory"});
  out = w.ov;
  out.stride[3] = 4;  // rows of 8 elements 4 apart: overlapping halves
  expect_error(w, out, w.qv, w.kv, w.vv, o, {"out", "strides", "share memory"});
  TensorView lse = w.lv;
  lse.stride = {0, 0, 0, 0, 0};
  expect_error(w, w.ov, w.qv, w.kv, w.vv, o, {"lse", "share memory"}, &lse);
  // Inputs may be broadcast (stride 0): reading one address twice is fine.
  TensorView k = w.kv;
  k.stride[0] = 0;
  EXPECT_NO_THROW(make_problem(w.ov, nullptr, w.qv, k, w.vv, o));
  // Size-1 dimensions may have any stride.
  Views one(1, 1, 1, 3, 5, 8);
  TensorView out1 = one.ov;
  out1.stride[0] = out1.stride[1] = out1.stride[2] = 0;
  EXPECT_NO_THROW(make_problem(out1, nullptr, one.qv, one.kv, one.vv, o));
}

TEST(Problem, OptionsOutOfRange) {
  Views w(1, 1, 1, 4, 4, 8);
  Options o;
  o.scale = std::nan("");
  expect_error(w, w.ov, w.qv, w.kv, w.vv, o, {"scale", "finite"});
  o = {};
  o.threads = -1;
  expect_error(w, w.ov, w.qv, w.kv, w.vv, o, {"threads", "-1"});
  o = {};
  o.block_kv = -8;
  expect_error(w, w.ov, w.qv, w.kv, w.vv, o, {"block_kv", "-8"});
  o = {};
  o.algorithm = Algorithm::naive;
  o.block_kv = 64;
  expect_error(w, w.ov, w.qv, w.kv, w.vv, o, {"naive", "64", "expected 0"});
  o = {};
  o.algorithm = Algorithm::chunked;
  o.block_q = 16;
  expect_error(w, w.ov, w.qv, w.kv, w.vv, o, {"block_q", "chunked"});
  o = {};
  o.algorithm = static_cast<Algorithm>(42);
  expect_error(w, w.ov, w.qv, w.kv, w.vv, o, {"algorithm", "42"});
}

}  // namespace
}  // namespace flashgqa
