// The seed's flash attention forward on an NVIDIA GPU (sm_80 instructions, built for Hopper sm_90a):
// FlashAttention-2's schedule written out for the mma.sync tensor-core instruction.
//
// One thread block of 4 warps per (b, kv head, block of Br query rows). The rows are the flattened
// (t, g) axis, row = t G + g, so a block holds all G query heads of its kv head for Br / G
// consecutive queries: each K/V tile read from device memory serves G heads (the GQA reuse). Each
// warp owns m_tiles x 16 of the rows; its accumulators O (rows x H, fp32), the running max m and
// sum l never leave registers (the seed's last rung: the KV loop inside, carries in fast memory).
//
// Per KV step of block_kv keys (kv_step; FlashAttention-2's order):
//   wait for K_j in shared memory; start loading V_j (cp.async; overlaps S = Q K_j^T)
//   S = Q K_j^T           Q from shared memory by ldmatrix, K_j as the B operand (ldmatrix)
//   wait for V_j; start loading K_{j+1} (overlaps the softmax and P V_j)
//   mask (only in steps some row does not fully see), online softmax in registers: 2^(s c - m c),
//                         c = |scale| log2(e), one FMA per logit; O rescaled only when a max grew
//   O += P V_j            P re-packed from S's accumulator registers as bf16 A fragments (no shared
//                         memory round trip), V_j through ldmatrix.trans
// Epilogue: O / l in bf16, lse = m c ln 2 + ln l. Causal blocks stop at their last visible key, and
// the heaviest row blocks are launched first. Measured on an H200: docs/gpu.md.
//
// Shared-memory tiles are row-major with 16-byte chunks XOR-swizzled by the row (chunk c of row r at
// c ^ (r & 7)), so the 8 rows one ldmatrix phase reads fall in 8 different bank groups.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): lane = 4 g + q (g = lane / 4, q = lane % 4);
//   A (16 x 16): a0 = row g, cols 2q..2q+1; a1 = row g+8, same; a2 = row g, cols 8+2q..; a3 = row g+8
//   B (16 x 8):  b0 = k rows 2q..2q+1, col g; b1 = k rows 8+2q.., col g
//   C (16 x 8):  c0, c1 = row g, cols 2q, 2q+1; c2, c3 = row g+8
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "core/int_math.hpp"
#include "cuda/flash_forward.hpp"
#include "kernels/exp_poly.hpp"
#include "flashgqa/flashgqa.hpp"

namespace flashgqa::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr float kLn2 = 0.6931471805599453f;    // ln(2): ln(2^y) = y ln(2)
constexpr std::uint32_t kBf16x2SignBits = 0x80008000u;  // the sign bits of two bf16 in one word

// ---- PTX wrappers ----------------------------------------------------------------------------------

