#include "study/ceilings.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <sstream>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "flashgqa/flashgqa.hpp"
#include "kernels/cpu_features.hpp"
#include "study/tune_cache.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace flashgqa::study {

namespace detail {

// A portable read loop for machines without vector loops (or a build without them).
double read_loop_portable(const void* data, long bytes, long ahead, long* sink) {
  const auto* p = static_cast<const std::uint64_t*>(data);
  std::uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (long i = 0; i < bytes / 8; i += 4) {
#if defined(__GNUC__)
    if (ahead > 0 && (reinterpret_cast<std::uintptr_t>(p + i) & 4095) < 32 && i * 8 + ahead < bytes)
      __builtin_prefetch(p + i + ahead / 8, 0, 2);
#endif
    a0 ^= p[i], a1 ^= p[i + 1], a2 ^= p[i + 2], a3 ^= p[i + 3];
  }
  *sink += static_cast<long>(a0 ^ a1 ^ a2 ^ a3);
  return static_cast<double>(bytes);
}

double f32_fma_loop_portable(long iterations, float* sink) {
  float acc[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  for (long i = 0; i < iterations; ++i)
    for (float& a : acc) a = a * 0.999999f + 1e-7f;
  for (float a : acc) *sink += a;
  return static_cast<double>(iterations) * 8 * 2;
}

}  // namespace detail

namespace {

// v2: DRAM = the better of two read loops; v3: the bf16 peak is AMX's where the CPU has it; v4: the
// fp32 FMA's where vdpbf16ps is half rate and no AMX (the path runs bf16 widened there).
constexpr const char* kHeader = "# flashgqa ceilings v4";

std::atomic<long> g_sink_bytes{0};  // keeps the measured loops' results alive

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median, min and max of `repeats` runs of `work` on `threads` threads. `work(thread)` returns the
// FLOPs or bytes that thread processed; the rate is their sum over the wall time of the region.
Ceiling measure(int threads, int repeats, const std::function<double(int)>& work) {
  std::vector<double> rates;
  for (int r = 0; r < repeats + 1; ++r) {  // the first run warms up (clocks, pages) and is dropped
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
  return {rates[rates.size() / 2], rates.front(), rates.back()};
}


std::string line_of(const Ceilings& c) {
  std::ostringstream os;
  os.precision(17);
  os << c.cpu << '\t' << c.threads << '\t' << c.bf16_instruction;
  for (const Ceiling* x : {&c.bf16_flops, &c.f32_flops, &c.dram_bytes, &c.l2_bytes})
    os << '\t' << x->median << '\t' << x->min << '\t' << x->max;
  return os.str();
}

bool parse_line(const std::string& line, Ceilings& c) {
  std::istringstream in(line);
  std::string threads;
  if (!std::getline(in, c.cpu, '\t') || !std::getline(in, threads, '\t') ||
      !std::getline(in, c.bf16_instruction, '\t'))
    return false;
  char* end = nullptr;
  c.threads = static_cast<int>(std::strtol(threads.c_str(), &end, 10));
  if (*end != '\0' || c.threads < 1) return false;
  for (Ceiling* x : {&c.bf16_flops, &c.f32_flops, &c.dram_bytes, &c.l2_bytes}) {
    std::string field;
    for (double* v : {&x->median, &x->min, &x->max}) {
      if (!std::getline(in, field, '\t')) return false;
      *v = std::strtod(field.c_str(), &end);
      if (*end != '\0' || !(*v > 0)) return false;
    }
  }
  return in.peek() == EOF;
}


// Per-thread buffers, first touched by the thread that reads them.
std::vector<AlignedBuffer> thread_buffers(int threads, std::size_t bytes) {
  std::vector<AlignedBuffer> buffers(static_cast<std::size_t>(threads));
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int i = 0; i < threads; ++i) {
    AlignedBuffer& b = buffers[static_cast<std::size_t>(i)];
    b.reset(bytes);
    std::memset(b.data(), 1, b.bytes());
  }
  return buffers;
}

// One streaming pass over `bytes` with the widest loads this CPU has (`ahead`: see read_loop_avx512).
double read_pass(const void* p, long bytes, long ahead = 0) {
  long sink = 0;
#if defined(FLASHGQA_X86_CEILINGS)
  const double b = isa_supported(Isa::avx512f) ? detail::read_loop_avx512(p, bytes, ahead, &sink)
                   : isa_supported(Isa::avx2)  ? detail::read_loop_avx2(p, bytes, ahead, &sink)
                                               : detail::read_loop_portable(p, bytes, ahead, &sink);
#elif defined(FLASHGQA_ARM_CEILINGS)
  const double b = isa_supported(Isa::neon) ? detail::read_loop_neon(p, bytes, ahead, &sink)
                                            : detail::read_loop_portable(p, bytes, ahead, &sink);
#else
  const double b = detail::read_loop_portable(p, bytes, ahead, &sink);
#endif
  g_sink_bytes.fetch_add(sink * 0, std::memory_order_relaxed);
  return b;
}

double fma_run() {
  float s = 0;
#if defined(FLASHGQA_X86_CEILINGS)
  const double f = isa_supported(Isa::avx512f) ? detail::f32_fma_loop_avx512(2'000'000, &s)
                   : isa_supported(Isa::avx2)  ? detail::f32_fma_loop_avx2(2'000'000, &s)
                                               : detail::f32_fma_loop_portable(4'000'000, &s);
#elif defined(FLASHGQA_ARM_CEILINGS)
  const double f = isa_supported(Isa::neon) ? detail::f32_fma_loop_neon(2'000'000, &s)
                                            : detail::f32_fma_loop_portable(4'000'000, &s);
#else
  const double f = detail::f32_fma_loop_portable(4'000'000, &s);
#endif
  g_sink_bytes.fetch_add(static_cast<long>(s * 0), std::memory_order_relaxed);
  return f;
}

}  // namespace

std::string ceilings_cache_path() { return user_cache_dir() + "/ceilings.tsv"; }

Ceiling measure_f32_peak(int threads, int repeats) {
  return measure(threads, repeats, [](int) { return fma_run(); });
}

// Where kernels_for runs bf16 on fp32 FMAs though the CPU has AVX512_BF16 (bf16_dot_half_rate(), no AMX).
static bool bf16_widened_on_fma() {
  return isa_supported(Isa::avx512bf16) && !isa_supported(Isa::amx) && bf16_dot_half_rate();
}

Ceiling measure_bf16_peak(int threads, int repeats) {
#if defined(FLASHGQA_X86_CEILINGS)
  if (!isa_supported(Isa::avx512bf16) || bf16_widened_on_fma()) return measure_f32_peak(threads, repeats);
  // AMX: 400k steps of 4 tdpbf16ps (~12 ms on one core), the vdpbf16ps loop 2M steps of 16.
  const auto loop = isa_supported(Isa::amx) ? [](long, float* sink) { return detail::amx_dot_loop(400'000, sink); }
                                            : detail::bf16_dot_loop;
#elif defined(FLASHGQA_ARM_CEILINGS)
  if (!isa_supported(Isa::neon_bf16)) return measure_f32_peak(threads, repeats);
  const auto loop = detail::bf16_dot_loop_neon;
#else
  return measure_f32_peak(threads, repeats);
#endif
#if defined(FLASHGQA_X86_CEILINGS) || defined(FLASHGQA_ARM_CEILINGS)
  return measure(threads, repeats, [loop](int) {
    float s = 0;
    const double f = loop(2'000'000, &s);
    g_sink_bytes.fetch_add(static_cast<long>(s * 0), std::memory_order_relaxed);
    return f;
  });
#endif
}

Ceiling measure_dram_read(int threads, int repeats) {
  constexpr long kBytes = 128L << 20;  // far beyond any cache
  const auto buffers = thread_buffers(threads, kBytes);
  Ceiling best;
  for (const long ahead : {0L, kDramPageAhead}) {
    const Ceiling c = measure(threads, repeats, [&](int id) {
      return read_pass(buffers[static_cast<std::size_t>(id)].data(), kBytes, ahead);
    });
    if (c.median > best.median) best = c;
  }
  return best;
}

Ceiling measure_l2_read(int threads, int repeats) {
  constexpr long kBytes = 256L << 10;  // beyond L1, within L2
  const auto buffers = thread_buffers(threads, kBytes);
  return measure(threads, repeats, [&](int id) {
    double bytes = 0;
    for (int pass = 0; pass < 1024; ++pass) bytes += read_pass(buffers[static_cast<std::size_t>(id)].data(), kBytes);
    return bytes;
  });
}

Ceilings measure_ceilings(int threads, int repeats) {
  threads = std::max(threads, 1);
  repeats = std::max(repeats, 1);
  Ceilings c;
  c.cpu = cpu_model();
  c.threads = threads;
  c.bf16_instruction = isa_supported(Isa::amx)          ? "tdpbf16ps (AMX)"
                       : bf16_widened_on_fma() ? "vfmadd231ps zmm (bf16 widened; vdpbf16ps is half rate here)"
                       : isa_supported(Isa::avx512bf16) ? "vdpbf16ps"
                       : isa_supported(Isa::neon_bf16)  ? "bfdot v.4s"
                       : isa_supported(Isa::avx512f)  ? "vfmadd231ps zmm (bf16 widened)"
                       : isa_supported(Isa::avx2)     ? "vfmadd231ps ymm (bf16 widened)"
                       : isa_supported(Isa::neon)     ? "fmla v.4s (bf16 widened)"
                                                      : "scalar fp32 (bf16 widened)";
  c.f32_flops = measure_f32_peak(threads, repeats);
  c.bf16_flops = measure_bf16_peak(threads, repeats);
  c.dram_bytes = measure_dram_read(threads, repeats);
  c.l2_bytes = measure_l2_read(threads, repeats);
  return c;
}

Ceilings machine_ceilings(int threads, bool remeasure, bool* from_cache) {
  const std::string path = ceilings_cache_path();
  const std::string cpu = cpu_model();
  std::vector<std::string> kept;
  {
    std::ifstream in(path);
    std::string line;
    if (in && std::getline(in, line) && line == kHeader)
      while (std::getline(in, line)) {
        Ceilings c;
        if (!parse_line(line, c)) {  // corrupt: ignore the whole file
          kept.clear();
          break;
        }
        if (c.cpu == cpu && c.threads == threads) {
          if (!remeasure) {
            if (from_cache) *from_cache = true;
            return c;
          }
          continue;
        }
        kept.push_back(line);
      }
  }
  if (from_cache) *from_cache = false;
  const Ceilings c = measure_ceilings(threads);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kHeader << '\n';
    for (const std::string& line : kept) out << line << '\n';
    out << line_of(c) << '\n';
  }
  std::filesystem::rename(tmp, path, ec);  // a cache that cannot be written only costs a remeasure
  return c;
}

}  // namespace flashgqa::study
