// Property test of the public API: random shapes (0 and 1 included), strides (padded, negative, zero,
// overlapping, huge), dtypes (valid and not), null pointers, block sizes, causal offsets and thread
// counts. Every call either throws flashgqa::Error or writes out (and lse) within the float64
// reference's bounds, and never touches memory outside out and lse: every tensor lives in its own
// mapping with inaccessible guard pages right before and after it, so a stray read or write faults.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/problem.hpp"
#include "flashgqa/flashgqa.hpp"
#include "ladder/ladder.hpp"
#include "reference/reference.hpp"
#include "reference/tolerance.hpp"
#include "testing/guarded_memory.hpp"

namespace flashgqa {
namespace {

using testing::GuardedBuffer;

struct RandomTensor {
  TensorView view;
  std::unique_ptr<GuardedBuffer> memory;
};

// A view of `shape` with random strides: contiguous, padded, a negative stride, or (for read-only
// tensors) a zero stride; its memory covers exactly the elements the strides reach.
RandomTensor random_tensor(std::mt19937_64& rng, std::vector<std::int64_t> shape, DType dtype, bool writable) {
  RandomTensor t;
  TensorView& v = t.view;
  v.dtype = dtype;
  v.rank = static_cast<int>(shape.size());
  std::int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    const auto i = static_cast<std::size_t>(d);
    v.shape[i] = shape[i];
    std::int64_t s = stride;
    if (d < v.rank - 1) {
      const int kind = static_cast<int>(rng() % 6);
      if (kind == 1) s = stride + static_cast<std::int64_t>(rng() % 7);  // padded
      if (kind == 2) s = -stride;                                        // reversed
      if (kind == 3 && !writable) s = 0;                                 // broadcast
    }
    v.stride[i] = s;
    stride = std::max<std::int64_t>(std::abs(s), 1) * std::max<std::int64_t>(shape[i], 1);
  }
  // Element offsets reached: [lo, hi].
  std::int64_t lo = 0, hi = 0, n = 1;
  for (int d = 0; d < v.rank; ++d) {
    const auto i = static_cast<std::size_t>(d);
    n *= v.shape[i];
    if (v.shape[i] == 0) continue;
    (v.stride[i] < 0 ? lo : hi) += (v.shape[i] - 1) * v.stride[i];
  }
  const std::size_t esize = dtype_size(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16 ? dtype : DType::f32);
  const std::size_t bytes = n == 0 ? 0 : static_cast<std::size_t>(hi - lo + 1) * esize;
  t.memory = std::make_unique<GuardedBuffer>(bytes);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::size_t e = 0; e + esize <= bytes; e += esize) {
    const float x = normal(rng);
    if (esize == 4)
      std::memcpy(t.memory->data() + e, &x, 4);
    else {
      const std::uint16_t b = dtype == DType::f16 ? float_to_f16_bits(x) : float_to_bf16_bits(x);
      std::memcpy(t.memory->data() + e, &b, 2);
    }
  }
  v.data = n == 0 ? (rng() % 2 ? nullptr : t.memory->data()) : t.memory->data() - lo * static_cast<std::int64_t>(esize);
  return t;
}

