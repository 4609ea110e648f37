// flashgqa bench --decode: attention_with_kvcache on a serving workload, per K/V dtype and cache
// layout, as GB/s of K/V read against this machine's DRAM read bandwidth measured in the same run.
// A decode step reads every K/V byte of every sequence once and does ~G FLOP per byte, so its
// roofline is the DRAM stream: the fraction of that bandwidth is its efficiency, and int8 K/V (one
// byte per value and a 4-byte scale per row) should run at ~2x bf16's tokens/s for the same fraction.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "core/dtype.hpp"
#include "core/names.hpp"
#include "core/problem.hpp"
#include "study/ceilings.hpp"
#include "study/timing.hpp"

namespace flashgqa::cli {
namespace {

// The workload: B sequences of lengths spread evenly over [S/32, S], T new tokens each.
struct DecodeShape {
  std::int64_t B, K, G, T, S, H;
  std::vector<std::int32_t> lengths() const {
    std::vector<std::int32_t> lens;
    const std::int64_t lo = std::max<std::int64_t>(S / 32, 1);
    for (std::int64_t b = 0; b < B; ++b)
      lens.push_back(static_cast<std::int32_t>(B == 1 ? S : lo + b * (S - lo) / (B - 1)));
    return lens;
  }
};

// A cache's K or V values: from the heap, 64-byte aligned as torch's and XLA's CPU allocators align
// theirs (a cache 16 bytes off, as malloc's large blocks and numpy's arrays lie, splits every row's
// loads over two cache lines: docs/performance.md, session 31), or (--huge-pages) a mapping advised
// MADV_HUGEPAGE before anything is written to it, 2 MiB aligned, so that transparent huge pages back it
// where the kernel allows them ("always" or "madvise" in /sys/kernel/mm/transparent_hugepage/enabled).
class CacheMemory {
 public:
  CacheMemory() = default;
  CacheMemory(std::size_t bytes, bool huge) {
    if (!huge) {
      constexpr std::size_t kLine = 64;
      heap_.resize(bytes + kLine);
      data_ = heap_.data() + (kLine - reinterpret_cast<std::uintptr_t>(heap_.data()) % kLine) % kLine;
      return;
    }
    constexpr std::size_t kHuge = std::size_t{2} << 20;
    size_ = (bytes + kHuge - 1) / kHuge * kHuge + kHuge;  // room to align the start
    void* m = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw Error("bench --decode: could not map " + std::to_string(size_) + " bytes for the cache");
    map_ = static_cast<std::byte*>(m);
    data_ = map_ + (kHuge - reinterpret_cast<std::uintptr_t>(map_) % kHuge) % kHuge;
#ifdef MADV_HUGEPAGE
    madvise(data_, size_ - static_cast<std::size_t>(data_ - map_), MADV_HUGEPAGE);  // advice: no error if refused
#endif
  }
  ~CacheMemory() {
    if (map_ != nullptr) munmap(map_, size_);
  }
  CacheMemory(const CacheMemory&) = delete;
  CacheMemory& operator=(const CacheMemory&) = delete;
  CacheMemory& operator=(CacheMemory&& o) noexcept {
    std::swap(heap_, o.heap_), std::swap(map_, o.map_), std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  std::byte* data() const { return data_; }

 private:
  std::vector<std::byte> heap_;
  std::byte* map_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;  // of the mapping
};

// One cache (dense or paged) of one K/V dtype holding the workload's keys, and the call's buffers.
class DecodeCase {
 public:
  DecodeCase(const DecodeShape& s, std::int64_t page_size, DType dtype, bool huge_pages)
      : s_(s), page_(page_size), dtype_(dtype) {
    lens_ = s.lengths();
    const std::int64_t longest = *std::max_element(lens_.begin(), lens_.end()) + s.T;
    std::int64_t dim0 = s.B, rows = longest;
    if (page_size > 0) {  // every sequence's pages, shuffled over the pool
      max_pages_ = (longest + page_size - 1) / page_size;
      std::vector<std::int32_t> pool(static_cast<std::size_t>(s.B * max_pages_));
      std::iota(pool.begin(), pool.end(), 0);
      std::shuffle(pool.begin(), pool.end(), std::mt19937_64(5));
      table_ = pool;
      dim0 = s.B * max_pages_;
      rows = page_size;
    }
    const std::int64_t n = dim0 * s.K * rows * s.H;
    for (auto [seed, values, scale, view, scale_view] : {std::tuple{2, &k_, &k_scale_, &k_view_, &ks_view_},
                                                         std::tuple{3, &v_, &v_scale_, &v_view_, &vs_view_}}) {
      *values = CacheMemory(static_cast<std::size_t>(n) * dtype_size(dtype), huge_pages);
      if (dtype != DType::i8) {
        random_values(values->data(), n, dtype, seed);
        *view = contiguous_view(values->data(), dtype, {dim0, s.K, rows, s.H});
        continue;
      }
      std::vector<std::byte> x(static_cast<std::size_t>(n) * 4);  // float32, then quantized
      random_values(x.data(), n, DType::f32, seed);
      scale->resize(static_cast<std::size_t>(dim0 * s.K * rows));
      *view = contiguous_view(values->data(), DType::i8, {dim0, s.K, rows, s.H});
      *scale_view = contiguous_view(scale->data(), DType::f32, {dim0, s.K, rows});
      quantize_kv(contiguous_view(x.data(), DType::f32, {dim0, s.K, rows, s.H}), *view, *scale_view);
    }
    q_.resize(static_cast<std::size_t>(s.B * s.K * s.G * s.T * s.H) * 2);
    random_values(q_.data(), s.B * s.K * s.G * s.T * s.H, DType::bf16, 1);
    out_.resize(q_.size());
  }

