#include "peak.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "kernels/cpu_features.hpp"
#include "study/ceilings.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace flashgqa::bench {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median rate of `repeats` runs (after one warm-up) of work(thread id) on `threads` threads; work
// returns the FLOPs or bytes it processed.
template <typename Work>
double median_rate(int threads, int repeats, Work work) {
  std::vector<double> rates;
  for (int r = 0; r <= repeats; ++r) {
    std::vector<double> done(static_cast<std::size_t>(threads), 0.0);
    const double t0 = now();
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
      const int id = omp_get_thread_num();
#else
      const int id = 0;
#endif
      done[static_cast<std::size_t>(id)] = work(id);
    }
    const double seconds = now() - t0;
    double total = 0;
    for (double d : done) total += d;
    if (r > 0) rates.push_back(total / seconds);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

struct Buffer {
  void* data;
  explicit Buffer(std::size_t bytes) : data(::operator new (bytes, std::align_val_t{64})) {
    std::memset(data, 1, bytes);
  }
  ~Buffer() { ::operator delete (data, std::align_val_t{64}); }
};

float g_sink = 0;
long g_lsink = 0;

// Plain C++ stand-ins for CPUs without AVX2 (the study's loops need it).
double fma_loop_portable(long iterations, float* sink) {
  float acc[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  for (long i = 0; i < iterations; ++i)
    for (float& a : acc) a = a * 0.999999f + 1e-7f;
  for (float a : acc) *sink += a;
  return static_cast<double>(iterations) * 8 * 2;
}

double read_loop_portable(const void* data, long bytes, long* sink) {
  const auto* p = static_cast<const unsigned long*>(data);
  unsigned long a = 0;
  for (long i = 0; i < bytes / 8; ++i) a ^= p[i];
  *sink += static_cast<long>(a);
  return static_cast<double>(bytes);
}

}  // namespace

double bf16_peak_flops(int threads, int repeats) {
  const bool bf16 = isa_supported(Isa::avx512bf16), avx512 = isa_supported(Isa::avx512f),
             avx2 = isa_supported(Isa::avx2);
  return median_rate(threads, repeats, [&](int) {
    float s = 0;
    const double f = bf16     ? study::detail::bf16_dot_loop(2'000'000, &s)
                     : avx512 ? study::detail::f32_fma_loop_avx512(2'000'000, &s)
                     : avx2   ? study::detail::f32_fma_loop_avx2(2'000'000, &s)
                              : fma_loop_portable(4'000'000, &s);
#pragma omp atomic
    g_sink += s * 0;
    return f;
  });
}

double dram_read_bandwidth(int threads, int repeats) {
  constexpr long kBytes = 128L << 20;
  std::vector<std::unique_ptr<Buffer>> buffers(static_cast<std::size_t>(threads));
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int i = 0; i < threads; ++i) buffers[static_cast<std::size_t>(i)] = std::make_unique<Buffer>(kBytes);
  const bool avx512 = isa_supported(Isa::avx512f), avx2 = isa_supported(Isa::avx2);
  return median_rate(threads, repeats, [&](int id) {
    long s = 0;
    const void* p = buffers[static_cast<std::size_t>(id)]->data;
    const double b = avx512 ? study::detail::read_loop_avx512(p, kBytes, &s)
                     : avx2 ? study::detail::read_loop_avx2(p, kBytes, &s)
                            : read_loop_portable(p, kBytes, &s);
#pragma omp atomic
    g_lsink += s * 0;
    return b;
  });
}

}  // namespace flashgqa::bench
