// Property test of attention_with_kvcache, on every instruction-set path: random caches (dense or
// paged, every K/V dtype, k_new or not, tables that share pages) under at most one hostile change
// (lengths out of range, page indices out of range, appends into another sequence's rows, a wrong
// k_new, missing scales, a bad page size or dtype). Every call either throws flashgqa::Error and leaves
// the cache and its scales as they were, or gives each sequence the attention over the keys its table
// names as the cache holds them after the call (gathered from the cache itself, int8 as its products)
// within the float64 reference's bounds, with the new keys where they belong. Every tensor, the table
// and the lengths live in guarded memory: a read or write past any of them faults. Rows no sequence
// holds are NaN (int8: their scales), so a read of one shows in the output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/quantize_row.hpp"
#include "flashgqa/flashgqa.hpp"
#include "reference/tolerance.hpp"
#include "testing/guarded_memory.hpp"
#include "testing/isa_test.hpp"
#include "testing/kvcache_case.hpp"

namespace flashgqa {
namespace {

using testing::GuardedBuffer;

class KvCacheProperty : public testing::KvCacheTest {};

// A contiguous tensor in guarded memory of exactly its bytes.
struct Guarded {
  std::unique_ptr<GuardedBuffer> memory;
  TensorView view;
  Guarded() = default;
  Guarded(DType dtype, std::initializer_list<std::int64_t> shape) {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    memory = std::make_unique<GuardedBuffer>(static_cast<std::size_t>(n) * dtype_size(dtype));
    view = contiguous_view(memory->data(), dtype, shape);
  }
  std::vector<char> bytes() const { return {memory->data(), memory->data() + memory->bytes()}; }
};

template <typename T, std::size_t N>
T pick(std::mt19937_64& rng, const T (&xs)[N]) {
  return xs[rng() % N];
}

TEST_P(KvCacheProperty, EveryCallMatchesItsGatheredKeysOrThrowsError) {
  std::mt19937_64 rng(40 + static_cast<std::uint64_t>(isa()));
  std::normal_distribution<float> normal;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  int computed = 0, rejected = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const std::int64_t B = pick(rng, {0, 1, 2, 3, 3}), K = pick(rng, {1, 2}), G = pick(rng, {1, 3, 4});
    const std::int64_t T = pick(rng, {0, 1, 1, 2, 5}), H = pick(rng, {16, 40, 64, 128});
    const std::int64_t P = pick(rng, {0, 16, 16, 32});
    const DType dtype = pick(rng, {DType::f32, DType::bf16, DType::f16, DType::i8});
    const bool int8 = dtype == DType::i8, with_new = rng() % 2 == 0;
    const DType fd = int8 ? DType::bf16 : dtype;                 // q's and k_new's dtype
    std::vector<std::int64_t> len(static_cast<std::size_t>(B));  // keys after the call
    std::int64_t longest = 1;
    for (std::int64_t& L : len)
      longest = std::max(longest, L = static_cast<std::int64_t>(rng() % 41) + (with_new ? T : 0));
    const std::int64_t max_pages = P ? (longest + P - 1) / P + static_cast<std::int64_t>(rng() % 2) : 0;
    const std::int64_t num_pages = P ? B * max_pages + static_cast<std::int64_t>(rng() % 3) : 0;
    const std::int64_t dim0 = P ? num_pages : B, rows = P ? P : longest + static_cast<std::int64_t>(rng() % 3);
    Guarded k(dtype, {dim0, K, rows, H}), v(dtype, {dim0, K, rows, H}), k_scale, v_scale;
    if (int8) k_scale = Guarded(DType::f32, {dim0, K, rows}), v_scale = Guarded(DType::f32, {dim0, K, rows});
    GuardedBuffer table(static_cast<std::size_t>(B * max_pages) * 4), seqlens(static_cast<std::size_t>(B) * 4);
    auto* tab = reinterpret_cast<std::int32_t*>(table.data());
    auto* lens = reinterpret_cast<std::int32_t*>(seqlens.data());
    for (std::int64_t b = 0; b < B; ++b)
      lens[b] = static_cast<std::int32_t>(len[static_cast<std::size_t>(b)] - (with_new ? T : 0));
    if (P) {
      std::vector<std::int32_t> pages(static_cast<std::size_t>(num_pages));
      for (std::int64_t i = 0; i < num_pages; ++i) pages[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
      std::shuffle(pages.begin(), pages.end(), rng);
      std::copy_n(pages.begin(), B * max_pages, tab);
      if (B > 1 && rng() % 2 == 0) tab[max_pages] = tab[0];  // sequence 1 starts on sequence 0's first page
    }
    // At most one hostile change; those of the table come before the cache is filled (the rows then
    // hold what the sequences sharing them wrote last), the others after.
    const int hostile = static_cast<int>(rng() % 12);
    std::string change = "none";
    if (hostile == 3 && P && B > 1) {
      tab[max_pages + (len[1] - 1) / P] = tab[(len[0] - 1) / P];
      change = "sequence 1's last page is sequence 0's";
    }
    if (hostile == 4 && P && B && max_pages > 1) {
      tab[1] = tab[0];
      change = "sequence 0's second page is its first";
    }
    // The cache: NaN everywhere (int8: NaN scales), then every key a sequence holds before the call.
    const std::int64_t es = static_cast<std::int64_t>(dtype_size(dtype));
    std::vector<float> row(static_cast<std::size_t>(H));
    auto row_at = [&](const Guarded& t, std::int64_t b, std::int64_t kh, std::int64_t s) {
      const std::int64_t i = P ? tab[b * max_pages + s / P] : b, r = P ? s % P : s;
      return t.memory->data() + ((i * K + kh) * rows + r) * (t.view.rank == 4 ? H : 1) *
                                    static_cast<std::int64_t>(dtype_size(t.view.dtype));
    };
    for (const Guarded* t : {&k, &v}) {
      std::fill(row.begin(), row.end(), nan);
      if (!int8)
        for (std::int64_t i = 0; i < dim0 * K * rows; ++i)
          store_row(t->memory->data() + i * H * es, dtype, row.data(), H);
    }
    for (const Guarded* t : {&k_scale, &v_scale})
      if (int8) std::fill_n(reinterpret_cast<float*>(t->memory->data()), dim0 * K * rows, nan);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t kh = 0; kh < K; ++kh)
        for (std::int64_t s = 0; s < lens[b]; ++s)
          for (auto [t, scale] : {std::pair{&k, &k_scale}, std::pair{&v, &v_scale}}) {
            for (float& x : row) x = normal(rng);
            if (int8)
              *reinterpret_cast<float*>(row_at(*scale, b, kh, s)) =
                  quantize_row(reinterpret_cast<std::int8_t*>(row_at(*t, b, kh, s)), row.data(), DType::f32, H);
            else
              store_row(row_at(*t, b, kh, s), dtype, row.data(), H);
          }
    Guarded q(fd, {B, K, G, T, H}), out(DType::f32, {B, K, G, T, H}), lse(DType::f32, {B, K, G, T});
    Guarded k_new, v_new;
    if (with_new) k_new = Guarded(fd, {B, K, T, H}), v_new = Guarded(fd, {B, K, T, H});
    for (const Guarded* t : {&q, &k_new, &v_new})
      if (t->memory)
        for (std::int64_t i = 0; i < t->view.numel() / std::max<std::int64_t>(H, 1); ++i) {
          for (float& x : row) x = normal(rng);
          store_row(t->memory->data() + i * H * static_cast<std::int64_t>(dtype_size(fd)), fd, row.data(), H);
        }
    KvCache cache;
    cache.k = k.view;
    cache.v = v.view;
    cache.seqlens = lens;
    if (P) cache.block_table = tab, cache.max_pages = max_pages;
    if (with_new) cache.k_new = &k_new.view, cache.v_new = &v_new.view;
    if (int8) cache.k_scale = &k_scale.view, cache.v_scale = &v_scale.view;
    TensorView bad_new = with_new ? k_new.view : TensorView{};
    if (hostile == 0 && B) {
      lens[B - 1] = -1;
      change = "a negative length";
    } else if (hostile == 1 && B) {
      lens[0] = static_cast<std::int32_t>((P ? max_pages * P : rows) + 1);
      change = "a length past the cache";
    } else if (hostile == 2 && P && B) {
      tab[(B - 1) * max_pages] = rng() % 2 ? -1 : static_cast<std::int32_t>(num_pages);
      change = "a page out of range";
    } else if (hostile == 5 && with_new) {
      ++bad_new.shape[2];
      cache.k_new = &bad_new;
      change = "k_new too long";
    } else if (hostile == 6 && with_new && !int8) {
      bad_new.dtype = dtype == DType::f32 ? DType::bf16 : DType::f32;
      cache.k_new = &bad_new;
      change = "k_new of another dtype";
    } else if (hostile == 7 && int8) {
      cache.v_scale = nullptr;
      change = "no v_scale";
    } else if (hostile == 8 && P == 32) {
      cache.k.shape[2] = cache.v.shape[2] = 24;
      change = "page size 24";
    } else if (hostile == 9) {
      out.view.dtype = static_cast<DType>(7);
      change = "a bad out dtype";
    }
    Options o;
    o.causal = rng() % 5 != 0;
    const std::uint64_t variant = rng() % 8;  // one of four variants, or none
    if (variant == 0) o.window_left = static_cast<std::int64_t>(rng() % 20);
    if (variant == 1) o.softcap = 2.0;
    if (variant == 2) o.precision = Precision::f32;
    if (variant == 3) o.block_kv = 16;
    const char* variants[] = {", window", ", softcap", ", f32", ", block_kv 16"};
    if (variant < std::size(variants)) change += variants[variant];
    o.threads = 1 + static_cast<int>(rng() % 3);
    const std::string what = "trial " + std::to_string(trial) + " B " + std::to_string(B) + " K " + std::to_string(K) +
                             " G " + std::to_string(G) + " T " + std::to_string(T) + " H " + std::to_string(H) +
                             (P ? " page " + std::to_string(P) : std::string(" dense")) + " " + dtype_name(dtype) +
                             (with_new ? " k_new" : "") + ", change: " + change;
    const std::vector<char> k_before = k.bytes(), v_before = v.bytes();
    const std::vector<char> ks_before = int8 ? k_scale.bytes() : std::vector<char>{};
    try {
      attention_with_kvcache(out.view, lse.view, q.view, cache, o);
    } catch (const Error&) {
      ++rejected;
      EXPECT_TRUE(k_before == k.bytes() && v_before == v.bytes()) << what << ": the cache was written";
      if (int8) {
        EXPECT_TRUE(ks_before == k_scale.bytes()) << what << ": the scales were written";
      }
      continue;
    }
    ++computed;
    // Each sequence against the reference on its keys as the cache now holds them (int8: the products;
    // testing::sequence_against_reference).
    if (T == 0) continue;  // no queries: no output and no new keys
    float max_v_scale = 0.0f;
    if (int8)
      for (std::int64_t i = 0; i < dim0 * K * rows; ++i)
        if (const float x = reinterpret_cast<const float*>(v_scale.memory->data())[i]; std::isfinite(x))
          max_v_scale = std::max(max_v_scale, std::fabs(x));
    const DType dense_dtype = int8 ? DType::f32 : dtype;
    const std::int64_t des = static_cast<std::int64_t>(dtype_size(dense_dtype));
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t L = len[static_cast<std::size_t>(b)];
      std::vector<char> kd(static_cast<std::size_t>(std::max<std::int64_t>(K * L * H * des, 1))), vd = kd;
      for (std::int64_t kh = 0; kh < K; ++kh)
        for (std::int64_t s = 0; s < L; ++s)
          for (auto [dst, t, scale, added] :
               {std::tuple{&kd, &k, &k_scale, &k_new}, std::tuple{&vd, &v, &v_scale, &v_new}}) {
            char* at = dst->data() + (kh * L + s) * H * des;
            if (int8) {
              const float sc = *reinterpret_cast<const float*>(row_at(*scale, b, kh, s));
              for (std::int64_t h = 0; h < H; ++h)
                row[static_cast<std::size_t>(h)] =
                    static_cast<float>(reinterpret_cast<const std::int8_t*>(row_at(*t, b, kh, s))[h]) * sc;
              store_row(at, DType::f32, row.data(), H);
            } else {
              std::memcpy(at, row_at(*t, b, kh, s), static_cast<std::size_t>(H * es));
            }
            if (s >= lens[b]) {  // appended: k_new's row (int8: as quantize_kv quantizes it)
              const char* src = added->memory->data() +
                                ((b * K + kh) * T + s - lens[b]) * H * static_cast<std::int64_t>(dtype_size(fd));
              if (int8) {
                std::vector<std::int8_t> q8(static_cast<std::size_t>(H));
                const float sc = quantize_row(q8.data(), src, fd, H);
                EXPECT_EQ(std::memcmp(row_at(*t, b, kh, s), q8.data(), static_cast<std::size_t>(H)), 0) << what;
                EXPECT_EQ(*reinterpret_cast<const float*>(row_at(*scale, b, kh, s)), sc) << what;
              } else {
                EXPECT_EQ(std::memcmp(row_at(*t, b, kh, s), src, static_cast<std::size_t>(H * es)), 0) << what;
              }
            } else {  // held before the call: as it was (no append wrote it)
              const std::vector<char>& before = t == &k ? k_before : v_before;
              const char* now = row_at(*t, b, kh, s);
              EXPECT_EQ(std::memcmp(now, before.data() + (now - t->memory->data()), static_cast<std::size_t>(H * es)),
                        0)
                  << what << ": sequence " << b << "'s key " << s << " was overwritten";
            }
          }
      const ErrorReport r = testing::sequence_against_reference(out.view, lse.view, q.view, b, kd.data(), vd.data(),
                                                                dense_dtype, L, o, int8, max_v_scale);
      EXPECT_TRUE(r.ok) << what << ", sequence " << b << ": " << r.describe();
    }
  }
  std::printf("kvcache property: %d calls computed, %d rejected with Error\n", computed, rejected);
  EXPECT_GT(computed, 100);
  EXPECT_GT(rejected, 30);
}

INSTANTIATE_TEST_SUITE_P(AllIsas, KvCacheProperty, ::testing::ValuesIn(testing::kAllIsas), testing::isa_test_name);

}  // namespace
}  // namespace flashgqa
