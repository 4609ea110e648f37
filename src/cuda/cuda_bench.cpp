// flashgqa_cuda_bench: TFLOP/s of the CUDA flash forward beside the bf16 GEMM peak measured in the same
// run with cuBLAS (an 8192^3 product on random data), as a fraction of that peak.
//
//   flashgqa_cuda_bench [--all-tiles] [--reps N] [--csv FILE]
//
// Each timing is the median of N (default 30) launches after 5 warm-ups, each launch between its own
// pair of CUDA events. FLOPs = 4 B K G H x (visible (query, key) pairs): causal counts only the
// visible half. --all-tiles times every compiled tile of each head size, not only the default.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "cuda/flash_forward.hpp"

namespace {

using flashgqa::cuda::ForwardParams;
using flashgqa::cuda::ForwardTile;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: cuBLAS status %d\n", what, static_cast<int>(s));
    std::exit(1);
  }
}

// n random bf16 values, normal(0, 1), on the device.
__nv_bfloat16* random_device_bf16(std::size_t n, unsigned seed) {
  std::vector<__nv_bfloat16> host(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (auto& x : host) x = __float2bfloat16(normal(rng));
  __nv_bfloat16* d = nullptr;
  check(cudaMalloc(&d, n * sizeof(__nv_bfloat16)), "cudaMalloc");
  check(cudaMemcpy(d, host.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice), "cudaMemcpy");
  return d;
}

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
};

Timing time_launches(const std::function<void()>& launch, int reps) {
  for (int i = 0; i < 5; ++i) launch();
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<cudaEvent_t> events(2 * reps);
  for (auto& e : events) check(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(events[2 * i]), "cudaEventRecord");
    launch();
    check(cudaEventRecord(events[2 * i + 1]), "cudaEventRecord");
  }
  check(cudaEventSynchronize(events.back()), "cudaEventSynchronize");
  check(cudaGetLastError(), "a launch");
  std::vector<double> ms(reps);
  for (int i = 0; i < reps; ++i) {
    float t = 0;
    check(cudaEventElapsedTime(&t, events[2 * i], events[2 * i + 1]), "cudaEventElapsedTime");
    ms[i] = t;
  }
  for (auto& e : events) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return {ms[reps / 2], ms.front(), ms.back()};
}

