// flashgqa bench: the seed's charts on this machine. Times every rung of the ladder over a sweep of
// sequence lengths T = S (warm-up, then the median of repeats) next to its roofline prediction, skips
// a rung where its memory or time would be unreasonable and says so, and writes a table (stdout),
// bench.csv, bench.json and bench.svg. Progress goes to stderr.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "core/problem.hpp"
#include "study/ceilings.hpp"
#include "study/report.hpp"
#include "study/timing.hpp"
#include "study/tune_cache.hpp"

namespace flashgqa::cli {
namespace {

const std::vector<FlagSpec> kFlags = {{"out"},    {"shape"},         {"seq"},     {"algos"},
                                      {"threads"}, {"causal", false}, {"repeats"}, {"budget"},
                                      {"softcap"}, {"decode", false}, {"kv-dtypes"}, {"page-sizes"},
                                      {"huge-pages", false}};

// The backward pass of flash (attention_backward), benchmarked beside the ladder's rungs.
constexpr const char* kBackwardName = "flash-backward";

// The default --algos: the whole ladder, from the library's table, and the backward.
std::string default_algos() { return join_names(kAlgorithmNames, ",", ",") + "," + kBackwardName; }

// What one --algos entry times: a rung's forward, or flash's backward (FLOP counted 2.5 times the
// forward's, FlashAttention's convention; its memory model is flash's plus the backward's q-sized
// and k-sized buffers: dout, dq, dk, dv and the packed operands).
struct BenchItem {
  Algorithm algorithm = Algorithm::flash;
  bool backward = false;
  std::string name() const { return backward ? kBackwardName : algorithm_name(algorithm); }
  double flops(const study::Shape& s, bool causal) const {
    return (backward ? 2.5 : 1.0) * study::attention_flops(s, causal);
  }
};

BenchItem parse_item(const std::string& word) {
  if (word == kBackwardName) return {Algorithm::flash, true};
  for (const auto& [algorithm, name] : kAlgorithmNames)
    if (word == name) return {algorithm, false};
  throw Error("--algos: unknown algorithm '" + word + "', expected " + join_names(kAlgorithmNames, ", ", ", ") +
              " or " + kBackwardName);
}

std::string help_text() {
  return "flashgqa bench [--out DIR] [--shape B,K,G,T,S,H] [--seq 256,512,...] [--algos a,b,...]\n"
    "               [--threads N] [--causal] [--repeats N] [--budget SECONDS] [--softcap C]\n"
    "  Times each algorithm of the ladder for each T = S in --seq (one warm-up, then the median of\n"
    "  --repeats runs) next to the roofline prediction from this machine's measured ceilings\n"
    "  (see flashgqa roofline). Prints a table; writes DIR/bench.csv, bench.json and bench.svg.\n"
    "  A rung is skipped, with the reason, where its memory would not fit in the available RAM or\n"
    "  its runs (estimated from the previous length) would take longer than --budget.\n"
    "\n"
    "  --out DIR            folder for the CSV, JSON and SVG files (default: the current folder)\n"
    "  --shape B,K,G,T,S,H  B, K, G and H of the sweep; T and S come from --seq (default 1,2,4,_,_,128)\n"
    "  --seq L1,L2,...      sequence lengths (default 256,512,1024,2048,4096,8192)\n"
    "  --algos A,B,...      algorithms (default " + default_algos() + ";\n"
    "                       flash-backward is flash's backward pass, 2.5x the forward's FLOP)\n"
    "  --threads N          threads (default 0 = all cores)\n"
    "  --causal             causal attention (half the FLOPs counted)\n"
    "  --softcap C          logit softcap C*tanh(s/C) (default 0 = off; FLOPs counted as without)\n"
    "  --repeats N          timed runs per point (default 3)\n"
    "  --budget SECONDS     skip a point whose warm-up and repeats would take longer (default 12)\n"
    "  --help               this text\n"
    "\n" + std::string(bench_decode_help());
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1 << 30));
  return buf;
}

// Block sizes the memory model assumes for a rung (its defaults).
std::int64_t model_block_q(Algorithm a) { return a == Algorithm::kernel1 ? 256 : 64; }
std::int64_t model_block_kv(Algorithm a) { return a == Algorithm::flash ? 512 : 1024; }

double memory_model(const BenchItem& item, const study::Shape& s, int threads) {
  const Algorithm a = item.algorithm;
  const double forward = study::memory_bytes(a, s, DType::bf16, model_block_q(a), model_block_kv(a), threads);
  if (!item.backward) return forward;
  const double q_bytes = 2.0 * static_cast<double>(s.B * s.K * s.G * s.T * s.H);
  const double k_bytes = 2.0 * static_cast<double>(s.B * s.K * s.S * s.H);
  return forward + 6 * q_bytes + 5 * k_bytes;  // dout, dq, packed Q/dO rows and transposes; dk, dv, 3 packed
}

}  // namespace

void write_out_files(const std::string& dir, const std::map<std::string, std::string>& files) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  for (const auto& [name, text] : files) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    std::ofstream out(path, std::ios::trunc);
    out << text;
    if (!out) throw Error("--out: cannot write " + path);
    std::printf("wrote %s\n", path.c_str());
  }
}

const char* bench_help() {
  static const std::string help = help_text();
  return help.c_str();
}

