// Test inputs for attention_with_kvcache: a cache (dense or paged, any K/V dtype, k_new/v_new) laid
// out as a CacheSpec says, its logical rows kept for the float64 reference on the gathered dense
// equivalent (CacheCase::expect_matches_reference), and the fixture of the tests that run on every
// instruction-set path. Used by src/api/kvcache_test.cpp and src/api/kvcache_guard_test.cpp.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.hpp"
#include "core/int_math.hpp"
#include "core/problem.hpp"
#include "core/quantize_row.hpp"
#include "flash/flash_decode.hpp"
#include "flashgqa/flashgqa.hpp"
#include "kernels/microkernels.hpp"
#include "reference/reference.hpp"
#include "reference/tolerance.hpp"
#include "testing/attention_case.hpp"
#include "testing/guarded_memory.hpp"
#include "testing/isa_test.hpp"

namespace flashgqa::testing {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct CacheSpec {
  std::int64_t K, G, T, H;
  std::vector<std::int32_t> seqlens;  // keys in the cache before the call
  std::int64_t page_size;             // 0: dense
  DType dtype;
  bool with_new;
};

inline std::string to_string(const CacheSpec& s) {
  // (Appends only: GCC 12 warns, wrongly, on some "literal" + std::string&& once inlined.)
  std::string r = "K ";
  for (auto [name, x] : {std::pair{"", s.K}, std::pair{" G ", s.G}, std::pair{" T ", s.T}, std::pair{" H ", s.H}}) {
    r += name;
    r += std::to_string(x);
  }
  r += " seqlens [";
  for (std::size_t i = 0; i < s.seqlens.size(); ++i) {
    if (i > 0) r += ",";
    r += std::to_string(s.seqlens[i]);
  }
  r += "] ";
  if (s.page_size) {
    r += "page ";
    r += std::to_string(s.page_size);
  } else {
    r += "dense";
  }
  r += " ";
  r += dtype_name(s.dtype);
  if (s.with_new) r += " k_new";
  return r;
}

// Sequence b of an attention_with_kvcache call (out, lse and q [B, K, G, T, H]) against the float64
// reference on its L keys, given as dense [1, K, L, H] rows kd, vd of dense_dtype (an int8 cache's as
// float32 products). int8: the call read an int8 cache, which it computes with in the integers form only
// where kvcache_int8_form(G, T, H) says so (the decode kernels take the call on int8 rows): that form,
// which rounds neither K nor V, is checked under Precision::f32 with its own errors (tolerance.hpp,
// ExtraError; max_v_scale: the cache's largest V scale); the products form as bf16 rows.
inline ErrorReport sequence_against_reference(const TensorView& out, const TensorView& lse, const TensorView& q,
                                              std::int64_t b, const void* kd, const void* vd, DType dense_dtype,
                                              std::int64_t L, const Options& o, bool int8, float max_v_scale) {
  const std::int64_t K = q.shape[1], G = q.shape[2], T = q.shape[3], H = q.shape[4];
  const bool integers = int8 && o.precision == Precision::bf16 && T > 0 &&
                        std::string(kvcache_int8_form(G, T, H)) == "integers";
  auto entry = [b](TensorView t) {
    t.data = static_cast<char*>(t.data) + b * t.stride[0] * static_cast<std::int64_t>(dtype_size(t.dtype));
    t.shape[0] = 1;
    return t;
  };
  const TensorView out_b = entry(out), lse_b = entry(lse), q_b = entry(q);
  Options ob = o;
  ob.causal_offset = o.causal_offset.value_or(L - T);
  if (integers) ob.precision = Precision::f32;
  const Problem p = make_problem(out_b, &lse_b, q_b, contiguous_view(kd, dense_dtype, {1, K, L, H}),
                                 contiguous_view(vd, dense_dtype, {1, K, L, H}), ob);
  const ReferenceResult ref = reference_attention(p);
  ExtraError extra;
  if (integers) {
    extra.logit = std::fabs(static_cast<double>(p.scale)) * static_cast<double>(H) * ref.max_abs_q * ref.max_abs_k *
                  (0x1p-16 + 0x1p-22);
    extra.weight_rel = 0x1p-8;
    extra.out = 16.0 * 128.0 * (0x1p-16 + 0x1p-22) * max_v_scale;
  }
  return check_against_reference(p, ref, any_key_sums(p), false, extra);
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

  // The cache's rows and scales in guarded segments (guard()), else in k_buf, v_buf and the scale bufs.
  std::unique_ptr<GuardedSegments> k_guard, v_guard, k_scale_guard, v_scale_guard;

  // guarded: then guard().
  CacheCase(const CacheSpec& s, std::uint64_t seed, bool guarded = false) : spec(s) {
    B = static_cast<std::int64_t>(s.seqlens.size());
    std::int64_t longest = 1, held = 1;  // the keys of the longest sequence: logical, and in the cache
    for (std::int32_t L : s.seqlens) {
      longest = std::max<std::int64_t>(longest, L + s.T);
      held = std::max<std::int64_t>(held, L + (s.with_new ? s.T : 0));
    }
    S_log = longest;
    // Dense: some room to spare, but none in guarded memory, where the longest sequence ends right
    // before the guard.
    S_max = s.page_size ? round_up(longest, s.page_size) : guarded ? held : longest + 3;
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
    if (guarded) guard();
  }

  // The cache's rows and scales moved into guarded segments, one per (page or batch entry, kv head),
  // each ending right before an inaccessible page (GuardedSegments): a read past the last row of any
  // page, or of any kv head of a dense entry, faults. The views' strides change; the values do not.
  void guard() {
    const std::int64_t entries = k.shape[0] * k.shape[1];
    for (auto [view, seg] : {std::pair{&k, &k_guard}, std::pair{&v, &v_guard}, std::pair{&k_scale, &k_scale_guard},
                             std::pair{&v_scale, &v_scale_guard}}) {
      if (view->data == nullptr) continue;  // no scales: a float cache
      const std::int64_t es = static_cast<std::int64_t>(dtype_size(view->dtype));
      const std::int64_t bytes = view->shape[2] * (view->rank == 4 ? view->shape[3] : 1) * es;  // a kv head's rows
      *seg = std::make_unique<GuardedSegments>(static_cast<std::size_t>(entries), static_cast<std::size_t>(bytes));
      for (std::int64_t i = 0; i < entries; ++i)
        std::memcpy((*seg)->segment(static_cast<std::size_t>(i)), static_cast<const char*>(view->data) + i * bytes,
                    static_cast<std::size_t>(bytes));
      const std::int64_t stride = static_cast<std::int64_t>((*seg)->stride()) / es;
      view->data = (*seg)->segment(0);
      view->stride[1] = stride;
      view->stride[0] = view->shape[1] * stride;
    }
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
  // an int8 cache, float32 rows of the products it stands for; sequence_against_reference, which checks
  // the integers form with its own errors where the call takes it: calls past the decode kernels, G > 8
  // or G*T > 128, and on amx calls of 16 rows or more, G*T >= 16, take the products form).
  void expect_matches_reference(const Options& o, const std::string& what) {
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
      const ErrorReport r = sequence_against_reference(out, lse, q, b, kd.data(), vd.data(), dense_dtype, L, o,
                                                       int8(), max_v_scale);
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

}  // namespace flashgqa::testing
