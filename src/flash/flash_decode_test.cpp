// The decode path (few query rows per kv head: T = 1 or 2) through flash_attention on every
// instruction set this machine supports, against the float64 reference (reference/tolerance.hpp):
// head sizes with and without padding, key counts that no block divides, causal offsets, the FA layout,
// every input dtype and both precisions, bitwise identity across thread counts, NaN and empty rows.
// Sets without decode kernels take the packed path for the same shapes, so these run there too.
#include "flash/flash_decode.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "core/dtype.hpp"
#include "flash/flash_packed.hpp"
#include "reference/reference.hpp"
#include "reference/tolerance.hpp"
#include "flash/flash_testing.hpp"
#include "testing/attention_case.hpp"
#include "testing/isa_test.hpp"

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

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

class FlashDecode : public testing::IsaTest {};

// T in {1, 2} x G in {1, 4, 8} x H in {64, 80, 128, 256}, S cycling through 1, 37, 1000, 4099 and the
// input dtype through bf16, f32, f16; Precision::bf16 always, Precision::f32 on every other shape (the
// suite also runs under the sanitizers).
TEST_P(FlashDecode, MatchesReference) {
  const std::int64_t keys[] = {1, 37, 1000, 4099};
  const DType dtypes[] = {DType::bf16, DType::f32, DType::f16};
  int i = 0;
  for (std::int64_t T : {1, 2})
    for (std::int64_t G : {1, 4, 8})
      for (std::int64_t H : {64, 80, 128, 256}) {
        const Shape shape{1, 2, G, T, keys[i % 4], H};
        const DType dtype = dtypes[i % 3];
        ++i;
        for (Precision precision : {Precision::bf16, Precision::f32}) {
          if (precision == Precision::f32 && i % 2 == 0) continue;
          AttentionCase c = make_case(shape, dtype, dtype, Layout::contiguous, 1000 + i);
          Options o;
          o.precision = precision;
          const ErrorReport r = run_flash_and_check(c, o, isa());
          EXPECT_TRUE(r.ok) << testing::to_string(shape) << " " << precision_name(precision) << " "
                            << dtype_name(dtype) << ": " << r.describe();
        }
      }
}

// Decode-sized problems take the decode path where the set has decode kernels, with KV splits.
TEST_P(FlashDecode, IsTakenWithSplits) {
  AttentionCase c = make_case(Shape{1, 1, 4, 1, 3000, 128}, DType::bf16, DType::bf16, Layout::contiguous, 3);
  Options o;
  o.block_kv = 64;
  const Problem p = flash_problem(c, o);
  const FlashKernels& k = decode_kernels_for(isa(), p.precision);
  if (k.decode_qk_rows) {
    EXPECT_TRUE(flash_decode_applies(p, k));
    EXPECT_GT(flash_decode_kv_splits(p, k), 1);
  }
  EXPECT_GT(flash_max_kv_splits(p, isa()), 1);
  AttentionCase wide = make_case(Shape{1, 1, 8, 2, 30, 64}, DType::bf16, DType::bf16, Layout::contiguous, 3);
  EXPECT_FALSE(flash_decode_applies(flash_problem(wide, o), k));  // 16 rows: the packed path
  flash_attention(p, isa());
  const ErrorReport r = check_against_reference(p, reference_attention(p));
  EXPECT_TRUE(r.ok) << r.describe();
}

// The avx512bf16 decode kernels' fast path (bf16 K/V rows, H = 64, 128 or 256, whole key groups) and
// their generic path (any dtype and H) run the same sums in the same order: the same values given once
// as bfloat16 and once as float32 (exactly, so the same bf16 operands) give the same bits, for every
// row count, key counts with whole groups and a tail, causal or not, blocks and splits. Against the
// reference too.
TEST_P(FlashDecode, FastKernelsGiveTheGenericBits) {
  int seed = 70;
  for (std::int64_t H : {64, 128, 256})
    for (const auto& [G, T] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1},
                               {6, 1}, {7, 1}, {8, 1}, {3, 2}, {4, 2}})
      for (bool causal : {false, true}) {
        const Shape shape{1, 2, G, T, 700 + 37 * G + 5 * T, H};
        Options o;
        o.causal = causal;
        o.block_kv = causal ? 200 : 0;
        AttentionCase fast = make_case(shape, DType::bf16, DType::f32, Layout::contiguous, ++seed);
        AttentionCase generic = make_case(shape, DType::f32, DType::f32, Layout::contiguous, seed);
        for (auto [from, to] : {std::pair{&fast.q, &generic.q}, {&fast.k, &generic.k}, {&fast.v, &generic.v}}) {
          const auto* bits = static_cast<const std::uint16_t*>(from->data);  // contiguous: numel() elements
          auto* values = static_cast<float*>(to->data);
          for (std::int64_t i = 0; i < from->numel(); ++i) values[i] = bf16_bits_to_float(bits[i]);
        }
        const ErrorReport r = run_flash_and_check(fast, o, isa());
        EXPECT_TRUE(r.ok) << testing::to_string(shape) << (causal ? " causal: " : ": ") << r.describe();
        flash_attention(flash_problem(generic, o), isa());
        EXPECT_TRUE(bitwise_equal(fast.out_and_lse_values(), generic.out_and_lse_values()))
            << testing::to_string(shape) << (causal ? " causal" : "");
      }
}