__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; with valid false the 16 bytes are zeros (nothing read).
__device__ __forceinline__ void copy16_async(std::uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void wait_copies() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Four 8x8 bf16 matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void load_matrices(std::uint32_t (&r)[4], std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
// The same, each matrix transposed.
__device__ __forceinline__ void load_matrices_transposed(std::uint32_t (&r)[4], std::uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a b: one 16x8x16 bf16 product with fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x (ex2.approx: relative error ~2^-22, below the library's exp budget kExpRelError = 2^-20;
// results below 2^-126 flush to zero, an absolute error the bounds carry).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats as bf16 (round to nearest even), lo in the low half: one 32-bit A/B fragment register.
__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  std::uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}

// The end of the keys query t sees under a causal mask: t + offset + 1 clamped to [0, S].
__device__ __forceinline__ int causal_end(const ForwardParams& p, std::int64_t t) {
  const std::int64_t end = t + p.causal_offset + 1;
  return static_cast<int>(end < 0 ? 0 : end > p.S ? p.S : end);
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of kChunks chunks per row.
template <int kChunks>
__device__ __forceinline__ std::uint32_t tile_offset(int row, int chunk) {
  static_assert(kChunks >= 8, "the swizzle permutes 8 chunks");
  return static_cast<std::uint32_t>((row * kChunks + (chunk ^ (row & 7))) * 16);
}

// Loads rows [row0, row0 + kRows) of a [rows, H] bf16 matrix (row stride in elements) into a tile;
// rows at or past n_valid are zeros.
template <int H, int kRows>
__device__ __forceinline__ void load_tile(std::uint32_t tile, const bf16* base, std::int64_t row_stride,
                                          int row0, int n_valid) {
  constexpr int kChunks = H / 8;
  static_assert(kRows * kChunks % kThreads == 0, "whole chunks per thread");
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * kThreads;
    const int r = c / kChunks, chunk = c % kChunks;
    const bool valid = row0 + r < n_valid;
    const bf16* src = base + (valid ? static_cast<std::int64_t>(row0 + r) * row_stride + chunk * 8 : 0);
    copy16_async(tile + tile_offset<kChunks>(r, chunk), src, valid);
  }
}

// ---- the kernel ------------------------------------------------------------------------------------

// What one thread of a block reads and keeps across KV steps.
template <int H, int kMTiles>
struct RowState {
  float o[kMTiles][H / 8][4];  // O: C fragments of 8 columns each
  float m[kMTiles][2];         // running max of the row's logits, unscaled (rows g and g + 8 of an m tile)
  float l[kMTiles][2];         // running sum of 2^((s - m) c): this lane's columns; the quad's sum at the end
  int row_end[kMTiles][2];     // the row sees keys [0, row_end)
};

struct Tiles {
  std::uint32_t q, k, v;  // shared-memory addresses
};

// One KV step over keys [j0, j0 + kBc): FlashAttention-2's order. V_j's load overlaps S = Q K_j^T,
// K_{j+1}'s the softmax and O += P V_j. kMask: some row of the block does not see some key of the
// step (the diagonal under a causal mask, or keys past S).
template <int H, int kMTiles, int kBc, bool kMask>
__device__ __forceinline__ void kv_step(const ForwardParams& p, const Tiles& tiles, const bf16* k, const bf16* v,
                                        int j, int n_blocks, float c,
                                        RowState<H, kMTiles>& st) {
  constexpr int kChunks = H / 8;
  constexpr int kSTiles = kBc / 8;
  constexpr int kOTiles = H / 8;
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int S = static_cast<int>(p.S), j0 = j * kBc;

  wait_copies();
  __syncthreads();  // K_j (and Q) are in; every warp is done with V_{j-1}
  load_tile<H, kBc>(tiles.v, v, p.v_stride[2], j0, S);
  commit_copies();

  // S = Q K_j^T (unscaled; Q's sign flipped when the scale is negative)
  float s[kMTiles][kSTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[mt][nt][i] = 0.0f;
#pragma unroll 1
  for (int kk = 0; kk < H / 16; ++kk) {
    std::uint32_t a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      load_matrices(a[mt], tiles.q + tile_offset<kChunks>(warp * 16 * kMTiles + mt * 16 + lane % 8 + (lane / 8 % 2) * 8,
                                                          2 * kk + lane / 16));
    }
#pragma unroll
    for (int np = 0; np < kSTiles / 2; ++np) {
      std::uint32_t kb[4];
      load_matrices(kb, tiles.k + tile_offset<kChunks>(np * 16 + lane % 8 + (lane / 16) * 8, 2 * kk + lane / 8 % 2));
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        mma_bf16(s[mt][2 * np], a[mt], kb[0], kb[1]);
        mma_bf16(s[mt][2 * np + 1], a[mt], kb[2], kb[3]);
      }
    }
  }

  wait_copies();
  __syncthreads();  // V_j is in; every warp is done with K_j
  if (j + 1 < n_blocks) load_tile<H, kBc>(tiles.k, k, p.k_stride[2], j0 + kBc, S);
  commit_copies();

  // Online softmax per row, in log2 units: p = 2^(s c - m c), c = |scale| log2(e); the row's 4 lanes
  // (one quad) share its max. A masked key counts as -inf in the max and 0 in the sum.
  bool any_grew = false;
  float rescale[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      bool seen[kSTiles][2];
      float block_max = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          seen[nt][e] = !kMask || j0 + nt * 8 + (lane % 4) * 2 + e < st.row_end[mt][half];
          if (seen[nt][e]) block_max = fmaxf(block_max, s[mt][nt][2 * half + e]);
        }
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 1));
      block_max = fmaxf(block_max, __shfl_xor_sync(0xffffffffu, block_max, 2));
      const float m_old = st.m[mt][half];
      const float m_new = fmaxf(m_old, block_max);
      const bool grew = m_new > m_old;
      any_grew |= grew;
      const float base = m_new == -INFINITY ? 0.0f : m_new * c;  // a row that saw nothing yet
      rescale[mt][half] = !grew ? 1.0f : m_old == -INFINITY ? 0.0f : exp2_approx(fmaf(m_old, c, -base));
      st.m[mt][half] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[mt][nt][2 * half + e];
          x = seen[nt][e] ? exp2_approx(fmaf(x, c, -base)) : 0.0f;
          sum += x;
        }
      st.l[mt][half] = st.l[mt][half] * rescale[mt][half] + sum;
    }
  // O's rescale, skipped when no row of the warp found a larger max (a factor of 1 changes nothing).
  if (__any_sync(0xffffffffu, any_grew)) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kOTiles; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) st.o[mt][nt][i] *= rescale[mt][i / 2];
  }

  // P as bf16 A fragments straight from S's accumulator registers (16 keys per fragment).
  std::uint32_t pa[kMTiles][kBc / 16][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      pa[mt][kk][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
      pa[mt][kk][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
      pa[mt][kk][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
      pa[mt][kk][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
    }

  // O += P V_j
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
    for (int np = 0; np < kOTiles / 2; ++np) {
      std::uint32_t vb[4];
      load_matrices_transposed(vb, tiles.v + tile_offset<kChunks>(kk * 16 + lane % 8 + (lane / 8 % 2) * 8, 2 * np + lane / 16));
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        mma_bf16(st.o[mt][2 * np], pa[mt][kk], vb[0], vb[1]);
        mma_bf16(st.o[mt][2 * np + 1], pa[mt][kk], vb[2], vb[3]);
      }
    }
}

template <int H, int kMTiles, int kBc>
__global__ void __launch_bounds__(kThreads, 2) flash_forward_kernel(const __grid_constant__ ForwardParams p) {
  constexpr int kChunks = H / 8;             // 16-byte chunks per row
  constexpr int kBr = kWarps * 16 * kMTiles;  // query rows per block
  constexpr int kOTiles = H / 8;             // 8-column tiles of O
  extern __shared__ __align__(128) unsigned char smem[];
  Tiles tiles;
  tiles.q = shared_address(smem);
  tiles.k = tiles.q + kBr * H * 2;
  tiles.v = tiles.k + kBc * H * 2;

  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const std::int64_t rows = p.G * p.T;
  const std::int64_t n_row_blocks = (rows + kBr - 1) / kBr;
  const std::int64_t heads = p.B * p.K;
  // Heaviest row blocks (the last queries, under a causal mask) first, across all heads.
  const std::int64_t bk = blockIdx.x % heads;
  const std::int64_t m0 = (n_row_blocks - 1 - blockIdx.x / heads) * kBr;
  const std::int64_t b = bk / p.K, kh = bk % p.K;
  const bf16* q = static_cast<const bf16*>(p.q) + b * p.q_stride[0] + kh * p.q_stride[1];
  const bf16* k = static_cast<const bf16*>(p.k) + b * p.k_stride[0] + kh * p.k_stride[1];
  const bf16* v = static_cast<const bf16*>(p.v) + b * p.v_stride[0] + kh * p.v_stride[1];
  const int S = static_cast<int>(p.S);

  // Q: row i of the tile is (t, g) = divmod(m0 + i, G); rows past G T are zeros. A negative scale:
  // s scale = (-s) |scale|, and -q is exact in bf16, so each thread flips the sign of the chunks it
  // loaded once they are in (the first KV step's barrier publishes them).
#pragma unroll
  for (int i = 0; i < kBr * kChunks / kThreads; ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * kThreads;
    const int r = c / kChunks, chunk = c % kChunks;
    const std::int64_t row = m0 + r;
    const bool valid = row < rows;
    const std::int64_t t = valid ? row / p.G : 0, g = valid ? row % p.G : 0;
    copy16_async(tiles.q + tile_offset<kChunks>(r, chunk), q + g * p.q_stride[2] + t * p.q_stride[3] + chunk * 8,
                 valid);
  }

  commit_copies();
  if (p.scale < 0.0f) {
    wait_copies();
#pragma unroll
    for (int i = 0; i < kBr * kChunks / kThreads; ++i) {
      const int c = static_cast<int>(threadIdx.x) + i * kThreads;
      unsigned char* chunk = smem + tile_offset<kChunks>(c / kChunks, c % kChunks);
      uint4 x = *reinterpret_cast<uint4*>(chunk);
      x.x ^= kBf16x2SignBits, x.y ^= kBf16x2SignBits, x.z ^= kBf16x2SignBits, x.w ^= kBf16x2SignBits;
      *reinterpret_cast<uint4*>(chunk) = x;
    }
  }

  // The keys this block visits, [0, kv_end), and those every one of its rows sees, [0, full_end).
  const std::int64_t t_first = m0 / p.G, t_last = ((m0 + kBr < rows ? m0 + kBr : rows) - 1) / p.G;
  int kv_end = S, full_end = S;
  if (p.causal) {
    kv_end = causal_end(p, t_last);
    full_end = causal_end(p, t_first);
  }
  RowState<H, kMTiles> st;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      // This thread's rows: C fragment rows g and g + 8 of each of its m tiles.
      const std::int64_t row = m0 + warp * 16 * kMTiles + mt * 16 + half * 8 + lane / 4;
      st.row_end[mt][half] =
          p.causal && row < rows ? causal_end(p, row / p.G) : S;
      st.m[mt][half] = -INFINITY;
      st.l[mt][half] = 0.0f;
    }
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) st.o[mt][nt][i] = 0.0f;
  }
  const float c = fabsf(p.scale) * exp_poly::kLog2e;

  // Steps whose keys every row sees, then those that need the mask.
  const int n_blocks = (kv_end + kBc - 1) / kBc;
  const int n_unmasked = full_end / kBc;
  if (n_blocks > 0) load_tile<H, kBc>(tiles.k, k, p.k_stride[2], 0, S);
  commit_copies();
  for (int j = 0; j < n_unmasked; ++j) kv_step<H, kMTiles, kBc, false>(p, tiles, k, v, j, n_blocks, c, st);
  for (int j = n_unmasked; j < n_blocks; ++j) kv_step<H, kMTiles, kBc, true>(p, tiles, k, v, j, n_blocks, c, st);
  wait_copies();

  // Epilogue: out = O / l (0 for a row that saw no key), lse = m c ln 2 + ln l (-inf then).
  bf16* out = static_cast<bf16*>(p.out) + b * p.out_stride[0] + kh * p.out_stride[1];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = st.l[mt][half];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const std::int64_t row = m0 + warp * 16 * kMTiles + mt * 16 + half * 8 + lane / 4;
      if (row >= rows) continue;
      const std::int64_t t = row / p.G, g = row % p.G;
      // A row saw no key when its sum is 0 (the CPU's finish_row says the same); a NaN sum is not empty.
      const bool empty = sum == 0.0f;
      const float inv = empty ? 0.0f : 1.0f / sum;
      bf16* dst = out + g * p.out_stride[2] + t * p.out_stride[3] + (lane % 4) * 2;