  void run(int threads) {
    KvCache c;
    c.k = k_view_;
    c.v = v_view_;
    c.seqlens = lens_.data();
    if (page_ > 0) c.block_table = table_.data(), c.max_pages = max_pages_;
    if (dtype_ == DType::i8) c.k_scale = &ks_view_, c.v_scale = &vs_view_;
    Options o;
    o.causal = true;
    o.threads = threads;
    attention_with_kvcache(contiguous_view(out_.data(), DType::bf16, {s_.B, s_.K, s_.G, s_.T, s_.H}),
                           contiguous_view(q_.data(), DType::bf16, {s_.B, s_.K, s_.G, s_.T, s_.H}), c, o);
  }

  // The K/V bytes a call reads: every sequence's keys, K and V, with int8's scales.
  double kv_bytes() const {
    const double keys = std::accumulate(lens_.begin(), lens_.end(), 0.0);
    const double row = static_cast<double>(s_.H * static_cast<std::int64_t>(dtype_size(dtype_))) +
                       (dtype_ == DType::i8 ? 4.0 : 0.0);
    return 2.0 * keys * static_cast<double>(s_.K) * row;
  }
  // Memory, in double (a --shape whose sizes overflow int64 is refused by the caller from build_bytes
  // before anything is allocated). Held: the cache (K and V, int8's scales). While building: also
  // int8's float32 staging copy of K or of V (one at a time; the float dtypes are written directly).
  static double resident_bytes(const DecodeShape& s, std::int64_t page, DType dtype) {
    const double rows = cells(s, page) / static_cast<double>(s.H);
    return 2.0 * (cells(s, page) * static_cast<double>(dtype_size(dtype)) + (dtype == DType::i8 ? 4.0 * rows : 0.0));
  }
  static double build_bytes(const DecodeShape& s, std::int64_t page, DType dtype) {
    return resident_bytes(s, page, dtype) + (dtype == DType::i8 ? 4.0 * cells(s, page) : 0.0);
  }

 private:
  // Values in K (or V): dim0 x K x rows x H.
  static double cells(const DecodeShape& s, std::int64_t page) {
    const double longest = static_cast<double>(s.S + s.T);
    const double rows = page > 0 ? std::ceil(longest / static_cast<double>(page)) * static_cast<double>(page) : longest;
    return static_cast<double>(s.B) * static_cast<double>(s.K) * rows * static_cast<double>(s.H);
  }

  // n values of a normal block tiled (the values do not change the time), as `dtype`, at dst.
  static void random_values(std::byte* dst, std::int64_t n, DType dtype, std::uint64_t seed) {
    constexpr std::int64_t kBlock = 1 << 16;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    std::vector<float> block(kBlock);
    for (float& x : block) x = normal(rng);
    const auto es = static_cast<std::int64_t>(dtype_size(dtype));
    for (std::int64_t i = 0; i < n; i += kBlock) store_row(dst + i * es, dtype, block.data(), std::min(kBlock, n - i));
  }

