// The plain parameter struct of the CUDA flash forward and its launcher (flash_forward.cu). Host code
// that includes this needs no CUDA header: pointers are device pointers held as void*.
#pragma once

#include <cstdint>

#include "flashgqa/flashgqa.hpp"

namespace flashgqa::cuda {

// One tile shape of the kernel: each of its 4 warps holds m_tiles x 16 query rows (the block holds
// 64 m_tiles rows of the flattened (t, g) axis), and each KV step loads block_kv keys of K and V into
// shared memory. Which shapes exist: forward_tiles().
struct ForwardTile {
  int m_tiles = 0;
  int block_kv = 0;
};

// The largest S the kernel takes: its key indices are int, and a step's keys end up to one tile past
// the last key.
constexpr std::int64_t kMaxKeys = 0x7fffffff - 256;

struct ForwardParams {
  std::int64_t B = 0, K = 0, G = 0, T = 0, S = 0, H = 0;
  // bfloat16 q, out [B,K,G,T,H] (strides of b, k, g, t) and k, v [B,K,S,H] (strides of b, k, s), in
  // elements; h contiguous.
  const void* q = nullptr;
  std::int64_t q_stride[4] = {};
  const void* k = nullptr;
  std::int64_t k_stride[3] = {};
  const void* v = nullptr;
  std::int64_t v_stride[3] = {};
  void* out = nullptr;
  std::int64_t out_stride[4] = {};
  float* lse = nullptr;  // [B,K,G,T] float32, or null
  std::int64_t lse_stride[4] = {};
  float scale = 1.0f;
  bool causal = false;
  std::int64_t causal_offset = 0;  // query t sees key j iff j <= t + causal_offset (when causal)
  ForwardTile tile{};               // {0, 0}: the default for H (default_forward_tile)
};

// Validates the views and options as flashgqa::cuda::attention documents (throwing Error) and returns
// the kernel's parameters with the default tile. Reads no device memory.
ForwardParams make_forward_params(const TensorView& out, const TensorView* lse, const TensorView& q,
                                  const TensorView& k, const TensorView& v, const Options& options);

// The tile shapes compiled for head size H (count written to *n); null for an H without a kernel.
const ForwardTile* forward_tiles(std::int64_t H, int* n);
// The tile a launch with tile {0, 0} takes for head size H.
ForwardTile default_forward_tile(std::int64_t H);

// Queues the kernel on `stream` (a cudaStream_t); nothing for an empty problem (B K G T = 0). Throws
// Error for a tile not compiled for p.H and for a launch CUDA refuses. p as make_forward_params makes it.
void launch_flash_forward(const ForwardParams& p, void* stream);

}  // namespace flashgqa::cuda