#pragma unroll
      for (int nt = 0; nt < kOTiles; ++nt)
        *reinterpret_cast<__nv_bfloat162*>(dst + nt * 8) =
            __floats2bfloat162_rn(st.o[mt][nt][2 * half] * inv, st.o[mt][nt][2 * half + 1] * inv);
      if (p.lse != nullptr && lane % 4 == 0)
        p.lse[b * p.lse_stride[0] + kh * p.lse_stride[1] + g * p.lse_stride[2] + t * p.lse_stride[3]] =
            empty ? -INFINITY : st.m[mt][half] * c * kLn2 + logf(sum);
    }
}

// ---- launch ----------------------------------------------------------------------------------------

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string("flashgqa::cuda::attention: ") + what + " failed: " + cudaGetErrorString(e));
}

constexpr std::int64_t kMaxBlocks = 0x7fffffff;  // a grid's x dimension

template <int H, int kMTiles, int kBc>
void launch(const ForwardParams& p, cudaStream_t stream) {
  constexpr int kBr = kWarps * 16 * kMTiles;
  constexpr int kSmem = (kBr + 2 * kBc) * H * 2;
  auto* kernel = flash_forward_kernel<H, kMTiles, kBc>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem),
        "cudaFuncSetAttribute");
  const std::int64_t blocks = ceil_div(p.G * p.T, kBr) * p.B * p.K;
  if (blocks > kMaxBlocks)
    throw Error("flashgqa::cuda::attention: " + std::to_string(blocks) +
                " thread blocks (B K ceil(G T / " + std::to_string(kBr) + ")); at most 2^31 - 1 are launched");
  kernel<<<static_cast<unsigned>(blocks), kThreads, kSmem, stream>>>(p);
  check(cudaGetLastError(), "the kernel launch");
}

