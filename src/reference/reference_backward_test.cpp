// The backward's float64 reference and its bounds: the gradients against central differences of the
// forward reference (causal, windows, G = 1 and 3), zero gradients for rows that see no key, the bounds
// catching a planted error or NaN, and the bounds holding for a plain fp32 rendition of the contract in
// backward_problem.hpp (so they are not tighter than the arithmetic the fast path is allowed).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/backward_problem.hpp"
#include "core/dtype.hpp"
#include "core/problem.hpp"
#include "reference/reference.hpp"
#include "reference/reference_backward.hpp"
#include "reference/tolerance_backward.hpp"
#include "testing/attention_case.hpp"

namespace flashgqa {
namespace {

using testing::AttentionCase;
using testing::Layout;
using testing::make_case;
using testing::Shape;

// q, k, v, the forward's out and lse (contiguous), dout and the three gradients (contiguous, or with
// `pad` elements of gap after every row and every head), with the BackwardProblem over them (filled by
// hand: the same fields make_backward_problem fills).
struct BackwardCase {
  AttentionCase c;
  std::vector<std::byte> dout, dq, dk, dv;
  BackwardProblem p;
};

std::vector<std::byte> random_buffer(std::int64_t n, DType dtype, std::uint64_t seed) {
  std::vector<std::byte> buf(static_cast<std::size_t>(n) * dtype_size(dtype));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = normal(rng);
    store_row(buf.data() + i * static_cast<std::int64_t>(dtype_size(dtype)), dtype, &x, 1);
  }
  return buf;
}

// Runs the forward (the public attention, so out and lse are what a user would pass) unless
// `run_forward` is false.
BackwardCase make_backward_case(const Shape& s, DType dtype, DType grad_dtype, const Options& o,
                                std::uint64_t seed, bool run_forward = true, std::int64_t pad = 0) {
  BackwardCase bc;
  bc.c = make_case(s, dtype, dtype, Layout::contiguous, seed);
  if (run_forward) attention(bc.c.out, bc.c.lse, bc.c.q, bc.c.k, bc.c.v, o);
  BackwardProblem& p = bc.p;
  p.fwd = make_problem(bc.c.out, &bc.c.lse, bc.c.q, bc.c.k, bc.c.v, o);
  const std::int64_t row = s.H + pad, q_head = s.T * row + pad, kv_head = s.S * row + pad;
  const std::int64_t q_stride[4] = {s.K * s.G * q_head, s.G * q_head, q_head, row};
  const std::int64_t kv_stride[3] = {s.K * kv_head, kv_head, row};
  const std::int64_t q_elems = s.B * q_stride[0], kv_elems = s.B * kv_stride[0];
  bc.dout = random_buffer(q_elems, dtype, seed + 1000);
  bc.dq.assign(static_cast<std::size_t>(q_elems) * dtype_size(grad_dtype), std::byte{0});
  bc.dk.assign(static_cast<std::size_t>(kv_elems) * dtype_size(grad_dtype), std::byte{0});
  bc.dv.assign(bc.dk.size(), std::byte{0});
  p.dout = bc.dout.data();
  p.dout_dtype = dtype;
  p.dq = bc.dq.data();
  p.dk = bc.dk.data();
  p.dv = bc.dv.data();
  p.dq_dtype = p.dk_dtype = p.dv_dtype = grad_dtype;
  std::memcpy(p.dout_stride, q_stride, sizeof q_stride);
  std::memcpy(p.dq_stride, q_stride, sizeof q_stride);
  std::memcpy(p.dk_stride, kv_stride, sizeof kv_stride);
  std::memcpy(p.dv_stride, kv_stride, sizeof kv_stride);
  return bc;
}

// Element i of a contiguous buffer of `dtype`.
void store_at(std::vector<std::byte>& buf, DType dtype, std::int64_t i, float x) {
  store_row(buf.data() + i * static_cast<std::int64_t>(dtype_size(dtype)), dtype, &x, 1);
}
float load_at(const std::vector<std::byte>& buf, DType dtype, std::int64_t i) {
  return load_element(buf.data(), dtype, i);
}

// The gradient buffers <- the reference's gradients, rounded to their dtype.
void store_reference(BackwardCase& bc, const ReferenceGradients& ref) {
  for (std::size_t i = 0; i < ref.dq.size(); ++i)
    store_at(bc.dq, bc.p.dq_dtype, static_cast<std::int64_t>(i), static_cast<float>(ref.dq[i]));
  for (std::size_t i = 0; i < ref.dk.size(); ++i) {
    store_at(bc.dk, bc.p.dk_dtype, static_cast<std::int64_t>(i), static_cast<float>(ref.dk[i]));
    store_at(bc.dv, bc.p.dv_dtype, static_cast<std::int64_t>(i), static_cast<float>(ref.dv[i]));
  }
}

// ---------------------------------------------------------------------------------------------------
// Finite differences: L = sum(dout * out) with out from the forward's float64 reference; dL/dx by
// central differences in double against the backward reference, for every element of q, k and v.

double loss(const BackwardProblem& p) {
  const ReferenceResult r = reference_attention(p.fwd);
  const Problem& f = p.fwd;
  double l = 0.0;
  for (std::int64_t b = 0; b < f.B; ++b)
    for (std::int64_t kh = 0; kh < f.K; ++kh)
      for (std::int64_t g = 0; g < f.G; ++g)
        for (std::int64_t t = 0; t < f.T; ++t)
          for (std::int64_t h = 0; h < f.H; ++h)
            l += static_cast<double>(load_element(p.dout_row(b, kh, g, t), p.dout_dtype, h)) *
                 r.out[static_cast<std::size_t>(r.row(b, kh, g, t) * f.H + h)];
  return l;
}

// Max over the elements of |fd - grad| / (|grad| + 1e-3 max |grad|): a relative error that does not
// blow up where a gradient element is near 0.
double finite_difference_error(const BackwardProblem& p, std::vector<std::byte>& x_buf,
                               const std::vector<double>& grad) {
  constexpr double kStep = 0x1p-13;
  float* x = reinterpret_cast<float*>(x_buf.data());
  double max_grad = 0.0;
  for (double g : grad) max_grad = std::max(max_grad, std::fabs(g));
  double worst = 0.0;
  for (std::size_t i = 0; i < grad.size(); ++i) {
    const float saved = x[i];
    const float up = static_cast<float>(saved + kStep), down = static_cast<float>(saved - kStep);
    x[i] = up;
    const double l_up = loss(p);
    x[i] = down;
    const double l_down = loss(p);
    x[i] = saved;
    const double fd = (l_up - l_down) / (static_cast<double>(up) - static_cast<double>(down));
    worst = std::max(worst, std::fabs(fd - grad[i]) / (std::fabs(grad[i]) + 1e-3 * max_grad));
  }
  return worst;
}

struct FiniteDifferenceCase {
  Shape shape;
  bool causal;
  std::int64_t offset;  // causal offset
  std::int64_t window_left, window_right;
};

TEST(ReferenceBackward, MatchesFiniteDifferencesOfTheForwardReference) {
  const FiniteDifferenceCase cases[] = {
      {{1, 1, 1, 3, 4, 5}, false, 0, -1, -1},  {{1, 1, 1, 4, 4, 6}, true, 0, -1, -1},
      {{1, 2, 3, 4, 5, 4}, false, 0, -1, -1},  {{1, 2, 3, 4, 5, 4}, true, 1, -1, -1},
      {{2, 1, 3, 5, 6, 3}, false, 1, 1, 1},    {{1, 1, 3, 6, 7, 4}, true, 1, 2, -1},
  };
  std::uint64_t seed = 1;
  for (const FiniteDifferenceCase& fc : cases) {
    Options o;
    o.precision = Precision::f32;
    o.causal = fc.causal;
    o.causal_offset = fc.offset;
    o.window_left = fc.window_left;
    o.window_right = fc.window_right;
    BackwardCase bc = make_backward_case(fc.shape, DType::f32, DType::f32, o, ++seed, false);
    const ReferenceGradients ref = reference_attention_backward(bc.p);
    const std::string what = testing::to_string(fc.shape) + (fc.causal ? " causal" : "") + " window (" +
                             std::to_string(fc.window_left) + ", " + std::to_string(fc.window_right) + ")";
    EXPECT_LT(finite_difference_error(bc.p, bc.c.q_buf, ref.dq), 1e-6) << what << ": dq";
    EXPECT_LT(finite_difference_error(bc.p, bc.c.k_buf, ref.dk), 1e-6) << what << ": dk";
    EXPECT_LT(finite_difference_error(bc.p, bc.c.v_buf, ref.dv), 1e-6) << what << ": dv";
  }
}

// With a logit softcap c (logits c tanh(s / c), dS times 1 - tanh^2): strong and mild caps.
TEST(ReferenceBackward, MatchesFiniteDifferencesWithASoftcap) {
  std::uint64_t seed = 50;
  for (const double cap : {0.7, 3.0})
    for (const bool causal : {false, true}) {
      Options o;
      o.precision = Precision::f32;
      o.causal = causal;
      o.scale = 1.0;
      o.softcap = cap;
      BackwardCase bc = make_backward_case(Shape{1, 2, 2, 4, 5, 6}, DType::f32, DType::f32, o, ++seed, false);
      const ReferenceGradients ref = reference_attention_backward(bc.p);
      const std::string what = "cap " + std::to_string(cap) + (causal ? " causal" : "");
      EXPECT_LT(finite_difference_error(bc.p, bc.c.q_buf, ref.dq), 1e-6) << what << ": dq";
      EXPECT_LT(finite_difference_error(bc.p, bc.c.k_buf, ref.dk), 1e-6) << what << ": dk";
      EXPECT_LT(finite_difference_error(bc.p, bc.c.v_buf, ref.dv), 1e-6) << what << ": dv";
    }
}

// D_t = sum_j P dP equals dout . out (the identity the fast path's D relies on).
TEST(ReferenceBackward, DIsDoutDotOut) {
  Options o;
  o.precision = Precision::f32;
  o.causal = true;
  BackwardCase bc = make_backward_case({1, 2, 2, 9, 11, 8}, DType::f32, DType::f32, o, 7, false);
  const ReferenceGradients ref = reference_attention_backward(bc.p);
  const ReferenceResult fwd = reference_attention(bc.p.fwd);
  const Problem& f = bc.p.fwd;
  for (std::int64_t kh = 0; kh < f.K; ++kh)
    for (std::int64_t g = 0; g < f.G; ++g)
      for (std::int64_t t = 0; t < f.T; ++t) {
        const std::int64_t row = ref.row(0, kh, g, t);
        double d = 0.0;
        for (std::int64_t h = 0; h < f.H; ++h)
          d += load_element(bc.p.dout_row(0, kh, g, t), DType::f32, h) *
               fwd.out[static_cast<std::size_t>(row * f.H + h)];
        EXPECT_NEAR(ref.d[static_cast<std::size_t>(row)], d, 1e-12);
        EXPECT_EQ(ref.lse[static_cast<std::size_t>(row)], fwd.lse[static_cast<std::size_t>(row)]);
      }
}

// ---------------------------------------------------------------------------------------------------
// Rows that see no key.

TEST(ReferenceBackward, RowsThatSeeNoKeyHaveZeroGradients) {
  const Shape s{1, 2, 3, 4, 5, 8};
  Options o;
  o.causal = true;
  o.causal_offset = -2;  // query t sees keys j <= t - 2: t = 0, 1 see none
  BackwardCase bc = make_backward_case(s, DType::bf16, DType::f32, o, 11);
  const ReferenceGradients ref = reference_attention_backward(bc.p);
  for (std::int64_t kh = 0; kh < s.K; ++kh)
    for (std::int64_t g = 0; g < s.G; ++g)
      for (std::int64_t t = 0; t < s.T; ++t) {
        EXPECT_EQ(std::isinf(ref.lse[static_cast<std::size_t>(ref.row(0, kh, g, t))]), t < 2);
        for (std::int64_t h = 0; h < s.H; ++h) {
          const double x = ref.dq[static_cast<std::size_t>(ref.q_index(0, kh, g, t, h))];
          if (t < 2) EXPECT_EQ(x, 0.0) << "t " << t;
          else EXPECT_TRUE(std::isfinite(x));
        }
      }
  // Keys 3 and 4 are seen by nobody (t <= 3 sees j <= 1): zero dk, dv.
  for (std::int64_t kh = 0; kh < s.K; ++kh)
    for (std::int64_t j = 0; j < s.S; ++j)
      for (std::int64_t h = 0; h < s.H; ++h) {
        const auto i = static_cast<std::size_t>(ref.kv_index(0, kh, j, h));
        if (j >= 2) {
          EXPECT_EQ(ref.dk[i], 0.0);
          EXPECT_EQ(ref.dv[i], 0.0);
        } else {
          EXPECT_NE(ref.dv[i], 0.0);
        }
      }
  // The reference's own gradients pass, zeros included (their bounds are 0 there).
  store_reference(bc, ref);
  const ErrorReport r = check_backward_against_reference(bc.p, ref);
  EXPECT_TRUE(r.ok) << r.describe();
  // A nonzero dq in a masked row fails.
  store_at(bc.dq, DType::f32, ref.q_index(0, 1, 2, 0, 3), 1e-30f);
  EXPECT_FALSE(check_backward_against_reference(bc.p, ref).ok);
}

TEST(ReferenceBackward, EveryRowMaskedGivesZeroGradients) {
  const Shape s{1, 1, 2, 3, 4, 8};
  Options o;
  o.causal = true;
  o.causal_offset = -s.T - 1;
  BackwardCase bc = make_backward_case(s, DType::f32, DType::f32, o, 12);
  const ReferenceGradients ref = reference_attention_backward(bc.p);
  for (const auto* x : {&ref.dq, &ref.dk, &ref.dv})
    for (double e : *x) EXPECT_EQ(e, 0.0);
  EXPECT_TRUE(check_backward_against_reference(bc.p, ref).ok);
}

// ---------------------------------------------------------------------------------------------------
// The bounds catch a planted error and a NaN.

TEST(ToleranceBackward, CatchesAPlantedErrorAndNaN) {
  for (Precision precision : {Precision::bf16, Precision::f32}) {
    Options o;
    o.precision = precision;
    o.causal = true;
    const DType dtype = precision == Precision::bf16 ? DType::bf16 : DType::f32;
    BackwardCase bc = make_backward_case({1, 2, 3, 7, 9, 16}, dtype, DType::f32, o, 21);
    const ReferenceGradients ref = reference_attention_backward(bc.p);
    store_reference(bc, ref);
    const ErrorReport clean = check_backward_against_reference(bc.p, ref);
    EXPECT_TRUE(clean.ok) << precision_name(precision) << ": " << clean.describe();
    struct Target {
      Gradient which;
      std::vector<std::byte>* buf;
      const std::vector<double>* ref;
      std::int64_t index;
    };
    for (const Target& x : {Target{Gradient::dq, &bc.dq, &ref.dq, ref.q_index(0, 1, 2, 5, 7)},
                            Target{Gradient::dk, &bc.dk, &ref.dk, ref.kv_index(0, 0, 3, 11)},
                            Target{Gradient::dv, &bc.dv, &ref.dv, ref.kv_index(0, 1, 6, 2)}}) {
      const float saved = load_at(*x.buf, DType::f32, x.index);
      const double bound = backward_error_bound(bc.p, ref, x.which, x.index);
      ASSERT_GT(bound, 0.0);
      const std::string what = std::string(precision_name(precision)) + " " + gradient_name(x.which);
      // Within the bound: still passes.
      store_at(*x.buf, DType::f32, x.index,
               static_cast<float>((*x.ref)[static_cast<std::size_t>(x.index)] + 0.5 * bound));
      EXPECT_TRUE(check_backward_against_reference(bc.p, ref).ok) << what;
      // Four times the bound: fails, and the report names the element.
      store_at(*x.buf, DType::f32, x.index,
               static_cast<float>((*x.ref)[static_cast<std::size_t>(x.index)] + 4 * bound));
      const ErrorReport planted = check_backward_against_reference(bc.p, ref);
      EXPECT_FALSE(planted.ok) << what;
      EXPECT_GT(planted.worst_ratio, 3.0) << what;
      EXPECT_STREQ(planted.worst_tensor, gradient_name(x.which)) << what;
      EXPECT_EQ(planted.worst_index, x.index) << what;
      // A NaN never passes.
      store_at(*x.buf, DType::f32, x.index, std::numeric_limits<float>::quiet_NaN());
      const ErrorReport nan = check_backward_against_reference(bc.p, ref);
      EXPECT_FALSE(nan.ok) << what;
      EXPECT_EQ(nan.nan_mismatches, 1) << what;
      store_at(*x.buf, DType::f32, x.index, saved);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// The bounds hold for a plain fp32 rendition of backward_problem.hpp's contract: P = exp(s - lse) from
// the forward's fp32 lse, D from the forward's out as stored, P and dS rounded to bf16 under
// Precision::bf16, every sum in fp32 (rows in order; keys in order), the gradients in their dtype. The
// two choices the bounds leave open are flags: dS from P as rounded (else fp32), D from dout as stored
// (else as rounded).

struct Fp32BackwardChoices {
  bool ds_from_rounded_p = false;
  bool d_from_stored_dout = false;
};

void fp32_backward(const BackwardProblem& p, Fp32BackwardChoices choices = {}) {
  const Problem& f = p.fwd;
  const std::int64_t S = f.S, H = f.H;
  const auto round_p = [&](float x) { return f.precision == Precision::bf16 ? round_to_bf16(x) : x; };
  std::vector<float> k(static_cast<std::size_t>(S * H)), v(k.size()), dk(k.size()), dv(k.size());
  std::vector<float> q(static_cast<std::size_t>(H)), dout(q.size()), out(q.size()), dq(q.size());
  for (std::int64_t b = 0; b < f.B; ++b)
    for (std::int64_t kh = 0; kh < f.K; ++kh) {
      for (std::int64_t s = 0; s < S; ++s) {
        load_row(k.data() + s * H, f.k_row(b, kh, s), f.k_dtype, H, f.precision);
        load_row(v.data() + s * H, f.v_row(b, kh, s), f.v_dtype, H, f.precision);
      }
      std::fill(dk.begin(), dk.end(), 0.0f);
      std::fill(dv.begin(), dv.end(), 0.0f);
      for (std::int64_t g = 0; g < f.G; ++g)
        for (std::int64_t t = 0; t < f.T; ++t) {
          std::fill(dq.begin(), dq.end(), 0.0f);
          const KeyRange keys = f.visible_keys(t);
          const float lse = *f.lse_at(b, kh, g, t);
          if (!keys.empty() && !std::isinf(lse)) {
            load_row(q.data(), f.q_row(b, kh, g, t), f.q_dtype, H, f.precision);
            load_row(dout.data(), p.dout_row(b, kh, g, t), p.dout_dtype, H, f.precision);
            load_row(out.data(), p.out_row(b, kh, g, t), f.out_dtype, H, Precision::f32);
            float d = 0.0f;
            for (std::int64_t h = 0; h < H; ++h)
              d += (choices.d_from_stored_dout ? load_element(p.dout_row(b, kh, g, t), p.dout_dtype, h)
                                               : dout[h]) *
                   out[h];
            for (std::int64_t j = keys.begin; j < keys.end; ++j) {
              float s = 0.0f, dp = 0.0f;
              for (std::int64_t h = 0; h < H; ++h) {
                s += q[h] * k[j * H + h];
                dp += dout[h] * v[j * H + h];
              }
              const float prob = std::exp(s * f.scale - lse);
              const float prob_p = round_p(prob);
              const float ds = round_p((choices.ds_from_rounded_p ? prob_p : prob) * (dp - d));
              for (std::int64_t h = 0; h < H; ++h) {
                dq[h] += ds * k[j * H + h];
                dk[j * H + h] += ds * q[h];
                dv[j * H + h] += prob_p * dout[h];
              }
            }
            for (float& x : dq) x *= f.scale;
          }
          store_row(p.dq_row(b, kh, g, t), p.dq_dtype, dq.data(), H);
        }
      for (std::int64_t s = 0; s < S; ++s) {
        for (std::int64_t h = 0; h < H; ++h) dk[s * H + h] *= f.scale;
        store_row(p.dk_row(b, kh, s), p.dk_dtype, dk.data() + s * H, H);
        store_row(p.dv_row(b, kh, s), p.dv_dtype, dv.data() + s * H, H);
      }
    }
}

TEST(ToleranceBackward, HoldsForAPlainFp32Backward) {
  const Shape shapes[] = {{1, 2, 4, 37, 53, 64}, {1, 1, 1, 19, 70, 80}, {2, 1, 8, 5, 33, 128}};
  std::uint64_t seed = 30;
  for (const Shape& s : shapes)
    for (Precision precision : {Precision::bf16, Precision::f32})
      for (DType dtype : {DType::bf16, DType::f32, DType::f16})
        for (bool causal : {false, true}) {
          Options o;
          o.precision = precision;
          o.causal = causal;
          BackwardCase bc = make_backward_case(s, dtype, dtype, o, ++seed);
          fp32_backward(bc.p);
          const ErrorReport r = check_backward_against_reference(bc.p, reference_attention_backward(bc.p));
          EXPECT_TRUE(r.ok) << testing::to_string(s) << " " << precision_name(precision) << " "
                            << dtype_name(dtype) << (causal ? " causal" : "") << ": " << r.describe();
        }
}

// The open choices, strided gradients and dout (the check reads every gradient through its strides), a
// causal offset that masks rows and one beyond S.
TEST(ToleranceBackward, HoldsForEveryOpenChoiceAndStrides) {
  std::uint64_t seed = 70;
  for (bool rounded_p : {false, true})
    for (bool stored_dout : {false, true})
      for (std::int64_t offset : {-3, 0, 40}) {
        Options o;
        o.causal = true;
        o.causal_offset = offset;
        BackwardCase bc = make_backward_case({2, 2, 3, 21, 29, 40}, DType::f32, DType::bf16, o, ++seed,
                                             true, 3);
        fp32_backward(bc.p, {rounded_p, stored_dout});
        const ErrorReport r = check_backward_against_reference(bc.p, reference_attention_backward(bc.p));
        EXPECT_TRUE(r.ok) << "dS from rounded P " << rounded_p << ", D from stored dout " << stored_dout
                          << ", offset " << offset << ": " << r.describe();
      }
}

}  // namespace
}  // namespace flashgqa
