// The fast flash path on every instruction set this machine supports, against the float64 reference
// (tolerances from reference/tolerance.hpp): awkward shapes, block sizes that divide nothing, causal
// offsets, strided layouts, the KV-split path, bitwise identity across thread counts, NaN and fully
// masked rows.
#include "flash/flash_packed.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "flash/block_sizes.hpp"
#include "kernels/microkernels.hpp"
#include "reference/reference.hpp"
#include "reference/tolerance.hpp"
#include "flash/flash_testing.hpp"
#include "testing/attention_case.hpp"
#include "testing/isa_test.hpp"
#include "testing/masked_rows.hpp"

namespace flashgqa {
namespace {

using testing::AttentionCase;
using testing::Layout;
using testing::make_case;
using testing::Shape;
using testing::bitwise_equal;
using testing::flash_problem;
using testing::run_flash_and_check;
using testing::run_flash_values;

class FlashPacked : public testing::IsaTest {};

// T, S not multiples of any block, T != S both ways, T = 1, G = 1 and 8, H from 1 to 256 (H % 32 != 0
// included), B.K below and above the thread count.
const Shape kShapes[] = {
    {1, 1, 1, 1, 1, 1},     {1, 2, 4, 37, 53, 64}, {2, 3, 1, 19, 70, 80}, {1, 1, 8, 5, 129, 128},
    {1, 1, 2, 33, 17, 256}, {1, 2, 3, 1, 41, 128}, {3, 1, 2, 23, 23, 17}, {1, 1, 4, 70, 300, 96},
};

TEST_P(FlashPacked, MatchesReferenceOnAwkwardShapes) {
  int seed = 0;
  for (const Shape& shape : kShapes)
    for (Precision precision : {Precision::bf16, Precision::f32})
      for (DType dtype : {DType::bf16, DType::f32, DType::f16}) {
        AttentionCase c = make_case(shape, dtype, dtype, Layout::contiguous, ++seed);
        Options o;
        o.precision = precision;
        const ErrorReport r = run_flash_and_check(c, o, isa());
        EXPECT_TRUE(r.ok) << testing::to_string(shape) << " " << precision_name(precision) << " "
                          << dtype_name(dtype) << ": " << r.describe();
      }
}

TEST_P(FlashPacked, MatchesReferenceWithBlocksThatDivideNothing) {
  const Shape shape{1, 2, 3, 29, 101, 64};
  int seed = 100;
  for (std::int64_t bq : {1, 7, 16, 1000})
    for (std::int64_t bkv : {1, 13, 32, 45, 64, 5000}) {
      Options o;
      o.block_q = bq;
      o.block_kv = bkv;
      o.causal = (bq + bkv) % 2 == 0;
      AttentionCase c = make_case(shape, DType::bf16, DType::bf16, Layout::contiguous, ++seed);
      const ErrorReport r = run_flash_and_check(c, o, isa());
      EXPECT_TRUE(r.ok) << "block_q " << bq << " block_kv " << bkv << ": " << r.describe();
    }
}

TEST_P(FlashPacked, CausalAtSeveralOffsets) {
  int seed = 200;
  for (const Shape& shape : {Shape{1, 2, 4, 37, 53, 64}, Shape{2, 1, 1, 70, 24, 80},
                             Shape{1, 1, 2, 1, 33, 128}, Shape{1, 1, 4, 100, 100, 128}})
    for (std::optional<std::int64_t> offset :
         {std::optional<std::int64_t>{}, std::optional<std::int64_t>{0}, std::optional<std::int64_t>{-3},
          std::optional<std::int64_t>{-40}, std::optional<std::int64_t>{7},
          std::optional<std::int64_t>{-1000}, std::optional<std::int64_t>{1000}})
      for (Precision precision : {Precision::bf16, Precision::f32}) {
        Options o;
        o.causal = true;
        o.causal_offset = offset;
        o.precision = precision;
        o.block_q = 8;
        o.block_kv = 32;
        AttentionCase c = make_case(shape, DType::f32, DType::bf16, Layout::contiguous, ++seed);
        const ErrorReport r = run_flash_and_check(c, o, isa());
        EXPECT_TRUE(r.ok) << testing::to_string(shape) << " offset "
                          << (offset ? std::to_string(*offset) : "default") << ": " << r.describe();
      }
}

// Windows: blocks skipped below and above each tile's keys, rows masked on both sides, KV splits (B.K
// = 1, 2) starting inside a block; the same bits on 1 and 2 threads.
TEST_P(FlashPacked, WindowsMatchReferenceAndKeepBitsAcrossThreads) {
  int seed = 900;
  for (const Shape& shape : {Shape{1, 2, 4, 37, 53, 64}, Shape{2, 1, 1, 70, 150, 80}, Shape{1, 1, 3, 100, 260, 128}})
    for (const testing::WindowCase& w : testing::kWindowCases)
      for (const auto& [bq, bkv] : {std::pair<std::int64_t, std::int64_t>{8, 32}, {5, 13}, {0, 0}}) {
        Options o;
        o.block_q = bq;
        o.block_kv = bkv;
        o.precision = (bq + w.left) % 2 ? Precision::f32 : Precision::bf16;
        std::vector<float> one, two;
        o.threads = 1;
        AttentionCase c = make_case(shape, DType::bf16, DType::f32, Layout::contiguous, ++seed);
        const ErrorReport r = testing::run_flash_window_and_check(c, o, w, isa(), &one);
        EXPECT_TRUE(r.ok) << testing::to_string(shape) << " " << testing::to_string(w) << " blocks " << bq << "/"
                          << bkv << ": " << r.describe();
        o.threads = 2;
        testing::run_flash_window_and_check(c, o, w, isa(), &two);
        EXPECT_TRUE(bitwise_equal(one, two)) << testing::to_string(shape) << " " << testing::to_string(w);
      }
}

TEST_P(FlashPacked, DefaultBlocksOnALongerSequence) {
  for (bool causal : {false, true}) {
    Options o;
    o.causal = causal;
    AttentionCase c =
        make_case(Shape{1, 1, 4, 150, 400, 128}, DType::bf16, DType::bf16, Layout::contiguous, 31);
    const ErrorReport r = run_flash_and_check(c, o, isa());
    EXPECT_TRUE(r.ok) << (causal ? "causal: " : "full: ") << r.describe();
  }
}

TEST_P(FlashPacked, StridedLayoutsGiveTheContiguousResult) {
  const Shape shape{2, 2, 3, 21, 34, 80};
  Options o;
  o.causal = true;
  const std::vector<float> base = run_flash_values(shape, o, isa());
  for (Layout layout : {Layout::fa, Layout::padded})
    EXPECT_TRUE(bitwise_equal(base, run_flash_values(shape, o, isa(), DType::bf16, layout)))
        << "layout " << static_cast<int>(layout);
}

// The split-KV path (few tasks: decode, B = K = 1) is taken and merges to the reference.
TEST_P(FlashPacked, SplitKvDecodeMatchesReference) {
  for (const Shape& shape : {Shape{1, 1, 4, 1, 2000, 128}, Shape{1, 2, 1, 3, 777, 64}}) {
    for (bool causal : {false, true}) {
      Options o;
      o.causal = causal;
      o.block_kv = 64;
      AttentionCase c = make_case(shape, DType::bf16, DType::bf16, Layout::contiguous, 41);
      EXPECT_GT(flash_max_kv_splits(flash_problem(c, o), isa()), 1) << testing::to_string(shape);
      const ErrorReport r = run_flash_and_check(c, o, isa());
      EXPECT_TRUE(r.ok) << testing::to_string(shape) << ": " << r.describe();
    }
  }
}

// The last two shapes (G·T <= 8 rows per kv head) take the decode path, split over KV blocks.
TEST_P(FlashPacked, SameBitsForAnyThreadCount) {
  for (const Shape& shape : {Shape{1, 3, 2, 45, 77, 64}, Shape{1, 1, 4, 1, 3000, 128}, Shape{1, 3, 2, 2, 1500, 64}}) {
    Options o;
    o.causal = true;
    o.block_kv = 64;
    testing::expect_same_bits_for_thread_counts(shape, o, isa());
  }
}

TEST_P(FlashPacked, FullyMaskedRowsGiveZeroAndMinusInfinity) {
  const Shape shape{1, 1, 2, 9, 12, 64};
  AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 5);
  Options o;
  o.causal = true;
  o.causal_offset = -4;  // queries 0..3 see no key
  flash_attention(flash_problem(c, o), isa());
  testing::expect_first_rows_masked(c, 4);
}

TEST_P(FlashPacked, NanInInputsReachesTheOutput) {
  const Shape shape{1, 1, 2, 6, 70, 64};
  Options o;
  o.causal = true;
  o.causal_offset = 40;  // query t sees keys 0..t+40: the diagonal crosses the second KV block
  o.block_kv = 32;
  {
    AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 3);
    c.set_q(0, 0, 1, 2, 5, std::numeric_limits<float>::quiet_NaN());
    flash_attention(flash_problem(c, o), isa());
    for (std::int64_t g = 0; g < 2; ++g)
      for (std::int64_t t = 0; t < 6; ++t)
        EXPECT_EQ(std::isnan(c.out_at(0, 0, g, t, 0)), g == 1 && t == 2) << "g " << g << " t " << t;
  }
  {
    AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 4);
    c.set_v(0, 0, 43, 7, std::numeric_limits<float>::quiet_NaN());  // seen by queries t >= 3
    flash_attention(flash_problem(c, o), isa());
    for (std::int64_t t = 3; t < 6; ++t) EXPECT_TRUE(std::isnan(c.out_at(0, 0, 0, t, 7))) << "t " << t;
    EXPECT_FALSE(std::isnan(c.out_at(0, 0, 0, 3, 6)));  // other columns stay finite
  }
  {  // A row whose logits are all NaN: NaN output and lse, its neighbours finite.
    AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 5);
    c.set_q(0, 0, 0, 5, 0, std::numeric_limits<float>::quiet_NaN());
    flash_attention(flash_problem(c, o), isa());
    EXPECT_TRUE(std::isnan(c.out_at(0, 0, 0, 5, 1)));
    EXPECT_TRUE(std::isnan(c.lse_at(0, 0, 0, 5)));
    EXPECT_FALSE(std::isnan(c.out_at(0, 0, 0, 4, 1)));
    EXPECT_FALSE(std::isnan(c.out_at(0, 0, 1, 5, 1)));
  }
}

