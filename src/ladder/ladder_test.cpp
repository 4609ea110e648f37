// Every rung of the ladder against the float64 reference (tolerances from reference/tolerance.hpp,
// derived from the dtypes' roundoff and the reduction depths), on awkward shapes, both precisions,
// causal offsets, strided layouts; plus the edge cases the API defines.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/problem.hpp"
#include "kernels/cpu_features.hpp"
#include "ladder/ladder.hpp"
#include "reference/reference.hpp"
#include "reference/tolerance.hpp"
#include "testing/attention_case.hpp"
#include "testing/masked_rows.hpp"

namespace flashgqa {
namespace {

using testing::AttentionCase;
using testing::Layout;
using testing::make_case;
using testing::Shape;
using testing::bitwise_equal;

// Runs `o` on the case and compares out and lse with the reference, bounded with the algorithm's own
// sums over keys (key_sums).
ErrorReport run_and_check(AttentionCase& c, const Options& o) {
  attention(c.out, c.lse, c.q, c.k, c.v, o);
  const Problem p = make_problem(c.out, &c.lse, c.q, c.k, c.v, o);
  return check_against_reference(p, reference_attention(p), key_sums(p, o.algorithm));
}

class Ladder : public ::testing::TestWithParam<Algorithm> {
 protected:
  Options options() const {
    Options o;
    o.algorithm = GetParam();
    return o;
  }
  bool takes_block_q() const { return GetParam() == Algorithm::kernel1 || GetParam() == Algorithm::flash; }
  bool takes_block_kv() const { return GetParam() != Algorithm::naive; }
};

// Shapes: T, S not multiples of any block; T != S both ways; T = 1; G = 1 and 8; H 64/80/128/256;
// B·K from 1 to 6 (the machine has 2 threads).
const Shape kShapes[] = {
    {1, 1, 1, 1, 1, 64},   {1, 2, 4, 37, 53, 64},  {2, 3, 1, 19, 70, 80}, {1, 1, 8, 5, 129, 128},
    {1, 1, 2, 33, 17, 256}, {1, 2, 3, 1, 41, 128}, {3, 1, 2, 23, 23, 64},
};

TEST_P(Ladder, MatchesReferenceOnAwkwardShapes) {
  int seed = 0;
  for (const Shape& shape : kShapes)
    for (Precision precision : {Precision::bf16, Precision::f32})
      for (DType dtype : {DType::bf16, DType::f32, DType::f16}) {
        AttentionCase c = make_case(shape, dtype, dtype, Layout::contiguous, ++seed);
        Options o = options();
        o.precision = precision;
        const ErrorReport r = run_and_check(c, o);
        EXPECT_TRUE(r.ok) << testing::to_string(shape) << " " << precision_name(precision) << " "
                          << dtype_name(dtype) << ": " << r.describe();
      }
}

// The rungs' matmuls and exps run on the active instruction set's micro-kernels: check every path
// this machine supports (CI sets no FLASHGQA_ISA).
TEST_P(Ladder, MatchesReferenceOnEveryInstructionSet) {
  const Isa saved = active_isa();
  int seed = 50;
  for (Isa isa : supported_isas()) {
    set_isa(isa);
    for (const Shape& shape : {Shape{1, 2, 3, 29, 45, 80}, Shape{2, 1, 2, 17, 70, 64}})
      for (Precision precision : {Precision::bf16, Precision::f32}) {
        Options o = options();
        o.precision = precision;
        o.causal = shape.B == 2;
        AttentionCase c = make_case(shape, DType::bf16, DType::f32, Layout::padded, ++seed);
        const ErrorReport r = run_and_check(c, o);
        EXPECT_TRUE(r.ok) << isa_name(isa) << " " << testing::to_string(shape) << " "
                          << precision_name(precision) << ": " << r.describe();
      }
  }
  set_isa(saved);
}

TEST_P(Ladder, MatchesReferenceWithSmallBlocksAndRemainders) {
  const Shape shape{1, 2, 3, 29, 45, 64};
  int seed = 100;
  for (std::int64_t bq : {1, 7, 16})
    for (std::int64_t bkv : {1, 8, 13, 64}) {
      Options o = options();
      o.block_q = takes_block_q() ? bq : 0;
      o.block_kv = takes_block_kv() ? bkv : 0;
      AttentionCase c = make_case(shape, DType::bf16, DType::bf16, Layout::contiguous, ++seed);
      const ErrorReport r = run_and_check(c, o);
      EXPECT_TRUE(r.ok) << "block_q " << o.block_q << " block_kv " << o.block_kv << ": " << r.describe();
    }
}

// Blocks longer than T or S are clamped to them: same result, no memory for the unused length.
TEST_P(Ladder, BlocksLongerThanTheSequenceAreClamped) {
  constexpr std::int64_t kHuge = std::int64_t{1} << 24;  // the largest block validation accepts
  for (const Shape& shape : {Shape{1, 1, 1, 1, 1, 64}, Shape{1, 2, 8, 1, 40, 64}, Shape{1, 1, 2, 9, 13, 80}}) {
    Options o = options();
    o.block_q = takes_block_q() ? kHuge : 0;
    o.block_kv = takes_block_kv() ? kHuge : 0;
    AttentionCase c = make_case(shape, DType::bf16, DType::bf16, Layout::contiguous, 77);
    const ErrorReport r = run_and_check(c, o);
    EXPECT_TRUE(r.ok) << testing::to_string(shape) << ": " << r.describe();
  }
}

TEST_P(Ladder, CausalAtSeveralOffsets) {
  int seed = 200;
  for (const Shape& shape : {Shape{1, 2, 4, 37, 53, 64}, Shape{2, 1, 1, 40, 24, 80}, Shape{1, 1, 2, 1, 33, 128}})
    for (std::optional<std::int64_t> offset :
         {std::optional<std::int64_t>{}, std::optional<std::int64_t>{0}, std::optional<std::int64_t>{-3},
          std::optional<std::int64_t>{7}, std::optional<std::int64_t>{-1000}, std::optional<std::int64_t>{1000}})
      for (Precision precision : {Precision::bf16, Precision::f32}) {
        Options o = options();
        o.causal = true;
        o.causal_offset = offset;
        o.precision = precision;
        o.block_q = takes_block_q() ? 8 : 0;
        o.block_kv = takes_block_kv() ? 16 : 0;
        AttentionCase c = make_case(shape, DType::f32, DType::bf16, Layout::contiguous, ++seed);
        const ErrorReport r = run_and_check(c, o);
        EXPECT_TRUE(r.ok) << testing::to_string(shape) << " offset "
                          << (offset ? std::to_string(*offset) : "default") << ": " << r.describe();
      }
}

// Sliding windows (Options::window_left/right): every rung masks both sides of each query's key range.
TEST_P(Ladder, WindowsMatchReference) {
  int seed = 600;
  struct Window {
    std::int64_t left, right;
    bool causal;
  };
  for (const Shape& shape : {Shape{1, 2, 4, 37, 53, 64}, Shape{2, 1, 1, 40, 90, 80}})
    for (const Window& w : {Window{5, 3, false}, Window{0, 0, false}, Window{40, -1, false}, Window{-1, 7, false},
                            Window{17, -1, true}, Window{1000, 2, false}}) {
      Options o = options();
      o.causal = w.causal;
      o.block_q = takes_block_q() ? 8 : 0;
      o.block_kv = takes_block_kv() ? 16 : 0;
      o.window_left = w.left;
      o.window_right = w.right;
      AttentionCase c = make_case(shape, DType::f32, DType::bf16, Layout::contiguous, ++seed);
      const ErrorReport r = run_and_check(c, o);
      EXPECT_TRUE(r.ok) << testing::to_string(shape) << " window (" << w.left << ", " << w.right << ")"
                        << (w.causal ? " causal: " : ": ") << r.describe();
    }
}

// Subnormal inputs (~1e-40): the avx512bf16 kernels flush them to zero (vdpbf16ps, vcvtne2ps2bf16) and
// return 0 where the others keep ~1e-40; the bound's underflow terms (tolerance.hpp) allow exactly that,
// on every instruction set. Also a mix: normal rows with subnormal q, k and v entries among them.
TEST_P(Ladder, SubnormalInputsPassOnEveryInstructionSet) {
  const Isa saved = active_isa();
  int seed = 700;
  for (Isa isa : supported_isas()) {
    set_isa(isa);
    for (const Shape& shape : {Shape{1, 2, 3, 29, 45, 64}, Shape{1, 2, 2, 1, 70, 80}})
      for (Precision precision : {Precision::bf16, Precision::f32})
        for (bool mixed : {false, true}) {
          Options o = options();
          o.precision = precision;
          AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, ++seed,
                                      mixed ? 1.0f : 1e-40f);
          if (mixed)
            for (std::int64_t s = 0; s < shape.S; s += 2)
              for (std::int64_t h = 0; h < shape.H; h += 3) {
                c.set_k(0, 0, s, h, 3e-39f);
                c.set_v(0, 1, s, h, -5e-40f);
                if (s < shape.T) c.set_q(0, 1, 1, s, h, 1e-39f);
              }
          const ErrorReport r = run_and_check(c, o);
          EXPECT_TRUE(r.ok) << isa_name(isa) << " " << testing::to_string(shape) << " "
                            << precision_name(precision) << (mixed ? " mixed: " : ": ") << r.describe();
        }
  }
  set_isa(saved);
}

// Long sums: S = 2^18 identical keys (zero: every logit 0, so every weight is exp(0) = 1 in every rung,
// chunked-unstable's too) and out is the mean of v (~0.7, all positive); a sequential fp32 sum of 2^18
// such terms drifts by ~1%. (Identical nonzero logits would give chunked-unstable 2^18 weights exp(l)
// with one and the same bf16 rounding, which the mean bound's independence assumption does not cover.) The rungs sum in chains
// (rung_kernels.hpp) and flash splits its keys (kv_splits.hpp), and the bound from their depths
// (key_sums) must pass every rung, stay below 1% of |out| (a bound that means something), and
// reject an error of 3%.
TEST_P(Ladder, LongSumsPassABoundThatMeansSomething) {
  const Shape shape{1, 1, 2, 2, std::int64_t{1} << 18, 32};
  for (Precision precision : {Precision::bf16, Precision::f32}) {
    AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 31, 0.1f);
    for (std::int64_t s = 0; s < shape.S; ++s)
      for (std::int64_t h = 0; h < shape.H; ++h) {
        c.set_k(0, 0, s, h, 0.0f);  // every key the same
        c.set_v(0, 0, s, h, 0.7f + 0.05f * static_cast<float>((s * 7 + h) % 11) / 11.0f);
      }
    Options o = options();
    o.precision = precision;
    attention(c.out, c.lse, c.q, c.k, c.v, o);
    const Problem p = make_problem(c.out, &c.lse, c.q, c.k, c.v, o);
    const ReferenceResult ref = reference_attention(p);
    const KeySums sums = key_sums(p, GetParam());
    const ErrorReport r = check_against_reference(p, ref, sums);
    EXPECT_TRUE(r.ok) << precision_name(precision) << " depth " << sums.depth << ": " << r.describe();
    const Underflow z = forward_underflow(p, ref.max_abs_q, ref.max_abs_k, ref.max_abs_v);
    for (std::size_t i = 0; i < ref.out.size(); ++i) {
      const double a = ref.abs_logit[i / static_cast<std::size_t>(shape.H)];
      const double bound = forward_out_error(p, sums, a, p.sink(0, 0), ref.abs_pv[i], ref.out[i], z);
      ASSERT_LT(bound, 0.01 * std::fabs(ref.out[i])) << precision_name(precision) << " element " << i;
    }
    EXPECT_LT(r.mean_bound, 0.01 * 0.7);
    float* out = static_cast<float*>(c.out.data);
    out[3] *= 1.03f;  // a plausible bug: 3% off in one element
    EXPECT_FALSE(check_against_reference(p, ref, sums).ok) << precision_name(precision);
  }
}

