// flashgqa_bench: the fast flash path (forward and backward) against this machine's ceilings, measured
// in the same run.
//
//   GFLOP/s = 4 B K G H x the (query, key) pairs the mask lets through / time (about half of T S when
//   causal; windows and packed sequences count only their visible pairs); pct_peak = that / the bf16
//   matmul peak (study::measure_bf16_peak: AMX's, vdpbf16ps's or the FMA's) measured on the same
//   number of threads right before the benchmark (bench/peak.hpp), so a machine busy with
//   other work lowers both; decode (T = 1) also reports K/V bytes read per second and pct_dram against
//   the DRAM read bandwidth measured right before. Inputs are random bf16 q, k, v and a bf16 output,
//   through the public attention() call with its default blocks (no tune cache: what a library user
//   gets), so the benchmark runs exactly the shipped code.
//
// Each benchmark runs 5 repetitions unless --benchmark_repetitions says otherwise; read the _median
// rows. Kernel-level benchmarks (qk_tile, softmax_tile, pv_tile on L1/L2-resident tiles) come first;
// they explain where the end-to-end figures lose against the peak.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "kernels/cpu_features.hpp"
#include "kernels/microkernels.hpp"
#include "peak.hpp"
#include "study/roofline.hpp"
#include "study/timing.hpp"

namespace {

using namespace flashgqa;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// --- End to end -------------------------------------------------------------------------------------

// `calls` calls on separate B = 1 problems of `shape` per iteration (the baseline of packed sequences),
// or one call. A softcap's FLOP count as without: the cap's tanh is overhead, as the softmax's exp.
void attention_bench(benchmark::State& state, study::Shape shape, Options o, int threads, int calls = 1) {
  study::BenchInputs inputs(shape, 1);
  o.threads = threads;
  const bool decode = shape.T == 1;
  const double peak = bench::bf16_peak_flops(threads);
  const double dram = decode ? bench::dram_read_bandwidth(threads) : 0.0;
  inputs.run(o);  // warm-up: pages, caches, the thread pool
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) inputs.run(o);
    seconds += seconds_since(t0);
  }
  const double per_call = seconds / static_cast<double>(state.iterations());
  const double flops = calls * inputs.flops(o);
  state.counters["GFLOP/s"] = flops / per_call / 1e9;
  state.counters["peak_GFLOP/s"] = peak / 1e9;
  state.counters["pct_peak"] = 100.0 * flops / per_call / peak;
  if (decode) {  // K and V are read once, 2 bytes per element: the keys the window lets through
    const double keys = o.window_left >= 0 ? std::min<double>(static_cast<double>(shape.S), static_cast<double>(o.window_left) + 1)
                                           : static_cast<double>(shape.S);
    const double bytes = 2.0 * 2.0 * static_cast<double>(shape.B * shape.K * shape.H) * keys;
    state.counters["GB/s"] = bytes / per_call / 1e9;
    state.counters["dram_GB/s"] = dram / 1e9;
    state.counters["pct_dram"] = 100.0 * bytes / per_call / dram;
  }
  state.SetLabel(isa_name(active_isa()));
}

// Sink logits for the K * G = 32 query heads of the shapes below (Options::sinks; -3 to 3).
const float* bench_sinks() {
  static const std::vector<float> sinks = [] {
    std::vector<float> s(32);
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<float>(i % 7) - 3.0f;
    return s;
  }();
  return sinks.data();
}

// The backward (and a training step: forward + backward) at FlashAttention's FLOP convention: the
// backward counts 2.5 times the forward's FLOP of the visible area (5 matmuls to its 2), a step 3.5.
// With `sinks`, the backward also writes the sinks' gradient (attention_backward's dsinks overload).
void backward_bench(benchmark::State& state, study::Shape shape, bool causal, int threads, bool step,
                    bool sinks) {
  study::BenchInputs inputs(shape, 1);
  Options o;
  o.causal = causal;
  o.threads = threads;
  if (sinks) o.sinks = bench_sinks();
  const double peak = bench::bf16_peak_flops(threads);
  inputs.run_backward(o);  // warm-up, and the forward's out and lse
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    if (step) inputs.run(o);
    inputs.run_backward(o);
    seconds += seconds_since(t0);
  }
  const double per_call = seconds / static_cast<double>(state.iterations());
  const double flops = (step ? 3.5 : 2.5) * study::attention_flops(shape, causal);
  state.counters["GFLOP/s"] = flops / per_call / 1e9;
  state.counters["peak_GFLOP/s"] = peak / 1e9;
  state.counters["pct_peak"] = 100.0 * flops / per_call / peak;
  state.SetLabel(isa_name(active_isa()));
}

