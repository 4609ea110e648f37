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

namespace flashgqa {
namespace {

using testing::bitwise_equal;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct CacheSpec {
  std::int64_t K, G, T, H;
  std::vector<std::int32_t> seqlens;  // keys in the cache before the call
  std::int64_t page_size;             // 0: dense
  DType dtype;
  bool with_new;
};

std::string to_string(const CacheSpec& s) {
  std::string lens;
  for (std::int32_t L : s.seqlens) lens += (lens.empty() ? "" : ",") + std::to_string(L);
  return "K " + std::to_string(s.K) + " G " + std::to_string(s.G) + " T " + std::to_string(s.T) + " H " +
         std::to_string(s.H) + " seqlens [" + lens + "] " +
         (s.page_size ? "page " + std::to_string(s.page_size) : std::string("dense")) + " " + dtype_name(s.dtype) +
         (s.with_new ? " k_new" : "");
}

// A cache laid out as the spec says; the same seed gives the same logical keys, values and queries in
// every layout. Rows no sequence holds are NaN (a read of one would show; in an int8 cache their
// scales are NaN). An int8 cache holds quantize_row of the logical rows, and the logical rows become
// the values it stands for (the fp32 products), so the reference sees exactly what the cache holds;
// q and k_new/v_new are then bfloat16 (k_new/v_new quantized by the call).
struct CacheCase {
  CacheSpec spec;
  std::int64_t B = 0, S_max = 0, S_log = 0, max_pages = 0, num_pages = 0;
  std::vector<float> logical_k, logical_v;  // [B][K][S_log][H]: keys 0..L_b + T of each sequence
  std::vector<std::byte> k_buf, v_buf, q_buf, out_buf, k_new_buf, v_new_buf;
  std::vector<float> lse_buf, k_scale_buf, v_scale_buf;
  std::vector<std::int32_t> table;
  TensorView k, v, q, out, lse, k_new, v_new, k_scale, v_scale;

  bool int8() const { return spec.dtype == DType::i8; }
  // The dtype of q and k_new/v_new.
  DType float_dtype() const { return int8() ? DType::bf16 : spec.dtype; }

  // An int8 cache's logical row: quantized (from its float_dtype() rounding when it is a new key, as
  // the call sees it) and replaced by the products it stands for; the int8 row and scale returned.
  float quantize_logical(float* x, std::int8_t* q8, bool as_new) const {
    std::vector<float> r(x, x + spec.H);
    if (as_new)
      for (float& f : r) f = round_to_bf16(f);
    const float scale = quantize_row(q8, r.data(), DType::f32, spec.H);
    for (std::int64_t h = 0; h < spec.H; ++h) x[h] = static_cast<float>(q8[h]) * scale;
    return scale;
  }