// A thread count far beyond the machine is capped, not passed to OpenMP (10^6 crashed naive, chunked
// and linear attention inside the runtime, and kernel1 allocated a workspace per requested thread).
TEST_P(Ladder, HugeThreadCountsAreCapped) {
  for (int threads : {1'000'000, 2'147'483'647}) {
    Options o = options();
    o.threads = threads;
    AttentionCase c = make_case(Shape{1, 1, 1, 4, 8, 8}, DType::f32, DType::f32, Layout::contiguous, 5);
    const ErrorReport r = run_and_check(c, o);
    EXPECT_TRUE(r.ok) << "threads " << threads << ": " << r.describe();
#ifdef _OPENMP
    EXPECT_LE(make_problem(c.out, &c.lse, c.q, c.k, c.v, o).threads,
              std::max(omp_get_num_procs(), omp_get_max_threads()));
#endif
    AttentionCase lin = make_case(Shape{1, 1, 1, 4, 8, 8}, DType::f32, DType::f32, Layout::contiguous, 6);
    o.block_q = 0;
    linear_attention(lin.out, lin.q, lin.k, lin.v, o);
  }
}

// A problem whose workspace cannot fit in this machine's memory is refused with a clear Error before
// anything is allocated: T = S = 2^22 (read through stride-0 views, so the inputs take no memory) makes
// naive's logits 2^44 floats, and as many the chunked rungs' chunk of every row with block_kv 2^22 and
// kernel1's tile with block_q = block_kv = 2^22.
// flash runs it (its workspace does not grow with T or S) only in the timed benchmarks: here it is
// enough that it does not refuse a smaller one of the same kind.
TEST_P(Ladder, WorkspacesLargerThanMemoryAreRefusedBeforeAllocating) {
  constexpr std::int64_t kLong = std::int64_t{1} << 22;
  std::vector<float> q(8, 0.5f), k(8, 0.25f), out(static_cast<std::size_t>(kLong));
  TensorView qv = contiguous_view(q.data(), DType::f32, {1, 1, 1, kLong, 1});
  TensorView kv = contiguous_view(k.data(), DType::f32, {1, 1, kLong, 1});
  qv.stride[3] = 0;  // every query row is q[0]
  kv.stride[2] = 0;  // every key is k[0]
  const TensorView ov = contiguous_view(out.data(), DType::f32, {1, 1, 1, kLong, 1});
  Options o = options();
  o.block_kv = takes_block_kv() ? kLong : 0;
  o.block_q = takes_block_q() ? kLong : 0;  // kernel1's tiles of block_q x block_kv logits
  if (GetParam() == Algorithm::flash) {
    EXPECT_EQ(rung_workspace_bytes(make_problem(ov, nullptr, qv, kv, kv, o), GetParam()), 0.0);
    return;
  }
  try {
    attention(ov, qv, kv, kv, o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(std::string("algorithm ") + algorithm_name(GetParam()) + " needs"), std::string::npos) << what;
    EXPECT_NE(what.find("GiB of workspace, more than this machine's"), std::string::npos) << what;
    EXPECT_NE(what.find("expected a smaller"), std::string::npos) << what;
  }
  if (GetParam() == Algorithm::chunked) {
    o.block_q = 0;
    EXPECT_THROW(linear_attention(ov, qv, kv, kv, o), Error);
  }
}

TEST_P(Ladder, StridedLayoutsGiveTheContiguousResult) {
  const Shape shape{2, 2, 3, 21, 34, 64};
  Options o = options();
  o.causal = true;
  AttentionCase base = make_case(shape, DType::bf16, DType::f32, Layout::contiguous, 7);
  attention(base.out, base.q, base.k, base.v, o);
  for (Layout layout : {Layout::fa, Layout::padded}) {
    AttentionCase c = make_case(shape, DType::bf16, DType::f32, layout, 7);
    attention(c.out, c.q, c.k, c.v, o);
    EXPECT_TRUE(bitwise_equal(base.out_values(), c.out_values())) << "layout " << static_cast<int>(layout);
  }
}

TEST_P(Ladder, SameBitsForOneAndTwoThreads) {
  const Shape shape{1, 3, 2, 45, 77, 64};
  std::vector<float> results[2];
  for (int threads : {1, 2}) {
    Options o = options();
    o.threads = threads;
    o.causal = true;
    AttentionCase c = make_case(shape, DType::bf16, DType::bf16, Layout::contiguous, 11);
    attention(c.out, c.lse, c.q, c.k, c.v, o);
    results[threads - 1] = c.out_and_lse_values();
  }
  EXPECT_TRUE(bitwise_equal(results[0], results[1]));
}

TEST_P(Ladder, FullyMaskedRowsGiveZeroAndMinusInfinity) {
  const Shape shape{1, 1, 2, 9, 12, 64};
  AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 5);
  Options o = options();
  o.causal = true;
  o.causal_offset = -4;  // queries 0..3 see no key
  attention(c.out, c.lse, c.q, c.k, c.v, o);
  testing::expect_first_rows_masked(c, 4);
}

