// flashgqa: exact grouped-query attention on the CPU.
//
// Shapes use the seed's letters everywhere:
//   B batch, T queries, S keys/values, K kv heads, G query heads per kv head, H head dim.
//   q   [B, K, G, T, H]      k, v [B, K, S, H]
//   out [B, K, G, T, H]      lse  [B, K, G, T]  (fp32, natural log, optional)
//
// Every tensor is a strided view: the innermost dimension (H) must be contiguous (stride 1), all other
// strides are free, so PyTorch's SDPA layout [B, K*G, T, H] and FlashAttention's [B, T, K*G, H] are
// viewed without copying (see split_heads / sdpa_q_view / fa_q_view below). lse may have any strides.
//
// out[b,k,g,t,:] = sum_j softmax_j(scale * q[b,k,g,t,:] . k[b,k,j,:]) v[b,k,j,:]
// over the keys j that query t may see: all of them, or those the mask lets through (Options: causal
// masking, j <= t + offset; a sliding window; packed sequences).
//
// Precision::bf16 (the seed's rule, the default): q, k, v and the softmax weights enter the matmuls
// rounded to bfloat16; every accumulation is fp32. Precision::f32: operands stay fp32.
//
// Edge cases: T = 0 writes nothing. S = 0, or a query row that may see no key (causal offset < -t),
// gives output 0 and lse -inf (lse = the head's sink with Options::sinks). A NaN in a q, k or v element that takes part in a visible (query, key)
// pair reaches that query's output (a NaN in the v of a masked key may or may not: blocked algorithms
// multiply it by a zero weight).
//
// A call opens no files (no cache or tuning results, nothing under /proc or /sys); of the machine it
// uses only the instruction set (cpuid, or FLASHGQA_ISA) and the cores. The same input and options
// give the same bits on every machine that runs the same instruction-set path.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>