  CacheCase(const CacheSpec& s, std::uint64_t seed) : spec(s) {
    B = static_cast<std::int64_t>(s.seqlens.size());
    std::int64_t longest = 1;
    for (std::int32_t L : s.seqlens) longest = std::max<std::int64_t>(longest, L + s.T);
    S_log = longest;
    S_max = s.page_size ? round_up(longest, s.page_size) : longest + 3;  // dense: some room to spare
    const std::int64_t K = s.K, H = s.H, T = s.T, es = static_cast<std::int64_t>(dtype_size(s.dtype));
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    logical_k.assign(static_cast<std::size_t>(B * K * S_log * H), 0.0f);
    logical_v = logical_k;
    for (auto* x : {&logical_k, &logical_v})
      for (float& f : *x) f = normal(rng);
    if (s.page_size) {
      max_pages = S_max / s.page_size;
      num_pages = B * max_pages + 3;  // spare pages, never used
      std::vector<std::int32_t> pages(static_cast<std::size_t>(num_pages));
      std::iota(pages.begin(), pages.end(), 0);
      std::mt19937_64 page_rng(seed + 1);  // q's values stay those of the dense case
      std::shuffle(pages.begin(), pages.end(), page_rng);
      table.assign(pages.begin(), pages.begin() + B * max_pages);
    }
    const std::int64_t dim0 = s.page_size ? num_pages : B, rows = s.page_size ? s.page_size : S_max;
    for (auto [buf, view] : {std::pair{&k_buf, &k}, std::pair{&v_buf, &v}}) {
      buf->assign(static_cast<std::size_t>(dim0 * K * rows * H * es), std::byte{0});
      *view = contiguous_view(buf->data(), s.dtype, {dim0, K, rows, H});
      std::vector<float> nan_row(static_cast<std::size_t>(H), kNaN);
      if (!int8())
        for (std::int64_t i = 0; i < dim0 * K * rows; ++i) store_row(buf->data() + i * H * es, s.dtype, nan_row.data(), H);
    }
    if (int8())
      for (auto [buf, view] : {std::pair{&k_scale_buf, &k_scale}, std::pair{&v_scale_buf, &v_scale}}) {
        buf->assign(static_cast<std::size_t>(dim0 * K * rows), kNaN);
        *view = contiguous_view(buf->data(), DType::f32, {dim0, K, rows});
      }
    const DType fd = float_dtype();
    const std::int64_t fes = static_cast<std::int64_t>(dtype_size(fd));
    if (s.with_new)  // from the logical rows before an int8 cache replaces them
      for (auto [buf, view, logical] :
           {std::tuple{&k_new_buf, &k_new, &logical_k}, std::tuple{&v_new_buf, &v_new, &logical_v}}) {
        buf->resize(static_cast<std::size_t>(B * K * T * H * fes));
        *view = contiguous_view(buf->data(), fd, {B, K, T, H});
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t kh = 0; kh < K; ++kh)
            for (std::int64_t t = 0; t < T; ++t)
              store_row(buf->data() + ((b * K + kh) * T + t) * H * fes, fd,
                        &(*logical)[static_cast<std::size_t>(((b * K + kh) * S_log + s.seqlens[static_cast<std::size_t>(b)] + t) * H)], H);
      }
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t kh = 0; kh < K; ++kh)
        for (std::int64_t j = 0; j < s.seqlens[static_cast<std::size_t>(b)] + (s.with_new ? T : 0); ++j)
          for (auto [view, logical, scale] :
               {std::tuple{&k, &logical_k, &k_scale}, std::tuple{&v, &logical_v, &v_scale}}) {
            float* x = &(*logical)[static_cast<std::size_t>(((b * K + kh) * S_log + j) * H)];
            const bool as_new = j >= s.seqlens[static_cast<std::size_t>(b)];
            if (int8()) {
              std::vector<std::int8_t> q8(static_cast<std::size_t>(H));
              const float sc = quantize_logical(x, q8.data(), as_new);
              if (!as_new) {
                std::memcpy(row(*view, b, kh, j), q8.data(), static_cast<std::size_t>(H));
                *scale_at(*scale, b, kh, j) = sc;
              }
            } else if (!as_new) {
              store_row(row(*view, b, kh, j), s.dtype, x, H);
            }
          }
    q_buf.resize(static_cast<std::size_t>(B * K * s.G * T * H * fes));
    q = contiguous_view(q_buf.data(), fd, {B, K, s.G, T, H});
    std::vector<float> qrow(static_cast<std::size_t>(H));
    for (std::int64_t i = 0; i < B * K * s.G * T; ++i) {
      for (float& f : qrow) f = normal(rng);
      store_row(q_buf.data() + i * H * fes, fd, qrow.data(), H);
    }
    out_buf.resize(static_cast<std::size_t>(B * K * s.G * T * H * 4));
    out = contiguous_view(out_buf.data(), DType::f32, {B, K, s.G, T, H});
    lse_buf.assign(static_cast<std::size_t>(B * K * s.G * T), kNaN);
    lse = contiguous_view(lse_buf.data(), DType::f32, {B, K, s.G, T});
    std::fill(reinterpret_cast<float*>(out_buf.data()), reinterpret_cast<float*>(out_buf.data()) + B * K * s.G * T * H, kNaN);
  }

  // Key j of kv head kh of sequence b in cache view t.
  std::byte* row(const TensorView& t, std::int64_t b, std::int64_t kh, std::int64_t j) const {
    const std::int64_t es = static_cast<std::int64_t>(dtype_size(t.dtype));
    std::int64_t at = b * t.stride[0] + kh * t.stride[1] + j * t.stride[2];
    if (spec.page_size)
      at = table[static_cast<std::size_t>(b * max_pages + j / spec.page_size)] * t.stride[0] + kh * t.stride[1] +
           (j % spec.page_size) * t.stride[2];
    return static_cast<std::byte*>(t.data) + at * es;
  }
  // The scale of key j of kv head kh of sequence b in scale view t.
  float* scale_at(const TensorView& t, std::int64_t b, std::int64_t kh, std::int64_t j) const {
    std::int64_t at = b * t.stride[0] + kh * t.stride[1] + j * t.stride[2];
    if (spec.page_size)
      at = table[static_cast<std::size_t>(b * max_pages + j / spec.page_size)] * t.stride[0] + kh * t.stride[1] +
           (j % spec.page_size) * t.stride[2];
    return static_cast<float*>(t.data) + at;
  }

  KvCache cache() {
    KvCache c;
    c.k = k;
    c.v = v;
    c.seqlens = spec.seqlens.data();
    if (spec.page_size) {
      c.block_table = table.data();
      c.max_pages = max_pages;
    }
    if (spec.with_new) {
      c.k_new = &k_new;
      c.v_new = &v_new;
    }
    if (int8()) {
      c.k_scale = &k_scale;
      c.v_scale = &v_scale;
    }
    return c;
  }