void register_backward() {
  for (const auto& [name, causal, step] : {std::tuple{"backward/noncausal", false, false},
                                           std::tuple{"backward/causal", true, false},
                                           std::tuple{"train_step/noncausal", false, true}})
    for (int threads : {1, 2})
      benchmark::RegisterBenchmark((std::string(name) + "/T=S=4096/H=128/threads=" + std::to_string(threads)).c_str(),
                                   backward_bench, study::Shape{1, 8, 4, 4096, 4096, 128}, causal, threads, step,
                                   false)
          ->Iterations(1)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("backward/sinks/noncausal/T=S=4096/H=128/threads=2", backward_bench,
                               study::Shape{1, 8, 4, 4096, 4096, 128}, false, 2, false, true)
      ->Iterations(1)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

void register_attention(const std::string& name, study::Shape shape, const Options& o, int threads, int calls = 1) {
  // Rough time of one call (compute at 3e11 FLOP/s per thread, K/V at 1e10 B/s), for ~0.3 s per repetition.
  const double kv_bytes = 4.0 * static_cast<double>(shape.B * shape.K * shape.S * shape.H);
  // The mask's FLOP from a one-head, H = 1 stand-in of the shape (cheap to allocate), scaled up.
  const double flops = calls * study::BenchInputs({1, 1, 1, shape.T, shape.S, 1}, 1).flops(o) *
                       static_cast<double>(shape.B * shape.K * shape.G * shape.H);
  const double seconds = std::max(flops / 3e11 / threads, kv_bytes / 1e10);
  const auto iterations = static_cast<benchmark::IterationCount>(std::max(1.0, 0.3 / seconds));
  benchmark::RegisterBenchmark(name.c_str(), attention_bench, shape, o, threads, calls)
      ->Iterations(iterations)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

Options causal_options(bool causal) {
  Options o;
  o.causal = causal;
  return o;
}

// The variants of issue #11 (2 threads, the targets' setting): a 4096-key window on a long causal
// sequence against the full causal one; 8 packed causal sequences of 4096 against 8 separate calls;
// decode over a 4096-key window of a 32768-key cache.
void register_variants() {
  const std::string tail = "/H=128/threads=2";
  Options window = causal_options(true);
  window.window_left = 4096;
  window.window_right = 0;
  register_attention("flash/causal-window=4096,0/T=S=32768" + tail, {1, 8, 4, 32768, 32768, 128}, window, 2);
  register_attention("flash/causal/T=S=32768" + tail, {1, 8, 4, 32768, 32768, 128}, causal_options(true), 2);
  static std::vector<std::int32_t> cu;  // 0, 4096, ..., 32768
  for (int i = 0; i <= 8; ++i) cu.push_back(4096 * i);
  Options packed = causal_options(true);
  packed.cu_seqlens_q = packed.cu_seqlens_k = cu.data();
  packed.num_sequences = 8;
  register_attention("flash/packed-causal/8x4096" + tail, {1, 8, 4, 32768, 32768, 128}, packed, 2);
  register_attention("flash/separate-causal/8x4096" + tail, {1, 8, 4, 4096, 4096, 128}, causal_options(true), 2, 8);
  Options decode_window;
  decode_window.window_left = 4095;
  register_attention("flash/decode-window=4095,-1/T=1/S=32768" + tail, {1, 8, 4, 1, 32768, 128}, decode_window, 2);
}

void register_end_to_end() {
  for (std::int64_t L : {1024, 2048, 4096, 8192})
    for (int threads : {1, 2})
      register_attention(
          "flash/noncausal/T=S=" + std::to_string(L) + "/H=128/threads=" + std::to_string(threads),
          {1, 8, 4, L, L, 128}, causal_options(false), threads);
  for (int threads : {1, 2})
    register_attention("flash/causal/T=S=4096/H=128/threads=" + std::to_string(threads),
                       {1, 8, 4, 4096, 4096, 128}, causal_options(true), threads);
  for (std::int64_t H : {64, 256})
    for (int threads : {1, 2})
      register_attention(
          "flash/noncausal/T=S=4096/H=" + std::to_string(H) + "/threads=" + std::to_string(threads),
          {1, 8, 4, 4096, 4096, H}, causal_options(false), threads);
  for (int threads : {1, 2})
    register_attention("flash/decode/T=1/S=32768/H=128/threads=" + std::to_string(threads),
                       {1, 8, 4, 1, 32768, 128}, causal_options(false), threads);
  // Gemma 2's logit softcap (50): the target is >= 65% of the peak at 2 threads.
  Options softcap = causal_options(false);
  softcap.softcap = 50.0;
  for (int threads : {1, 2})
    register_attention("flash/softcap/noncausal/T=S=4096/H=128/threads=" + std::to_string(threads),
                       {1, 8, 4, 4096, 4096, 128}, softcap, threads);
  // Attention sinks: the same shapes with one sink logit per head (compare with the rows above).
  Options sinks;
  sinks.sinks = bench_sinks();
  for (int threads : {1, 2}) {
    register_attention("flash/sinks/noncausal/T=S=4096/H=128/threads=" + std::to_string(threads),
                       {1, 8, 4, 4096, 4096, 128}, sinks, threads);
    register_attention("flash/sinks/decode/T=1/S=32768/H=128/threads=" + std::to_string(threads),
                       {1, 8, 4, 1, 32768, 128}, sinks, threads);
  }
}

// --- Kernels ------------------------------------------------------------------------------------------

// One KV block (npad keys) against M rows of one task, as flash_packed.cpp runs it, with the packed
// block in L2 and the tiles in L1: what the kernels reach before packing, threads and memory.
struct KernelBench {
  const FlashKernels& k;
  std::int64_t Hp, npad, M, ob;
  AlignedBuffer q, kp, vp, s, p, o, m, l, corr;
  KernelBench(const FlashKernels& kern, std::int64_t H, std::int64_t n, std::int64_t rows)
      : k(kern),
        Hp(H),
        npad(n),
        M(rows / kern.mr * kern.mr),
        ob(kern.operand_bytes),
        q(static_cast<std::size_t>(M * Hp * ob)),
        kp(static_cast<std::size_t>(npad * Hp * ob)),
        vp(static_cast<std::size_t>(npad * Hp * ob)),
        s(static_cast<std::size_t>(k.mr * npad * 4)),
        p(static_cast<std::size_t>(k.mr * npad * ob)),
        o(static_cast<std::size_t>(M * Hp * 4)),
        m(static_cast<std::size_t>(M * 4)),
        l(static_cast<std::size_t>(M * 4)),
        corr(64 * 4) {
    for (AlignedBuffer* b : {&q, &kp, &vp, &s, &p, &o, &l}) std::memset(b->data(), 0, b->bytes());
    for (std::int64_t i = 0; i < M; ++i) m.as<float>()[i] = 0.0f;
  }
  void qk(std::int64_t r0) {
    for (std::int64_t c = 0; c < npad; c += kPanelKeys)
      k.qk_tile({s.as<float>() + c, npad, q.as<char>() + r0 * Hp * ob, Hp, kp.as<char>() + c * Hp * ob, Hp,
                 1.0f, k.mr});
  }
  void cap() {  // the logit softcap (Gemma 2's c = 50) over the tile's S rows
    for (int i = 0; i < k.mr; ++i) k.softcap_n(s.as<float>() + i * npad, npad, 50.0f);
  }
  bool softmax(std::int64_t r0) {
    return k.softmax_tile({s.as<float>(), npad, p.data(), npad, m.as<float>() + r0, l.as<float>() + r0,
                           corr.as<float>(), nullptr, nullptr, npad, k.mr, true});
  }
  void pv(std::int64_t r0, bool moved) {
    for (std::int64_t c = 0; c < Hp; c += kHTile)
      k.pv_tile({o.as<float>() + r0 * Hp + c, Hp, p.data(), npad, vp.as<char>() + c * npad * ob, npad,
                 moved ? corr.as<float>() : nullptr, k.mr});
  }
};

// part: 0 qk_tile, 1 softmax_tile, 2 pv_tile, 3 the block (all three), 4 softcap_n, 5 the block with
// the softcap.
void kernel_bench(benchmark::State& state, int part) {
  KernelBench kb(kernels_for(active_isa(), Precision::bf16), 128, 256, 240);
  const double peak = bench::bf16_peak_flops(1);
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t r0 = 0; r0 < kb.M; r0 += kb.k.mr) {
      const bool block = part == 3 || part == 5;
      if (part == 0 || block) kb.qk(r0);
      if (part == 4 || part == 5) kb.cap();
      bool moved = false;
      if (part == 1 || block) moved = kb.softmax(r0);
      if (part == 2 || block) kb.pv(r0, moved);
    }
    seconds += seconds_since(t0);
  }
  const double per_call = seconds / static_cast<double>(state.iterations());
  const double logits = static_cast<double>(kb.M * kb.npad);
  const double flops = (part == 3 || part == 5 ? 4.0 : 2.0) * logits * static_cast<double>(kb.Hp);
  if (part == 1 || part == 4) {
    state.counters["ns/logit"] = per_call / logits * 1e9;
    // The softmax's (softcap's) time as a share of the matmul time of the same logits at the peak (H = 128).
    state.counters["pct_of_matmul_at_peak"] = 100.0 * per_call / (logits * 4.0 * 128 / peak);
  } else {
    state.counters["GFLOP/s"] = flops / per_call / 1e9;
    state.counters["pct_peak"] = 100.0 * flops / per_call / peak;
  }
  state.SetLabel(kb.k.name);
}

void register_kernels() {
  const char* names[] = {"kernel/qk_tile/M=240/npad=256/H=128", "kernel/softmax_tile/M=240/npad=256",
                         "kernel/pv_tile/M=240/npad=256/H=128", "kernel/block/M=240/npad=256/H=128",
                         "kernel/softcap_n/M=240/npad=256", "kernel/block_softcap/M=240/npad=256/H=128"};
  for (int part = 0; part < 6; ++part)
    benchmark::RegisterBenchmark(names[part], kernel_bench, part)->MinTime(0.2)->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  if (!flashgqa::bench::initialize(argc, argv)) return 1;
  register_kernels();
  register_end_to_end();
  register_variants();
  register_backward();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