namespace flashgqa {

// Thrown for every bad argument. what() names the argument, the value found and what was expected.
class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Thrown when a call stops early because Options::interrupt was set (the outputs are then partly
// written and must not be used).
class Interrupted : public std::runtime_error {
 public:
  Interrupted() : std::runtime_error("interrupted") {}
};

// Every enum below has one table of {value, name}, in the order front ends list the choices: its
// *_name function prints from it, its parse_* function reads from it, and the CLI's help and the
// Python module list the valid names from it (join_names).
template <typename Enum>
struct EnumName {
  Enum value;
  const char* name;
};

// int8 is only for a quantized KV cache (KvCache: k and v with a float32 scale per key and kv head,
// written by quantize_kv); every other tensor is one of the float dtypes (kFloatDTypeNames).
enum class DType : std::uint8_t { f32, bf16, f16, i8 };
inline constexpr std::array<EnumName<DType>, 4> kDTypeNames{{
    {DType::f32, "float32"},
    {DType::bf16, "bfloat16"},
    {DType::f16, "float16"},
    {DType::i8, "int8"},
}};
// The dtypes of q, k, v, out, gradients and every tensor but a quantized cache's k and v.
inline constexpr std::array<EnumName<DType>, 3> kFloatDTypeNames{{
    {DType::f32, "float32"},
    {DType::bf16, "bfloat16"},
    {DType::f16, "float16"},
}};
constexpr bool is_float_dtype(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }
// Size of one element in bytes.
std::size_t dtype_size(DType dtype);
// "float32", "bfloat16", "float16", "int8" ("unknown" for a code outside the table).
const char* dtype_name(DType dtype);
// Parses a name as printed by dtype_name; throws Error for anything else, naming `argument` and
// listing the valid names: "dtype: unknown dtype 'float64', expected float32, bfloat16 or float16".
DType parse_dtype(const std::string& name, const std::string& argument = "dtype");

enum class Algorithm : std::uint8_t {
  naive,             // logits materialised per (b, k, g); the seed's attn_naive
  chunked_unstable,  // chunked over S, exp without a max: overflows (the seed's attn_scan_s)
  chunked,           // chunked over S with a running max (attn_scan_s_stable)
  kernel1,           // the seed's first kernel: carries go through memory every KV step
  flash,             // KV loop inside, accumulators stay in cache/registers (flash_attention)
};
inline constexpr std::array<EnumName<Algorithm>, 5> kAlgorithmNames{{
    {Algorithm::naive, "naive"},
    {Algorithm::chunked_unstable, "chunked-unstable"},
    {Algorithm::chunked, "chunked"},
    {Algorithm::kernel1, "kernel1"},
    {Algorithm::flash, "flash"},
}};
// "naive", "chunked-unstable", "chunked", "kernel1", "flash" ("unknown" outside the table).
const char* algorithm_name(Algorithm algorithm);
// Parses a name as printed by algorithm_name; throws Error for anything else, naming `argument`
// and listing the valid names.
Algorithm parse_algorithm(const std::string& name, const std::string& argument = "algorithm");

enum class Precision : std::uint8_t { bf16, f32 };
inline constexpr std::array<EnumName<Precision>, 2> kPrecisionNames{{
    {Precision::bf16, "bf16"},
    {Precision::f32, "f32"},
}};
const char* precision_name(Precision precision);  // "bf16", "f32" ("unknown" outside the table)
// Parses "bf16" or "f32"; throws Error for anything else, naming `argument`.
Precision parse_precision(const std::string& name, const std::string& argument = "precision");

// The names of a table for messages and help texts: join_names(kPrecisionNames) is "bf16 or f32",
// join_names(kAlgorithmNames, ",", ",") is "naive,chunked-unstable,chunked,kernel1,flash".
template <typename Enum, std::size_t N>
std::string join_names(const std::array<EnumName<Enum>, N>& table, const char* separator = ", ",
                       const char* last_separator = " or ") {
  std::string s;
  for (std::size_t i = 0; i < N; ++i)
    s += std::string(i == 0 ? "" : i + 1 == N ? last_separator : separator) + table[i].name;
  return s;
}

// A strided view of at most 5 dimensions. Strides are in elements, not bytes.
struct TensorView {
  static constexpr int kMaxRank = 5;
  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = 0;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> stride{};

  std::int64_t numel() const;
};

// A C-order (row-major, contiguous) view.
TensorView contiguous_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape);
TensorView contiguous_view(const void* data, DType dtype, std::initializer_list<std::int64_t> shape);

// SDPA's layout [B, Hq, T, H] (rank 4, any strides) viewed as [B, K, G, T, H], G = Hq / K: query
// head h = k*G + g uses kv head k = h / G (as PyTorch SDPA's enable_gqa). The head axis, of stride s,
// splits into (K, G) with strides (G*s, s); no data moves. A rank-3 view [B, Hq, T] (such as lse)
// splits the same way into [B, K, G, T]. Throws Error, naming `name`, for a rank other than 3 or 4,
// a negative dimension, K < 1, Hq not a multiple of K, or a stride that overflows.
TensorView split_heads(const TensorView& heads, std::int64_t K,
                       const std::string& name = "split_heads");

// Views of PyTorch SDPA's q layout [B, K*G, T, H] (contiguous) as [B, K, G, T, H]: split_heads of
// the contiguous 4-D view (throwing as it does, e.g. for K < 1).
TensorView sdpa_q_view(void* data, DType dtype, std::int64_t B, std::int64_t K, std::int64_t G,
                       std::int64_t T, std::int64_t H);
// Views of FlashAttention's q layout [B, T, K*G, H] (contiguous) as [B, K, G, T, H].
TensorView fa_q_view(void* data, DType dtype, std::int64_t B, std::int64_t K, std::int64_t G,
                     std::int64_t T, std::int64_t H);
// Views of FlashAttention's k/v layout [B, S, K, H] (contiguous) as [B, K, S, H].
TensorView fa_kv_view(void* data, DType dtype, std::int64_t B, std::int64_t K, std::int64_t S,
                      std::int64_t H);

struct Options {
  Algorithm algorithm = Algorithm::flash;
  // Multiplies the logits q.k (in fp32, after the matmul). Default 1/sqrt(H); the seed pre-scales q and
  // so uses scale 1.
  std::optional<double> scale;
  bool causal = false;
  // Query t may see key j when j <= t + causal_offset. Default S - T (bottom-right aligned, as
  // FlashAttention); 0 is top-left (as PyTorch SDPA's is_causal).
  std::optional<std::int64_t> causal_offset;
  // A sliding window (FlashAttention's window_size, as Mistral and Gemma use): query t sees key j when
  //   t + offset - window_left <= j <= t + offset + window_right,
  // offset as for causal (causal_offset, default S - T); -1 = unbounded on that side. Composes with
  // causal, which sets the right side to 0: causal with window_left = 4095 is a 4096-key window ending
  // at the diagonal. Cost follows the visible keys: KV blocks no row of a block sees are skipped.
  std::int64_t window_left = -1;
  std::int64_t window_right = -1;
  // Packed sequences (FlashAttention's varlen): with num_sequences = n > 0, cu_seqlens_q and
  // cu_seqlens_k point to n + 1 non-decreasing int32 offsets, from 0 to T and to S, on a B = 1 problem.
  // Sequence i is queries [cu_seqlens_q[i], cu_seqlens_q[i+1]) against keys [cu_seqlens_k[i],
  // cu_seqlens_k[i+1]): nothing crosses a boundary, and causal masks and windows apply to positions
  // within each sequence, with causal_offset (default: each sequence's own S_i - T_i) per sequence.
  // FlashAttention's packed [total, Hq, H] layout is a strided view: split_heads of q viewed as
  // [1, total, Hq, H] with dims 1 and 2 swapped (the Python module takes 3-D arrays directly).
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_k = nullptr;
  std::int64_t num_sequences = 0;
  Precision precision = Precision::bf16;
  // Logit softcap (Gemma 2): 0 = off; else c in [2^-126, 2^126] (c and 1/c normal floats), and every
  // logit s = scale q.k becomes c tanh(s / c), in (-c, c), before the softmax (masked keys stay
  // masked). A NaN logit stays NaN; an infinite one becomes +-c. The kernels' tanh is within kTanhMaxRelError (2^-21) of the exact
  // one (kernels/microkernels.hpp). The backward multiplies dS by the cap's derivative 1 - tanh^2(s/c).
  // Every algorithm takes it; linear_attention rejects it (it has no softmax).
  double softcap = 0.0;
  // Rows of q per block and keys per KV block; 0 = chosen automatically, from the shape, the
  // instruction set and a fixed, nominal cache model (48 KiB L1d, 1 MiB L2 per core), never from the
  // caches of the machine at hand: block sizes change the rounding. Blocks measured for a machine
  // (`flashgqa tune`, which the flashgqa tool reuses itself) reach a library call only through here.
  std::int64_t block_q = 0;
  std::int64_t block_kv = 0;
  // Worker threads; 0 = all cores (OMP_NUM_THREADS when set). A larger count than the machine's
  // processors (or OMP_NUM_THREADS, if larger) is capped to it; results do not depend on the count.
  int threads = 0;
  // When not null, polled between tasks (flash, decode, backward) and between KV chunks or heads (the
  // ladder's rungs): once it reads true, the call stops and throws Interrupted. For Ctrl-C: a signal
  // handler can set it (the Python module does, for calls from the main thread).
  const std::atomic<bool>* interrupt = nullptr;
  // Attention sinks (gpt-oss): when not null, K*G float32 logits, sinks[k*G + g] for query head
  // h = k*G + g (the [K, G] or [Hq] layout, contiguous). Each row's softmax denominator gains
  // exp(sink) with no value attached: out = sum_j e^(s_j) v_j / (sum_j e^(s_j) + e^sink) and
  // lse = log(sum_j e^(s_j) + e^sink), over the visible keys j. -inf is no sink for that head; NaN and
  // +inf are errors. A row that sees no key gets out 0 and lse = sink. Read during the call only.
  // Every algorithm, the decode path and the backward take it (pass the forward's sinks there).
  const float* sinks = nullptr;
};

// out <- attention(q, k, v). out must not overlap q, k or v.
void attention(const TensorView& out, const TensorView& q, const TensorView& k, const TensorView& v,
               const Options& options = {});
// The same, also writing lse[b,k,g,t] = log(sum_j exp(scale * q.k_j)) over the visible keys (fp32;
// plus exp(sink) inside the log with Options::sinks).
void attention(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
               const TensorView& v, const Options& options = {});

// The backward pass of attention (FlashAttention-2's): given dout = dL/d(out) and the forward's q, k,
// v, out and lse (the lse attention() wrote, with the same options), writes
//   dq = dL/dq  [B,K,G,T,H] (like q),   dk = dL/dk, dv = dL/dv  [B,K,S,H] (like k; summed over the G
//   query heads of each kv head).
// P is recomputed from q, k and lse; D = rowsum(dout * out). Options: scale, causal and its offset,
// the window, packed sequences, sinks (already in lse; their own gradient: the overload below),
// softcap (then dS = P (dP - D) (1 - tanh^2(s / c))), precision, block_q / block_kv (the backward's q
// and KV blocks; 0 = automatic), threads; algorithm is ignored. Under Precision::bf16 the matmul
// operands are rounded to bfloat16: q, k, v and dout as read,
// the weights P before dv = P^T dout, and dS = P (dP - D) before dq = scale dS k and dk = scale dS^T q;
// every accumulation, D included, is fp32. Any dtype (f32, bf16, f16) and strides with H contiguous.
// A row that saw no key (lse = -inf) gets zero gradients; T = 0 or S = 0 gives zero dk, dv (and dq).
// The result does not depend on the thread count (no atomics: each KV block's dk, dv belong to one
// task; dq is summed over a task's KV blocks in key order, and over tasks in a fixed order). The
// gradients must not overlap each other or any input.
void attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        const TensorView& dout, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& out, const TensorView& lse,
                        const Options& options = {});