TEST_P(Ladder, NanInInputsReachesTheOutput) {
  const Shape shape{1, 1, 2, 6, 10, 64};
  Options o = options();
  o.causal = true;
  o.causal_offset = 0;  // query t sees keys 0..t
  {
    AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 3);
    c.set_q(0, 0, 1, 2, 5, std::numeric_limits<float>::quiet_NaN());
    attention(c.out, c.q, c.k, c.v, o);
    for (std::int64_t g = 0; g < 2; ++g)
      for (std::int64_t t = 0; t < 6; ++t)
        EXPECT_EQ(std::isnan(c.out_at(0, 0, g, t, 0)), g == 1 && t == 2) << "g " << g << " t " << t;
  }
  {
    AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 4);
    c.set_v(0, 0, 3, 7, std::numeric_limits<float>::quiet_NaN());  // seen by queries t >= 3
    attention(c.out, c.q, c.k, c.v, o);
    // Rows that see key 3 must be NaN; for rows that don't, the header leaves it unspecified.
    for (std::int64_t t = 3; t < 6; ++t) EXPECT_TRUE(std::isnan(c.out_at(0, 0, 0, t, 7))) << "t " << t;
    EXPECT_FALSE(std::isnan(c.out_at(0, 0, 0, 3, 6)));  // other columns stay finite
  }
}

