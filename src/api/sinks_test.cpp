// Attention sinks (Options::sinks): every rung of the ladder, the packed flash path and the decode path
// on every instruction set this machine supports, against the float64 reference and its derived bounds
// (reference/tolerance.hpp, w_sink): awkward shapes (T != S, blocks that divide nothing, G = 1, H = 64 to
// 256, B K above the thread count), causal offsets whose first rows see no key (out 0, lse = the sink),
// KV splits (long S, few q blocks; the decode path too), sinks far above the logits, -inf sinks (the
// bits of no sink), bit identity across thread counts, sliding windows and packed sequences; and the
// backward with the sinks' gradient
// (dq, dk, dv, dsinks against the float64 reference, dsinks against finite differences of the
// reference forward), and the argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "backward/flash_backward.hpp"
#include "backward/sink_gradient.hpp"
#include "core/dtype.hpp"
#include "flash/flash_decode.hpp"
#include "flash/flash_packed.hpp"
#include "flash/flash_testing.hpp"
#include "kernels/cpu_features.hpp"
#include "kernels/microkernels.hpp"
#include "ladder/ladder.hpp"
#include "reference/reference.hpp"
#include "reference/reference_backward.hpp"
#include "reference/tolerance.hpp"
#include "reference/tolerance_backward.hpp"
#include "testing/attention_case.hpp"
#include "testing/isa_test.hpp"

namespace flashgqa {
namespace {

using testing::AttentionCase;
using testing::Layout;
using testing::make_case;
using testing::Shape;
using testing::bitwise_equal;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// K*G sink logits: normal(0, spread) (the logits of unit inputs are ~N(0, 1)), head 1 without a sink
// (-inf) and, with `big`, the last head far above every logit.
std::vector<float> make_sinks(const Shape& s, std::uint64_t seed, float spread = 2.0f, bool big = true) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> sinks(static_cast<std::size_t>(s.K * s.G));
  for (float& x : sinks) x = normal(rng);
  if (sinks.size() > 2) sinks[1] = kNegInf;
  if (big && sinks.size() > 1) sinks.back() = 40.0f;
  return sinks;
}

// The rows of head (b, kh, g) that see no key (by the problem's mask) have out 0 and lse = the sink.
void expect_empty_rows_give_the_sink(const AttentionCase& c, const Problem& p) {
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t kh = 0; kh < p.K; ++kh)
      for (std::int64_t g = 0; g < p.G; ++g)
        for (std::int64_t t = 0; t < p.T; ++t) {
          if (!p.visible_keys(t).empty()) continue;
          EXPECT_EQ(c.lse_at(b, kh, g, t), p.sink(kh, g)) << "k " << kh << " g " << g << " t " << t;
          for (std::int64_t h = 0; h < p.H; ++h) ASSERT_EQ(c.out_at(b, kh, g, t, h), 0.0f);
        }
}

class Sinks : public testing::IsaTest {
 protected:
  void SetUp() override {
    IsaTest::SetUp();
    if (IsSkipped()) return;  // GTEST_SKIP in the base only left its SetUp
    saved_ = active_isa();
    set_isa(isa());  // the rungs run on the active set
    restore_ = true;
  }
  void TearDown() override {
    if (restore_) set_isa(saved_);
  }
  Isa saved_ = Isa::portable;
  bool restore_ = false;
};