  void run(const Options& o) { attention_with_kvcache(out, lse, q, cache(), o); }

  std::vector<float> out_and_lse() const {
    std::vector<float> r(reinterpret_cast<const float*>(out_buf.data()),
                         reinterpret_cast<const float*>(out_buf.data()) + out_buf.size() / 4);
    r.insert(r.end(), lse_buf.begin(), lse_buf.end());
    return r;
  }

  // Each sequence's output and lse against the reference on its dense [1, K, L_b, H] equivalent (for
  // an int8 cache, float32 rows of the products it stands for). Where the decode kernels take int8 in
  // the integers form (microkernels.hpp), which rounds neither K nor V, the reference runs under
  // Precision::f32 and the check adds that form's own errors (tolerance.hpp, ExtraError).
  void expect_matches_reference(const Options& o, const std::string& what) {
    const bool integers = int8() && o.precision == Precision::bf16 && std::string(kvcache_int8_form()) == "integers";
    float max_v_scale = 0.0f;
    for (float x : v_scale_buf)
      if (std::isfinite(x)) max_v_scale = std::max(max_v_scale, std::fabs(x));
    const DType dense_dtype = int8() ? DType::f32 : spec.dtype;
    const std::int64_t K = spec.K, H = spec.H, T = spec.T, es = static_cast<std::int64_t>(dtype_size(dense_dtype));
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t L = spec.seqlens[static_cast<std::size_t>(b)] + (spec.with_new ? T : 0);
      std::vector<std::byte> kd(static_cast<std::size_t>(std::max<std::int64_t>(K * L * H * es, 1))), vd = kd;
      std::vector<float> rowf(static_cast<std::size_t>(H));
      for (std::int64_t kh = 0; kh < K; ++kh)
        for (std::int64_t j = 0; j < L; ++j)
          for (auto [dst, logical] : {std::pair{&kd, &logical_k}, std::pair{&vd, &logical_v}}) {
            std::copy_n(&(*logical)[static_cast<std::size_t>(((b * K + kh) * S_log + j) * H)], H, rowf.begin());
            store_row(dst->data() + (kh * L + j) * H * es, dense_dtype, rowf.data(), H);
          }
      auto entry = [b](TensorView t) {
        t.data = static_cast<char*>(t.data) + b * t.stride[0] * static_cast<std::int64_t>(dtype_size(t.dtype));
        t.shape[0] = 1;
        return t;
      };
      const TensorView out_b = entry(out), lse_b = entry(lse), q_b = entry(q);
      Options ob = o;
      ob.causal_offset = o.causal_offset.value_or(L - T);
      if (integers) ob.precision = Precision::f32;
      const Problem p = make_problem(out_b, &lse_b, q_b, contiguous_view(kd.data(), dense_dtype, {1, K, L, H}),
                                     contiguous_view(vd.data(), dense_dtype, {1, K, L, H}), ob);
      const ReferenceResult ref = reference_attention(p);
      ExtraError extra;
      if (integers) {
        extra.logit = std::fabs(static_cast<double>(p.scale)) * static_cast<double>(H) * ref.max_abs_q *
                      ref.max_abs_k * (0x1p-16 + 0x1p-22);
        extra.weight_rel = 0x1p-8;
        extra.out = 16.0 * 128.0 * (0x1p-16 + 0x1p-22) * max_v_scale;
      }
      const ErrorReport r = check_against_reference(p, ref, any_key_sums(p), false, extra);
      EXPECT_TRUE(r.ok) << what << " " << to_string(spec) << " sequence " << b << ": " << r.describe();
    }
  }
};

class KvCacheTest : public testing::IsaTest {
 protected:
  void SetUp() override {
    IsaTest::SetUp();
    if (IsSkipped()) return;  // a path this machine lacks: leave the active one alone
    saved_ = active_isa();
    set_isa(isa());
  }
  void TearDown() override {
    if (!IsSkipped()) set_isa(saved_);
  }
  Isa saved_ = Isa::portable;
};

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
  EXPECT_EQ(8, decode_group_heads(8, 4, 128, 64, 1));
  EXPECT_EQ(6, decode_group_heads(8, 4, 128, 24, 1));
  EXPECT_EQ(2, decode_group_heads(8, 4, 128, 24, 3));
  EXPECT_EQ(1, decode_group_heads(8, 4, 128, 24, 16));
  EXPECT_EQ(5, decode_group_heads(32, 64, 256, 100000, 1));  // the state of 5 heads fits 512 KiB
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
// and paged, with row groups, windows and softcap, where the decode kernels take the products form;
// in the integers form (avx512bf16, amx) it meets the reference's bound for that form.
TEST_P(KvCacheTest, Int8GivesTheBitsOfItsFloat32Products) {
  int i = 0;
  for (std::int64_t T : {1, 16})
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
        if (std::string(kvcache_int8_form()) == "products") {
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