// The same with Options::sinks, also writing the sinks' gradient: dsinks[k*G + g] (K*G float32, the
// layout of Options::sinks) = dL/dsink = -sum_{b,t} exp(sink - lse[b,k,g,t]) D[b,k,g,t], with
// D = rowsum(dout * out) (summed in double, in a fixed order: no dependence on the thread count).
// Options::sinks must be set; dq, dk, dv are as above (the saved lse includes the sink, so they need
// nothing else). dsinks must not overlap the other gradients or any input.
void attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, float* dsinks,
                        const TensorView& dout, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& out, const TensorView& lse,
                        const Options& options);

// A KV cache for decoding (FlashAttention's flash_attn_with_kvcache): each of the B sequences has
// seqlens[b] keys already in the cache, and its T new queries (q [B,K,G,T,H]) are its latest positions.
//   dense:  k, v [B, K, S_max, H]: sequence b's key s at k[b, :, s, :]; block_table null.
//   paged:  k, v [num_pages, K, page_size, H] with block_table [B][max_pages] (int32, row-major):
//           sequence b's key s at k[block_table[b * max_pages + s / page_size], :, s % page_size, :];
//           page_size a multiple of 16. A page may appear in several tables (shared prefixes), but a
//           call's k_new may not go into a row that another sequence (or the same one at another
//           position) holds in the call: that is an Error, before anything is written.
// Any strides with H contiguous; K/V dtypes float32, bfloat16, float16 or int8 (k and v alike).
// int8 (quantized, quantize_kv): k_scale and v_scale are float32 views of the cache's shape without H
// ([B, K, S_max] or [num_pages, K, page_size], any strides); key s of kv head kh stands for the values
// k_int8[..., s, :] * k_scale[..., s]. How they are computed with is kvcache_int8_form()'s: the
// products in fp32 as an f32 cache's values (rounded to bf16 under Precision::bf16), or the integers
// themselves. With any other dtype k_scale and v_scale must be null.
// With k_new, v_new ([B,K,T,H]; the cache's dtype, or any float dtype for an int8 cache, which
// quantizes them as quantize_kv does and writes their scales) the call first writes them into the cache
// at keys seqlens[b] .. seqlens[b] + T - 1 of each sequence, and the queries attend to them: the
// sequence then has L_b = seqlens[b] + T keys (else L_b = seqlens[b]). seqlens itself is not changed.
struct KvCache {
  TensorView k, v;
  const std::int32_t* seqlens = nullptr;      // [B]
  const std::int32_t* block_table = nullptr;  // [B][max_pages], or null: a dense cache
  std::int64_t max_pages = 0;
  const TensorView* k_new = nullptr;  // [B,K,T,H] or null (with v_new)
  const TensorView* v_new = nullptr;
  const TensorView* k_scale = nullptr;  // int8 k, v: their float32 scales (both), else null
  const TensorView* v_scale = nullptr;
};