// Every algorithm through the public API, against the reference with the algorithm's own sums.
TEST_P(Sinks, EveryAlgorithmMatchesReference) {
  const Shape shapes[] = {{1, 2, 4, 37, 53, 64}, {2, 3, 1, 19, 70, 80}, {1, 1, 8, 5, 129, 128},
                          {1, 1, 2, 33, 17, 256}, {3, 1, 2, 23, 23, 64}};
  const std::optional<std::int64_t> offsets[] = {std::nullopt, 0, -3};
  const DType dtypes[] = {DType::bf16, DType::f32, DType::f16};
  int seed = 0;
  for (const Shape& shape : shapes)
    for (const auto& [algorithm, name] : kAlgorithmNames)
      for (int variant = 0; variant < 4; ++variant) {
        ++seed;
        const DType dtype = dtypes[seed % 3];
        AttentionCase c = make_case(shape, dtype, dtype, Layout::contiguous, seed);
        const std::vector<float> sinks = make_sinks(shape, seed);
        Options o;
        o.algorithm = algorithm;
        o.sinks = sinks.data();
        o.precision = variant % 2 ? Precision::f32 : Precision::bf16;
        o.causal = variant >= 1;
        o.causal_offset = offsets[variant % 3];
        attention(c.out, c.lse, c.q, c.k, c.v, o);
        const Problem p = make_problem(c.out, &c.lse, c.q, c.k, c.v, o);
        const ErrorReport r = check_against_reference(p, reference_attention(p), key_sums(p, algorithm));
        EXPECT_TRUE(r.ok) << name << " " << testing::to_string(shape) << " variant " << variant << ": " << r.describe();
        expect_empty_rows_give_the_sink(c, p);
      }
}

// -inf sinks are no sinks: the same bits on every algorithm (the row's end rescales by e^0 = 1).
TEST_P(Sinks, MinusInfinitySinksGiveTheBitsOfNoSinks) {
  const Shape shape{1, 2, 3, 29, 45, 80};
  const std::vector<float> sinks(6, kNegInf);
  for (const auto& [algorithm, name] : kAlgorithmNames)
    for (bool causal : {false, true}) {
      AttentionCase a = make_case(shape, DType::bf16, DType::bf16, Layout::contiguous, 3);
      AttentionCase b = make_case(shape, DType::bf16, DType::bf16, Layout::contiguous, 3);
      Options o;
      o.algorithm = algorithm;
      o.causal = causal;
      o.causal_offset = -2;  // two rows see no key: lse -inf either way
      attention(a.out, a.lse, a.q, a.k, a.v, o);
      o.sinks = sinks.data();
      attention(b.out, b.lse, b.q, b.k, b.v, o);
      EXPECT_TRUE(bitwise_equal(a.out_and_lse_values(), b.out_and_lse_values())) << name;
    }
}

// Sinks far above the logits (the weights e^(s - sink) near fp32's underflow, or below it): out ~ 0 and
// lse ~ sink, within the bounds on every algorithm; and far below them: the result of no sink, nearly.
TEST_P(Sinks, SinksFarFromTheLogits) {
  const Shape shape{1, 2, 2, 21, 90, 64};
  for (float level : {30.0f, 95.0f, 200.0f, -200.0f})
    for (const auto& [algorithm, name] : kAlgorithmNames) {
      AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 11);
      const std::vector<float> sinks(4, level);
      Options o;
      o.algorithm = algorithm;
      o.sinks = sinks.data();
      o.causal = true;
      attention(c.out, c.lse, c.q, c.k, c.v, o);
      const Problem p = make_problem(c.out, &c.lse, c.q, c.k, c.v, o);
      const ErrorReport r = check_against_reference(p, reference_attention(p), key_sums(p, algorithm));
      EXPECT_TRUE(r.ok) << name << " sink " << level << ": " << r.describe();
      if (level >= 95.0f) {
        EXPECT_NEAR(c.lse_at(0, 1, 1, 20), level, 1e-3f) << name;
        EXPECT_LT(std::fabs(c.out_at(0, 1, 1, 20, 3)), 1e-30f) << name;
      }
    }
}