// The overlap (a dense block's first row group in pieces of 32 keys, each prefetching the rows the next
// phase reads) gives the bits of one call per block: the set's decode kernels with it from 8 rows and
// without it give the same out and lse for row groups (G*T = 16 and 12), keys no piece divides,
// causal or not, blocks and splits; against the reference too. Each set's own choice is one of these
// two (decode_overlap_rows: 8, or 0 on avx2).
TEST_P(FlashDecode, OverlapGivesTheBitsOfOneCall) {
  const FlashKernels& k = decode_kernels_for(isa(), Precision::bf16);
  if (k.decode_qk_rows == nullptr) return;  // the packed path: no overlap to check
  FlashKernels with = k, without = k;
  with.decode_overlap_rows = 8;
  without.decode_overlap_rows = 0;
  with.decode_packed_rows = without.decode_packed_rows = 0;  // 16 rows in row groups (not packed blocks)
  int seed = 90;
  for (std::int64_t H : {64, 128})
    for (const Shape& shape : {Shape{1, 2, 4, 4, 1500, H}, Shape{2, 1, 4, 3, 999, H}})
      for (bool causal : {false, true}) {
        Options o;
        o.causal = causal;
        o.block_kv = causal ? 200 : 0;
        AttentionCase c = make_case(shape, DType::bf16, DType::bf16, Layout::contiguous, ++seed);
        const Problem p = flash_problem(c, o);
        ASSERT_TRUE(flash_decode_row_groups_apply(p, k));
        flash_attention_decode(p, with);
        const ErrorReport r = check_against_reference(p, reference_attention(p));
        EXPECT_TRUE(r.ok) << testing::to_string(shape) << (causal ? " causal: " : ": ") << r.describe();
        const std::vector<float> overlapped = c.out_and_lse_values();
        flash_attention_decode(p, without);
        EXPECT_TRUE(bitwise_equal(overlapped, c.out_and_lse_values()))
            << testing::to_string(shape) << (causal ? " causal" : "");
      }
}

// Packed blocks (decode_packed_rows; flash_decode.cpp), on every decode set with tiles and packers
// (its own bf16 pairs', or decode_tiles': avx512bf16's fma decode set on avx512f's fp32 tiles), from 16
// rows: against the reference with row counts past one row tile and one group of 64 (G*T = 16, 21,
// 128), G = 1, H = 40 (the packers' generic path), 64, 128 and 256, blocks that divide nothing, causal,
// a window and the softcap; the same bits on 1 and 3 threads, and with V packed (pv_tile_rows null) as
// with V's rows read where they lie.
TEST_P(FlashDecode, PackedBlocksMatchReferenceAndKeepBitsAcrossThreads) {
  const FlashKernels& k = decode_kernels_for(isa(), Precision::bf16);
  const FlashKernels& tiles = decode_tile_set(k);
  if (k.decode_qk_rows == nullptr || k.operand_bytes != 2 || tiles.qk_tile == nullptr || tiles.pack_k == nullptr)
    GTEST_SKIP() << k.name << ": no tiles and packers in this decode set";
  int seed = 400;
  for (const Shape& shape : {Shape{1, 2, 1, 16, 777, 128}, Shape{2, 1, 3, 7, 1000, 64}, Shape{1, 1, 8, 16, 300, 256},
                             Shape{1, 3, 4, 4, 513, 40}})
    for (int variant = 0; variant < 3; ++variant) {
      Options o;
      o.causal = variant != 0;
      o.block_kv = variant == 1 ? 45 : 0;
      if (variant == 2) o.window_left = 100, o.softcap = 20.0f;
      AttentionCase c = make_case(shape, DType::bf16, DType::bf16, Layout::contiguous, ++seed);
      std::vector<float> one;
      for (int threads : {1, 3}) {
        o.threads = threads;
        const Problem p = flash_problem(c, o);
        // (Handed out anew for each call: the amx set's tiles load their configuration per call.)
        FlashKernels packed = decode_kernels_for(isa(), Precision::bf16);
        packed.decode_packed_rows = 16;
        ASSERT_TRUE(flash_decode_row_groups_apply(p, packed) && decode_packs_blocks(p, packed));
        flash_attention_decode(p, packed);
        if (threads == 1) {
          const ErrorReport r = check_against_reference(p, reference_attention(p));
          EXPECT_TRUE(r.ok) << testing::to_string(shape) << " variant " << variant << ": " << r.describe();
          one = c.out_and_lse_values();
          if (tiles.pv_tile_rows != nullptr) {  // V's rows where they lie: the bits of V packed
            FlashKernels v_packed = decode_kernels_for(isa(), Precision::bf16), v_tiles = tiles;
            v_packed.decode_packed_rows = 16;
            v_tiles.pv_tile_rows = nullptr;
            v_packed.decode_tiles = &v_tiles;
            flash_attention_decode(p, v_packed);
            EXPECT_TRUE(bitwise_equal(one, c.out_and_lse_values()))
                << testing::to_string(shape) << " variant " << variant << " without pv_tile_rows";
          }
        } else {
          EXPECT_TRUE(bitwise_equal(one, c.out_and_lse_values())) << testing::to_string(shape) << " variant " << variant;
        }
      }
    }
}