int bench_command(const std::vector<std::string>& words) {
  const Args args("bench", words, kFlags);
  if (args.has("decode")) return bench_decode(args);
  for (const char* flag : {"kv-dtypes", "page-sizes", "huge-pages"})
    if (args.has(flag)) throw Error(std::string("--") + flag + ": only with --decode");
  study::Shape base = args.has("shape") ? parse_shape("--shape", args.required("shape"))
                                        : study::Shape{1, 2, 4, 0, 0, 128};
  std::vector<std::int64_t> seq;
  for (const std::string& w : split_list(args.optional("seq").value_or("256,512,1024,2048,4096,8192")))
    seq.push_back(parse_integer("--seq", w, 1, std::int64_t{1} << 24));
  if (seq.empty()) throw Error("--seq: no lengths given, expected e.g. 256,512,1024");
  std::vector<BenchItem> algos;
  for (const std::string& w : split_list(args.optional("algos").value_or(default_algos()))) algos.push_back(parse_item(w));
  if (algos.empty()) throw Error("--algos: no algorithm given");
  const int threads = resolve_threads(static_cast<int>(args.integer("threads", 0, 0, 1024)));
  const bool causal = args.has("causal");
  const double softcap = args.real("softcap", 0.0);
  const int repeats = static_cast<int>(args.integer("repeats", 3, 1, 1000));
  const double budget = args.real("budget", 12.0);
  const std::string dir = args.optional("out").value_or(".");

  std::fprintf(stderr, "bench: ceilings (cached or measured; see flashgqa roofline)...\n");
  const study::Ceilings c = study::machine_ceilings(threads, false);
  study::BenchReport report;
  report.cpu = c.cpu;
  report.threads = threads;
  report.machine = {c.bf16_flops.median, c.dram_bytes.median};
  report.available_memory = study::available_memory_bytes();

  const std::size_t total = algos.size() * seq.size();
  std::size_t done = 0;
  for (const BenchItem& item : algos) {
    const Algorithm a = item.algorithm;
    double last_s = 0, last_flops = 0;  // the previous measured point, for the time estimate
    std::string give_up;                // once a rung is over budget, longer lengths are too
    for (std::int64_t L : seq) {
      study::BenchRow row;
      row.algo = item.name();
      row.shape = base;
      row.shape.T = row.shape.S = L;
      row.causal = causal;
      const double flops = item.flops(row.shape, causal);
      row.intensity = study::intensity(a, row.shape, model_block_kv(a));
      row.predicted_s = study::predict(flops, row.intensity, report.machine).time();
      row.memory_bytes = memory_model(item, row.shape, threads);
      ++done;
      const double estimate = last_flops > 0 ? last_s * flops / last_flops : 0;
      if (report.available_memory > 0 && row.memory_bytes > 0.8 * report.available_memory) {
        row.skipped = true;
        row.skip_reason = "needs " + gib(row.memory_bytes) + " of " + gib(report.available_memory) + " available";
      } else if (!give_up.empty()) {
        row.skipped = true;
        row.skip_reason = give_up;
      } else if (estimate * (repeats + 1) > budget) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "about %.1f s per run (scaled from T=S=%lld) is over the %.0f s budget",
                      estimate, static_cast<long long>(last_flops > 0 ? row.shape.T / 2 : 0), budget);
        row.skipped = true;
        row.skip_reason = give_up = buf;
      }
      if (row.skipped) {
        std::fprintf(stderr, "bench: [%zu/%zu] %s T=S=%lld skipped: %s\n", done, total, row.algo.c_str(),
                     static_cast<long long>(L), row.skip_reason.c_str());
      } else {
        std::fprintf(stderr, "bench: [%zu/%zu] %s T=S=%lld ...", done, total, row.algo.c_str(),
                     static_cast<long long>(L));
        std::fflush(stderr);
        study::BenchInputs inputs(row.shape, 1);
        Options o;
        o.algorithm = a;
        o.causal = causal;
        o.softcap = softcap;
        o.threads = threads;
        // The tool's opt-in to tuning: flash takes the blocks `flashgqa tune` stored, if any.
        o = study::with_tuned_blocks(o, row.shape);
        const study::Timing t = item.backward ? study::time_backward(inputs, o, repeats)
                                              : study::time_attention(inputs, o, repeats);
        row.repeats = t.repeats;
        row.median_s = t.median_s;
        row.min_s = t.min_s;
        row.max_s = t.max_s;
        row.gflops = flops / t.median_s / 1e9;
        row.percent_peak = 100 * flops / t.median_s / report.machine.flops;
        last_s = t.median_s;
        last_flops = flops;
        std::fprintf(stderr, " %.3f ms\n", t.median_s * 1e3);
      }
      report.rows.push_back(row);
    }
    // The longest power-of-two T = S whose memory fits.
    study::LongestFit fit{item.name(), 0};
    for (std::int64_t L = 1; L <= (std::int64_t{1} << 26); L *= 2) {
      study::Shape s = base;
      s.T = s.S = L;
      if (memory_model(item, s, threads) > report.available_memory)
        break;
      fit.length = L;
    }
    report.longest.push_back(fit);
  }

  std::printf("%s, %d threads, peak %.1f GFLOP/s (%s), DRAM %.1f GB/s; shape B,K,G,H = %lld,%lld,%lld,%lld%s\n",
              c.cpu.c_str(), threads, c.bf16_flops.median / 1e9, c.bf16_instruction.c_str(), c.dram_bytes.median / 1e9,
              static_cast<long long>(base.B), static_cast<long long>(base.K), static_cast<long long>(base.G),
              static_cast<long long>(base.H), causal ? ", causal" : "");
  if (softcap != 0.0) std::printf("softcap %g\n", softcap);
  std::printf("%s", study::to_table(report).c_str());
  write_out_files(dir, {{"bench.csv", study::to_csv(report)},
                        {"bench.json", study::to_json(report)},
                        {"bench.svg", study::to_svg(report)}});
  return 0;
}

}  // namespace flashgqa::cli
