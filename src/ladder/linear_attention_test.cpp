// The seed's linear attention (no softmax) against its own float64 reference.
#include <gtest/gtest.h>

#include "core/problem.hpp"
#include "kernels/cpu_features.hpp"
#include "ladder/ladder.hpp"
#include "reference/reference.hpp"
#include "reference/tolerance.hpp"
#include "testing/attention_case.hpp"

namespace flashgqa {
namespace {

using testing::Layout;
using testing::Shape;

TEST(LinearAttention, MatchesReference) {
  int seed = 0;
  for (const Shape& shape : {Shape{1, 2, 4, 37, 53, 64}, Shape{2, 1, 1, 19, 70, 128}, Shape{1, 1, 3, 1, 9, 80}})
    for (Precision precision : {Precision::bf16, Precision::f32})
      for (bool causal : {false, true})
        for (std::int64_t bkv : {0, 16}) {
          auto c = testing::make_case(shape, DType::bf16, DType::f32, Layout::padded, ++seed);
          Options o;
          o.precision = precision;
          o.causal = causal;
          o.block_kv = bkv;
          linear_attention(c.out, c.q, c.k, c.v, o);
          const Problem p = make_problem(c.out, nullptr, c.q, c.k, c.v, o);
          const ErrorReport r = check_against_reference(p, reference_linear_attention(p), linear_key_sums(p), true);
          EXPECT_TRUE(r.ok) << testing::to_string(shape) << " causal " << causal << ": " << r.describe();
        }
}

// Subnormal inputs (~1e-40), flushed by the avx512bf16 kernels: within the bound's underflow terms on
// every instruction set.
TEST(LinearAttention, SubnormalInputsPassOnEveryInstructionSet) {
  const Isa saved = active_isa();
  int seed = 40;
  for (Isa isa : supported_isas()) {
    set_isa(isa);
    for (Precision precision : {Precision::bf16, Precision::f32}) {
      auto c = testing::make_case(Shape{1, 2, 3, 29, 45, 64}, DType::f32, DType::f32, Layout::contiguous, ++seed,
                                  1e-40f);
      Options o;
      o.precision = precision;
      linear_attention(c.out, c.q, c.k, c.v, o);
      const Problem p = make_problem(c.out, nullptr, c.q, c.k, c.v, o);
      const ErrorReport r = check_against_reference(p, reference_linear_attention(p), linear_key_sums(p), true);
      EXPECT_TRUE(r.ok) << isa_name(isa) << " " << precision_name(precision) << ": " << r.describe();
    }
  }
  set_isa(saved);
}

TEST(LinearAttention, IsNotSoftmaxAttention) {
  // Guards the check itself: the softmax result must fail the linear bound.
  auto c = testing::make_case(Shape{1, 1, 2, 8, 12, 64}, DType::f32, DType::f32, Layout::contiguous, 3);
  Options o;
  attention(c.out, c.q, c.k, c.v, o);
  const Problem p = make_problem(c.out, nullptr, c.q, c.k, c.v, o);
  EXPECT_FALSE(check_against_reference(p, reference_linear_attention(p), true).ok);
}

}  // namespace
}  // namespace flashgqa