// Windows in decode (G*T <= 8 rows): a key range that starts inside the cache, splits starting inside
// a block, rows of different positions with different ranges; the same bits on 1 and 2 threads.
TEST_P(FlashDecode, WindowsMatchReferenceAndKeepBitsAcrossThreads) {
  int seed = 300;
  for (const Shape& shape : {Shape{1, 1, 4, 1, 1000, 128}, Shape{1, 2, 2, 3, 777, 64}, Shape{2, 1, 8, 1, 300, 256}})
    for (const testing::WindowCase& w : testing::kWindowCases)
      for (std::int64_t bkv : {0, 45}) {
        Options o;
        o.block_kv = bkv;
        std::vector<float> one, two;
        o.threads = 1;
        AttentionCase c = make_case(shape, DType::bf16, DType::bf16, Layout::contiguous, ++seed);
        ASSERT_TRUE(flash_decode_applies(flash_problem(c, o), decode_kernels_for(isa(), Precision::bf16)) ||
                    decode_kernels_for(isa(), Precision::bf16).decode_qk_rows == nullptr);
        const ErrorReport r = testing::run_flash_window_and_check(c, o, w, isa(), &one);
        EXPECT_TRUE(r.ok) << testing::to_string(shape) << " " << testing::to_string(w) << " block_kv " << bkv
                          << ": " << r.describe();
        o.threads = 2;
        testing::run_flash_window_and_check(c, o, w, isa(), &two);
        EXPECT_TRUE(bitwise_equal(one, two)) << testing::to_string(shape) << " " << testing::to_string(w);
      }
}

TEST_P(FlashDecode, BlocksThatDivideNothing) {
  int seed = 50;
  for (std::int64_t bkv : {1, 13, 45, 64, 5000})
    for (bool causal : {false, true}) {
      Options o;
      o.block_kv = bkv;
      o.causal = causal;
      o.causal_offset = causal ? std::optional<std::int64_t>{500} : std::nullopt;
      AttentionCase c = make_case(Shape{1, 2, 4, 2, 1001, 80}, DType::bf16, DType::bf16, Layout::contiguous, ++seed);
      const ErrorReport r = run_flash_and_check(c, o, isa());
      EXPECT_TRUE(r.ok) << "block_kv " << bkv << (causal ? " causal" : "") << ": " << r.describe();
    }
}

TEST_P(FlashDecode, CausalAtSeveralOffsets) {
  int seed = 70;
  for (const Shape& shape : {Shape{1, 1, 4, 1, 100, 128}, Shape{2, 1, 3, 2, 77, 64}})
    for (std::optional<std::int64_t> offset :
         {std::optional<std::int64_t>{}, std::optional<std::int64_t>{0}, std::optional<std::int64_t>{-1},
          std::optional<std::int64_t>{5}, std::optional<std::int64_t>{40}, std::optional<std::int64_t>{-1000},
          std::optional<std::int64_t>{1000}})
      for (Precision precision : {Precision::bf16, Precision::f32}) {
        Options o;
        o.causal = true;
        o.causal_offset = offset;
        o.precision = precision;
        o.block_kv = 32;
        AttentionCase c = make_case(shape, DType::f32, DType::bf16, Layout::contiguous, ++seed);
        const ErrorReport r = run_flash_and_check(c, o, isa());
        EXPECT_TRUE(r.ok) << testing::to_string(shape) << " offset "
                          << (offset ? std::to_string(*offset) : "default") << ": " << r.describe();
      }
}

