// The backward pass on every instruction set this machine supports, against the float64 reference
// and its derived bounds (reference/reference_backward.hpp, tolerance_backward.hpp): awkward shapes
// (T != S, H = 17 to 256, G = 1 and 8), both precisions and every dtype, causal offsets and windows,
// blocks that divide nothing, the FlashAttention and padded layouts for every tensor, bit identity
// across thread counts, the logit softcap, and the edge cases (rows that see no key, T = 0, S = 0).
#include "backward/flash_backward.hpp"

#include <gtest/gtest.h>

#include <cstring>

#include <cmath>
#include <optional>
#include <vector>

#include "core/dtype.hpp"
#include "flash/flash_packed.hpp"
#include "kernels/cpu_features.hpp"
#include "reference/reference_backward.hpp"
#include "reference/tolerance_backward.hpp"
#include "testing/attention_case.hpp"
#include "testing/isa_test.hpp"

namespace flashgqa {
namespace {

using testing::AttentionCase;
using testing::Layout;
using testing::make_case;
using testing::Shape;

// The forward's inputs and outputs, and a second case whose q is dout, whose out is dq and whose k
// and v are dk and dv (same layout; out is NaN-filled, so an element left unwritten is caught).
struct BackwardCase {
  AttentionCase fwd, grads;
  BackwardCase(const Shape& shape, DType dtype, Layout layout, std::uint64_t seed)
      : fwd(make_case(shape, dtype, dtype, layout, seed)), grads(make_case(shape, dtype, dtype, layout, seed + 7919)) {}
  BackwardProblem problem(const Options& o) {
    return make_backward_problem(grads.out, grads.k, grads.v, grads.q, fwd.q, fwd.k, fwd.v, fwd.out, fwd.lse, o);
  }
};

// dq, dk, dv in logical order, as float.
std::vector<float> gradient_values(const BackwardProblem& p) {
  std::vector<float> x;
  const Problem& f = p.fwd;
  for (std::int64_t b = 0; b < f.B; ++b)
    for (std::int64_t kh = 0; kh < f.K; ++kh) {
      for (std::int64_t g = 0; g < f.G; ++g)
        for (std::int64_t t = 0; t < f.T; ++t)
          for (std::int64_t h = 0; h < f.H; ++h) x.push_back(load_element(p.dq_row(b, kh, g, t), p.dq_dtype, h));
      for (std::int64_t s = 0; s < f.S; ++s)
        for (std::int64_t h = 0; h < f.H; ++h) {
          x.push_back(load_element(p.dk_row(b, kh, s), p.dk_dtype, h));
          x.push_back(load_element(p.dv_row(b, kh, s), p.dv_dtype, h));
        }
    }
  return x;
}

// The forward (flash on `isa`), then the backward; checked against the reference. `values` gets the
// gradients.
ErrorReport run_and_check(BackwardCase& c, const Options& o, Isa isa, std::vector<float>* values = nullptr) {
  Options f = o;
  f.algorithm = Algorithm::flash;
  flash_attention(make_problem(c.fwd.out, &c.fwd.lse, c.fwd.q, c.fwd.k, c.fwd.v, f), isa);
  const BackwardProblem bp = c.problem(o);
  flash_backward(bp, isa);
  if (values) *values = gradient_values(bp);
  return check_backward_against_reference(bp, reference_attention_backward(bp));
}

class FlashBackward : public testing::IsaTest {};

const Shape kShapes[] = {
    {1, 1, 1, 1, 1, 64},    {1, 2, 4, 37, 53, 64},  {2, 3, 1, 19, 70, 80}, {1, 1, 8, 5, 129, 128},
    {1, 1, 2, 33, 17, 256}, {1, 2, 3, 1, 41, 40},   {3, 1, 2, 23, 23, 17}, {1, 1, 4, 70, 300, 128},
};

TEST_P(FlashBackward, MatchesReferenceOnAwkwardShapes) {
  int seed = 0;
  for (const Shape& shape : kShapes)
    for (Precision precision : {Precision::bf16, Precision::f32})
      for (DType dtype : {DType::bf16, DType::f32, DType::f16}) {
        BackwardCase c(shape, dtype, Layout::contiguous, ++seed);
        Options o;
        o.precision = precision;
        const ErrorReport r = run_and_check(c, o, isa());
        EXPECT_TRUE(r.ok) << testing::to_string(shape) << " " << precision_name(precision) << " "
                          << dtype_name(dtype) << ": " << r.describe();
      }
}

// Subnormal inputs (~1e-40, and normal ones with subnormal entries): the avx512bf16 kernels flush them
// (vdpbf16ps, vcvtne2ps2bf16); the bounds' underflow terms (tolerance_backward.hpp) allow that.
TEST_P(FlashBackward, SubnormalInputsPass) {
  int seed = 900;
  for (const Shape& shape : {Shape{1, 2, 3, 29, 45, 64}, Shape{1, 1, 2, 1, 70, 80}})
    for (Precision precision : {Precision::bf16, Precision::f32})
      for (bool mixed : {false, true}) {
        BackwardCase c(shape, DType::f32, Layout::contiguous, ++seed);
        for (AttentionCase* a : {&c.fwd, &c.grads}) {
          AttentionCase tiny = make_case(shape, DType::f32, DType::f32, Layout::contiguous, ++seed, 1e-40f);
          for (std::int64_t s = 0; s < shape.S; ++s)
            for (std::int64_t h = 0; h < shape.H; ++h)
              if (!mixed || (s + h) % 3 == 0) {
                const auto i = static_cast<std::size_t>((s * shape.H + h) * 4);
                float x;
                std::memcpy(&x, tiny.k_buf.data() + i, 4);  // contiguous f32 [1, K, S, H], head 0
                a->set_k(0, 0, s, h, x);
                std::memcpy(&x, tiny.v_buf.data() + i, 4);
                a->set_v(0, 0, s, h, x);
                if (s < shape.T) a->set_q(0, 0, 0, s, h, x);
              }
        }
        Options o;
        o.precision = precision;
        const ErrorReport r = run_and_check(c, o, isa());
        EXPECT_TRUE(r.ok) << testing::to_string(shape) << " " << precision_name(precision)
                          << (mixed ? " mixed: " : ": ") << r.describe();
      }
}

TEST_P(FlashBackward, CausalOffsetsAndBlocksThatDivideNothing) {
  int seed = 100;
  for (const Shape& shape : {Shape{1, 2, 4, 37, 53, 64}, Shape{2, 1, 1, 70, 24, 80}, Shape{1, 1, 3, 100, 100, 128}})
    for (std::optional<std::int64_t> offset :
         {std::optional<std::int64_t>{}, std::optional<std::int64_t>{0}, std::optional<std::int64_t>{-3},
          std::optional<std::int64_t>{-40}, std::optional<std::int64_t>{7}, std::optional<std::int64_t>{-1000},
          std::optional<std::int64_t>{1000}})
      for (const auto& [bq, bkv] : {std::pair<std::int64_t, std::int64_t>{7, 13}, {0, 0}, {40, 45}}) {
        BackwardCase c(shape, DType::bf16, Layout::contiguous, ++seed);
        Options o;
        o.causal = true;
        o.causal_offset = offset;
        o.block_q = bq;
        o.block_kv = bkv;
        const ErrorReport r = run_and_check(c, o, isa());
        EXPECT_TRUE(r.ok) << testing::to_string(shape) << " offset " << (offset ? std::to_string(*offset) : "default")
                          << " blocks " << bq << "/" << bkv << ": " << r.describe();
      }
}

TEST_P(FlashBackward, WindowsMatchReference) {
  int seed = 200;
  struct Window {
    std::int64_t left, right;
    bool causal;
  };
  for (const Window& w : {Window{5, 3, false}, Window{0, 0, false}, Window{40, -1, false}, Window{17, -1, true}}) {
    BackwardCase c(Shape{1, 2, 2, 45, 90, 64}, DType::bf16, Layout::contiguous, ++seed);
    Options o;
    o.causal = w.causal;
    o.block_kv = 32;
    o.window_left = w.left;
    o.window_right = w.right;
    const ErrorReport r = run_and_check(c, o, isa());
    EXPECT_TRUE(r.ok) << "window (" << w.left << ", " << w.right << ")" << (w.causal ? " causal" : "") << ": "
                      << r.describe();
  }
}

// The FlashAttention and padded layouts (every tensor, gradients included) give the contiguous bits;
// 1 and 2 threads too.
TEST_P(FlashBackward, LayoutsAndThreadCountsKeepTheBits) {
  const Shape shape{2, 2, 3, 41, 77, 64};
  for (bool causal : {false, true}) {
    Options o;
    o.causal = causal;
    o.block_kv = 32;
    std::vector<float> base;
    for (Layout layout : {Layout::contiguous, Layout::fa, Layout::padded})
      for (int threads : {1, 2}) {
        o.threads = threads;
        BackwardCase c(shape, DType::bf16, layout, 5);
        std::vector<float> values;
        const ErrorReport r = run_and_check(c, o, isa(), &values);
        EXPECT_TRUE(r.ok) << r.describe();
        if (base.empty())
          base = values;
        else
          EXPECT_TRUE(testing::bitwise_equal(base, values)) << "layout " << static_cast<int>(layout) << " threads "
                                                            << threads << (causal ? " causal" : "");
      }
  }
}

// Rows that see no key get zero dq; keys no row sees get zero dk, dv; T = 0 and S = 0 write zeros.
TEST_P(FlashBackward, EdgeCasesGiveZeros) {
  {
    BackwardCase c(Shape{1, 1, 2, 6, 9, 64}, DType::f32, Layout::contiguous, 9);
    Options o;
    o.causal = true;
    o.causal_offset = -3;  // queries 0..2 see no key; keys 6..8 are seen by no query
    EXPECT_TRUE(run_and_check(c, o, isa()).ok);
    const BackwardProblem p = c.problem(o);
    for (std::int64_t g = 0; g < 2; ++g)
      for (std::int64_t t = 0; t < 3; ++t)
        for (std::int64_t h = 0; h < 64; ++h) EXPECT_EQ(load_element(p.dq_row(0, 0, g, t), p.dq_dtype, h), 0.0f);
    for (std::int64_t s = 6; s < 9; ++s)
      for (std::int64_t h = 0; h < 64; ++h) {
        EXPECT_EQ(load_element(p.dk_row(0, 0, s), p.dk_dtype, h), 0.0f);
        EXPECT_EQ(load_element(p.dv_row(0, 0, s), p.dv_dtype, h), 0.0f);
      }
  }
  for (const Shape& shape : {Shape{1, 2, 2, 0, 5, 32}, Shape{1, 2, 2, 4, 0, 32}}) {
    BackwardCase c(shape, DType::f32, Layout::contiguous, 11);
    const ErrorReport r = run_and_check(c, Options{}, isa());
    EXPECT_TRUE(r.ok) << testing::to_string(shape) << ": " << r.describe();
    for (float x : gradient_values(c.problem(Options{}))) EXPECT_EQ(x, 0.0f) << testing::to_string(shape);
  }
}

// The logit softcap: P from the capped logits, dS times the cap's slope 1 - tanh^2; strong and weak
// caps, causal or not, windows, both precisions, and the same bits on 1 and 2 threads.
TEST_P(FlashBackward, SoftcapMatchesReferenceAndKeepsTheBits) {
  int seed = 700;
  for (const Shape& shape : {Shape{1, 2, 4, 37, 53, 64}, Shape{2, 1, 1, 19, 70, 128}, Shape{1, 1, 8, 5, 129, 256},
                             Shape{1, 1, 2, 70, 300, 80}})
    for (const float cap : {1.0f, 5.0f, 50.0f}) {
      ++seed;
      BackwardCase c(shape, seed % 2 ? DType::bf16 : DType::f32, Layout::contiguous, seed);
      Options o;
      o.softcap = cap;
      o.scale = 1.0;  // logits ~ N(0, H): the cap bites
      o.causal = seed % 3 != 0;
      o.precision = seed % 4 == 0 ? Precision::f32 : Precision::bf16;
      o.window_left = seed % 5 == 0 ? 9 : -1;
      o.threads = 1;
      std::vector<float> one, two;
      const ErrorReport r = run_and_check(c, o, isa(), &one);
      EXPECT_TRUE(r.ok) << testing::to_string(shape) << " cap " << cap << ": " << r.describe();
      o.threads = 2;
      run_and_check(c, o, isa(), &two);
      EXPECT_TRUE(testing::bitwise_equal(one, two)) << testing::to_string(shape) << " cap " << cap;
    }
}

// Blocks whose tiles would need more than the workspace limit are refused with Error, not allocated.
TEST(FlashBackwardBlocks, HugeBlocksAreRefused) {
  BackwardCase c(Shape{1, 1, 1, 65536, 65536, 1}, DType::f32, Layout::contiguous, 13);
  Options o;
  o.block_q = 65536;
  o.block_kv = 65536;
  EXPECT_THROW(attention_backward(c.grads.out, c.grads.k, c.grads.v, c.grads.q, c.fwd.q, c.fwd.k, c.fwd.v, c.fwd.out,
                                  c.fwd.lse, o),
               Error);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, FlashBackward, ::testing::ValuesIn(testing::kAllIsas), testing::isa_test_name);

}  // namespace
}  // namespace flashgqa