// The fast path as it runs (flash_attention on this set): packed and decode, KV splits, awkward blocks.
TEST_P(Sinks, FlashPathsWithSplitsMatchReference) {
  struct Case {
    Shape shape;
    std::int64_t block_kv;
    std::optional<std::int64_t> offset;  // causal when set
  };
  const Case cases[] = {
      {{1, 1, 4, 1, 3000, 128}, 64, std::nullopt},  // decode (where the set has decode kernels), split
      {{1, 2, 1, 2, 2000, 64}, 64, -1},             // decode, first row sees no key
      {{1, 3, 2, 2, 1500, 256}, 0, 1000},           // decode, default blocks
      {{1, 1, 4, 5, 2000, 128}, 64, std::nullopt},  // packed, few q blocks: split
      {{1, 2, 3, 45, 777, 80}, 96, -10},            // packed, split, empty rows
      {{2, 3, 2, 70, 129, 64}, 0, std::nullopt},    // B K = 6 heads, default blocks
      {{1, 1, 1, 33, 1000, 128}, 48, 5},            // G = 1
  };
  int seed = 200;
  for (const Case& k : cases)
    for (Precision precision : {Precision::bf16, Precision::f32}) {
      AttentionCase c = make_case(k.shape, DType::bf16, DType::bf16, Layout::contiguous, ++seed);
      const std::vector<float> sinks = make_sinks(k.shape, seed);
      Options o;
      o.sinks = sinks.data();
      o.block_kv = k.block_kv;
      o.precision = precision;
      o.causal = k.offset.has_value();
      o.causal_offset = k.offset;
      const Problem p = testing::flash_problem(c, o);
      flash_attention(p, isa());
      const ErrorReport r = check_against_reference(p, reference_attention(p), flash_key_sums(p, isa()));
      EXPECT_TRUE(r.ok) << testing::to_string(k.shape) << " " << precision_name(precision) << ": " << r.describe();
      expect_empty_rows_give_the_sink(c, p);
    }
  // The long ones do split.
  AttentionCase c = make_case(cases[0].shape, DType::bf16, DType::bf16, Layout::contiguous, 1);
  Options o;
  o.block_kv = 64;
  EXPECT_GT(flash_max_kv_splits(testing::flash_problem(c, o), isa()), 1);
  AttentionCase d = make_case(cases[3].shape, DType::bf16, DType::bf16, Layout::contiguous, 1);
  EXPECT_GT(flash_max_kv_splits(testing::flash_problem(d, o), isa()), 1);
}

// Head sizes 64/128/256 with S = 0 (every row sees no key: out 0, lse = sink) and T = 0.
TEST_P(Sinks, NoKeysGiveTheSink) {
  for (std::int64_t H : {64, 128, 256}) {
    const Shape shape{1, 2, 2, 3, 0, H};
    AttentionCase c = make_case(shape, DType::bf16, DType::bf16, Layout::contiguous, 1);
    const std::vector<float> sinks = {0.5f, kNegInf, -3.0f, 7.0f};
    Options o;
    o.sinks = sinks.data();
    const Problem p = testing::flash_problem(c, o);
    flash_attention(p, isa());
    expect_empty_rows_give_the_sink(c, p);
  }
}

TEST_P(Sinks, SameBitsForAnyThreadCount) {
  for (const Shape& shape : {Shape{1, 3, 2, 45, 77, 64}, Shape{1, 1, 4, 1, 3000, 128}, Shape{1, 3, 2, 2, 1500, 64}}) {
    const std::vector<float> sinks = make_sinks(shape, 5);
    Options o;
    o.causal = true;
    o.block_kv = 64;
    o.sinks = sinks.data();
    testing::expect_same_bits_for_thread_counts(shape, o, isa());
  }
}

TEST_P(Sinks, NanStillReachesTheOutput) {
  const Shape shape{1, 1, 2, 6, 70, 64};
  AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 5);
  c.set_q(0, 0, 0, 5, 0, std::numeric_limits<float>::quiet_NaN());  // row (g 0, t 5): NaN logits
  const std::vector<float> sinks = {100.0f, 1.0f};                   // the sink is the larger logit
  Options o;
  o.sinks = sinks.data();
  o.block_kv = 32;
  flash_attention(testing::flash_problem(c, o), isa());
  EXPECT_TRUE(std::isnan(c.out_at(0, 0, 0, 5, 1)));
  EXPECT_TRUE(std::isnan(c.lse_at(0, 0, 0, 5)));
  EXPECT_FALSE(std::isnan(c.out_at(0, 0, 0, 4, 1)));
  EXPECT_FALSE(std::isnan(c.out_at(0, 0, 1, 5, 1)));
}

