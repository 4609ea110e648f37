// flashgqa roofline: this machine's measured ceilings and the seed's roofline model at a shape —
// intensities, t_math, t_comms, predicted times, and the length from which flash is compute-bound.
#include <cmath>
#include <cstdio>
#include <string>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "core/problem.hpp"
#include "study/ceilings.hpp"
#include "study/roofline.hpp"

namespace flashgqa::cli {
namespace {

const std::vector<FlagSpec> kFlags = {{"shape"}, {"threads"}, {"remeasure", false}, {"block-kv"}};

constexpr const char* kHelp =
    "flashgqa roofline [--shape B,K,G,T,S,H] [--threads N] [--remeasure]\n"
    "  Measures this machine's ceilings (bf16 matmul and fp32 FMA peaks, DRAM and L2 read bandwidth;\n"
    "  medians of repeated runs with their spread; DRAM: the better of a plain streaming loop and one\n"
    "  that also prefetches each 4 KiB page ahead), cached per CPU model and thread count in the\n"
    "  user's cache folder, and applies the seed's roofline model to the shape.\n"
    "\n"
    "  --shape B,K,G,T,S,H  the shape (default 1,8,4,4096,4096,128)\n"
    "  --threads N          threads (default 0 = all cores)\n"
    "  --remeasure          measure again instead of using the cached ceilings\n"
    "  --block-kv N         KV block of the chunked rungs and kernel1 in the model (default 1024)\n"
    "  --help               this text\n";

void print_ceiling(const char* name, const study::Ceiling& c, double unit, const char* unit_name) {
  std::printf("  %-34s %9.1f %s   (min %.1f, max %.1f, spread %.1f%%)\n", name, c.median / unit, unit_name,
              c.min / unit, c.max / unit, 100 * c.spread());
}

}  // namespace

const char* roofline_help() { return kHelp; }

study::Shape parse_shape(const std::string& flag, const std::string& text) {
  const auto v = parse_integer_list(flag, text, 6, 0, std::int64_t{1} << 40);
  study::Shape s{v[0], v[1], v[2], v[3], v[4], v[5]};
  if (s.B < 1 || s.K < 1 || s.G < 1 || s.T < 1 || s.S < 1 || s.H < 1)
    throw Error(flag + " '" + text + "': every dimension must be >= 1");
  return s;
}

int roofline_command(const std::vector<std::string>& words) {
  const Args args("roofline", words, kFlags);
  const study::Shape s = args.has("shape") ? parse_shape("--shape", args.required("shape"))
                                           : study::Shape{1, 8, 4, 4096, 4096, 128};
  const int threads = resolve_threads(static_cast<int>(args.integer("threads", 0, 0, 1024)));
  const std::int64_t block_kv = args.integer("block-kv", 1024, 1, std::int64_t{1} << 24);
  bool cached = false;
  if (!args.has("remeasure")) std::fprintf(stderr, "roofline: looking up or measuring ceilings...\n");
  const study::Ceilings c = study::machine_ceilings(threads, args.has("remeasure"), &cached);
  std::printf("%s, %d thread%s; ceilings %s %s\n", c.cpu.c_str(), threads, threads == 1 ? "" : "s",
              cached ? "from the cache" : "measured now, cached in", cached ? "" : study::ceilings_cache_path().c_str());
  std::printf("ceilings (median of repeated runs):\n");
  const std::string peak_name = "bf16 matmul peak (" + c.bf16_instruction + ")";
  print_ceiling(peak_name.c_str(), c.bf16_flops, 1e9, "GFLOP/s");
  print_ceiling("fp32 FMA peak", c.f32_flops, 1e9, "GFLOP/s");
  print_ceiling("DRAM read bandwidth", c.dram_bytes, 1e9, "GB/s");
  print_ceiling("L2 read bandwidth", c.l2_bytes, 1e9, "GB/s");
  constexpr double kBusySpread = 0.2;  // a spread this wide means other work shared the cores
  if (c.bf16_flops.spread() > kBusySpread || c.dram_bytes.spread() > kBusySpread)
    std::printf("  warning: the runs spread by more than %.0f%%; the machine looks busy and these ceilings may be\n"
                "  low. Rerun `flashgqa roofline --remeasure` on a quiet machine to replace the cached ones.\n",
                100 * kBusySpread);
  const study::Machine dram{c.bf16_flops.median, c.dram_bytes.median};
  const double bal = study::balance(dram);
  std::printf("balance point: %.1f FLOP/byte against DRAM, %.1f against L2 (the seed's TPU v6e: 561)\n", bal,
              c.bf16_flops.median / c.l2_bytes.median);

  const double flops = study::attention_flops(s, false);
  std::printf("\nshape B,K,G,T,S,H = %s: %.3g FLOP (4*B*K*G*T*S*H)\n", study::to_string(s).c_str(), flops);
  std::printf("  %-17s %12s %12s %12s %12s  %s\n", "algorithm", "FLOP/byte", "t_math ms", "t_comms ms",
              "predicted ms", "bound by");
  for (Algorithm a : {Algorithm::naive, Algorithm::chunked, Algorithm::kernel1, Algorithm::flash}) {
    const double i = study::intensity(a, s, block_kv);
    const study::Prediction p = study::predict(flops, i, dram);
    std::printf("  %-17s %12.1f %12.3f %12.3f %12.3f  %s\n", algorithm_name(a), i, p.t_math * 1e3,
                p.t_comms * 1e3, p.time() * 1e3, p.compute_bound() ? "compute" : "memory");
  }
  std::printf("  (naive: G*T*H*S/(G*T*H + S*H + G*T*S); flash: G*T*S/(G*T + S); chunked and kernel1 add\n"
              "   their carries' round trips per KV block of %lld)\n", static_cast<long long>(block_kv));
  const double flash_len = study::flash_compute_bound_length(s.G, bal);
  std::printf("flash is compute-bound from T = S >= %.0f (G*L/(G+1) >= %.1f)\n", std::ceil(flash_len), bal);
  const double naive_len = study::naive_compute_bound_length(s.G, s.H, bal);
  if (std::isinf(naive_len))
    std::printf("naive is never compute-bound: its intensity tends to H = %lld <= %.1f\n",
                static_cast<long long>(s.H), bal);
  else
    std::printf("naive is compute-bound from T = S >= %.0f (its intensity tends to H = %lld)\n",
                std::ceil(naive_len), static_cast<long long>(s.H));
  return 0;
}

}  // namespace flashgqa::cli
