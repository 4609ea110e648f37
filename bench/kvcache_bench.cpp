// flashgqa_kvcache_bench: attention_with_kvcache (issue 13's workloads) against this machine's ceilings,
// measured in the same run (bench/peak.hpp), K = 8, G = 4, H = 128, bf16 q/k/v/out, causal.
//
//   kvcache/<dense|page16|page256>/T=1/8seqs_1k-32k: 8 sequences with lengths spread evenly over
//     1024..32768 keys, one new token each. GB/s = K/V bytes the call must read (sum of the lengths x
//     K x H x 2 bytes x 2) / time; pct_dram = that / the DRAM read bandwidth measured right before.
//   kvcache_int8/...: the same cache quantized by quantize_kv (bytes: 1 per element and a 4-byte scale
//     per row); the target is tokens/s >= 1.7 x the bf16 row's.
//   kvcache/dense/T=<n>/S=32768: one sequence of 32768 keys, T new tokens (row groups of 2 positions;
//     4 on the amx set, whose decode kernels take 16 rows; from T = 4 the avx512bf16 set's packed
//     blocks, all rows of a call on the tiles).
//     x_roofline = time / max(t_math, t_comms): t_math = 4 K G T S H FLOP at the bf16 matmul peak
//     (AMX's where present), t_comms = the K/V bytes at the DRAM bandwidth (the target is <= 1.5).
//   attention/T=<n>/S=32768: the same shape through attention() (the packed path for T > 2), the
//     baseline the row groups replace.
//   kvcache/dense/T=<n>/S=2048: a short sequence, where a call's fixed costs (threads, workspaces)
//     show: its calls take 0.1-2 ms (workspace blocks kept across calls since session 28).
// Each benchmark runs 5 repetitions; read the _median rows.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "flashgqa/flashgqa.hpp"
#include "kernels/cpu_features.hpp"
#include "peak.hpp"

namespace {

using namespace flashgqa;

constexpr std::int64_t K = 8, G = 4, H = 128, kThreads = 2;

// The cache and the call's buffers 64-byte aligned, as torch's and XLA's CPU allocators align theirs
// (malloc's large blocks lie 16 bytes past a page, and a cache there splits every row's loads over two
// cache lines: docs/performance.md, session 31).
template <typename T>
struct LineAligned {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  LineAligned() = default;
  template <typename U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, kAlign); }
  template <typename U>
  bool operator==(const LineAligned<U>&) const { return true; }
};
template <typename T>
using Buffer = std::vector<T, LineAligned<T>>;

Buffer<std::uint16_t> random_bf16(std::int64_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  Buffer<std::uint16_t> x(static_cast<std::size_t>(n));
  for (auto& e : x) e = float_to_bf16_bits(normal(rng));
  return x;
}

struct Inputs {
  std::int64_t B, T, page_size;  // page_size 0: dense
  bool int8;                     // the cache quantized by quantize_kv (bf16 otherwise)
  std::vector<std::int32_t> seqlens, table;
  std::int64_t max_pages = 0;
  Buffer<std::uint16_t> q, out, k, v;
  Buffer<std::int8_t> k8, v8;
  Buffer<float> k_scale, v_scale;
  TensorView qv, ov, kv, vv, ksv, vsv;