// The backward with sinks: the forward (flash on this set) writes out and lse with the sinks, then
// dq, dk, dv and dsinks are checked against the reference's.
struct BackwardRun {
  AttentionCase fwd, grads;
  std::vector<float> sinks, dsinks;
  BackwardRun(const Shape& shape, DType dtype, std::uint64_t seed)
      : fwd(make_case(shape, dtype, dtype, Layout::contiguous, seed)),
        grads(make_case(shape, dtype, dtype, Layout::contiguous, seed + 7919)),
        sinks(make_sinks(shape, seed, 2.0f, false)),
        dsinks(sinks.size(), std::numeric_limits<float>::quiet_NaN()) {}
  // Forward then backward on `isa`; returns the backward problem (grads hold the gradients).
  BackwardProblem run(Options o, Isa isa) {
    o.sinks = sinks.data();
    Options f = o;
    f.algorithm = Algorithm::flash;
    flash_attention(make_problem(fwd.out, &fwd.lse, fwd.q, fwd.k, fwd.v, f), isa);
    const BackwardProblem bp = make_backward_problem(grads.out, grads.k, grads.v, grads.q, fwd.q, fwd.k, fwd.v,
                                                     fwd.out, fwd.lse, o, dsinks.data());
    flash_backward(bp, isa);
    sink_gradient(bp);
    return bp;
  }
};

TEST_P(Sinks, BackwardMatchesReference) {
  const Shape shapes[] = {{1, 2, 4, 37, 53, 64}, {2, 3, 1, 19, 70, 80}, {1, 1, 8, 5, 129, 128},
                          {1, 1, 2, 33, 17, 256}, {1, 1, 4, 70, 300, 128}};
  int seed = 300;
  for (const Shape& shape : shapes)
    for (Precision precision : {Precision::bf16, Precision::f32})
      for (std::optional<std::int64_t> offset : {std::optional<std::int64_t>{}, std::optional<std::int64_t>{-4}}) {
        BackwardRun c(shape, precision == Precision::bf16 ? DType::bf16 : DType::f32, ++seed);
        Options o;
        o.precision = precision;
        o.causal = offset.has_value();
        o.causal_offset = offset;
        const BackwardProblem bp = c.run(o, isa());
        const ErrorReport r = check_backward_against_reference(bp, reference_attention_backward(bp));
        EXPECT_TRUE(r.ok) << testing::to_string(shape) << " " << precision_name(precision) << ": " << r.describe();
        // The check above covers dsinks: a wrong sign fails it. (Under f32 only: under bf16 the worst-case
        // bound of a sum over rows whose D_t cancel, from out stored in bf16, can exceed |dsink| itself.)
        if (precision == Precision::f32) {
          for (float& x : c.dsinks) x = -x;
          EXPECT_FALSE(check_backward_against_reference(bp, reference_attention_backward(bp)).ok)
              << testing::to_string(shape);
        }
      }
}

TEST_P(Sinks, BackwardKeepsBitsAcrossThreadCounts) {
  const Shape shape{2, 3, 2, 45, 130, 64};
  std::vector<float> results[3];
  for (int threads : {1, 2, 3}) {
    BackwardRun c(shape, DType::bf16, 77);
    Options o;
    o.threads = threads;
    o.causal = true;
    c.run(o, isa());
    results[threads - 1] = c.grads.out_values();  // dq
    for (const std::vector<std::byte>* buf : {&c.grads.k_buf, &c.grads.v_buf})  // dk, dv (f32 bits)
      for (std::size_t i = 0; i + 1 < buf->size(); i += 2)
        results[threads - 1].push_back(static_cast<float>(std::to_integer<int>((*buf)[i]) +
                                                          256 * std::to_integer<int>((*buf)[i + 1])));
    results[threads - 1].insert(results[threads - 1].end(), c.dsinks.begin(), c.dsinks.end());
  }
  EXPECT_TRUE(bitwise_equal(results[0], results[1]));
  EXPECT_TRUE(bitwise_equal(results[0], results[2]));
}

