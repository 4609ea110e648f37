// flashgqa::cuda::attention: validates the views and options (make_problem, as the CPU path, then what
// the CUDA kernel takes) and queues the flash forward (flash_forward.cu).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/problem.hpp"
#include "cuda/flash_forward.hpp"
#include "flashgqa/cuda.hpp"
#include "kernels/exp_poly.hpp"

namespace flashgqa::cuda {
namespace {

const std::string kWho = "flashgqa::cuda::attention: ";

// Options this path does not have yet; checked before make_problem, which reads host arrays
// (sinks, cu_seqlens) that a GPU caller may have passed as device pointers.
void refuse_unsupported(const Options& o) {
  auto refuse = [](const std::string& what) {
    throw Error(kWho + what + " is not supported on the CUDA path yet");
  };
  if (o.algorithm != Algorithm::flash)
    refuse(std::string("algorithm ") + algorithm_name(o.algorithm) + " (expected flash)");
  if (o.window_left != -1 || o.window_right != -1)
    refuse("a window (window_left " + std::to_string(o.window_left) + ", window_right " +
           std::to_string(o.window_right) + "; expected -1, -1)");
  if (o.softcap != 0.0) refuse("softcap " + std::to_string(o.softcap) + " (expected 0)");
  if (o.sinks != nullptr) refuse("sinks (expected null)");
  if (o.num_sequences != 0 || o.cu_seqlens_q != nullptr || o.cu_seqlens_k != nullptr)
    refuse("packed sequences (expected num_sequences 0 and null cu_seqlens)");
  if (o.precision != Precision::bf16)
    refuse(std::string("precision ") + precision_name(o.precision) + " (expected bf16)");
  if (o.block_q != 0 || o.block_kv != 0)
    refuse("block_q " + std::to_string(o.block_q) + ", block_kv " + std::to_string(o.block_kv) +
           " (expected 0, 0: the tiles are the kernel's)");
}

// Each row of `name` must start 16-byte aligned: the base pointer and the stride of every dimension
// but h's, where that dimension has more than one index (a stride never multiplied by a non-zero
// index does not matter, and PyTorch keeps any stride there). An empty view is not read.
void check_rows_aligned(const char* name, const void* data, const std::int64_t* strides,
                        std::initializer_list<std::int64_t> extents) {
  const std::int64_t* extent = extents.begin();
  for (std::int64_t e : extents)
    if (e == 0) return;
  if (reinterpret_cast<std::uintptr_t>(data) % 16 != 0)
    throw Error(kWho + name + "'s data pointer is not 16-byte aligned (expected cudaMalloc'd memory)");
  for (std::size_t i = 0; i < extents.size(); ++i)
    if (extent[i] > 1 && strides[i] % 8 != 0)
      throw Error(kWho + name + " has stride " + std::to_string(strides[i]) + " in dimension " +
                  std::to_string(i) + ", expected a multiple of 8 elements (16-byte aligned rows)");
}

// Every pointer the kernel touches must be memory of the current device (cudaMalloc'd or managed):
// a host pointer would otherwise fail inside the kernel, and that error sticks to the CUDA context.
void check_device_memory(const ForwardParams& f) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    throw Error(kWho + "no CUDA device: " + cudaGetErrorString(cudaGetLastError()));
  const void* no_keys = nullptr;  // S = 0: k and v are not read
  const std::pair<const char*, const void*> pointers[] = {
      {"q", f.q}, {"k", f.S > 0 ? f.k : no_keys}, {"v", f.S > 0 ? f.v : no_keys}, {"out", f.out}, {"lse", f.lse}};
  for (auto [name, ptr] : pointers) {
    if (ptr == nullptr) continue;  // lse not asked for, or k and v not read
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess)
      throw Error(kWho + name + ": cudaPointerGetAttributes failed: " + cudaGetErrorString(cudaGetLastError()));
    if ((a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) || a.device != device)
      throw Error(kWho + name + " is not memory of the current device " + std::to_string(device) +
                  " (expected cudaMalloc'd or managed device memory)");
  }
}

}  // namespace

ForwardParams make_forward_params(const TensorView& out, const TensorView* lse, const TensorView& q,
                                  const TensorView& k, const TensorView& v, const Options& options) {
  refuse_unsupported(options);
  const Problem p = make_problem(out, lse, q, k, v, options);
  for (auto [name, dtype] : {std::pair{"q", p.q_dtype}, {"k", p.k_dtype}, {"v", p.v_dtype}, {"out", p.out_dtype}})
    if (dtype != DType::bf16)
      throw Error(kWho + name + " is " + dtype_name(dtype) + ", expected bf16 (the only dtype of the CUDA path)");
  int n_tiles = 0;
  forward_tiles(p.H, &n_tiles);
  if (n_tiles == 0)
    throw Error(kWho + "head size H = " + std::to_string(p.H) + ", expected 64, 128 or 256");
  if (p.S > kMaxKeys)
    throw Error(kWho + "S = " + std::to_string(p.S) + ", expected at most " + std::to_string(kMaxKeys));
  // The kernel works in c = |scale| log2(e), this product in float (flash_forward.cu).
  if (!std::isfinite(std::fabs(p.scale) * exp_poly::kLog2e))
    throw Error(kWho + "scale " + std::to_string(p.scale) + ": |scale| log2(e) overflows float, expected |scale| < 2.3e38");
  check_rows_aligned("q", p.q, p.q_stride, {p.B, p.K, p.G, p.T});
  check_rows_aligned("k", p.k, p.k_stride, {p.B, p.K, p.S});
  check_rows_aligned("v", p.v, p.v_stride, {p.B, p.K, p.S});
  check_rows_aligned("out", p.out, p.out_stride, {p.B, p.K, p.G, p.T});
  if (p.lse != nullptr && reinterpret_cast<std::uintptr_t>(p.lse) % alignof(float) != 0)
    throw Error(kWho + "lse's data pointer is not 4-byte aligned (expected float32 elements)");

  ForwardParams f;
  f.B = p.B, f.K = p.K, f.G = p.G, f.T = p.T, f.S = p.S, f.H = p.H;
  f.q = p.q, f.k = p.k, f.v = p.v, f.out = p.out, f.lse = p.lse;
  for (int i = 0; i < 4; ++i) {
    f.q_stride[i] = p.q_stride[i];
    f.out_stride[i] = p.out_stride[i];
    f.lse_stride[i] = p.lse_stride[i];
  }
  for (int i = 0; i < 3; ++i) {
    f.k_stride[i] = p.k_stride[i];
    f.v_stride[i] = p.v_stride[i];
  }
  f.scale = p.scale;
  f.causal = p.causal;
  // Offsets past these ends mean the same mask (no key, or every key, for every query) and keep the
  // kernel's t + offset + 1 from overflowing.
  f.causal_offset = p.causal_offset < -(p.T + 1) ? -(p.T + 1) : p.causal_offset > p.S ? p.S : p.causal_offset;
  return f;
}

namespace {

void run(const ForwardParams& f, void* stream) {
  if (f.B * f.K * f.G * f.T == 0) return;  // nothing to read or write
  check_device_memory(f);
  launch_flash_forward(f, stream);
}

}  // namespace

void attention(const TensorView& out, const TensorView& q, const TensorView& k, const TensorView& v,
               const Options& options, void* stream) {
  run(make_forward_params(out, nullptr, q, k, v, options), stream);
}

void attention(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
               const TensorView& v, const Options& options, void* stream) {
  run(make_forward_params(out, &lse, q, k, v, options), stream);
}

}  // namespace flashgqa::cuda
