// Options::interrupt: a set flag stops every algorithm, the linear attention and the backward with
// flashgqa::Interrupted (before any work, since the flag is polled before each task and KV chunk);
// a clear flag changes nothing (same bits as without one).
#include <gtest/gtest.h>

#include <atomic>

#include "flashgqa/flashgqa.hpp"
#include "testing/attention_case.hpp"

namespace flashgqa {
namespace {

using testing::make_case;

TEST(Interrupt, ASetFlagStopsEveryAlgorithm) {
  std::atomic<bool> stop{true};
  for (const auto& [algorithm, name] : kAlgorithmNames) {
    testing::AttentionCase c = make_case({1, 2, 2, 40, 70, 64}, DType::bf16, DType::bf16, testing::Layout::contiguous, 3);
    Options o;
    o.algorithm = algorithm;
    o.interrupt = &stop;
    EXPECT_THROW(attention(c.out, c.lse, c.q, c.k, c.v, o), Interrupted) << name;
    EXPECT_THROW(attention(c.out, c.q, c.k, c.v, o), Interrupted) << name;
  }
  testing::AttentionCase c = make_case({1, 2, 2, 40, 70, 64}, DType::f32, DType::f32, testing::Layout::contiguous, 4);
  Options o;
  o.interrupt = &stop;
  EXPECT_THROW(linear_attention(c.out, c.q, c.k, c.v, o), Interrupted);
  // Decode (a few rows per kv head) goes through its own path.
  testing::AttentionCase d = make_case({1, 2, 2, 1, 700, 64}, DType::bf16, DType::bf16, testing::Layout::contiguous, 5);
  EXPECT_THROW(attention(d.out, d.q, d.k, d.v, o), Interrupted);
}

TEST(Interrupt, ASetFlagStopsTheBackward) {
  testing::AttentionCase c = make_case({1, 2, 2, 40, 70, 64}, DType::bf16, DType::bf16, testing::Layout::contiguous, 6);
  testing::AttentionCase g = make_case({1, 2, 2, 40, 70, 64}, DType::bf16, DType::bf16, testing::Layout::contiguous, 7);
  attention(c.out, c.lse, c.q, c.k, c.v);
  std::atomic<bool> stop{true};
  Options o;
  o.interrupt = &stop;
  EXPECT_THROW(attention_backward(g.out, g.k, g.v, g.q, c.q, c.k, c.v, c.out, c.lse, o), Interrupted);
}

TEST(Interrupt, AClearFlagChangesNothing) {
  std::atomic<bool> stop{false};
  for (const auto& [algorithm, name] : kAlgorithmNames) {
    testing::AttentionCase a = make_case({1, 2, 2, 40, 70, 64}, DType::bf16, DType::bf16, testing::Layout::contiguous, 8);
    testing::AttentionCase b = make_case({1, 2, 2, 40, 70, 64}, DType::bf16, DType::bf16, testing::Layout::contiguous, 8);
    Options o;
    o.algorithm = algorithm;
    attention(a.out, a.lse, a.q, a.k, a.v, o);
    o.interrupt = &stop;
    attention(b.out, b.lse, b.q, b.k, b.v, o);
    EXPECT_TRUE(testing::bitwise_equal(a.out_and_lse_values(), b.out_and_lse_values())) << name;
  }
}

}  // namespace
}  // namespace flashgqa
