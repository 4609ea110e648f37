// This machine's ceilings, measured by its own micro-benchmarks on a given number of threads: the
// peak of the bf16 matmul instruction (AMX's tdpbf16ps where the CPU and OS have AMX-BF16, else
// vdpbf16ps where the CPU has AVX512_BF16, BFDOT where it has FEAT_BF16, else the fp32 FMA the widened
// path uses), the fp32 FMA peak, DRAM read bandwidth and L2
// read bandwidth. Each is the median of repeated runs, with its min and max. Cached per CPU model and
// thread count in the user's cache folder (user_cache_dir()/ceilings.tsv, see tune_cache.hpp), reused
// until asked to remeasure.
#pragma once

#include <optional>
#include <string>

namespace flashgqa::study {

constexpr long kDramPageAhead = 64L << 10;  // bytes, see measure_dram_read

struct Ceiling {
  double median = 0, min = 0, max = 0;  // per second (FLOP/s or bytes/s)
  double spread() const { return median > 0 ? (max - min) / median : 0; }
};

struct Ceilings {
  std::string cpu;
  int threads = 0;
  std::string bf16_instruction;  // "tdpbf16ps (AMX)", "vdpbf16ps", "bfdot v.4s", or the fp32 FMA it falls back to
  Ceiling bf16_flops, f32_flops, dram_bytes, l2_bytes;
};

// Runs the micro-benchmarks (a few seconds).
Ceilings measure_ceilings(int threads, int repeats = 5);

// The single ceilings, each over `repeats` runs after a warm-up on `threads` threads (the benchmark
// measures them right before each of its runs).
// tdpbf16ps / vdpbf16ps / BFDOT, or the fp32 FMA (no bf16 instruction, or vdpbf16ps at half its rate)
Ceiling measure_bf16_peak(int threads, int repeats);
Ceiling measure_f32_peak(int threads, int repeats);
// 128 MiB streamed per thread, by two loops: plain loads, and plain loads plus a prefetch of each
// 4 KiB page kDramPageAhead bytes before it is read (on this VM the hardware prefetchers restart at
// every page, and the prefetch raised the streaming rate by 0-25%). The better median of the two.
Ceiling measure_dram_read(int threads, int repeats);
Ceiling measure_l2_read(int threads, int repeats);    // 256 KiB reread per thread

// The cached ceilings for this CPU and thread count, or measured (and cached) ones when none are
// cached or `remeasure`. `from_cache` tells which. A corrupt cache file is ignored.
Ceilings machine_ceilings(int threads, bool remeasure, bool* from_cache = nullptr);

// Path of the ceilings cache file.
std::string ceilings_cache_path();

namespace detail {
// Per-ISA loops (ceilings_<isa>.cpp). Each returns the FLOPs or bytes it processed; `sink` defeats
// dead-code elimination.
double bf16_dot_loop(long iterations, float* sink);    // avx512bf16 only
double amx_dot_loop(long iterations, float* sink);     // amx only (ceilings_amx.cpp)
double f32_fma_loop_avx512(long iterations, float* sink);
double f32_fma_loop_avx2(long iterations, float* sink);
// Stream `bytes` once; with ahead > 0 they also prefetch the start of the 4 KiB page `ahead` bytes on.
double read_loop_avx512(const void* data, long bytes, long ahead, long* sink);
double read_loop_avx2(const void* data, long bytes, long ahead, long* sink);
// aarch64 (ceilings_neon.cpp; ceilings_neon_bf16.cpp for FEAT_BF16 only).
double bf16_dot_loop_neon(long iterations, float* sink);
double f32_fma_loop_neon(long iterations, float* sink);
double read_loop_neon(const void* data, long bytes, long ahead, long* sink);
// Plain C++, every architecture (ceilings.cpp).
double f32_fma_loop_portable(long iterations, float* sink);
double read_loop_portable(const void* data, long bytes, long ahead, long* sink);
}  // namespace detail


}  // namespace flashgqa::study
