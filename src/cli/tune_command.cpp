// flashgqa tune: measures flash over a grid of block_q x block_kv for one shape (the seed's block-size
// lever: (512, 2048) against (256, 4096) on the TPU), prints the grid, and stores the best blocks in
// the tune cache, which `flashgqa attention` and `flashgqa bench` then pass to flash for shapes of that
// class when no blocks are given (the library itself never reads it).
#include <cstdio>
#include <limits>
#include <map>
#include <string>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "core/problem.hpp"
#include "kernels/cpu_features.hpp"
#include "study/timing.hpp"
#include "study/tune_cache.hpp"

namespace flashgqa::cli {
namespace {

const std::vector<FlagSpec> kFlags = {{"shape"},   {"threads"},  {"causal", false}, {"repeats"},
                                      {"block-q"}, {"block-kv"}, {"precision"},     {"no-store", false}};

constexpr const char* kHelp =
    "flashgqa tune --shape B,K,G,T,S,H [--threads N] [--causal] [--repeats N]\n"
    "              [--block-q 16,32,...] [--block-kv 128,256,...] [--precision bf16|f32] [--no-store]\n"
    "  Times flash for every block_q x block_kv pair (one warm-up, then the median of --repeats runs),\n"
    "  prints the grid in ms, and stores the fastest pair in the tune cache ($FLASHGQA_TUNE_CACHE, else\n"
    "  $XDG_CACHE_HOME/flashgqa/tune.tsv or ~/.cache/flashgqa/tune.tsv). flashgqa attention and bench\n"
    "  use it for flash on shapes of the same class (G, H, causal, precision, instruction set, and T\n"
    "  and S rounded up to a power of two) whenever both block sizes are left automatic, on any number\n"
    "  of threads. The library (C++ and Python) never reads it: pass the blocks to use them there.\n"
    "\n"
    "  --shape B,K,G,T,S,H  the shape (required)\n"
    "  --threads N          threads (default 0 = all cores)\n"
    "  --causal             causal attention\n"
    "  --repeats N          timed runs per pair (default 3)\n"
    "  --block-q LIST       query rows per block (default 16,32,64,128,256)\n"
    "  --block-kv LIST      keys per KV block (default 128,256,512,1024,2048)\n"
    "  --precision P        bf16 (default) | f32\n"
    "  --no-store           print the grid without storing the best pair\n"
    "  --help               this text\n";

std::vector<std::int64_t> parse_list(const std::string& flag, const std::string& text) {
  std::vector<std::int64_t> values;
  std::string part;
  for (char c : text + ",") {
    if (c != ',') {
      part += c;
      continue;
    }
    if (!part.empty()) values.push_back(parse_integer("--" + flag, part, 1, std::int64_t{1} << 24));
    part.clear();
  }
  if (values.empty()) throw Error("--" + flag + ": no sizes given, expected e.g. 64,128");
  return values;
}

}  // namespace

const char* tune_help() { return kHelp; }

int tune_command(const std::vector<std::string>& words) {
  const Args args("tune", words, kFlags);
  const study::Shape s = parse_shape("--shape", args.required("shape"));
  const int threads = resolve_threads(static_cast<int>(args.integer("threads", 0, 0, 1024)));
  const int repeats = static_cast<int>(args.integer("repeats", 3, 1, 1000));
  const auto bqs = parse_list("block-q", args.optional("block-q").value_or("16,32,64,128,256"));
  const auto bkvs = parse_list("block-kv", args.optional("block-kv").value_or("128,256,512,1024,2048"));
  Options o;
  o.algorithm = Algorithm::flash;
  o.causal = args.has("causal");
  o.threads = threads;
  o.precision = parse_precision(args.optional("precision").value_or("bf16"), "--precision");

  study::BenchInputs inputs(s, 1);
  std::printf("flash on B,K,G,T,S,H = %s%s, %d threads, %s path: median ms of %d runs\n",
              study::to_string(s).c_str(), o.causal ? " causal" : "", threads, isa_name(active_isa()), repeats);
  std::printf("%10s", "bq \\ bkv");
  for (std::int64_t bkv : bkvs) std::printf(" %9lld", static_cast<long long>(bkv));
  std::printf("\n");
  double best = std::numeric_limits<double>::infinity();
  std::int64_t best_q = 0, best_kv = 0;
  std::map<std::int64_t, std::vector<std::string>> by_area;  // bq x bkv -> cells "(bq, bkv) ms"
  for (std::int64_t bq : bqs) {
    std::printf("%10lld", static_cast<long long>(bq));
    for (std::int64_t bkv : bkvs) {
      o.block_q = bq;
      o.block_kv = bkv;
      try {
        const double ms = study::time_attention(inputs, o, repeats).median_s * 1e3;
        std::printf(" %9.2f", ms);
        if (ms < best) best = ms, best_q = bq, best_kv = bkv;
        char cell[64];
        std::snprintf(cell, sizeof cell, "(%lld, %lld) %.2f ms", static_cast<long long>(bq),
                      static_cast<long long>(bkv), ms);
        by_area[bq * bkv].push_back(cell);
      } catch (const Error&) {  // a size this path cannot take
        std::printf(" %9s", "n/a");
      }
      std::fflush(stdout);
    }
    std::printf("\n");
  }
  if (best_q == 0) throw Error("tune: no block pair in the grid is usable for this shape");
  // The seed's comparison: pairs with the same tile area bq x bkv (what fits VMEM on the TPU), the
  // largest area that has several.
  for (auto it = by_area.rbegin(); it != by_area.rend(); ++it)
    if (it->second.size() > 1) {
      std::printf("same tile area bq x bkv = %lld (the seed's (512, 2048) vs (256, 4096)):",
                  static_cast<long long>(it->first));
      for (const std::string& c : it->second) std::printf("  %s", c.c_str());
      std::printf("\n");
      break;
    }
  std::printf("best: block_q %lld, block_kv %lld, %.2f ms\n", static_cast<long long>(best_q),
              static_cast<long long>(best_kv), best);
  if (!args.has("no-store")) {
    study::TuneEntry e;
    e.key = study::make_tune_key(isa_name(active_isa()), s.G, s.H, s.T, s.S, o.causal, o.precision);
    e.threads = threads;
    e.block_q = best_q;
    e.block_kv = best_kv;
    e.ms = best;
    const std::string path = study::tune_cache_path();
    study::store_tune_entry(path, e);
    study::reload_tune_cache();
    std::printf("stored in %s\n", path.c_str());
  }
  return 0;
}

}  // namespace flashgqa::cli
