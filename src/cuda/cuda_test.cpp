// flashgqa_cuda_test: the CUDA forward against the float64 reference, on random inputs of awkward
// shapes (no size a multiple of a tile, T != S, G = 1, H = 64/128/256, B K beyond the multiprocessors'
// blocks, rows that see no key, S = 0, causal offsets past every clamp, a NaN input), every compiled
// tile of each H, with and without lse; out and lse poisoned with NaN before each run, so an
// unwritten element fails. Also: the same bits twice, through the public entry point on a stream of
// its own, and in both layouts (the arithmetic does not depend on strides); the refusals (Error,
// before any launch; the ones that need no device run first, so they also run without a GPU).
// Needs a CUDA GPU for the rest; prints a line per check and exits 1 if any failed.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "cuda/flash_forward.hpp"
#include "flashgqa/cuda.hpp"
#include "reference/reference.hpp"
#include "reference/tolerance.hpp"
#include "testing/attention_case.hpp"

namespace flashgqa::cuda {
namespace {

using testing::AttentionCase;
using testing::Layout;
using testing::Shape;

int g_failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++g_failures;
}

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "FAIL %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// A device copy of one host buffer.
struct DeviceBuffer {
  void* data = nullptr;
  std::size_t bytes = 0;
  DeviceBuffer(const void* host, std::size_t n) : bytes(n) {
    cuda_check(cudaMalloc(&data, n > 0 ? n : 1), "cudaMalloc");
    if (n > 0) cuda_check(cudaMemcpy(data, host, n, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
  }
  ~DeviceBuffer() { cudaFree(data); }
  void copy_to(void* host) const {
    if (bytes > 0) cuda_check(cudaMemcpy(host, data, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
  }
};

// `view` (into host buffer `host`) moved onto the device copy of that buffer.
TensorView on_device(TensorView view, const void* host, const DeviceBuffer& device) {
  view.data = static_cast<char*>(device.data) + (static_cast<const char*>(view.data) - static_cast<const char*>(host));
  return view;
}

// Runs the CUDA forward on a fresh device copy of c (out and lse poisoned with NaN: 0xffff is a
// bf16 NaN) and copies the results back into c. public_api: through flashgqa::cuda::attention on a
// stream of its own, with the default tile (`tile` unused); else the launcher with `tile`.
void run_on_device(AttentionCase& c, const Options& options, ForwardTile tile, bool with_lse,
                   bool public_api = false) {
  std::fill(c.out_buf.begin(), c.out_buf.end(), std::byte{0xff});
  std::fill(c.lse_buf.begin(), c.lse_buf.end(), std::nanf(""));
  DeviceBuffer q(c.q_buf.data(), c.q_buf.size()), k(c.k_buf.data(), c.k_buf.size()),
      v(c.v_buf.data(), c.v_buf.size()), out(c.out_buf.data(), c.out_buf.size()),
      lse(c.lse_buf.data(), c.lse_buf.size() * sizeof(float));
  const TensorView d_out = on_device(c.out, c.out_buf.data(), out), d_q = on_device(c.q, c.q_buf.data(), q),
                   d_k = on_device(c.k, c.k_buf.data(), k), d_v = on_device(c.v, c.v_buf.data(), v),
                   d_lse = on_device(c.lse, c.lse_buf.data(), lse);
  if (public_api) {
    cudaStream_t stream = nullptr;
    cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");
    if (with_lse)
      flashgqa::cuda::attention(d_out, d_lse, d_q, d_k, d_v, options, stream);
    else
      flashgqa::cuda::attention(d_out, d_q, d_k, d_v, options, stream);
    cuda_check(cudaStreamSynchronize(stream), "the kernel on its stream");
    cuda_check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  } else {
    ForwardParams p = make_forward_params(d_out, with_lse ? &d_lse : nullptr, d_q, d_k, d_v, options);
    p.tile = tile;
    launch_flash_forward(p, nullptr);
    cuda_check(cudaDeviceSynchronize(), "the kernel");
  }
  out.copy_to(c.out_buf.data());
  lse.copy_to(c.lse_buf.data());
}

// ||out - ref|| / ||ref|| over the output elements.
double relative_l2(const AttentionCase& c, const ReferenceResult& ref) {
  const std::vector<float> got = c.out_values();
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - ref.out[i]) * (got[i] - ref.out[i]);
    den += ref.out[i] * ref.out[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Case {
  Shape shape;
  bool causal = false;
  std::optional<std::int64_t> causal_offset;
  Layout layout = Layout::contiguous;
  std::optional<double> scale = std::nullopt;  // default 1 / sqrt(H)
  bool nan_key = false;                          // a NaN planted in one key of kv head 0
};

std::string describe(const Case& k, ForwardTile tile, bool with_lse) {
  const Shape& s = k.shape;
  char buf[256];
  std::snprintf(buf, sizeof buf, "B%lld K%lld G%lld T%lld S%lld H%lld %s%s%s %s tile %dx%d%s", (long long)s.B,
                (long long)s.K, (long long)s.G, (long long)s.T, (long long)s.S, (long long)s.H,
                k.causal ? "causal" : "full",
                k.causal_offset ? (" offset " + std::to_string(*k.causal_offset)).c_str() : "",
                k.scale ? (" scale " + std::to_string(*k.scale)).c_str() : "",
                k.layout == Layout::fa ? "fa-layout" : "contiguous", tile.m_tiles, tile.block_kv,
                with_lse ? " +lse" : "");
  return buf;
}

void check_case(const Case& k, std::uint64_t seed) {
  Options options;
  options.causal = k.causal;
  options.causal_offset = k.causal_offset;
  options.scale = k.scale;
  int n_tiles = 0;
  const ForwardTile* tiles = forward_tiles(k.shape.H, &n_tiles);
  AttentionCase c = testing::make_case(k.shape, DType::bf16, DType::bf16, k.layout, seed);
  if (k.nan_key) c.set_k(0, 0, k.shape.S / 2, 3, std::nanf(""));  // the rows that see it: NaN, not empty
  const Problem host = make_problem(c.out, &c.lse, c.q, c.k, c.v, options);
  const ReferenceResult ref = reference_attention(host);
  std::vector<float> first;
  for (int i = 0; i < n_tiles; ++i)
    for (bool with_lse : {true, false}) {
      run_on_device(c, options, tiles[i], with_lse);
      Problem checked = host;
      if (!with_lse) checked.lse = nullptr;
      const ErrorReport r = check_against_reference(checked, ref);
      char rel[64];
      std::snprintf(rel, sizeof rel, " rel-l2 %.2e", relative_l2(c, ref));
      expect(r.ok, describe(k, tiles[i], with_lse) + ": " + r.describe() + rel);
      if (!with_lse) {
        bool untouched = true;
        for (float x : c.lse_buf) untouched = untouched && std::isnan(x);
        expect(untouched, describe(k, tiles[i], with_lse) + ": lse left alone without lse");
      }
      if (i == 0 && with_lse) {
        first = c.out_and_lse_values();
        run_on_device(c, options, tiles[i], with_lse);
        expect(testing::bitwise_equal(first, c.out_and_lse_values()),
               describe(k, tiles[i], with_lse) + ": the same bits on a second run");
      }
    }
  if (k.shape.T > 0) {  // the public entry point: the default tile's bits
    run_on_device(c, options, tiles[0], true, true);
    expect(testing::bitwise_equal(first, c.out_and_lse_values()),
           describe(k, tiles[0], true) + ": the same bits through flashgqa::cuda::attention on a stream");
  }
  if (k.layout == Layout::contiguous) {  // the same bits from FlashAttention's layout
    AttentionCase f = testing::make_case(k.shape, DType::bf16, DType::bf16, Layout::fa, seed);
    run_on_device(f, options, tiles[0], true);
    expect(testing::bitwise_equal(first, f.out_and_lse_values()),
           describe(k, tiles[0], true) + ": the same bits in the fa layout");
  }
}

void expect_error(const std::string& what, const std::function<void()>& call, const std::string& needle) {
  try {
    call();
    expect(false, what + ": no Error thrown");
  } catch (const Error& e) {
    const bool named = std::string(e.what()).find(needle) != std::string::npos;
    expect(named, what + ": Error \"" + e.what() + "\"");
  }
}

void check_refusals() {
  AttentionCase c = testing::make_case({1, 2, 2, 9, 17, 128}, DType::bf16, DType::bf16, Layout::contiguous, 7);
  // The views point at host memory: every refusal comes before any device access.
  auto call = [&](const Options& o) { flashgqa::cuda::attention(c.out, c.lse, c.q, c.k, c.v, o); };
  Options o;
  o.window_left = 4;
  expect_error("window", [&] { call(o); }, "window");
  o = {};
  o.softcap = 30.0;
  expect_error("softcap", [&] { call(o); }, "softcap");
  o = {};
  const float sinks[4] = {};
  o.sinks = sinks;
  expect_error("sinks", [&] { call(o); }, "sinks");
  o = {};
  o.precision = Precision::f32;
  expect_error("precision f32", [&] { call(o); }, "precision f32");
  o = {};
  o.algorithm = Algorithm::naive;
  expect_error("algorithm naive", [&] { call(o); }, "naive");
  o = {};
  o.block_kv = 64;
  expect_error("block_kv", [&] { call(o); }, "block_kv");
  AttentionCase f32 = testing::make_case({1, 2, 2, 9, 17, 128}, DType::f32, DType::f32, Layout::contiguous, 7);
  expect_error("f32 inputs", [&] { flashgqa::cuda::attention(f32.out, f32.q, f32.k, f32.v); }, "expected bf16");
  AttentionCase h96 = testing::make_case({1, 2, 2, 9, 17, 96}, DType::bf16, DType::bf16, Layout::contiguous, 7);
  expect_error("H = 96", [&] { flashgqa::cuda::attention(h96.out, h96.q, h96.k, h96.v); }, "H = 96");
  AttentionCase pad = testing::make_case({1, 2, 2, 9, 17, 64}, DType::bf16, DType::bf16, Layout::padded, 7);
  expect_error("rows not 16-byte aligned", [&] { flashgqa::cuda::attention(pad.out, pad.q, pad.k, pad.v); }, "multiple of 8");
  o = {};
  o.scale = 3e38;  // finite as a float, but |scale| log2(e) is not
  expect_error("scale 3e38", [&] { call(o); }, "overflows");
  TensorView lse_off = c.lse;
  lse_off.data = static_cast<char*>(lse_off.data) + 2;
  expect_error("lse not 4-byte aligned", [&] { make_forward_params(c.out, &lse_off, c.q, c.k, c.v, {}); },
               "lse's data pointer");
  // A stride of a dimension with one index is never used: any value is taken (as PyTorch keeps it).
  TensorView q_odd = c.q;
  q_odd.stride[0] = 3;
  bool taken = true;
  try {
    make_forward_params(c.out, &c.lse, q_odd, c.k, c.v, {});
  } catch (const Error&) {
    taken = false;
  }
  expect(taken, "an odd stride of q's size-1 batch dimension is taken");
  expect_error("mismatched shapes (make_problem's own checks)",
               [&] { flashgqa::cuda::attention(c.out, c.q, c.k, h96.v); }, "v: shape");
}

}  // namespace
}  // namespace flashgqa::cuda

int main() {
  using namespace flashgqa::cuda;
  check_refusals();  // before any device call: these need no GPU
  int devices = 0;
  cuda_check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s, %d SMs, compute capability %d.%d\n", prop.name, prop.multiProcessorCount, prop.major,
              prop.minor);
  const Layout plain = Layout::contiguous, fa = Layout::fa;
  const std::optional<std::int64_t> bottom_right;  // the default offset, S - T
  const Case cases[] = {
      {{1, 1, 1, 1, 1, 64}, false, bottom_right, plain},
      {{2, 3, 1, 100, 37, 64}, true, bottom_right, plain},  // T > S: the first 63 queries see no key
      {{2, 3, 1, 100, 37, 64}, false, bottom_right, plain},
      {{1, 40, 1, 20, 70, 64}, false, bottom_right, fa},  // B K = 40 heads of one block each
      {{1, 2, 4, 77, 300, 128}, true, bottom_right, plain},
      {{1, 2, 4, 77, 300, 128}, false, bottom_right, fa},
      {{3, 1, 5, 33, 129, 128}, false, bottom_right, plain},
      {{2, 2, 3, 128, 128, 128}, true, 0, plain},  // top-left causal
      {{1, 3, 4, 300, 700, 128}, true, 17, plain},
      {{1, 1, 8, 1, 4000, 128}, true, bottom_right, plain},  // decode: one query, G = 8
      {{1, 2, 4, 520, 520, 128}, true, bottom_right, plain},
      {{1, 2, 2, 257, 1000, 256}, false, bottom_right, plain},
      {{2, 1, 1, 300, 301, 256}, true, bottom_right, plain},
      {{1, 2, 4, 77, 300, 128}, true, bottom_right, plain, -0.3},  // a negative scale: Q enters negated
      {{2, 3, 1, 100, 37, 64}, true, bottom_right, plain, 0.0},    // scale 0: the mean of the visible v
      {{1, 2, 4, 40, 30, 64}, true, bottom_right, plain},  // T > S with G = 4: empty rows among full ones
      {{1, 2, 2, 50, 60, 128}, true, INT64_MIN, plain},    // offsets past the clamps: no key at all
      {{1, 2, 2, 50, 60, 128}, true, INT64_MAX, plain},    // every key
      {{1, 2, 2, 50, 60, 128}, true, -1000000, plain},
      {{1, 2, 2, 50, 60, 128}, true, 200, plain},          // past S
      {{1, 2, 3, 33, 90, 128}, true, bottom_right, plain, std::nullopt, true},  // NaN in: NaN out
      {{1, 1, 2, 5, 0, 64}, false, bottom_right, plain},   // S = 0: out 0, lse -inf
      {{1, 2, 3, 0, 9, 128}, false, bottom_right, plain},  // T = 0: nothing to do
  };
  {
    flashgqa::testing::AttentionCase h = flashgqa::testing::make_case(
        {1, 2, 2, 9, 17, 128}, flashgqa::DType::bf16, flashgqa::DType::bf16, flashgqa::testing::Layout::contiguous, 7);
    expect_error("host memory", [&] { flashgqa::cuda::attention(h.out, h.q, h.k, h.v); }, "not memory of the current device");
  }
  std::uint64_t seed = 1000;
  for (const Case& k : cases) check_case(k, seed++);
  std::printf("%s: %d failed\n", g_failures == 0 ? "PASSED" : "FAILED", g_failures);
  return g_failures == 0 ? 0 : 1;
}