TEST_P(FlashDecode, FaLayoutGivesTheContiguousResult) {
  for (const Shape& shape : {Shape{2, 3, 4, 1, 333, 128}, Shape{1, 2, 2, 2, 90, 80}}) {
    Options o;
    o.block_kv = 64;
    const std::vector<float> base = run_flash_values(shape, o, isa());
    for (Layout layout : {Layout::fa, Layout::padded})
      EXPECT_TRUE(bitwise_equal(base, run_flash_values(shape, o, isa(), DType::bf16, layout)))
          << testing::to_string(shape) << " layout " << static_cast<int>(layout);
  }
}

TEST_P(FlashDecode, EmptyRowsGiveZeroAndMinusInfinity) {
  // T = 2, offset -1: position 0 sees no key, position 1 sees key 0 only.
  AttentionCase c = make_case(Shape{1, 2, 4, 2, 50, 64}, DType::f32, DType::f32, Layout::contiguous, 5);
  Options o;
  o.causal = true;
  o.causal_offset = -1;
  flash_attention(flash_problem(c, o), isa());
  for (std::int64_t kh = 0; kh < 2; ++kh)
    for (std::int64_t g = 0; g < 4; ++g) {
      EXPECT_EQ(c.lse_at(0, kh, g, 0), -std::numeric_limits<float>::infinity());
      EXPECT_TRUE(std::isfinite(c.lse_at(0, kh, g, 1)));
      for (std::int64_t h = 0; h < 64; ++h) {
        ASSERT_EQ(c.out_at(0, kh, g, 0, h), 0.0f);
        ASSERT_TRUE(std::isfinite(c.out_at(0, kh, g, 1, h)));
      }
    }
  AttentionCase none = make_case(Shape{1, 1, 4, 1, 0, 128}, DType::bf16, DType::bf16, Layout::contiguous, 1);
  flash_attention(flash_problem(none, Options{}), isa());
  for (float x : none.out_values()) ASSERT_EQ(x, 0.0f);
}

TEST_P(FlashDecode, NanInInputsReachesTheOutput) {
  const Shape shape{1, 1, 4, 1, 3000, 64};
  Options o;
  o.block_kv = 64;  // split: the NaN sits in one split and must survive the merge
  {
    AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 3);
    c.set_q(0, 0, 2, 0, 5, kNaN);
    flash_attention(flash_problem(c, o), isa());
    for (std::int64_t g = 0; g < 4; ++g) {
      EXPECT_EQ(std::isnan(c.out_at(0, 0, g, 0, 0)), g == 2) << "g " << g;
      EXPECT_EQ(std::isnan(c.lse_at(0, 0, g, 0)), g == 2) << "g " << g;
    }
  }
  {
    AttentionCase c = make_case(shape, DType::f32, DType::f32, Layout::contiguous, 4);
    c.set_v(0, 0, 2001, 7, kNaN);
    flash_attention(flash_problem(c, o), isa());
    for (std::int64_t g = 0; g < 4; ++g) {
      EXPECT_TRUE(std::isnan(c.out_at(0, 0, g, 0, 7))) << "g " << g;
      EXPECT_FALSE(std::isnan(c.out_at(0, 0, g, 0, 6))) << "g " << g;
    }
  }
  {  // A NaN in the last key, masked for position 0 (it sees keys 0..2998): position 1 only.
    AttentionCase c = make_case(Shape{1, 1, 2, 2, 3000, 64}, DType::f32, DType::f32, Layout::contiguous, 6);
    c.set_v(0, 0, 2999, 0, kNaN);
    Options causal = o;
    causal.causal = true;
    causal.causal_offset = 2998;
    flash_attention(flash_problem(c, causal), isa());
    for (std::int64_t g = 0; g < 2; ++g) EXPECT_TRUE(std::isnan(c.out_at(0, 0, g, 1, 0))) << "g " << g;
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, FlashDecode, ::testing::ValuesIn(testing::kAllIsas), testing::isa_test_name);

}  // namespace
}  // namespace flashgqa