// How attention_with_kvcache computes with an int8 cache on the path in use, under Precision::bf16,
// for calls its decode kernels take in one row group (T = 1 at G <= 8):
//   "products": the bits of a float32 cache holding the products x_int8 * scale (every path but below);
//   "integers": avx2, avx512bf16 and amx (vpmaddwd, AVX512_VNNI's vpdpwssd): the int8 values as they
//     are, with each query row quantized to int16 (H <= 256) and each row's softmax weights times the V
//     scales quantized to int16 per 16 keys, the scales applied after exact int32 sums. Faster (docs/
//     performance.md, session 11); within the bounds of src/reference/tolerance.hpp (ExtraError).
// Other calls, and Precision::f32, take the products form: kvcache_int8_form(G, T, H) says which a call
// of G query heads per kv head, T new tokens and head size H takes. The integers form needs G <= 8,
// G*T <= 128 and H <= 256; on amx also G*T < 16 (T <= 3 at G = 4, T = 1 at G = 8), on avx512bf16 G*T < 32
// (T <= 7 at G = 4): from there each KV block's int8 rows become their bf16 products once for all the
// row groups, for the bf16 tiles (amx at G = 4: T = 4 1.05-1.3x and T = 16 1.3-1.6x faster,
// docs/performance.md, session 26; avx512bf16 on the packed blocks' tiles: T = 8 1.15-1.2x, T = 16
// 1.2-1.35x faster, session 27). Where avx512bf16's vdpbf16ps runs at half rate (Intel without AMX) the
// integers form stays.
const char* kvcache_int8_form();
const char* kvcache_int8_form(std::int64_t G, std::int64_t T, std::int64_t H);