TEST_P(Ladder, EmptyKeysAndQueries) {
  {
    AttentionCase c = make_case(Shape{1, 2, 2, 3, 0, 64}, DType::bf16, DType::bf16, Layout::contiguous, 1);
    attention(c.out, c.lse, c.q, c.k, c.v, options());
    for (float x : c.out_values()) ASSERT_EQ(x, 0.0f);
    for (std::size_t i = 0; i + 1 < c.lse_buf.size(); ++i)
      ASSERT_EQ(c.lse_buf[i], -std::numeric_limits<float>::infinity());
  }
  {
    AttentionCase c = make_case(Shape{1, 2, 2, 0, 5, 64}, DType::bf16, DType::bf16, Layout::contiguous, 1);
    EXPECT_NO_THROW(attention(c.out, c.lse, c.q, c.k, c.v, options()));
  }
}

INSTANTIATE_TEST_SUITE_P(AllRungs, Ladder,
                         ::testing::Values(Algorithm::naive, Algorithm::chunked_unstable, Algorithm::chunked,
                                           Algorithm::kernel1, Algorithm::flash),
                         [](const auto& info) {
                           std::string name = algorithm_name(info.param);
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

// The seed's point about attn_scan_s: without a running max, large logits overflow exp.
TEST(ChunkedUnstable, OverflowsWhereTheStableRungDoesNot) {
  const Shape shape{1, 1, 2, 8, 16, 64};
  Options o;
  o.scale = 1.0;  // logits ~ 64 · 4 · 4: far above exp's fp32 range
  o.algorithm = Algorithm::chunked_unstable;
  AttentionCase unstable = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 9, 4.0f);
  attention(unstable.out, unstable.q, unstable.k, unstable.v, o);
  int non_finite = 0;
  for (float x : unstable.out_values()) non_finite += !std::isfinite(x);
  EXPECT_GT(non_finite, 0);

  o.algorithm = Algorithm::chunked;
  AttentionCase stable = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 9, 4.0f);
  const ErrorReport r = run_and_check(stable, o);
  EXPECT_TRUE(r.ok) << r.describe();
}

// A bound that cannot fail is no bound: a perturbed output must fail the check.
TEST(Tolerance, RejectsAPerturbedOutputAndNaN) {
  const Shape shape{1, 1, 2, 16, 40, 64};
  Options o;
  AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 21);
  attention(c.out, c.lse, c.q, c.k, c.v, o);
  const Problem p = make_problem(c.out, &c.lse, c.q, c.k, c.v, o);
  const ReferenceResult ref = reference_attention(p);
  ASSERT_TRUE(check_against_reference(p, ref).ok);
  float* out = static_cast<float*>(c.out.data);
  const float saved = out[5];
  out[5] += 0.02f;  // a small, plausible bug
  EXPECT_FALSE(check_against_reference(p, ref).ok);
  out[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(check_against_reference(p, ref).ok);
  out[5] = saved;
  c.lse_buf[3] += 1e-3f;
  EXPECT_FALSE(check_against_reference(p, ref).ok);
}

}  // namespace
}  // namespace flashgqa
