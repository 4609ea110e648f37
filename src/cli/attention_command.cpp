// flashgqa attention: reads q, k, v from .npy files, runs attention, writes out (and lse), and
// optionally times the computation (--repeat) or checks it against the float64 reference (--check).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "core/dtype.hpp"
#include "core/problem.hpp"
#include "io/npy.hpp"
#include "kernels/cpu_features.hpp"
#include "ladder/ladder.hpp"
#include "study/roofline.hpp"
#include "study/tune_cache.hpp"
#include "reference/reference.hpp"
#include "reference/tolerance.hpp"

namespace flashgqa::cli {
namespace {

constexpr std::int64_t kMaxThreads = 1024;
constexpr std::int64_t kMaxBlock = std::int64_t{1} << 24;
constexpr std::int64_t kMaxRepeat = 1000000;
constexpr std::int64_t kMaxInt64 = INT64_MAX;
constexpr std::int64_t kMinInt64 = INT64_MIN;

const std::vector<FlagSpec> kFlags = {
    {"q"},       {"k"},        {"v"},         {"out"},       {"lse"},      {"algo"},
    {"causal", false},         {"causal-offset"},            {"window"},   {"scale"},    {"precision"},
    {"threads"}, {"block-q"},  {"block-kv"},  {"repeat"},    {"kv-heads"}, {"check", false}, {"isa"},
    {"softcap"},
    {"sinks"},
};

// The help text; the dtype, algorithm and precision names come from the library's tables.
std::string help_text() {
  return "flashgqa attention --q Q.npy --k K.npy --v V.npy --out O.npy [flags]\n"
    "  out[b,k,g,t,:] = sum_j softmax_j(scale * q[b,k,g,t,:] . k[b,k,j,:]) v[b,k,j,:]\n"
    "\n"
    "  --q FILE             queries [B,K,G,T,H] (or [B,K*G,T,H] with --kv-heads K), in\n"
    "                       " + join_names(kFloatDTypeNames) + "\n"
    "  --k FILE             keys [B,K,S,H]\n"
    "  --v FILE             values [B,K,S,H]\n"
    "  --out FILE           output, written with q's shape and dtype\n"
    "  --lse FILE           also write the log-sum-exp, float32 [B,K,G,T] ([B,K*G,T] for 4-D q)\n"
    "  --kv-heads K         number of kv heads K when q is 4-D [B,K*G,T,H]\n"
    "  --algo NAME          " + join_names(kAlgorithmNames, " | ", " | ") + " (default " +
    algorithm_name(Options{}.algorithm) + ")\n"
    "  --causal             causal mask: query t sees keys j <= t + offset\n"
    "  --causal-offset N    the offset (needs --causal or --window); default S - T (bottom-right\n"
    "                       aligned), 0 is top-left (PyTorch's is_causal)\n"
    "  --window L,R         sliding window (FlashAttention's window_size): query t sees keys\n"
    "                       t + offset - L <= j <= t + offset + R, offset as for causal (default\n"
    "                       S - T); -1 = unbounded on that side; with --causal, R is 0\n"
    "  --scale X            logit scale (default 1/sqrt(H))\n"
    "  --softcap C          logit softcap (Gemma 2): logits s become C*tanh(s/C) before the\n"
    "                       softmax (default 0 = off)\n"
    "  --sinks FILE         attention sinks (gpt-oss): one logit per query head, [K,G] or [K*G]\n"
    "                       (" + join_names(kFloatDTypeNames) + "); each row's softmax denominator gains\n"
    "                       exp(sink), with no value, and so does the lse; -inf is no sink\n"
    "  --precision P        " + join_names(kPrecisionNames, " | ", " | ") + " (default " +
    precision_name(Options{}.precision) + "); bf16: q, k, v and the softmax weights enter\n"
    "                       the matmuls rounded to bfloat16, fp32 accumulation\n"
    "  --threads N          worker threads (default 0 = all cores)\n"
    "  --block-q N          query rows per block (default 0 = automatic; kernel1 and flash only)\n"
    "  --block-kv N         keys per KV block (default 0 = automatic; not for naive)\n"
    "  --repeat N           run once to warm up, then N timed runs; prints to stderr\n"
    "                       '<algo>: median <X> ms over <N> runs, <Y> GFLOP/s'\n"
    "                       (FLOPs = 4*B*K*G*H per (query, key) pair the mask lets through;\n"
    "                       file I/O not timed)\n"
    "  --isa NAME           instruction-set path of the fast kernels: amx | avx512bf16 | avx512f |\n"
    "                       avx2 | neon-bf16 | neon | portable (default: the best this CPU\n"
    "                       supports, or $FLASHGQA_ISA)\n"
    "  --check              compare the output with the float64 reference; prints one line to\n"
    "                       stdout and fails if the derived error bounds are exceeded\n"
    "  --help               this text\n";
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// A view of a, as [B,K,S,H].
TensorView kv_view(NpyArray& a, const std::string& flag, const std::string& path) {
  if (a.shape.size() != 4)
    throw Error(flag + " " + path + ": rank " + std::to_string(a.shape.size()) + " shape " +
                shape_string(a.shape) + ", expected rank 4 [B,K,S,H]");
  return a.view();
}

// The sinks of --sinks as K*G floats (query head k*G + g): a [K,G] or [K*G] array of any dtype.
std::vector<float> read_sinks(const std::string& path, std::int64_t K, std::int64_t G) {
  NpyArray a = read_npy(path);
  const bool fits = (a.shape.size() == 2 && a.shape[0] == K && a.shape[1] == G) ||
                    (a.shape.size() == 1 && a.shape[0] == K * G);
  if (!fits)
    throw Error("--sinks " + path + ": shape " + shape_string(a.shape) + ", expected [K,G] = [" +
                std::to_string(K) + "," + std::to_string(G) + "] or [K*G] = [" + std::to_string(K * G) + "]");
  if (!is_float_dtype(a.dtype))
    throw Error("--sinks " + path + ": dtype " + dtype_name(a.dtype) + ", expected " + join_names(kFloatDTypeNames));
  std::vector<float> sinks(static_cast<std::size_t>(K * G));
  for (std::int64_t i = 0; i < K * G; ++i) sinks[static_cast<std::size_t>(i)] = load_element(a.data.data(), a.dtype, i);
  return sinks;
}

// A view of q as [B,K,G,T,H]: q is 5-D, or 4-D [B,K*G,T,H] split into kv_heads x G (split_heads).
TensorView q_view(NpyArray& q, const std::string& path, std::optional<std::int64_t> kv_heads) {
  if (q.shape.size() == 5) {
    if (kv_heads && *kv_heads != q.shape[1])
      throw Error("--kv-heads " + std::to_string(*kv_heads) + " does not match K = " +
                  std::to_string(q.shape[1]) + " of 5-D q " + shape_string(q.shape) +
                  ", expected " + std::to_string(q.shape[1]) + " or no --kv-heads");
    return q.view();
  }
  if (q.shape.size() != 4)
    throw Error("--q " + path + ": rank " + std::to_string(q.shape.size()) + " shape " +
                shape_string(q.shape) + ", expected rank 5 [B,K,G,T,H] or 4 [B,K*G,T,H] with --kv-heads");
  if (!kv_heads)
    throw Error("--q " + path + ": 4-D shape " + shape_string(q.shape) +
                " needs --kv-heads K to split its K*G heads, expected --kv-heads or a 5-D q");
  try {
    return split_heads(q.view(), *kv_heads, "--q " + path);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (K from --kv-heads)");
  }
}

Options parse_options(const Args& args) {
  Options o;
  if (auto name = args.optional("algo")) o.algorithm = parse_algorithm(*name, "--algo");
  if (auto name = args.optional("precision")) o.precision = parse_precision(*name, "--precision");
  o.causal = args.has("causal");
  if (const auto window = args.optional("window")) {
    const auto lr = parse_integer_list("--window", *window, 2, -1, kMaxInt64);
    o.window_left = lr[0];
    o.window_right = lr[1];
  }
  if (args.has("causal-offset")) {
    if (!o.causal && !args.has("window"))
      throw Error("--causal-offset needs --causal or --window (it places their diagonal), expected one of them");
    o.causal_offset = args.integer("causal-offset", 0, kMinInt64, kMaxInt64);
  }
  if (args.has("scale")) o.scale = args.real("scale", 0.0);
  o.softcap = args.real("softcap", 0.0);  // the library checks the value
  o.threads = static_cast<int>(args.integer("threads", 0, 0, kMaxThreads));
  o.block_q = args.integer("block-q", 0, 0, kMaxBlock);
  o.block_kv = args.integer("block-kv", 0, 0, kMaxBlock);
  return o;
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  const std::size_t n = xs.size();
  return n % 2 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

}  // namespace

const char* attention_help() {
  static const std::string help = help_text();
  return help.c_str();
}

int attention_command(const std::vector<std::string>& words) {
  // stderr carries only the --repeat line or the error: tune cache warnings go to stdout.
  study::set_tune_warning_sink([](const std::string& m) { std::printf("flashgqa: warning: %s\n", m.c_str()); });
  const Args args("attention", words, kFlags);
  const std::string q_path = args.required("q"), k_path = args.required("k"),
                    v_path = args.required("v"), out_path = args.required("out");
  const std::optional<std::string> lse_path = args.optional("lse");
  Options options = parse_options(args);
  if (const auto isa = args.optional("isa")) set_isa(*isa);
  const std::int64_t repeat = args.integer("repeat", 0, 1, kMaxRepeat);
  std::optional<std::int64_t> kv_heads;
  if (args.has("kv-heads")) kv_heads = args.integer("kv-heads", 0, 1, kMaxInt64);

  NpyArray q = read_npy(q_path), k = read_npy(k_path), v = read_npy(v_path);
  const TensorView qv = q_view(q, q_path, kv_heads);
  const TensorView kv = kv_view(k, "--k", k_path), vv = kv_view(v, "--v", v_path);
  const std::int64_t B = qv.shape[0], K = qv.shape[1], G = qv.shape[2], T = qv.shape[3],
                     H = qv.shape[4], S = kv.shape[2];
  std::vector<float> sinks;
  if (const auto sinks_path = args.optional("sinks")) {
    sinks = read_sinks(*sinks_path, K, G);
    options.sinks = sinks.data();
  }
  // Everything is checked before anything is allocated or computed: the inputs (the library's own
  // messages), then that the outputs can be written.
  check_inputs(qv, kv, vv, options);
  check_writable_npy(out_path);
  if (lse_path) check_writable_npy(*lse_path);

  // out [B,K,G,T,H] in q's dtype; lse [B,K,G,T] fp32.
  std::vector<std::byte> out(q.data.size());
  const TensorView out_view = contiguous_view(out.data(), q.dtype, {B, K, G, T, H});
  std::vector<float> lse(lse_path ? static_cast<std::size_t>(B * K * G * T) : 0);
  const TensorView lse_view = contiguous_view(lse.data(), DType::f32, {B, K, G, T});
  // Validated before anything runs (the library's own messages), and for --check below.
  const Problem p = make_problem(out_view, lse_path ? &lse_view : nullptr, qv, kv, vv, options);
  // The tool's opt-in to tuning (the library reads no files): flash with both block sizes automatic
  // takes the blocks `flashgqa tune` stored for the shape's class, if any.
  const Options run_options = study::with_tuned_blocks(options, study::Shape{B, K, G, T, S, H});
  auto compute = [&] {
    if (lse_path)
      attention(out_view, lse_view, qv, kv, vv, run_options);
    else
      attention(out_view, qv, kv, vv, run_options);
  };

  compute();  // the single run, or the warm-up before timing
  if (args.has("repeat")) {
    std::vector<double> ms;
    for (std::int64_t r = 0; r < repeat; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      compute();
      const auto t1 = std::chrono::steady_clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    const double median_ms = median(ms);
    // The work done: the (query, key) pairs the mask lets through.
    const double flops = study::attention_flops(p);
    const double gflops = flops / (std::max(median_ms, 1e-9) * 1e6);
    std::fprintf(stderr, "%s: median %.3f ms over %lld runs, %.2f GFLOP/s\n",
                 algorithm_name(options.algorithm), median_ms, static_cast<long long>(repeat),
                 gflops);
  }

  write_npy(out_path, q.dtype, q.shape, out.data());
  if (lse_path) {
    const std::vector<std::int64_t> lse_shape =
        q.shape.size() == 5 ? std::vector<std::int64_t>{B, K, G, T}
                            : std::vector<std::int64_t>{B, K * G, T};
    write_npy(*lse_path, DType::f32, lse_shape, lse.data());
  }

  if (args.has("check")) {
    const ReferenceResult ref = reference_attention(p);
    // Bounded with the algorithm's own sums over keys (a bound that still means something at long S).
    // The blocks the run used (run_options: perhaps tuned) decide those sums.
    const Problem run = make_problem(out_view, lse_path ? &lse_view : nullptr, qv, kv, vv, run_options);
    const ErrorReport r = check_against_reference(p, ref, key_sums(run, run_options.algorithm), /*linear=*/false);
    std::string line;
    char buf[320];
    // The max bound differs per element, so the max error is reported with the worst err/bound.
    std::snprintf(buf, sizeof buf,
                  "check: max |err| %.1e (worst err/bound %.2f), mean |err| %.1e (bound %.1e)",
                  r.max_err, r.worst_ratio, r.mean_err, r.mean_bound);
    line = buf;
    if (lse_path) {
      std::snprintf(buf, sizeof buf, ", lse max |err| %.1e (worst err/bound %.2f)", r.lse_max_err,
                    r.lse_worst_ratio);
      line += buf;
    }
    if (r.nan_mismatches > 0)
      line += ", " + std::to_string(r.nan_mismatches) + " NaN mismatches";
    std::printf("%s: %s\n", line.c_str(), r.ok ? "ok" : "FAILED");
    std::fflush(stdout);
    if (!r.ok) {
      std::snprintf(buf, sizeof buf,
                    "--check: %s output differs from the float64 reference beyond the derived bound "
                    "(worst err/bound %.3g, %lld NaN mismatches; expected err/bound <= 1 and no NaN "
                    "mismatch)",
                    algorithm_name(options.algorithm), std::max(r.worst_ratio, r.lse_worst_ratio),
                    static_cast<long long>(r.nan_mismatches));
      throw Error(buf);
    }
  }
  return 0;
}

}  // namespace flashgqa::cli
