#include "study/timing.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>
#include <string>

#include "core/dtype.hpp"
#include "core/problem.hpp"
#include "study/roofline.hpp"

namespace flashgqa::study {
namespace {

void fill(std::vector<std::uint16_t>& dst, std::size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  dst.resize(n);
  for (auto& x : dst) x = float_to_bf16_bits(normal(rng));
}

}  // namespace

BenchInputs::BenchInputs(const Shape& s, std::uint64_t seed) : shape_(s) {
  std::mt19937_64 rng(seed);
  const auto q_elems = static_cast<std::size_t>(s.B * s.K * s.G * s.T * s.H);
  const auto kv_elems = static_cast<std::size_t>(s.B * s.K * s.S * s.H);
  fill(q_, q_elems, rng);
  fill(k_, kv_elems, rng);
  fill(v_, kv_elems, rng);
  out_.assign(q_elems, 0);
}

void BenchInputs::run(const Options& options) {
  const Shape& s = shape_;
  attention(contiguous_view(out_.data(), DType::bf16, {s.B, s.K, s.G, s.T, s.H}),
            contiguous_view(q_.data(), DType::bf16, {s.B, s.K, s.G, s.T, s.H}),
            contiguous_view(k_.data(), DType::bf16, {s.B, s.K, s.S, s.H}),
            contiguous_view(v_.data(), DType::bf16, {s.B, s.K, s.S, s.H}), options);
}

double BenchInputs::flops(const Options& options) {
  const Shape& s = shape_;
  const Problem p = make_problem(contiguous_view(out_.data(), DType::bf16, {s.B, s.K, s.G, s.T, s.H}), nullptr,
                                 contiguous_view(q_.data(), DType::bf16, {s.B, s.K, s.G, s.T, s.H}),
                                 contiguous_view(k_.data(), DType::bf16, {s.B, s.K, s.S, s.H}),
                                 contiguous_view(v_.data(), DType::bf16, {s.B, s.K, s.S, s.H}), options);
  return attention_flops(p);
}

void BenchInputs::run_backward(const Options& options) {
  const Shape& s = shape_;
  const auto q_view = [&](std::vector<std::uint16_t>& x) {
    return contiguous_view(x.data(), DType::bf16, {s.B, s.K, s.G, s.T, s.H});
  };
  const auto kv_view = [&](std::vector<std::uint16_t>& x) {
    return contiguous_view(x.data(), DType::bf16, {s.B, s.K, s.S, s.H});
  };
  if (dout_.empty()) {
    std::mt19937_64 rng(7);
    fill(dout_, q_.size(), rng);
    dq_.assign(q_.size(), 0);
    dk_.assign(k_.size(), 0);
    dv_.assign(v_.size(), 0);
    lse_.assign(static_cast<std::size_t>(s.B * s.K * s.G * s.T), 0.0f);
    attention(q_view(out_), contiguous_view(lse_.data(), DType::f32, {s.B, s.K, s.G, s.T}), q_view(q_),
              kv_view(k_), kv_view(v_), options);
  }
  const TensorView lse = contiguous_view(lse_.data(), DType::f32, {s.B, s.K, s.G, s.T});
  if (options.sinks != nullptr) {  // with sinks, their gradient too
    dsinks_.resize(static_cast<std::size_t>(s.K * s.G));
    attention_backward(q_view(dq_), kv_view(dk_), kv_view(dv_), dsinks_.data(), q_view(dout_), q_view(q_), kv_view(k_),
                       kv_view(v_), q_view(out_), lse, options);
    return;
  }
  attention_backward(q_view(dq_), kv_view(dk_), kv_view(dv_), q_view(dout_), q_view(q_), kv_view(k_), kv_view(v_),
                     q_view(out_), lse, options);
}

namespace {

// One warm-up call of run(), then `repeats` timed calls.
template <typename Run>
Timing time_runs(Run run, int repeats) {
  run();  // warm-up: pages, caches, the thread pool
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  Timing t;
  t.repeats = repeats;
  if (!seconds.empty()) {
    const std::size_t n = seconds.size();
    t.median_s = n % 2 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2;
    t.min_s = seconds.front();
    t.max_s = seconds.back();
  }
  return t;
}

}  // namespace

Timing time_attention(BenchInputs& inputs, const Options& options, int repeats) {
  return time_runs([&] { inputs.run(options); }, repeats);
}

Timing time_backward(BenchInputs& inputs, const Options& options, int repeats) {
  return time_runs([&] { inputs.run_backward(options); }, repeats);
}

double available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

}  // namespace flashgqa::study