// Symmetric int8 quantization of the rows of x (any float dtype, rank 1..5, H = the last axis
// contiguous), one scale per row: scale = max_h |x[h]| / 127 (fp32), x_int8[h] = x[h] / scale rounded to
// nearest even (0 for a row of zeros, whose scale is 0). x_int8 has x's shape, scale x's shape without
// its last axis (float32); any strides, H contiguous in x_int8. So |x[h] - x_int8[h] * scale| <=
// scale (1/2 + 127 * 2^-23) + 2^-143 (the rounding to an integer, the fp32 quotient and the fp32
// product; the last term for subnormal scales and products: rows with max |x| below ~2^-119).
// Throws Error for a NaN or infinite x (a row that cannot be scaled), naming the row, before writing.
void quantize_kv(const TensorView& x, const TensorView& x_int8, const TensorView& scale);

// out[b] <- attention(q[b], the L_b keys of sequence b) for each b: attention() on the dense
// [1, K, L_b, H] equivalent, with Options as there per sequence: causal bottom-right by default
// (query t sees key j <= t + L_b - T; Options::causal_offset, when set, replaces L_b - T for every
// sequence), windows, softcap, sinks, precision, blocks, threads. Options::algorithm is ignored (the
// fast flash path always: its decode kernels read the rows in place, pages included, T in groups of
// rows; without them the packed path, which gathers a paged sequence first); Options::cu_seqlens must
// be null. Throws Error before writing anything for a length beyond the cache (seqlens[b] + T past
// S_max or max_pages * page_size with k_new), a page index outside [0, num_pages), shapes or dtypes
// that disagree, int8 without scales (or scales without int8), or out overlapping the cache. out (and lse) must not overlap q, the cache or k_new/v_new.
void attention_with_kvcache(const TensorView& out, const TensorView& q, const KvCache& cache,
                            const Options& options = {});
// The same, also writing lse [B,K,G,T] as attention() does.
void attention_with_kvcache(const TensorView& out, const TensorView& lse, const TensorView& q,
                            const KvCache& cache, const Options& options = {});

// The seed's linear_attn_scan_s, another operator (no softmax):
//   out[b,k,g,t,:] = sum_j (scale * q.k_j) v_j      over the visible keys j,
// with the same precision rule (logits rounded to bf16 before the second matmul under Precision::bf16),
// chunked over S with Options::block_kv. Options::algorithm is ignored; Options::block_q must be 0
// (it chunks only over S).
void linear_attention(const TensorView& out, const TensorView& q, const TensorView& k,
                      const TensorView& v, const Options& options = {});

// Workspace memory: every call allocates its threads' scratch (and the packed path its packed K/V) and
// frees it at its end. Blocks of 64 KiB or more are kept for the next calls, up to 64 MiB in all (the
// oldest handed back first; a larger block is handed back at once): short calls, decode above all, then
// skip a page fault per 4 KiB of fresh memory (docs/performance.md, session 28). Safe from any thread.
// This hands every kept block back to the system now, returning how many bytes they held.
std::size_t free_workspace_cache();

}  // namespace flashgqa
