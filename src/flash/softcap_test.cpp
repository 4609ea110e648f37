// The logit softcap (Options::softcap: s -> c tanh(s / c)) against the float64 reference, whose bound
// counts the cap (reference/tolerance.hpp): the fast path on every instruction set (packed and decode),
// awkward shapes, strong and weak caps, causal offsets and sliding windows, bitwise identity across
// thread counts, every rung of the ladder, NaN and infinite logits, and the option's validation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "flash/flash_decode.hpp"
#include "flash/flash_packed.hpp"
#include "flash/flash_testing.hpp"
#include "kernels/microkernels.hpp"
#include "ladder/ladder.hpp"
#include "reference/reference.hpp"
#include "reference/tolerance.hpp"
#include "testing/attention_case.hpp"
#include "testing/isa_test.hpp"

namespace flashgqa {
namespace {

using testing::AttentionCase;
using testing::Layout;
using testing::make_case;
using testing::Shape;

class FlashSoftcap : public testing::IsaTest {};

// T != S both ways and not multiples of any block, T = 1, G = 1 and 8, H 17/64/128/256, B.K above
// the thread count.
const Shape kShapes[] = {
    {1, 2, 4, 37, 53, 64}, {2, 3, 1, 19, 70, 128}, {1, 1, 8, 5, 129, 128},
    {1, 1, 2, 33, 17, 256}, {3, 1, 2, 23, 23, 17}, {1, 1, 4, 70, 300, 96},
};

// Strongly capped (1: most logits near +-c with scale 1), Gemma's 50 (barely capped), in between.
const float kCaps[] = {1.0f, 5.0f, 50.0f};

TEST_P(FlashSoftcap, MatchesReferenceOnAwkwardShapes) {
  int seed = 0;
  for (const Shape& shape : kShapes)
    for (const float cap : kCaps)
      for (const bool causal : {false, true}) {
        ++seed;
        const DType dtype = seed % 2 ? DType::bf16 : DType::f32;
        AttentionCase c = make_case(shape, dtype, DType::f32, Layout::contiguous, seed);
        Options o;
        o.softcap = cap;
        o.causal = causal;
        o.scale = seed % 3 == 0 ? std::optional<double>{} : 1.0;  // logits ~ N(0, H) with scale 1
        o.precision = seed % 4 == 0 ? Precision::f32 : Precision::bf16;
        const ErrorReport r = testing::run_flash_and_check(c, o, isa());
        EXPECT_TRUE(r.ok) << testing::to_string(shape) << " cap " << cap << (causal ? " causal: " : ": ")
                          << r.describe();
      }
}

// Decode-sized problems (G T <= 8) take the decode path on sets with decode kernels, with KV splits.
TEST_P(FlashSoftcap, DecodeMatchesReference) {
  int seed = 100;
  for (const Shape& shape : {Shape{1, 2, 4, 1, 1000, 128}, Shape{2, 1, 8, 1, 37, 64}, Shape{1, 3, 1, 2, 4099, 80}})
    for (const float cap : kCaps) {
      AttentionCase c = make_case(shape, DType::bf16, DType::bf16, Layout::contiguous, ++seed);
      Options o;
      o.softcap = cap;
      o.scale = 1.0;
      o.causal = seed % 2 == 0;
      const ErrorReport r = testing::run_flash_and_check(c, o, isa());
      EXPECT_TRUE(r.ok) << testing::to_string(shape) << " cap " << cap << ": " << r.describe();
    }
}

TEST_P(FlashSoftcap, WindowsMatchReference) {
  int seed = 200;
  for (const Shape& shape : {Shape{1, 2, 4, 37, 53, 64}, Shape{1, 1, 2, 2, 300, 128}})
    for (const testing::WindowCase& w : testing::kWindowCases) {
      AttentionCase c = make_case(shape, DType::bf16, DType::f32, Layout::contiguous, ++seed);
      Options o;
      o.softcap = 2.5;
      o.scale = 1.0;
      o.block_q = 16;
      o.block_kv = 32;
      const ErrorReport r = testing::run_flash_window_and_check(c, o, w, isa());
      EXPECT_TRUE(r.ok) << testing::to_string(shape) << " " << testing::to_string(w) << ": " << r.describe();
    }
}

TEST_P(FlashSoftcap, SameBitsForOneAndTwoThreads) {
  for (const Shape& shape :
       {Shape{1, 1, 4, 300, 700, 128}, Shape{1, 1, 4, 1, 5000, 128}, Shape{3, 1, 2, 40, 90, 64}}) {
    Options o;
    o.softcap = 3.0;
    o.scale = 1.0;
    o.causal = true;
    o.threads = 1;
    const std::vector<float> one = testing::run_flash_values(shape, o, isa());
    o.threads = 2;
    const std::vector<float> two = testing::run_flash_values(shape, o, isa());
    EXPECT_TRUE(testing::bitwise_equal(one, two)) << testing::to_string(shape);
  }
}

// A NaN logit stays NaN and reaches its row; an infinite logit is capped to +-c like any other, so its
// row stays finite (the reference caps tanh(+-inf) = +-1 as well).
TEST_P(FlashSoftcap, NaNAndInfiniteLogits) {
  const Shape shape{1, 1, 2, 9, 40, 64};
  AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 300);
  c.set_q(0, 0, 0, 3, 5, std::numeric_limits<float>::quiet_NaN());  // row (g 0, t 3): NaN logits
  c.set_k(0, 0, 11, 7, std::numeric_limits<float>::infinity());     // key 11: +-inf logits elsewhere
  Options o;
  o.softcap = 4.0;
  const Problem p = testing::flash_problem(c, o);
  flash_attention(p, isa());
  for (std::int64_t g = 0; g < shape.G; ++g)
    for (std::int64_t t = 0; t < shape.T; ++t)
      for (std::int64_t h = 0; h < shape.H; ++h) {
        const float x = c.out_at(0, 0, g, t, h);
        if (g == 0 && t == 3)
          EXPECT_TRUE(std::isnan(x)) << "t " << t << " h " << h;
        else
          EXPECT_TRUE(std::isfinite(x)) << "g " << g << " t " << t << " h " << h;
      }
  const ReferenceResult ref = reference_attention(p);
  for (std::int64_t g = 0; g < shape.G; ++g)
    for (std::int64_t t = 0; t < shape.T; ++t) {
      if (g == 0 && t == 3) continue;
      const double l = ref.lse[static_cast<std::size_t>(ref.row(0, 0, g, t))];
      EXPECT_NEAR(c.lse_at(0, 0, g, t), l, 1e-5 * (std::fabs(l) + 1)) << "g " << g << " t " << t;
    }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, FlashSoftcap, ::testing::ValuesIn(testing::kAllIsas), testing::isa_test_name);

// Every rung caps through qk_logits: each matches the reference, causal or not, with small blocks.
TEST(SoftcapLadder, EveryRungMatchesReference) {
  int seed = 400;
  for (const auto& [algorithm, algorithm_name] : kAlgorithmNames)
    for (const Shape& shape : {Shape{1, 2, 4, 37, 53, 64}, Shape{2, 1, 1, 19, 70, 128}})
      for (const bool causal : {false, true}) {
        AttentionCase c = make_case(shape, DType::bf16, DType::f32, Layout::contiguous, ++seed);
        Options o;
        o.algorithm = algorithm;
        o.softcap = 2.0;
        o.scale = 1.0;
        o.causal = causal;
        o.block_kv = algorithm == Algorithm::naive ? 0 : 16;
        o.block_q = algorithm == Algorithm::kernel1 || algorithm == Algorithm::flash ? 8 : 0;
        attention(c.out, c.lse, c.q, c.k, c.v, o);
        const Problem p = make_problem(c.out, &c.lse, c.q, c.k, c.v, o);
        const ErrorReport r = check_against_reference(p, reference_attention(p), key_sums(p, algorithm));
        EXPECT_TRUE(r.ok) << algorithm_name << " " << testing::to_string(shape) << (causal ? " causal: " : ": ")
                          << r.describe();
      }
}

// The capped logits differ from the plain ones: a strong cap moves the output (the option is not
// silently ignored), and the bound of the capped reference is what the fast path meets.
TEST(SoftcapOption, ChangesTheResult) {
  const Shape shape{1, 1, 2, 16, 64, 64};
  AttentionCase plain = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 500);
  AttentionCase capped = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 500);
  Options o;
  o.scale = 1.0;
  attention(plain.out, plain.q, plain.k, plain.v, o);
  o.softcap = 1.0;
  attention(capped.out, capped.q, capped.k, capped.v, o);
  EXPECT_FALSE(testing::bitwise_equal(plain.out_values(), capped.out_values()));
}

TEST(SoftcapOption, BadValuesAreErrors) {
  const Shape shape{1, 1, 1, 2, 3, 8};
  AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 600);
  for (const double bad : {-1.0, -0.0 - 1e-300, std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity(), 1e39, 1e-40, 0x1p127}) {
    Options o;
    o.softcap = bad;
    try {
      attention(c.out, c.q, c.k, c.v, o);
      ADD_FAILURE() << "softcap " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("softcap"), std::string::npos) << e.what();
    }
  }
  Options o;
  o.softcap = 30.0;
  EXPECT_THROW(linear_attention(c.out, c.q, c.k, c.v, o), Error);
  EXPECT_NO_THROW(attention(c.out, c.q, c.k, c.v, o));
  o.softcap = 0x1p126;  // the largest cap whose reciprocal is a normal float
  EXPECT_NO_THROW(attention(c.out, c.q, c.k, c.v, o));
  // Sinks, too, need a softmax: linear attention refuses them rather than ignoring them.
  const float sinks[1] = {5.0f};
  Options with_sinks;
  with_sinks.sinks = sinks;
  EXPECT_THROW(linear_attention(c.out, c.q, c.k, c.v, with_sinks), Error);
}

}  // namespace
}  // namespace flashgqa