TEST(Property, EveryCallMatchesTheReferenceOrThrowsError) {
  std::mt19937_64 rng(2026);
  const std::int64_t sizes[] = {0, 1, 1, 2, 3, 5, 17, 33};
  auto pick = [&](std::int64_t lo = 0) {
    std::int64_t x = 0;
    do x = sizes[rng() % std::size(sizes)];
    while (x < lo);
    return x;
  };
  int computed = 0, rejected = 0, checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const std::int64_t B = pick(), K = pick(), G = pick(), T = pick(), S = pick(), H = pick() + (rng() % 2 ? 0 : 48);
    const DType dtypes[] = {DType::f32, DType::bf16, DType::f16};
    const DType dtype = dtypes[rng() % 3];
    RandomTensor q = random_tensor(rng, {B, K, G, T, H}, dtype, false);
    RandomTensor k = random_tensor(rng, {B, K, S, H}, dtypes[rng() % 3], false);
    RandomTensor v = random_tensor(rng, {B, K, S, H}, dtypes[rng() % 3], false);
    RandomTensor out = random_tensor(rng, {B, K, G, T, H}, dtypes[rng() % 3], true);
    RandomTensor lse = random_tensor(rng, {B, K, G, T}, DType::f32, true);
    // Hostile changes, one at a time: a wrong shape, a null pointer, a bad dtype code, out
    // overlapping q, a zero (aliasing) stride on out, a huge stride.
    std::string change = "none";
    switch (rng() % 10) {
      case 0: ++k.view.shape[2], change = "k longer than v"; break;
      case 1: if (q.view.numel() > 0) q.view.data = nullptr, change = "null q"; break;
      case 2: out.view.dtype = static_cast<DType>(7), change = "bad dtype"; break;
      case 3: out.view = q.view, change = "out is q"; break;
      case 4: if (out.view.rank > 1) out.view.stride[0] = 0, change = "zero out stride"; break;
      case 5: q.view.stride[0] = std::int64_t{1} << 62, change = "huge stride"; break;
      default: break;
    }
    Options o;
    const Algorithm algos[] = {Algorithm::naive, Algorithm::chunked_unstable, Algorithm::chunked,
                               Algorithm::kernel1, Algorithm::flash};
    o.algorithm = algos[rng() % 5];
    o.precision = rng() % 2 ? Precision::bf16 : Precision::f32;
    o.causal = rng() % 2;
    const std::int64_t offsets[] = {0, -1, 3, -40, INT64_MIN, INT64_MAX};
    if (o.causal && rng() % 2) o.causal_offset = offsets[rng() % std::size(offsets)];
    const std::int64_t blocks[] = {0, 1, 7, 32, 1000, std::int64_t{1} << 40};
    if (o.algorithm == Algorithm::kernel1 || o.algorithm == Algorithm::flash) o.block_q = blocks[rng() % std::size(blocks)];
    if (o.algorithm != Algorithm::naive) o.block_kv = blocks[rng() % std::size(blocks)];
    const int threads[] = {0, 1, 2, 3, 1'000'000, -1};
    o.threads = threads[rng() % std::size(threads)];
    const bool with_lse = rng() % 2;
    // Sinks on half of the calls, from their own generator (the draws above stay as they were), in
    // guarded memory of exactly K*G floats: normal(0, 3), -inf, far above the logits, or a NaN (Error).
    std::mt19937_64 sink_rng(static_cast<std::uint64_t>(trial));
    GuardedBuffer sinks(static_cast<std::size_t>(K * G) * sizeof(float));
    if (sink_rng() % 2) {
      std::normal_distribution<float> normal(0.0f, 3.0f);
      float* s = reinterpret_cast<float*>(sinks.data());
      for (std::int64_t i = 0; i < K * G; ++i) {
        const std::uint64_t kind = sink_rng() % 8;
        s[i] = kind == 0 ? -std::numeric_limits<float>::infinity() : kind == 1 ? 60.0f : normal(sink_rng);
      }
      if (K * G > 0 && sink_rng() % 16 == 0) s[sink_rng() % static_cast<std::uint64_t>(K * G)] = std::nanf("");
      o.sinks = s;
      change += " +sinks";
    }
    try {
      if (with_lse)
        attention(out.view, lse.view, q.view, k.view, v.view, o);
      else
        attention(out.view, q.view, k.view, v.view, o);
    } catch (const Error&) {
      ++rejected;
      continue;
    }
    ++computed;
    const Problem p = make_problem(out.view, with_lse ? &lse.view : nullptr, q.view, k.view, v.view, o);
    if (p.B * p.K * p.G * p.T == 0) continue;
    ++checked;
    const ErrorReport r = check_against_reference(p, reference_attention(p), key_sums(p, o.algorithm));
    EXPECT_TRUE(r.ok) << "trial " << trial << " " << algorithm_name(o.algorithm) << " shape " << B << "," << K
                      << "," << G << "," << T << "," << S << "," << H << " change " << change << ": " << r.describe();
  }
  std::printf("property: %d calls computed (%d with outputs checked), %d rejected with Error\n", computed, checked,
              rejected);
  // Both sides were exercised.
  EXPECT_GT(checked, 50);
  EXPECT_GT(rejected, 50);
}

}  // namespace
}  // namespace flashgqa