  DecodeShape s_;
  std::int64_t page_, max_pages_ = 0;
  DType dtype_;
  std::vector<std::int32_t> lens_, table_;
  CacheMemory k_, v_;
  std::vector<std::byte> q_, out_;
  std::vector<float> k_scale_, v_scale_;
  TensorView k_view_, v_view_, ks_view_, vs_view_;
};

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

const char* bench_decode_help() {
  return "flashgqa bench --decode [--shape B,K,G,T,S,H] [--kv-dtypes D1,D2,...] [--page-sizes P1,P2,...]\n"
         "               [--huge-pages] [--threads N] [--repeats N] [--out DIR]\n"
         "  Times attention_with_kvcache (causal) on B sequences whose lengths are spread evenly over\n"
         "  [S/32, S], T new tokens each, for each K/V dtype and cache layout, and reports the K/V bytes\n"
         "  read per second against the DRAM read bandwidth. The cases of a layout are built together and\n"
         "  timed in --repeats rounds, each running every case once and measuring the DRAM read once;\n"
         "  medians over the rounds. Prints a table; writes DIR/bench_decode.csv.\n"
         "  --shape B,K,G,T,S,H  the workload (default 8,8,4,1,32768,128: lengths 1024..32768)\n"
         "  --kv-dtypes D,...    K/V dtypes (default bfloat16,float16,float32,int8; int8 with a float32\n"
         "                       scale per row, from quantize_kv, in kvcache_int8_form(G, T, H)'s form)\n"
         "  --page-sizes P,...   0 = a dense [B,K,S_max,H] cache, else pages of P keys (multiples of 16),\n"
         "                       shuffled (default 0,16,256)\n"
         "  --huge-pages         K and V in memory advised MADV_HUGEPAGE (transparent huge pages where\n"
         "                       the system allows them), as a server may allocate its cache; default:\n"
         "                       the heap's pages\n";
}

int bench_decode(const Args& args) {
  for (const char* flag : {"seq", "algos", "causal", "softcap", "budget"})
    if (args.has(flag)) throw Error(std::string("--") + flag + ": not used with --decode (see flashgqa bench --help)");
  const std::vector<std::int64_t> d =
      parse_integer_list("--shape", args.optional("shape").value_or("8,8,4,1,32768,128"), 6, 1, std::int64_t{1} << 30);
  const DecodeShape shape{d[0], d[1], d[2], d[3], d[4], d[5]};
  std::vector<DType> dtypes;
  for (const std::string& w : split_list(args.optional("kv-dtypes").value_or("bfloat16,float16,float32,int8")))
    dtypes.push_back(parse_dtype(w, "--kv-dtypes"));
  std::vector<std::int64_t> pages;
  for (const std::string& w : split_list(args.optional("page-sizes").value_or("0,16,256"))) {
    pages.push_back(parse_integer("--page-sizes", w, 0, std::int64_t{1} << 20));
    if (pages.back() % 16 != 0)
      throw Error("--page-sizes: " + w + ", expected 0 (dense) or a multiple of 16");
  }
  if (dtypes.empty() || pages.empty()) throw Error("--kv-dtypes/--page-sizes: empty list");
  const int threads = resolve_threads(static_cast<int>(args.integer("threads", 0, 0, 1024)));
  const int repeats = static_cast<int>(args.integer("repeats", 5, 1, 1000));
  const std::string dir = args.optional("out").value_or(".");
  const bool huge_pages = args.has("huge-pages");

  for (const std::int64_t page : pages)
    for (const DType dtype : dtypes)
      if (const double b = DecodeCase::build_bytes(shape, page, dtype); b > 0x1p50)
        throw Error("--shape: a cache of " + std::to_string(b / 1e9) + " GB, expected one that fits in memory");

  // The cases of a layout are built first (as many as fit in memory together), then timed in rounds:
  // each round runs each case once and measures the DRAM read once, so a slow or a fast spell of a
  // shared machine falls on all of them alike, and their ratios (int8 / bf16 tokens/s, % of DRAM) hold
  // where times taken one case after another swung 1.2-1.65x (docs/performance.md, session 14).
  struct Row {
    std::string cache;
    std::int64_t page;
    DType dtype;
    double bytes = 0;
    std::vector<double> times;  // none: skipped (the case would not fit in memory)
  };
  std::vector<Row> rows;
  std::vector<double> dram_rounds;
  const double available = study::available_memory_bytes();
  // measure_dram_read's buffers (128 MiB per thread), allocated while the cases are held.
  const double dram_buffers = static_cast<double>(threads) * static_cast<double>(128L << 20);
  const auto fits = [&](double bytes) { return available <= 0 || bytes + dram_buffers <= 0.8 * available; };
  const std::vector<std::int32_t> lens = shape.lengths();
  for (const std::int64_t page : pages) {
    const std::string cache = page == 0 ? "dense" : "page" + std::to_string(page);
    std::vector<std::pair<std::size_t, std::unique_ptr<DecodeCase>>> batch;  // (row, its case)
    double held = 0;
    const auto run_batch = [&] {
      if (batch.empty()) return;
      std::fprintf(stderr, "bench --decode: timing %s, %zu cases, %d rounds ...\n", cache.c_str(), batch.size(),
                   repeats);
      for (auto& [row, c] : batch) c->run(threads);  // warm-up
      for (int r = 0; r < repeats; ++r) {
        dram_rounds.push_back(study::measure_dram_read(threads, 1).median);
        for (auto& [row, c] : batch) {
          DecodeCase& one = *c;  // (clang 14 does not capture a structured binding)
          rows[row].times.push_back(seconds_of([&] { one.run(threads); }));
        }
      }
      batch.clear();
      held = 0;
    };
    for (const DType dtype : dtypes) {
      rows.push_back(Row{cache, page, dtype, 0, {}});
      const double build = DecodeCase::build_bytes(shape, page, dtype);
      if (!fits(build)) continue;
      if (!fits(held + build)) {  // time what is built and free it: this layout's ratios span two batches
        std::fprintf(stderr, "bench --decode: %s: not every case fits in memory at once; timing the %zu built\n",
                     cache.c_str(), batch.size());
        run_batch();
      }
      std::fprintf(stderr, "bench --decode: building %s %s ...\n", cache.c_str(), dtype_name(dtype));
      batch.emplace_back(rows.size() - 1, std::make_unique<DecodeCase>(shape, page, dtype, huge_pages));
      rows.back().bytes = batch.back().second->kv_bytes();
      held += DecodeCase::resident_bytes(shape, page, dtype);
    }
    run_batch();
  }

  if (dram_rounds.empty()) dram_rounds.push_back(study::measure_dram_read(threads, 5).median);  // all skipped
  std::sort(dram_rounds.begin(), dram_rounds.end());
  const double dram = dram_rounds[dram_rounds.size() / 2];  // over every round of the run
  std::printf("flashgqa bench --decode: %d threads, DRAM read %.1f GB/s (measured: median of %zu, %.1f-%.1f); "
              "B,K,G,T,H = %lld,%lld,%lld,%lld,%lld, lengths %d..%d\n",
              threads, dram / 1e9, dram_rounds.size(), dram_rounds.front() / 1e9, dram_rounds.back() / 1e9,
              static_cast<long long>(shape.B),
              static_cast<long long>(shape.K), static_cast<long long>(shape.G), static_cast<long long>(shape.T),
              static_cast<long long>(shape.H), lens.front(), lens.back());
  if (huge_pages) std::printf("K/V in memory advised MADV_HUGEPAGE (--huge-pages)\n");
  if (std::find(dtypes.begin(), dtypes.end(), DType::i8) != dtypes.end())
    std::printf("int8 computed in the \"%s\" form (flashgqa::kvcache_int8_form)\n",
                kvcache_int8_form(shape.G, shape.T, shape.H));
  std::printf("%-8s %-9s %10s %9s %8s %7s %9s\n", "cache", "kv_dtype", "median_ms", "kv_MB", "GB/s", "%dram",
              "tokens/s");
  std::string csv = "cache,page_size,kv_dtype,B,K,G,T,H,S,median_s,min_s,max_s,kv_bytes,gb_per_s,dram_gb_per_s,"
                    "percent_dram,tokens_per_s,huge_pages\n";
  for (Row& row : rows) {
    if (row.times.empty()) {
      std::printf("%-8s %-9s skipped: the cache would not fit in the available memory\n", row.cache.c_str(),
                  dtype_name(row.dtype));
      continue;
    }
    std::vector<double>& times = row.times;
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2], bytes = row.bytes;
    const double gbs = bytes / median / 1e9, pct = 100.0 * bytes / median / dram;
    const double tokens = static_cast<double>(shape.B * shape.T) / median;
    std::printf("%-8s %-9s %10.3f %9.1f %8.2f %7.1f %9.1f\n", row.cache.c_str(), dtype_name(row.dtype),
                median * 1e3, bytes / 1e6, gbs, pct, tokens);
    char line[512];
    std::snprintf(line, sizeof line,
                  "%s,%lld,%s,%lld,%lld,%lld,%lld,%lld,%lld,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.4g,%.6g,%d\n",
                  row.cache.c_str(), static_cast<long long>(row.page), dtype_name(row.dtype),
                  static_cast<long long>(shape.B), static_cast<long long>(shape.K), static_cast<long long>(shape.G),
                  static_cast<long long>(shape.T), static_cast<long long>(shape.H), static_cast<long long>(shape.S),
                  median, times.front(), times.back(), bytes, gbs, dram / 1e9, pct, tokens, huge_pages ? 1 : 0);
    csv += line;
  }
  write_out_files(dir, {{"bench_decode.csv", csv}});
  return 0;
}

}  // namespace flashgqa::cli
