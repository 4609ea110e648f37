// attention_with_kvcache on random caches in guarded memory, on every instruction-set path: every
// page's rows of each kv head (a dense cache: each batch entry's) end right before an inaccessible
// page (CacheCase::guard), so a kernel that reads a row past a page, or a scale past its page's, stops
// the test with a fault. Rows no sequence holds are NaN (their int8 scales NaN), so a read of one
// within a page shows in the output; the output is checked against the float64 reference on each
// sequence's dense equivalent. Random: lengths at and beside page boundaries, page sizes (16 to 256,
// among them 48 and 80, which the amx set's P.V takes in one call per block), T = 1..24 (24: past the
// decode kernels, G*T > 128), G, H (16 to 256, among them 40 and 72: a partial last 32 columns), every
// K/V dtype, k_new, windows, softcap, sinks, Precision::f32, block sizes and thread counts.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flashgqa/flashgqa.hpp"
#include "testing/isa_test.hpp"
#include "testing/kvcache_case.hpp"

namespace flashgqa {
namespace {

using testing::CacheCase;
using testing::CacheSpec;

class KvCacheGuardTest : public testing::KvCacheTest {};

// A random element of xs.
template <typename T, std::size_t N>
T pick(std::mt19937_64& rng, const T (&xs)[N]) {
  return xs[rng() % N];
}

TEST_P(KvCacheGuardTest, RandomCachesReadOnlyTheirRows) {
  std::mt19937_64 rng(24 + static_cast<std::uint64_t>(isa()));
  const std::int64_t pages[] = {0, 16, 32, 48, 80, 256};
  const std::int64_t Hs[] = {16, 40, 64, 64, 72, 128, 128, 256};
  const std::int64_t Ts[] = {1, 1, 1, 2, 3, 4, 7, 16, 24};
  const std::int64_t Gs[] = {1, 2, 4, 4, 5, 8};
  const DType dtypes[] = {DType::bf16, DType::f16, DType::f32, DType::i8};
  const float sinks[] = {0.5f, -1.0f, 2.0f, -std::numeric_limits<float>::infinity(), 0.0f, 1.0f, -2.0f, 3.0f,
                         1.5f, -0.5f, 0.25f, 4.0f, -3.0f, 0.75f, 2.5f, -1.5f, 1.0f, 0.0f, -0.25f, 0.5f,
                         -2.0f, 1.25f, 3.5f, -4.0f};
  static_assert(std::size(sinks) >= 3 * 8, "a sink for every query head: K <= 3, G <= 8");
  constexpr int kTrials = 10 * std::size(pages) * std::size(dtypes);  // each (page, dtype) 10 times
  for (int trial = 0; trial < kTrials; ++trial) {
    const std::int64_t page = pages[trial % std::size(pages)];
    const DType dtype = dtypes[trial / std::size(pages) % std::size(dtypes)];
    const std::int64_t T = pick(rng, Ts), G = pick(rng, Gs), H = pick(rng, Hs);
    const std::int64_t K = 1 + static_cast<std::int64_t>(rng() % 3);
    // Lengths at and beside page (or 16-key) boundaries, and anywhere up to ~600.
    const std::int64_t unit = page > 0 ? page : 16;
    std::vector<std::int32_t> lens(1 + rng() % 3);
    for (std::int32_t& L : lens) {
      const std::int64_t at = unit * static_cast<std::int64_t>(rng() % 4), beside[] = {-1, 0, 1, 2};
      L = static_cast<std::int32_t>(rng() % 3 == 0 ? rng() % 600 : std::max<std::int64_t>(0, at + pick(rng, beside)));
    }
    const CacheSpec spec{K, G, T, H, lens, page, dtype, rng() % 2 == 0};
    CacheCase c(spec, 1000 + static_cast<std::uint64_t>(trial), true);
    Options o;
    o.causal = rng() % 5 != 0;
    std::string what = o.causal ? "causal" : "not causal";
    switch (rng() % 8) {
      case 0:
        o.window_left = static_cast<std::int64_t>(rng() % 100);
        what += ", window " + std::to_string(o.window_left);
        break;
      case 1: o.softcap = 3.0, what += ", softcap 3"; break;
      case 2: o.sinks = sinks, what += ", sinks"; break;
      case 3: o.precision = Precision::f32, what += ", f32"; break;
      case 4:
        o.block_kv = 16 * (1 + static_cast<std::int64_t>(rng() % 8));
        what += ", block_kv " + std::to_string(o.block_kv);
        break;
      default: break;
    }
    o.threads = 1 + static_cast<int>(rng() % 3);
    SCOPED_TRACE(testing::to_string(spec) + ", " + what + ", threads " + std::to_string(o.threads));
    c.run(o);
    c.expect_matches_reference(o, what);
  }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, KvCacheGuardTest, ::testing::ValuesIn(testing::kAllIsas), testing::isa_test_name);

}  // namespace
}  // namespace flashgqa
