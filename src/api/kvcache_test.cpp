// attention_with_kvcache on every instruction-set path against the float64 reference on the gathered
// dense equivalent (each sequence's L_b keys as a [1, K, L_b, H] problem): dense and paged caches
// (page sizes 16 and 256, shuffled page tables), ragged lengths including 0 and 1, T = 1..16, every K/V
// dtype, k_new/v_new appended, windows, softcap, sinks; the same bits dense and paged and for any
// thread count; bad lengths, pages and shapes rejected with an Error before anything is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/int_math.hpp"
#include "core/problem.hpp"
#include "core/quantize_row.hpp"
#include "flash/flash_decode.hpp"
#include "flashgqa/flashgqa.hpp"
#include "reference/reference.hpp"
#include "reference/tolerance.hpp"
#include "testing/attention_case.hpp"
#include "testing/isa_test.hpp"
#include "testing/kvcache_case.hpp"

namespace flashgqa {
namespace {

using testing::bitwise_equal;

using testing::CacheCase;
using testing::CacheSpec;
using testing::KvCacheTest;
using testing::kNaN;

const std::vector<std::int32_t> kRagged = {0, 1, 37, 300, 16, 1000};

// T = 1..16 new tokens (and 24: past the decode path's row groups), G 1..8, dense and paged (16, 256),
// every K/V dtype, with and without k_new.
TEST_P(KvCacheTest, MatchesReference) {
  const DType dtypes[] = {DType::bf16, DType::f16, DType::f32, DType::i8};
  int i = 0;
  for (std::int64_t T : {1, 2, 3, 5, 8, 16, 24})
    for (std::int64_t page_size : {0, 16, 256}) {
      ++i;
      const std::int64_t G = (i % 3 == 0) ? 1 : (i % 3 == 1) ? 4 : 8;
      const CacheSpec spec{2, G, T, i % 2 ? 128 : 64, kRagged, page_size, dtypes[i % 4], i % 3 != 0};
      CacheCase c(spec, 100 + static_cast<std::uint64_t>(i));
      Options o;
      o.causal = true;
      c.run(o);
      c.expect_matches_reference(o, "causal");
    }
}

// Windows, softcap, sinks, non-causal, an explicit causal offset and Precision::f32, with row groups
// (G*T > 8) and pages.
TEST_P(KvCacheTest, VariantsMatchReference) {
  const float sinks[] = {0.5f, -1.0f, 2.0f, -std::numeric_limits<float>::infinity(), 0.0f, 1.0f, -2.0f, 3.0f};
  for (int variant = 0; variant < 7; ++variant)
    for (std::int64_t page_size : {0, 16}) {
      const CacheSpec spec{2, 4, 6, 64, {5, 0, 200, 33}, page_size, DType::bf16, variant % 2 == 0};
      CacheCase c(spec, 200 + static_cast<std::uint64_t>(variant));
      Options o;
      o.causal = variant != 3;
      std::string what;
      switch (variant) {
        case 0: o.window_left = 20, what = "window 20"; break;
        case 1: o.window_left = 7, o.window_right = 0, o.causal = false, what = "window (7, 0)"; break;
        case 2: o.softcap = 2.0, what = "softcap 2"; break;
        case 3: what = "not causal"; break;
        case 4: o.sinks = sinks, o.window_left = 40, what = "sinks and window"; break;
        case 5: o.causal_offset = 3, what = "causal offset 3"; break;
        case 6: o.precision = Precision::f32, o.block_kv = 45, what = "f32, block_kv 45"; break;
      }
      c.run(o);
      c.expect_matches_reference(o, what);
    }
}

// The same keys dense and paged (pages 16, 80 and 256) give the same bits, for 1, 2 and 3 threads; k_new
// lands in the cache (quantized, with its scale, in an int8 cache). f16 at T = 16 and f32 at T = 4
// take the row groups' once-per-block bf16 copy on avx2 (page by page when paged).
// With a window too (301 keys: its first key at no multiple of 16 or 32), some of the cases.
TEST_P(KvCacheTest, SameBitsDensePagedAndAnyThreads) {
  for (const auto& [dtype, T] : {std::pair{DType::bf16, std::int64_t{1}}, {DType::bf16, 4}, {DType::bf16, 16},
                                 {DType::i8, 1}, {DType::i8, 4}, {DType::i8, 16}, {DType::f16, 16}, {DType::f32, 4}})
    for (std::int64_t window : {-1, 301}) {
      if (window > 0 && dtype != DType::bf16 && dtype != DType::i8) continue;
      std::vector<float> first;
      // Page 80: past the small pages, but not a multiple of the amx set's P.V step (32 keys).
      for (std::int64_t page_size : {0, 16, 80, 256})
        for (int threads : {1, 2, 3}) {
          if (page_size == 80 && threads > 1) continue;  // (the others check the threads)
          const CacheSpec spec{3, 4, T, 128, {700, 1, 1300, 0}, page_size, dtype, true};
          CacheCase c(spec, 7);
          Options o;
          o.causal = true;
          o.window_left = window;
          o.threads = threads;
          c.run(o);
          if (first.empty()) first = c.out_and_lse();
          EXPECT_TRUE(bitwise_equal(first, c.out_and_lse()))
              << to_string(spec) << " window " << window << " threads " << threads;
          for (std::int64_t b = 0; b < c.B; ++b)  // the new keys are in the cache
            for (std::int64_t t = 0; t < T; ++t) {
              const std::int64_t j = spec.seqlens[static_cast<std::size_t>(b)] + t;
              const std::int64_t es = static_cast<std::int64_t>(dtype_size(c.float_dtype()));
              const std::byte* new_row = c.k_new_buf.data() + ((b * 3 + 2) * T + t) * 128 * es;
              if (dtype == DType::i8) {
                std::int8_t q8[128];
                const float scale = quantize_row(q8, new_row, DType::bf16, 128);
                ASSERT_EQ(0, std::memcmp(c.row(c.k, b, 2, j), q8, 128));
                ASSERT_EQ(scale, *c.scale_at(c.k_scale, b, 2, j));
              } else {
                ASSERT_EQ(0, std::memcmp(c.row(c.k, b, 2, j), new_row, static_cast<std::size_t>(128 * es)));
              }
            }
        }
    }
}

// Paged caches run a sequence's kv heads in groups (flash_decode.cpp, decode_group_heads), checked
// against the dense cache's bits, where every task is one head: 8 kv heads, 24 tasks at T = 1 (the
// first sequence's keys in two splits), in groups of 6 on 1 thread and of 2 on 3 threads.
TEST_P(KvCacheTest, HeadGroupsGiveTheBitsOfOneHeadATask) {
  EXPECT_EQ(8, decode_group_heads(8, 4, 128, 2, 64, 1));
  EXPECT_EQ(6, decode_group_heads(8, 4, 128, 2, 24, 1));
  EXPECT_EQ(2, decode_group_heads(8, 4, 128, 2, 24, 3));
  EXPECT_EQ(1, decode_group_heads(8, 4, 128, 2, 24, 16));
  EXPECT_EQ(5, decode_group_heads(32, 64, 256, 2, 100000, 1));  // the state of 5 heads fits 512 KiB
  EXPECT_EQ(3, decode_group_heads(32, 64, 256, 4, 100000, 1));  // with fp32 Q rows (packed blocks) 3
  for (const auto& [dtype, T] : {std::pair{DType::bf16, std::int64_t{1}}, {DType::i8, 1}, {DType::bf16, 4}}) {
    std::vector<float> first;
    for (std::int64_t page_size : {0, 16, 256})
      for (int threads : {1, 3}) {
        if (page_size == 0 && threads > 1) continue;  // (the dense cache's tasks are one head each)
        const CacheSpec spec{8, 4, T, 128, {2100, 700}, page_size, dtype, true};
        CacheCase c(spec, 11);
        Options o;
        o.causal = true;
        o.threads = threads;
        c.run(o);
        if (first.empty()) first = c.out_and_lse();
        EXPECT_TRUE(bitwise_equal(first, c.out_and_lse())) << to_string(spec) << " threads " << threads;
      }
  }
}

// to's queries set to from's values (the same shape), stored in to's dtype (rounded to nearest even).
void copy_queries(const CacheCase& from, CacheCase& to) {
  const std::int64_t es = static_cast<std::int64_t>(dtype_size(to.q.dtype));
  for (std::int64_t n = 0; n < from.q.numel(); ++n) {
    const float x = load_element(from.q_buf.data(), from.q.dtype, n);
    store_row(to.q_buf.data() + n * es, to.q.dtype, &x, 1);
  }
}

// Causal, with a window of 100 keys on every third case i and a softcap of 5 on every fourth.
Options causal_variant(int i) {
  Options o;
  o.causal = true;
  if (i % 3 == 0) o.window_left = 100;
  if (i % 4 == 0) o.softcap = 5.0;
  return o;
}

// An int8 cache gives the bits of a float32 cache holding the products it stands for, on every path
// (the decode kernels scale the rows as they read them; the others read a dequantized copy), dense
// and paged, with row groups, windows and softcap, where the call takes the products form
// (kvcache_int8_form(G, T, H); on amx also T = 4 and 16 at G = 4, 16 rows in one row group and in
// four, which run on the block's bf16 products); in the integers form (avx2, avx512bf16, amx) it meets
// the reference's bound for that form.
TEST_P(KvCacheTest, Int8GivesTheBitsOfItsFloat32Products) {
  int i = 0;
  for (std::int64_t T : {1, 4, 16})
    for (std::int64_t page_size : {0, 16, 256})
      for (std::int64_t H : {128, 40}) {
        ++i;
        const CacheSpec spec{2, (i / 2) % 2 ? 4 : 1, T, H, {0, 1, 333, 64, 1100}, page_size, DType::i8, false};
        CacheCase c8(spec, 40 + static_cast<std::uint64_t>(i));
        CacheSpec fspec = spec;
        fspec.dtype = DType::f32;
        CacheCase c32(fspec, 40 + static_cast<std::uint64_t>(i));
        c32.logical_k = c8.logical_k, c32.logical_v = c8.logical_v;  // the products, into the f32 cache
        for (std::int64_t b = 0; b < c8.B; ++b)
          for (std::int64_t kh = 0; kh < spec.K; ++kh)
            for (std::int64_t j = 0; j < spec.seqlens[static_cast<std::size_t>(b)]; ++j)
              for (auto [view, logical] : {std::pair{&c32.k, &c32.logical_k}, std::pair{&c32.v, &c32.logical_v}})
                store_row(c32.row(*view, b, kh, j), DType::f32,
                          &(*logical)[static_cast<std::size_t>(((b * spec.K + kh) * c32.S_log + j) * H)], H);
        copy_queries(c8, c32);
        const Options o = causal_variant(i);
        c8.run(o);
        c32.run(o);
        // In the integers form (microkernels.hpp) the decode path computes otherwise: only the bound.
        if (std::string(kvcache_int8_form(spec.G, spec.T, spec.H)) == "products") {
          EXPECT_TRUE(bitwise_equal(c32.out_and_lse(), c8.out_and_lse())) << to_string(spec);
        }
        c8.expect_matches_reference(o, "int8");
      }
}

// A float32 or float16 cache gives the bits of a bf16 cache holding its values rounded to bf16 (the
// operands decide the bits, microkernels.hpp; the queries likewise), dense and paged, with row groups
// (T = 4, 16 at G = 4: the avx2 set's once-per-block bf16 copy of f16/f32 rows), H = 128 and 40 (the
// kernels' fast and generic paths), windows and softcap.
TEST_P(KvCacheTest, FloatCachesGiveTheBitsOfTheirBf16Operands) {
  int i = 0;
  for (DType dtype : {DType::f32, DType::f16})
    for (std::int64_t T : {1, 4, 16})
      for (std::int64_t page_size : {0, 16, 256})
        for (std::int64_t H : {128, 40}) {
          ++i;
          const CacheSpec spec{2, 4, T, H, {0, 1, 333, 64, 1100}, page_size, dtype, false};
          CacheCase c(spec, 60 + static_cast<std::uint64_t>(i));
          CacheSpec bf_spec = spec;
          bf_spec.dtype = DType::bf16;
          CacheCase bf(bf_spec, 60 + static_cast<std::uint64_t>(i));
          std::vector<float> x(static_cast<std::size_t>(H));
          for (std::int64_t b = 0; b < c.B; ++b)
            for (std::int64_t kh = 0; kh < spec.K; ++kh)
              for (std::int64_t j = 0; j < spec.seqlens[static_cast<std::size_t>(b)]; ++j)
                for (auto [from, to] : {std::pair{&c.k, &bf.k}, std::pair{&c.v, &bf.v}}) {
                  for (std::int64_t h = 0; h < H; ++h)
                    x[static_cast<std::size_t>(h)] = load_element(c.row(*from, b, kh, j), dtype, h);
                  store_row(bf.row(*to, b, kh, j), DType::bf16, x.data(), H);  // nearest even
                }
          copy_queries(c, bf);
          const Options o = causal_variant(i);
          c.run(o);
          bf.run(o);
          EXPECT_TRUE(bitwise_equal(bf.out_and_lse(), c.out_and_lse())) << to_string(spec);
        }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, KvCacheTest, ::testing::ValuesIn(testing::kAllIsas), testing::isa_test_name);

// Bad input: an Error that names the problem, and the cache untouched.
TEST(KvCache, RejectsBadInput) {
  const CacheSpec spec{1, 2, 2, 64, {20, 10}, 16, DType::bf16, true};
  auto expect_error = [&](auto change, const std::string& fragment) {
    CacheCase c(spec, 3);
    const std::vector<std::byte> before = c.k_buf;
    KvCache cache = c.cache();
    Options o;
    change(c, cache, o);
    try {
      attention_with_kvcache(c.out, c.q, cache, o);
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    EXPECT_TRUE(before == c.k_buf) << fragment << ": the cache was written";
  };
  std::vector<std::int32_t> too_long = {20, 31}, negative = {-1, 3};
  expect_error([&](CacheCase&, KvCache& k, Options&) { k.seqlens = too_long.data(); }, "seqlens[1] = 31");
  expect_error([&](CacheCase&, KvCache& k, Options&) { k.seqlens = negative.data(); }, "seqlens[0] = -1");
  expect_error([&](CacheCase& c, KvCache&, Options&) { c.table[1] = static_cast<std::int32_t>(c.num_pages); },
               "block_table[0][1]");
  expect_error([&](CacheCase& c, KvCache&, Options&) { c.table[2] = -1; }, "block_table[1][0]");
  expect_error([&](CacheCase&, KvCache& k, Options&) { k.k.shape[2] = 24, k.v.shape[2] = 24; }, "page_size 24");
  expect_error([&](CacheCase&, KvCache& k, Options&) { k.v_new = nullptr; }, "v_new");
  expect_error([&](CacheCase& c, KvCache& k, Options&) { c.k_new.shape[2] = 3, k.k_new = &c.k_new; }, "k_new: shape");
  expect_error([&](CacheCase& c, KvCache& k, Options&) { c.k_new.dtype = DType::f16, k.k_new = &c.k_new; }, "k_new: dtype");
  expect_error([&](CacheCase&, KvCache& k, Options&) { k.k.shape[3] = 32; }, "k_cache: shape");
  expect_error([&](CacheCase&, KvCache& k, Options&) { k.seqlens = nullptr; }, "seqlens: null");
  expect_error([&](CacheCase& c, KvCache&, Options&) { c.out.shape[3] = 1; }, "out: shape");
  expect_error([&](CacheCase& c, KvCache& k, Options&) { c.out = k.k, c.out.rank = 5, c.out.shape = {2, 1, 2, 2, 64}, c.out.stride = {256, 256, 128, 64, 1}, c.out.dtype = DType::bf16; },
               "out: memory overlaps k_cache");
  // Appends into a page another sequence, or the same one elsewhere, holds (seqlens {20, 10}, T = 2:
  // sequence 0 appends rows 4..5 of its page 1 = table[1], sequence 1 rows 10..11 of table[2]).
  expect_error([&](CacheCase& c, KvCache&, Options&) { c.table[2] = c.table[1]; },
               "sequence 0 appends k_new/v_new into rows 4..5 of page " + std::to_string(CacheCase(spec, 3).table[1]) +
                   ", which sequence 1 also holds (block_table[1][0]), rows 0..11");
  expect_error([&](CacheCase& c, KvCache&, Options&) { c.table[1] = c.table[0]; },
               "which it also holds at block_table[0][0], rows 0..15");
  expect_error([&](CacheCase& c, KvCache&, Options&) { c.table[2] = c.table[0]; },  // a shared prefix appended into
               "sequence 1 appends k_new/v_new into rows 10..11");
  std::int32_t cu[] = {0, 1};
  expect_error([&](CacheCase&, KvCache&, Options& o) { o.cu_seqlens_q = o.cu_seqlens_k = cu, o.num_sequences = 1; },
               "cu_seqlens");
  // A dense cache too short for the new keys.
  CacheCase dense(CacheSpec{1, 2, 2, 64, {10, 20}, 0, DType::bf16, true}, 4);
  KvCache cache = dense.cache();
  cache.k.shape[2] = cache.v.shape[2] = 21;
  EXPECT_THROW(attention_with_kvcache(dense.out, dense.q, cache), Error);
}

// Scale views of any strides (here every scale two floats apart, and [dim0, rows, K] transposed) give
// the bits of contiguous ones; H = 256 and 96 (the fast path's widest rows, the generic path at
// H = Hp) and 40 (a tail), with k_new appended into them and row groups (G*T = 12).
TEST_P(KvCacheTest, Int8ScalesOfAnyStrides) {
  for (std::int64_t H : {256, 96, 40})
    for (std::int64_t page_size : {0, 16, 256}) {
      const CacheSpec spec{2, 4, 3, H, {0, 1, 70, 300}, page_size, DType::i8, true};
      CacheCase plain(spec, 61), strided(spec, 61), transposed(spec, 61);
      const std::int64_t dim0 = plain.k_scale.shape[0], K = 2, rows = plain.k_scale.shape[2];
      std::vector<float> pad_k(plain.k_scale_buf.size() * 2), pad_v(pad_k.size()), tr_k(plain.k_scale_buf.size()),
          tr_v(tr_k.size());
      for (auto [c, buf_k, buf_v, stride] :
           {std::tuple{&strided, &pad_k, &pad_v, std::array<std::int64_t, 5>{K * rows * 2, rows * 2, 2}},
            std::tuple{&transposed, &tr_k, &tr_v, std::array<std::int64_t, 5>{rows * K, 1, K}}})
        for (auto [view, buf, src] : {std::tuple{&c->k_scale, buf_k, &c->k_scale_buf},
                                      std::tuple{&c->v_scale, buf_v, &c->v_scale_buf}}) {
          for (std::int64_t i = 0; i < dim0; ++i)
            for (std::int64_t kh = 0; kh < K; ++kh)
              for (std::int64_t r = 0; r < rows; ++r)
                (*buf)[static_cast<std::size_t>(i * stride[0] + kh * stride[1] + r * stride[2])] =
                    (*src)[static_cast<std::size_t>((i * K + kh) * rows + r)];
          view->data = buf->data();
          view->stride = stride;
        }
      Options o;
      o.causal = true;
      plain.run(o);
      strided.run(o);
      transposed.run(o);
      EXPECT_TRUE(bitwise_equal(plain.out_and_lse(), strided.out_and_lse())) << to_string(spec);
      EXPECT_TRUE(bitwise_equal(plain.out_and_lse(), transposed.out_and_lse())) << to_string(spec);
      plain.expect_matches_reference(o, "int8");
    }
}

// An int8 cache: scales missing, misshapen or beside a float cache, dtypes mixed, non-finite new
// keys; an Error naming the problem, and the cache and its scales untouched.
TEST(KvCache, RejectsBadInt8Input) {
  const CacheSpec spec{1, 2, 2, 64, {20, 10}, 16, DType::i8, true};
  auto expect_error = [&](auto change, const std::string& fragment) {
    CacheCase c(spec, 3);
    const std::vector<std::byte> before = c.k_buf;
    const std::vector<float> scales_before = c.k_scale_buf;
    KvCache cache = c.cache();
    change(c, cache);
    try {
      attention_with_kvcache(c.out, c.q, cache);
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
    EXPECT_TRUE(before == c.k_buf) << fragment << ": the cache was written";
    EXPECT_TRUE(std::equal(scales_before.begin(), scales_before.end(), c.k_scale_buf.begin(),
                           [](float a, float b) { return std::memcmp(&a, &b, 4) == 0; }))
        << fragment << ": the scales were written";
  };
  expect_error([](CacheCase&, KvCache& k) { k.k_scale = nullptr; }, "k_scale: null, expected float32 scales");
  expect_error([](CacheCase& c, KvCache& k) { c.v_scale.shape[2] = 8, k.v_scale = &c.v_scale; }, "v_scale: shape");
  expect_error([](CacheCase& c, KvCache& k) { c.k_scale.dtype = DType::bf16, k.k_scale = &c.k_scale; },
               "k_scale: dtype bfloat16, expected float32");
  expect_error([](CacheCase&, KvCache& k) { k.v.dtype = DType::f16; }, "expected int8 (k and v are quantized together)");
  expect_error([](CacheCase& c, KvCache& k) { c.k_new.dtype = DType::i8, k.k_new = &c.k_new; }, "k_new: dtype int8");
  expect_error([](CacheCase& c, KvCache&) { store_row(c.v_new_buf.data() + 2 * (64 + 5), DType::bf16,
                                                      std::vector<float>{kNaN}.data(), 1); },
               "v_new: [0,0,1,5] is not finite");
  expect_error([](CacheCase&, KvCache& k) { k.v_scale = k.k_scale; }, "v_scale: the same memory as k_scale");
  expect_error([](CacheCase& c, KvCache& k) { c.k_scale.stride = {0, 0, 0}, k.k_scale = &c.k_scale; },
               "k_scale: shape [7,1,16] with strides [0,0,0] makes different elements share memory");
  expect_error([](CacheCase& c, KvCache& k) { c.k_scale = c.q, c.k_scale.rank = 3, c.k_scale.dtype = DType::f32,
                                               c.k_scale.shape = c.k.shape, c.k_scale.stride = {128, 64, 1};
                                               k.k_scale = &c.k_scale; },
               "memory overlaps k_scale");
  // Scales with a float cache.
  CacheCase f(CacheSpec{1, 2, 2, 64, {20, 10}, 16, DType::bf16, true}, 3);
  KvCache cache = f.cache();
  TensorView scale = contiguous_view(f.lse_buf.data(), DType::f32, {1, 1, 1});
  cache.k_scale = &scale;
  try {
    attention_with_kvcache(f.out, f.q, cache);
    ADD_FAILURE() << "no error for scales with a bfloat16 cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k_scale: given for a bfloat16 cache"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flashgqa