// Sinks with the other variants of issue #11 on the flash path: sliding windows, packed sequences (an
// empty sequence of queries, one without keys: its rows give the sink) and the logit softcap, forward
// and backward.
TEST_P(Sinks, ComposeWithWindowsPackedSequencesAndSoftcap) {
  int seed = 400;
  const Shape shape{1, 2, 3, 45, 77, 64};
  for (const testing::WindowCase& w : testing::kWindowCases) {
    AttentionCase c = make_case(shape, DType::bf16, DType::bf16, Layout::contiguous, ++seed);
    const std::vector<float> sinks = make_sinks(shape, seed);
    Options o;
    o.sinks = sinks.data();
    o.block_kv = 32;
    const ErrorReport r = testing::run_flash_window_and_check(c, o, w, isa());
    EXPECT_TRUE(r.ok) << testing::to_string(w) << ": " << r.describe();
  }
  const std::vector<std::int32_t> cu_q = {0, 0, 13, 20, 49}, cu_k = {0, 5, 18, 18, 58};
  const Shape packed{1, 2, 2, 49, 58, 64};
  for (bool causal : {false, true}) {
    Options o;
    o.cu_seqlens_q = cu_q.data();
    o.cu_seqlens_k = cu_k.data();
    o.num_sequences = 4;
    o.causal = causal;
    o.window_left = causal ? 9 : -1;
    AttentionCase c = make_case(packed, DType::bf16, DType::bf16, Layout::contiguous, ++seed);
    const std::vector<float> sinks = make_sinks(packed, seed);
    o.sinks = sinks.data();
    const Problem p = testing::flash_problem(c, o);
    flash_attention(p, isa());
    const ErrorReport r = check_against_reference(p, reference_attention(p), flash_key_sums(p, isa()));
    EXPECT_TRUE(r.ok) << "packed, causal " << causal << ": " << r.describe();
    expect_empty_rows_give_the_sink(c, p);
    BackwardRun b(packed, DType::bf16, ++seed);
    const BackwardProblem bp = b.run(o, isa());
    const ErrorReport rb = check_backward_against_reference(bp, reference_attention_backward(bp));
    EXPECT_TRUE(rb.ok) << "packed backward, causal " << causal << ": " << rb.describe();
  }
  {  // With Gemma's logit softcap: the logits are capped, the sink is not.
    AttentionCase c = make_case(shape, DType::bf16, DType::bf16, Layout::contiguous, ++seed, 3.0f);
    const std::vector<float> sinks = make_sinks(shape, seed, 4.0f);
    Options o;
    o.sinks = sinks.data();
    o.softcap = 5.0;
    o.causal = true;
    o.causal_offset = -3;
    const Problem p = testing::flash_problem(c, o);
    flash_attention(p, isa());
    const ErrorReport r = check_against_reference(p, reference_attention(p), flash_key_sums(p, isa()));
    EXPECT_TRUE(r.ok) << "softcap: " << r.describe();
    expect_empty_rows_give_the_sink(c, p);
    BackwardRun b(shape, DType::f32, ++seed);
    Options ob;
    ob.precision = Precision::f32;
    ob.softcap = 5.0;
    const BackwardProblem bp = b.run(ob, isa());
    const ErrorReport rb = check_backward_against_reference(bp, reference_attention_backward(bp));
    EXPECT_TRUE(rb.ok) << "softcap backward: " << rb.describe();
  }
  for (const testing::WindowCase& w : {testing::kWindowCases[1], testing::kWindowCases[5]}) {
    BackwardRun b(shape, DType::f32, ++seed);
    Options o;
    o.precision = Precision::f32;
    o.causal = w.causal;
    o.causal_offset = w.offset;
    o.window_left = w.left;
    o.window_right = w.right;
    const BackwardProblem bp = b.run(o, isa());
    const ErrorReport rb = check_backward_against_reference(bp, reference_attention_backward(bp));
    EXPECT_TRUE(rb.ok) << "backward " << testing::to_string(w) << ": " << rb.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, Sinks, ::testing::ValuesIn(testing::kAllIsas), testing::isa_test_name);

// The reference's dsinks is the derivative of the reference forward: central differences of
// L = sum dout . out(sinks) in float64, at sinks of several magnitudes.
TEST(SinksReference, GradientMatchesFiniteDifferences) {
  const Shape shape{2, 2, 2, 9, 14, 64};
  AttentionCase fwd = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 1);
  AttentionCase grads = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 2);
  std::vector<float> sinks = {0.0f, 2.5f, -1.0f, 6.0f};
  Options o;
  o.precision = Precision::f32;
  o.causal = true;
  o.causal_offset = -2;  // rows without keys: they add nothing
  o.sinks = sinks.data();
  attention(fwd.out, fwd.lse, fwd.q, fwd.k, fwd.v, o);
  const BackwardProblem bp = make_backward_problem(grads.out, grads.k, grads.v, grads.q, fwd.q, fwd.k, fwd.v,
                                                   fwd.out, fwd.lse, o);
  Problem with_sinks = bp.fwd;
  const ReferenceGradients ref = reference_attention_backward(bp);
  ASSERT_EQ(ref.dsinks.size(), sinks.size());
  // L(sinks) = sum dout . out in float64; dout is grads.q (as the backward reads it).
  auto loss = [&](const std::vector<float>& s) {
    with_sinks.sinks = s.data();
    const ReferenceResult r = reference_attention(with_sinks);
    double sum = 0.0;
    for (std::int64_t b = 0; b < shape.B; ++b)
      for (std::int64_t kh = 0; kh < shape.K; ++kh)
        for (std::int64_t g = 0; g < shape.G; ++g)
          for (std::int64_t t = 0; t < shape.T; ++t)
            for (std::int64_t h = 0; h < shape.H; ++h)
              sum += r.out[static_cast<std::size_t>(r.row(b, kh, g, t) * shape.H + h)] *
                     load_element(bp.dout_row(b, kh, g, t), bp.dout_dtype, h);
    return sum;
  };
  for (std::size_t i = 0; i < sinks.size(); ++i) {
    // Sinks are float: a step of 2^-10 is exact, and the central difference's error ~ step^2 L''' ~ 1e-7.
    const float step = 0x1p-10f;
    std::vector<float> up = sinks, down = sinks;
    up[i] += step;
    down[i] -= step;
    const double fd = (loss(up) - loss(down)) / (2.0 * step);
    EXPECT_NEAR(ref.dsinks[i], fd, 1e-5 * (1 + std::fabs(fd))) << "head " << i;
  }
}