struct Variant {
  int H;
  ForwardTile tile;
  void (*launch)(const ForwardParams&, cudaStream_t);
};

// Per H, the default tile first: the fastest in session 18's H200 runs (docs/gpu.md). H = 256 holds
// one m tile per warp: two would need 256 fp32 accumulators per thread for O alone.
constexpr Variant kVariants[] = {
    {64, {2, 64}, launch<64, 2, 64>},     {64, {2, 128}, launch<64, 2, 128>},
    {64, {1, 64}, launch<64, 1, 64>},     {128, {2, 64}, launch<128, 2, 64>},
    {128, {2, 32}, launch<128, 2, 32>},   {128, {2, 16}, launch<128, 2, 16>},
    {128, {1, 64}, launch<128, 1, 64>},   {128, {1, 128}, launch<128, 1, 128>},
    {256, {1, 32}, launch<256, 1, 32>},   {256, {1, 64}, launch<256, 1, 64>},
    {256, {1, 16}, launch<256, 1, 16>},
};

}  // namespace

const ForwardTile* forward_tiles(std::int64_t H, int* n) {
  static const auto tiles = [] {
    struct Table {
      ForwardTile t[3][8];
      int n[3] = {};
    } table{};
    for (const Variant& v : kVariants) {
      const int i = v.H == 64 ? 0 : v.H == 128 ? 1 : 2;
      table.t[i][table.n[i]++] = v.tile;
    }
    return table;
  }();
  const int i = H == 64 ? 0 : H == 128 ? 1 : H == 256 ? 2 : -1;
  *n = i < 0 ? 0 : tiles.n[i];
  return i < 0 ? nullptr : tiles.t[i];
}

ForwardTile default_forward_tile(std::int64_t H) {
  int n = 0;
  const ForwardTile* tiles = forward_tiles(H, &n);
  return n > 0 ? tiles[0] : ForwardTile{};
}

void launch_flash_forward(const ForwardParams& p, void* stream) {
  if (p.B * p.K * p.G * p.T == 0) return;
  const ForwardTile tile = p.tile.m_tiles == 0 ? default_forward_tile(p.H) : p.tile;
  for (const Variant& v : kVariants)
    if (v.H == p.H && v.tile.m_tiles == tile.m_tiles && v.tile.block_kv == tile.block_kv) {
      ForwardParams q = p;
      q.tile = tile;
      return v.launch(q, static_cast<cudaStream_t>(stream));
    }
  throw Error("flashgqa::cuda::attention: no kernel for H = " + std::to_string(p.H) + " with tile " +
              std::to_string(tile.m_tiles) + " x " + std::to_string(tile.block_kv));
}

}  // namespace flashgqa::cuda