// The cuBLAS bf16 product C = A B, M = N = K = n, fp32 accumulation: TFLOP/s of the median launch.
double gemm_peak(int n, int reps, FILE* csv) {
  __nv_bfloat16* a = random_device_bf16(std::size_t(n) * n, 1);
  __nv_bfloat16* b = random_device_bf16(std::size_t(n) * n, 2);
  __nv_bfloat16* c = nullptr;
  check(cudaMalloc(&c, std::size_t(n) * n * sizeof(__nv_bfloat16)), "cudaMalloc");
  cublasHandle_t handle;
  check(cublasCreate(&handle), "cublasCreate");
  const float alpha = 1.0f, beta = 0.0f;
  const Timing t = time_launches(
      [&] {
        check(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n,
                           &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
      },
      reps);
  const double flops = 2.0 * n * double(n) * n;
  const double tflops = flops / (t.median_ms * 1e-3) / 1e12;
  std::printf("gemm bf16 %dx%dx%d (cuBLAS, fp32 accumulation): median %.3f ms [%.3f, %.3f] = %.1f TFLOP/s\n", n, n,
              n, t.median_ms, t.min_ms, t.max_ms, tflops);
  if (csv) std::fprintf(csv, "gemm,%d,%d,%d,,,,,,%.5f,%.5f,%.5f,%.2f,100.0\n", n, n, n, t.median_ms, t.min_ms, t.max_ms, tflops);
  cublasDestroy(handle);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return tflops;
}

struct Workload {
  std::int64_t B, K, G, T, S, H;
  bool causal;
};

void bench_flash(const Workload& w, bool all_tiles, int reps, double peak, FILE* csv) {
  const std::size_t nq = std::size_t(w.B * w.K * w.G * w.T * w.H), nkv = std::size_t(w.B * w.K * w.S * w.H);
  __nv_bfloat16* q = random_device_bf16(nq, 3);
  __nv_bfloat16* k = random_device_bf16(nkv, 4);
  __nv_bfloat16* v = random_device_bf16(nkv, 5);
  __nv_bfloat16* out = nullptr;
  float* lse = nullptr;
  check(cudaMalloc(&out, nq * sizeof(__nv_bfloat16)), "cudaMalloc");
  check(cudaMalloc(&lse, nq / w.H * sizeof(float)), "cudaMalloc");
  using flashgqa::contiguous_view;
  using flashgqa::DType;
  const auto qv = contiguous_view(q, DType::bf16, {w.B, w.K, w.G, w.T, w.H});
  const auto ov = contiguous_view(out, DType::bf16, {w.B, w.K, w.G, w.T, w.H});
  const auto lv = contiguous_view(lse, DType::f32, {w.B, w.K, w.G, w.T});
  const auto kv = contiguous_view(k, DType::bf16, {w.B, w.K, w.S, w.H});
  const auto vv = contiguous_view(v, DType::bf16, {w.B, w.K, w.S, w.H});
  flashgqa::Options options;
  options.causal = w.causal;
  const ForwardParams base = flashgqa::cuda::make_forward_params(ov, &lv, qv, kv, vv, options);
  // Visible (query, key) pairs of one head, as the library counts them (bottom-right causal).
  const double pairs = double(flashgqa::make_problem(ov, &lv, qv, kv, vv, options).visible_pairs());
  int n_tiles = 0;
  const ForwardTile* tiles = flashgqa::cuda::forward_tiles(w.H, &n_tiles);
  const double flops = 4.0 * double(w.B * w.K * w.G * w.H) * pairs;
  for (int i = 0; i < (all_tiles ? n_tiles : 1); ++i) {
    ForwardParams p = base;
    p.tile = tiles[i];
    const Timing t = time_launches([&] { flashgqa::cuda::launch_flash_forward(p, nullptr); }, reps);
    const double tflops = flops / (t.median_ms * 1e-3) / 1e12;
    std::printf("flash B%lld K%lld G%lld T%lld S%lld H%lld %-6s tile %dx%-3d: median %.3f ms [%.3f, %.3f] = %.1f "
                "TFLOP/s = %.1f%% of the GEMM peak\n",
                (long long)w.B, (long long)w.K, (long long)w.G, (long long)w.T, (long long)w.S, (long long)w.H,
                w.causal ? "causal" : "full", tiles[i].m_tiles, tiles[i].block_kv, t.median_ms, t.min_ms, t.max_ms,
                tflops, 100.0 * tflops / peak);
    if (csv)
      std::fprintf(csv, "flash,%lld,%lld,%lld,%lld,%lld,%lld,%d,%dx%d,%.5f,%.5f,%.5f,%.2f,%.2f\n", (long long)w.B,
                   (long long)w.K, (long long)w.G, (long long)w.T, (long long)w.S, (long long)w.H, w.causal ? 1 : 0,
                   tiles[i].m_tiles, tiles[i].block_kv, t.median_ms, t.min_ms, t.max_ms, tflops, 100.0 * tflops / peak);
  }
  cudaFree(q);
  cudaFree(k);
  cudaFree(v);
  cudaFree(out);
  cudaFree(lse);
}

}  // namespace

int main(int argc, char** argv) {
  bool all_tiles = false;
  int reps = 30;
  FILE* csv = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--all-tiles") {
      all_tiles = true;
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--csv" && i + 1 < argc) {
      csv = std::fopen(argv[++i], "w");
      if (!csv) {
        std::fprintf(stderr, "cannot write %s\n", argv[i]);
        return 2;
      }
      std::fprintf(csv, "what,B,K,G,T,S,H,causal,tile,median_ms,min_ms,max_ms,tflops,percent_of_gemm\n");
    } else {
      std::fprintf(stderr, "usage: flashgqa_cuda_bench [--all-tiles] [--reps N] [--csv FILE]\n");
      return 2;
    }
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s, %d SMs, %.0f MB L2\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6);
  const double peak = gemm_peak(8192, reps, csv);
  const Workload workloads[] = {
      {1, 8, 4, 4096, 4096, 128, false}, {1, 8, 4, 4096, 4096, 128, true},  // the targets
      {1, 8, 4, 4096, 4096, 64, false},  {1, 8, 4, 4096, 4096, 256, false},
      {4, 8, 4, 4096, 4096, 128, false}, {1, 8, 4, 16384, 16384, 128, true},
  };
  for (const Workload& w : workloads) bench_flash(w, all_tiles, reps, peak, csv);
  // The GEMM again: the clocks may have moved during the run.
  gemm_peak(8192, reps, csv);
  if (csv) std::fclose(csv);
  return 0;
}