TEST(SinksArguments, AreChecked) {
  const Shape shape{1, 2, 2, 3, 5, 64};
  AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 1);
  std::vector<float> sinks = {0.0f, kNegInf, 1.0f, -2.0f};
  Options o;
  o.sinks = sinks.data();
  EXPECT_NO_THROW(attention(c.out, c.lse, c.q, c.k, c.v, o));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    sinks[2] = bad;
    try {
      attention(c.out, c.lse, c.q, c.k, c.v, o);
      ADD_FAILURE() << "sink " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sinks: head 2 (k 1, g 0)"), std::string::npos) << e.what();
    }
  }
  sinks[2] = 1.0f;
  // The backward: dsinks needs the sinks, must be non-null in its overload and overlap nothing.
  AttentionCase g = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 2);
  std::vector<float> dsinks(4);
  attention(c.out, c.lse, c.q, c.k, c.v, o);
  EXPECT_NO_THROW(attention_backward(g.out, g.k, g.v, dsinks.data(), g.q, c.q, c.k, c.v, c.out, c.lse, o));
  EXPECT_THROW(attention_backward(g.out, g.k, g.v, nullptr, g.q, c.q, c.k, c.v, c.out, c.lse, o), Error);
  EXPECT_THROW(attention_backward(g.out, g.k, g.v, sinks.data(), g.q, c.q, c.k, c.v, c.out, c.lse, o), Error);
  EXPECT_THROW(attention_backward(g.out, g.k, g.v, c.lse_buf.data(), g.q, c.q, c.k, c.v, c.out, c.lse, o), Error);
  Options none;
  EXPECT_THROW(attention_backward(g.out, g.k, g.v, dsinks.data(), g.q, c.q, c.k, c.v, c.out, c.lse, none), Error);
}

}  // namespace
}  // namespace flashgqa