  Inputs(std::vector<std::int32_t> lens, std::int64_t T_, std::int64_t page, bool int8_ = false)
      : B(static_cast<std::int64_t>(lens.size())), T(T_), page_size(page), int8(int8_), seqlens(std::move(lens)) {
    const std::int64_t longest = *std::max_element(seqlens.begin(), seqlens.end());
    q = random_bf16(B * K * G * T * H, 1);
    out.resize(q.size());
    qv = contiguous_view(q.data(), DType::bf16, {B, K, G, T, H});
    ov = contiguous_view(out.data(), DType::bf16, {B, K, G, T, H});
    std::int64_t dim0 = B, rows = longest;
    if (page_size > 0) {  // every sequence's pages, shuffled over the pool
      max_pages = (longest + page_size - 1) / page_size;
      std::vector<std::int32_t> pool;
      for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t n = (seqlens[static_cast<std::size_t>(b)] + page_size - 1) / page_size;
        for (std::int64_t i = 0; i < max_pages; ++i)
          table.push_back(i < n ? static_cast<std::int32_t>(pool.size() + i) : 0);
        for (std::int64_t i = 0; i < n; ++i) pool.push_back(static_cast<std::int32_t>(pool.size()));
      }
      std::vector<std::int32_t> perm(pool.size());
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), std::mt19937_64(5));
      for (auto& e : table) e = perm[static_cast<std::size_t>(e)];
      dim0 = static_cast<std::int64_t>(pool.size());
      rows = page_size;
    }
    k = random_bf16(dim0 * K * rows * H, 2);
    v = random_bf16(dim0 * K * rows * H, 3);
    kv = contiguous_view(k.data(), DType::bf16, {dim0, K, rows, H});
    vv = contiguous_view(v.data(), DType::bf16, {dim0, K, rows, H});
    if (int8) {
      for (auto [x, x8, scale, view, sview] : {std::tuple{&kv, &k8, &k_scale, &kv, &ksv},
                                               std::tuple{&vv, &v8, &v_scale, &vv, &vsv}}) {
        x8->resize(static_cast<std::size_t>(dim0 * K * rows * H));
        scale->resize(static_cast<std::size_t>(dim0 * K * rows));
        const TensorView q8 = contiguous_view(x8->data(), DType::i8, {dim0, K, rows, H});
        *sview = contiguous_view(scale->data(), DType::f32, {dim0, K, rows});
        quantize_kv(*x, q8, *sview);
        *view = q8;
      }
      Buffer<std::uint16_t>().swap(k);  // only the int8 cache stays
      Buffer<std::uint16_t>().swap(v);
    }
  }
  KvCache cache() const {
    KvCache c;
    c.k = kv;
    c.v = vv;
    c.seqlens = seqlens.data();
    if (page_size > 0) c.block_table = table.data(), c.max_pages = max_pages;
    if (int8) c.k_scale = &ksv, c.v_scale = &vsv;
    return c;
  }
  // The K/V bytes a call must read: 2 bytes per element (bf16), or 1 and a 4-byte scale per row (int8).
  double kv_bytes() const {
    const double per_key = int8 ? 2.0 * K * (H + 4) : 4.0 * K * H;
    return per_key * static_cast<double>(std::accumulate(seqlens.begin(), seqlens.end(), std::int64_t{0}));
  }
  double keys() const {
    return static_cast<double>(std::accumulate(seqlens.begin(), seqlens.end(), std::int64_t{0}));
  }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// via_attention: the dense single-sequence shape through attention() instead (the baseline).
void kvcache_bench(benchmark::State& state, std::vector<std::int32_t> lens, std::int64_t T, std::int64_t page,
                   bool via_attention, bool int8) {
  Inputs in(std::move(lens), T, page, int8);
  Options o;
  o.causal = true;
  o.threads = kThreads;
  auto call = [&] {
    if (via_attention) attention(in.ov, in.qv, in.kv, in.vv, o);
    else attention_with_kvcache(in.ov, in.qv, in.cache(), o);
  };
  const double dram = bench::dram_read_bandwidth(kThreads);
  const double peak = bench::bf16_peak_flops(kThreads);
  call();  // warm-up
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    seconds += seconds_since(t0);
  }
  const double per_call = seconds / static_cast<double>(state.iterations());
  const double bytes = in.kv_bytes();
  state.counters["GB/s"] = bytes / per_call / 1e9;
  state.counters["dram_GB/s"] = dram / 1e9;
  state.counters["pct_dram"] = 100.0 * bytes / per_call / dram;
  const double keys = in.keys();
  const double t_math = 4.0 * K * G * static_cast<double>(T) * keys * H / peak, t_comms = bytes / dram;
  state.counters["x_roofline"] = per_call / std::max(t_math, t_comms);
  state.counters["tokens/s"] = static_cast<double>(in.B * T) / per_call;
  state.SetLabel(isa_name(active_isa()));
}

void add(const std::string& name, std::vector<std::int32_t> lens, std::int64_t T, std::int64_t page, bool via,
         bool int8 = false) {
  const std::int64_t keys = std::accumulate(lens.begin(), lens.end(), std::int64_t{0});
  benchmark::RegisterBenchmark(name.c_str(), kvcache_bench, std::move(lens), T, page, via, int8)
      ->Iterations(T > 2 && via ? 2 : keys <= 4096 ? 100 : 10)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  if (!flashgqa::bench::initialize(argc, argv)) return 1;
  std::vector<std::int32_t> spread;  // 8 lengths from 1024 to 32768
  for (int i = 0; i < 8; ++i) spread.push_back(1024 + i * (32768 - 1024) / 7);
  for (const auto& [name, page] : {std::pair{"dense", 0}, std::pair{"page16", 16}, std::pair{"page256", 256}})
    for (const bool int8 : {false, true})
      add(std::string(int8 ? "kvcache_int8/" : "kvcache/") + name + "/T=1/8seqs_1k-32k", spread, 1, page, false, int8);
  for (std::int64_t T : {1, 2, 4, 8, 16}) {
    add("kvcache/dense/T=" + std::to_string(T) + "/S=32768", {32768}, T, 0, false);
    add("attention/T=" + std::to_string(T) + "/S=32768", {32768}, T, 0, true);
  }
  for (std::int64_t T : {1, 16}) add("kvcache/dense/T=" + std::to_string(T) + "/S=2048", {2048}, T, 0, false);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
