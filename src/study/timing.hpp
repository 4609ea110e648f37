// Timing attention on generated inputs, shared by `flashgqa bench` and `flashgqa tune`: random bf16
// q, k, v of a shape, one warm-up run, then the median (and min, max) of repeated runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "flashgqa/flashgqa.hpp"
#include "study/roofline.hpp"

namespace flashgqa::study {

struct Timing {
  int repeats = 0;
  double median_s = 0, min_s = 0, max_s = 0;
};

// Random normal bf16 inputs and a bf16 output buffer for one shape.
class BenchInputs {
 public:
  BenchInputs(const Shape& shape, std::uint64_t seed);
  const Shape& shape() const { return shape_; }
  // Runs attention once with `options`.
  void run(const Options& options);
  // The forward's FLOP under `options`: 4 H per (query, key) pair its mask lets through (causal,
  // window, packed sequences), over B K G.
  double flops(const Options& options);
  // The forward with lse (once, on the first call, to have out and lse), then attention_backward
  // once with a random dout; `options` as the forward's (with Options::sinks, dsinks too).
  void run_backward(const Options& options);

 private:
  Shape shape_;
  std::vector<std::uint16_t> q_, k_, v_, out_;
  std::vector<std::uint16_t> dout_, dq_, dk_, dv_;  // the backward's, allocated on first use
  std::vector<float> lse_, dsinks_;
};

// One warm-up run, then `repeats` timed runs (wall clock, steady_clock).
Timing time_attention(BenchInputs& inputs, const Options& options, int repeats);

// The same for the backward (BenchInputs::run_backward; its first call, the warm-up, runs the forward).
Timing time_backward(BenchInputs& inputs, const Options& options, int repeats);

// MemAvailable from /proc/meminfo in bytes (0 when unknown).
double available_memory_bytes();

}  // namespace flashgqa::study