TEST_P(FlashPacked, EmptyKeysAndQueries) {
  AttentionCase c = make_case(Shape{1, 2, 2, 3, 0, 64}, DType::bf16, DType::bf16, Layout::contiguous, 1);
  flash_attention(flash_problem(c, Options{}), isa());
  for (float x : c.out_values()) ASSERT_EQ(x, 0.0f);
  for (std::size_t i = 0; i + 1 < c.lse_buf.size(); ++i)
    ASSERT_EQ(c.lse_buf[i], -std::numeric_limits<float>::infinity());
  AttentionCase e = make_case(Shape{1, 2, 2, 0, 5, 64}, DType::bf16, DType::bf16, Layout::contiguous, 1);
  EXPECT_NO_THROW(flash_attention(flash_problem(e, Options{}), isa()));
}

TEST_P(FlashPacked, LargeLogitsStayFinite) {
  // Logits of several hundred: exp would overflow without the running max.
  AttentionCase c =
      make_case(Shape{1, 1, 2, 20, 90, 64}, DType::f32, DType::f32, Layout::contiguous, 9, 6.0f);
  Options o;
  o.block_kv = 32;
  const ErrorReport r = run_flash_and_check(c, o, isa());
  EXPECT_TRUE(r.ok) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(AllIsas, FlashPacked, ::testing::ValuesIn(testing::kAllIsas), testing::isa_test_name);

TEST(FlashBlocks, DefaultsFollowTheCaches) {
  Problem p;
  p.B = 1, p.K = 8, p.G = 4, p.T = 4096, p.S = 4096, p.H = 128;
  const FlashKernels& k = kernels_for(Isa::portable, Precision::bf16);
  const FlashBlocks small = choose_flash_blocks(p, k, CacheSizes{32 * 1024, 512 * 1024});
  const FlashBlocks large = choose_flash_blocks(p, k, CacheSizes{48 * 1024, 2 * 1024 * 1024});
  EXPECT_GE(small.bq, 1);
  EXPECT_GE(small.bkv, kPanelKeys);
  EXPECT_EQ(small.bkv % kPanelKeys, 0);
  EXPECT_LE(small.bq, large.bq);
  EXPECT_LE(small.bkv, large.bkv);
  EXPECT_LE(flash_workspace_bytes(p, k, large), 2 * 1024 * 1024);
}

TEST(FlashBlocks, ExplicitSizesAreKeptAndHugeOnesRejected) {
  Problem p;
  p.B = 1, p.K = 1, p.G = 4, p.T = 100, p.S = 1 << 24, p.H = 128;
  const FlashKernels& k = kernels_for(Isa::portable, Precision::bf16);
  p.block_q = 7, p.block_kv = 45;
  const FlashBlocks b = choose_flash_blocks(p, k);
  EXPECT_EQ(b.bq, 7);
  EXPECT_EQ(b.bkv, 45);
  p.block_kv = std::int64_t{1} << 24;
  try {
    choose_flash_blocks(p, k);
    ADD_FAILURE() << "expected Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block_q/block_kv"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flashgqa
