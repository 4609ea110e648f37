// Validation of the public views and options into a Problem (make_problem and its checks). The
// enums' names and parsers are in names.cpp, the views (contiguous_view, split_heads, ...) in
// views.cpp.
#include "core/problem.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <string>
#include <tuple>

#include "core/backward_problem.hpp"
#include "core/error_text.hpp"
#include "core/names.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace flashgqa {
namespace {

bool valid_dtype(DType d) { return find_name(kDTypeNames, d) != nullptr; }

// Byte range [lo, hi) that a view touches; checks that every offset fits in 64 bits.
struct Extent {
  std::int64_t lo = 0, hi = 0;
};

Extent checked_extent(const TensorView& t, const char* name) {
  std::int64_t lo = 0, hi = 0;  // element offsets of the first and last element
  for (int d = 0; d < t.rank; ++d) {
    const auto i = static_cast<std::size_t>(d);
    if (t.shape[i] == 0) return {};
    std::int64_t span = 0;
    if (__builtin_mul_overflow(t.shape[i] - 1, t.stride[i], &span) ||
        __builtin_add_overflow(t.stride[i] < 0 ? lo : hi, span, t.stride[i] < 0 ? &lo : &hi))
      fail(std::string(name) + ": shape " + shape_string(t) +
           " with its strides overflows 64-bit element indexing; expected smaller dimensions");
  }
  const auto esize = static_cast<std::int64_t>(dtype_size(t.dtype));
  std::int64_t lo_b = 0, hi_b = 0;
  if (__builtin_mul_overflow(lo, esize, &lo_b) || __builtin_mul_overflow(hi + 1, esize, &hi_b))
    fail(std::string(name) + ": shape " + shape_string(t) +
         " overflows 64-bit byte offsets; expected smaller dimensions");
  const auto base = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(t.data));
  return {base + lo_b, base + hi_b};
}

// int8_ok: the view may be int8 (a quantized KV cache's k and v); otherwise a float dtype.
void check_view(const TensorView& t, const char* name, int rank, const char* layout, bool int8_ok = false) {
  if (t.rank != rank)
    fail(std::string(name) + ": rank " + std::to_string(t.rank) + ", expected " +
         std::to_string(rank) + " " + layout);
  if (!valid_dtype(t.dtype))
    fail(std::string(name) + ": unknown dtype code " + std::to_string(static_cast<int>(t.dtype)) +
         ", expected " + (int8_ok ? join_names(kDTypeNames) : join_names(kFloatDTypeNames)));
  if (t.dtype == DType::i8 && !int8_ok)
    fail(std::string(name) + ": dtype int8, expected " + join_names(kFloatDTypeNames) +
         " (int8 only in a KV cache's k and v, with their scales: attention_with_kvcache)");
  for (int d = 0; d < rank; ++d)
    if (t.shape[static_cast<std::size_t>(d)] < 0)
      fail(std::string(name) + ": negative dimension in shape " + shape_string(t));
  const auto last = static_cast<std::size_t>(rank - 1);
  if (t.shape[last] > 1 && t.stride[last] != 1)
    fail(std::string(name) + ": innermost stride " + std::to_string(t.stride[last]) +
         ", expected 1 (the last dimension must be contiguous)");
  if (t.data == nullptr && t.numel() > 0)
    fail(std::string(name) + ": null data pointer for shape " + shape_string(t));
}

void check_dim(const TensorView& t, const char* name, int d, std::int64_t expected,
               const char* what) {
  const std::int64_t found = t.shape[static_cast<std::size_t>(d)];
  if (found != expected)
    fail(std::string(name) + ": shape " + shape_string(t) + " has " + what + " = " +
         std::to_string(found) + ", expected " + std::to_string(expected) + " (from q)");
}

}  // namespace

// An output must not write one address twice: sorted by |stride|, every dimension longer than 1 must
// step past everything the dimensions inside it span. (Sufficient, and true of every dense or padded
// layout; stride 0, as from expand() or broadcast_to(), fails it.)
void check_distinct_elements(const TensorView& t, const char* name) {
  if (t.numel() == 0) return;  // no element to write
  std::array<std::pair<std::int64_t, std::int64_t>, TensorView::kMaxRank> dims{};  // |stride|, extent
  int n = 0;
  for (int d = 0; d < t.rank; ++d) {
    const auto i = static_cast<std::size_t>(d);
    if (t.shape[i] > 1) dims[static_cast<std::size_t>(n++)] = {t.stride[i] < 0 ? -t.stride[i] : t.stride[i], t.shape[i]};
  }
  for (int i = 1; i < n; ++i)  // insertion sort of at most 5 (|stride|, extent) pairs
    for (int j = i; j > 0 && dims[static_cast<std::size_t>(j)] < dims[static_cast<std::size_t>(j - 1)]; --j)
      std::swap(dims[static_cast<std::size_t>(j)], dims[static_cast<std::size_t>(j - 1)]);
  std::int64_t span = 0;  // largest offset reached by the dimensions inside (checked_extent bounds it)
  for (int d = 0; d < n; ++d) {
    const auto [stride, extent] = dims[static_cast<std::size_t>(d)];
    if (stride <= span)
      fail(std::string(name) + ": shape " + shape_string(t) + " with strides " + stride_string(t) +
           " makes different elements share memory, expected an output whose elements are distinct");
    span += (extent - 1) * stride;
  }
}

namespace {

// t (named `name`) must have the shape of `like` (named `like_name`); both of like's rank.
void check_same_shape(const TensorView& t, const char* name, const TensorView& like, const char* like_name) {
  for (int d = 0; d < like.rank; ++d)
    if (t.shape[static_cast<std::size_t>(d)] != like.shape[static_cast<std::size_t>(d)])
      fail(std::string(name) + ": shape " + shape_string(t) + ", expected the shape of " + like_name + " " +
           shape_string(like));
}

// dst[d] = t.stride[d] for d < n.
void copy_strides(std::int64_t* dst, const TensorView& t, int n) {
  for (int d = 0; d < n; ++d) dst[d] = t.stride[static_cast<std::size_t>(d)];
}

bool overlaps(const Extent& a, const Extent& b) {
  return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi;
}

void check_blocks(Algorithm algorithm, std::int64_t block_q, std::int64_t block_kv) {
  if (block_q < 0) fail("block_q: " + std::to_string(block_q) + ", expected >= 0 (0 = automatic)");
  if (block_kv < 0)
    fail("block_kv: " + std::to_string(block_kv) + ", expected >= 0 (0 = automatic)");
  constexpr std::int64_t kMaxBlock = std::int64_t{1} << 24;
  if (block_q > kMaxBlock || block_kv > kMaxBlock)
    fail("block_q/block_kv: " + std::to_string(std::max(block_q, block_kv)) + ", expected <= " +
         std::to_string(kMaxBlock));
  switch (algorithm) {
    case Algorithm::naive:
      if (block_q != 0 || block_kv != 0)
        fail("block_q/block_kv: naive takes no blocks (got " + std::to_string(block_q) + "/" +
             std::to_string(block_kv) + "), expected 0");
      return;
    case Algorithm::chunked_unstable:
    case Algorithm::chunked:
      if (block_q != 0)
        fail(std::string("block_q: ") + algorithm_name(algorithm) +
             " chunks only over S (got block_q " + std::to_string(block_q) + "), expected 0");
      return;
    case Algorithm::kernel1:
    case Algorithm::flash:
      return;
  }
  fail("algorithm: unknown algorithm code " + std::to_string(static_cast<int>(algorithm)) +
       ", expected " + join_names(kAlgorithmNames));
}

// Options::sinks: K*G logits, each finite or -inf (no sink for that head).
void check_sinks(const float* sinks, std::int64_t K, std::int64_t G) {
  if (sinks == nullptr) return;
  for (std::int64_t h = 0; h < K * G; ++h)
    if (std::isnan(sinks[h]) || sinks[h] == std::numeric_limits<float>::infinity())
      fail("sinks: head " + std::to_string(h) + " (k " + std::to_string(h / G) + ", g " + std::to_string(h % G) +
           ") has sink " + std::to_string(sinks[h]) + ", expected a finite number or -inf (no sink)");
}

// Options::cu_seqlens_q/k: n + 1 non-decreasing offsets from 0 to T (to S), on a B = 1 problem.
void check_sequences(const Options& o, std::int64_t B, std::int64_t T, std::int64_t S) {
  const std::int64_t n = o.num_sequences;
  if (n == 0 && o.cu_seqlens_q == nullptr && o.cu_seqlens_k == nullptr) return;
  if (n < 1 || n > std::int64_t{1} << 31)
    fail("num_sequences: " + std::to_string(n) + " with cu_seqlens given, expected 1 to 2^31 sequences");
  if (o.cu_seqlens_q == nullptr || o.cu_seqlens_k == nullptr)
    fail(std::string(o.cu_seqlens_q == nullptr ? "cu_seqlens_q" : "cu_seqlens_k") +
         ": null, expected both cu_seqlens_q and cu_seqlens_k for packed sequences");
  if (B != 1)
    fail("q: B = " + std::to_string(B) + " with packed sequences (cu_seqlens), expected B = 1");
  for (const auto& [cu, name, total, letter] :
       {std::tuple{o.cu_seqlens_q, "cu_seqlens_q", T, "T"}, std::tuple{o.cu_seqlens_k, "cu_seqlens_k", S, "S"}}) {
    if (cu[0] != 0) fail(std::string(name) + "[0] = " + std::to_string(cu[0]) + ", expected 0");
    for (std::int64_t i = 0; i < n; ++i)
      if (cu[i + 1] < cu[i])
        fail(std::string(name) + "[" + std::to_string(i + 1) + "] = " + std::to_string(cu[i + 1]) + " < " +
             name + "[" + std::to_string(i) + "] = " + std::to_string(cu[i]) +
             ", expected non-decreasing offsets");
    if (cu[n] != total)
      fail(std::string(name) + "[" + std::to_string(n) + "] = " + std::to_string(cu[n]) + ", expected " +
           letter + " = " + std::to_string(total) + " (the packed length)");
  }
}

}  // namespace

bool views_overlap(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name) {
  return overlaps(checked_extent(a, a_name), checked_extent(b, b_name));
}

int resolve_threads(int requested) {
  if (requested < 0)
    fail("threads: " + std::to_string(requested) + ", expected >= 0 (0 = all cores)");
#ifdef _OPENMP
  // More threads than the machine runs at once only cost memory and start-up (and a huge count made
  // the OpenMP runtime crash or exit): capped at the processors, or OMP_NUM_THREADS if larger.
  const int most = std::max(omp_get_num_procs(), omp_get_max_threads());
  return requested == 0 ? omp_get_max_threads() : std::min(requested, most);
#else
  return 1;
#endif
}

void check_inputs(const TensorView& q, const TensorView& k, const TensorView& v, const Options& options,
                  bool int8_kv) {
  check_view(q, "q", 5, "[B,K,G,T,H]");
  check_view(k, "k", 4, "[B,K,S,H]", int8_kv);
  check_view(v, "v", 4, "[B,K,S,H]", int8_kv);
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}})
    if (t->numel() == INT64_MAX)
      fail(std::string(name) + ": shape " + shape_string(*t) +
           " overflows 64-bit indexing (too many elements); expected smaller dimensions");
  const std::int64_t B = q.shape[0], K = q.shape[1], G = q.shape[2], H = q.shape[4];
  if (G < 1) fail("q: G = " + std::to_string(G) + " in shape " + shape_string(q) + ", expected G >= 1");
  if (K < 1) fail("q: K = " + std::to_string(K) + " in shape " + shape_string(q) + ", expected K >= 1");
  if (H < 1) fail("q: H = " + std::to_string(H) + " in shape " + shape_string(q) + ", expected H >= 1");
  check_dim(k, "k", 0, B, "B");
  check_dim(k, "k", 1, K, "K");
  check_dim(k, "k", 3, H, "H");
  check_same_shape(v, "v", k, "k");
  checked_extent(q, "q");
  checked_extent(k, "k");
  checked_extent(v, "v");
  const double scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(H)));
  if (!std::isfinite(scale) || !std::isfinite(static_cast<float>(scale)))
    fail("scale: " + std::to_string(scale) + ", expected a finite number");
  if (options.precision != Precision::bf16 && options.precision != Precision::f32)
    fail("precision: unknown code " + std::to_string(static_cast<int>(options.precision)) +
         ", expected bf16 or f32");
  // c and 1/c must be normal floats (the kernels multiply by 1/c; a subnormal 1/c would flush small
  // logits to 0 and break softcap_n's bound): c in [2^-126, 2^126].
  if (options.softcap != 0.0 && !(options.softcap >= 0x1p-126 && options.softcap <= 0x1p126))
    fail("softcap: " + std::to_string(options.softcap) +
         ", expected 0 (off) or a number in [2^-126, 2^126] (c and 1/c normal floats)");
  check_blocks(options.algorithm, options.block_q, options.block_kv);
  resolve_threads(options.threads);
  check_sinks(options.sinks, K, G);
  if (options.window_left < -1 || options.window_right < -1)
    fail("window: (" + std::to_string(options.window_left) + ", " + std::to_string(options.window_right) +
         "), expected each side >= 0, or -1 for unbounded");
  check_sequences(options, q.shape[0], q.shape[3], k.shape[2]);
}

Problem make_problem(const TensorView& out, const TensorView* lse, const TensorView& q,
                     const TensorView& k, const TensorView& v, const Options& options, bool int8_kv) {
  check_inputs(q, k, v, options, int8_kv);
  check_view(out, "out", 5, "[B,K,G,T,H]");
  if (out.numel() == INT64_MAX)
    fail("out: shape " + shape_string(out) +
         " overflows 64-bit indexing (too many elements); expected smaller dimensions");
  Problem p;
  p.B = q.shape[0];
  p.K = q.shape[1];
  p.G = q.shape[2];
  p.T = q.shape[3];
  p.H = q.shape[4];
  p.S = k.shape[2];
  check_same_shape(out, "out", q, "q");

  const Extent eq = checked_extent(q, "q"), ek = checked_extent(k, "k"),
               ev = checked_extent(v, "v"), eo = checked_extent(out, "out");
  check_distinct_elements(out, "out");
  if (overlaps(eo, eq) || overlaps(eo, ek) || overlaps(eo, ev))
    fail(std::string("out: memory overlaps ") + (overlaps(eo, eq) ? "q" : overlaps(eo, ek) ? "k" : "v") +
         ", expected a separate buffer");
  if (lse != nullptr) {
    if (lse->rank != 4)
      fail("lse: rank " + std::to_string(lse->rank) + ", expected 4 [B,K,G,T]");
    if (lse->dtype != DType::f32)
      fail(std::string("lse: dtype ") + dtype_name(lse->dtype) + ", expected float32");
    for (int d = 0; d < 4; ++d)
      if (lse->shape[static_cast<std::size_t>(d)] != q.shape[static_cast<std::size_t>(d)])
        fail("lse: shape " + shape_string(*lse) + ", expected [B,K,G,T] = [" +
             std::to_string(p.B) + "," + std::to_string(p.K) + "," + std::to_string(p.G) + "," +
             std::to_string(p.T) + "]");
    if (lse->data == nullptr && lse->numel() > 0) fail("lse: null data pointer");
    const Extent el = checked_extent(*lse, "lse");
    check_distinct_elements(*lse, "lse");
    if (overlaps(el, eq) || overlaps(el, ek) || overlaps(el, ev) || overlaps(el, eo))
      fail("lse: memory overlaps q, k, v or out, expected a separate buffer");
    p.lse = static_cast<float*>(lse->data);
    copy_strides(p.lse_stride, *lse, 4);
  }

  p.q = q.data;
  p.q_dtype = q.dtype;
  copy_strides(p.q_stride, q, 4);
  p.out = out.data;
  p.out_dtype = out.dtype;
  copy_strides(p.out_stride, out, 4);
  p.k = k.data;
  p.k_dtype = k.dtype;
  copy_strides(p.k_stride, k, 3);
  p.v = v.data;
  p.v_dtype = v.dtype;
  copy_strides(p.v_stride, v, 3);

  p.scale = static_cast<float>(options.scale.value_or(1.0 / std::sqrt(static_cast<double>(p.H))));
  p.causal = options.causal;
  p.causal_offset = options.causal_offset.value_or(p.S - p.T);
  p.window_left = options.window_left;
  p.window_right = options.window_right;
  for (std::int64_t i = 0; i < options.num_sequences; ++i) {
    const std::int64_t q0 = options.cu_seqlens_q[i], q1 = options.cu_seqlens_q[i + 1];
    const std::int64_t k0 = options.cu_seqlens_k[i], k1 = options.cu_seqlens_k[i + 1];
    if (q1 > q0) p.sequences.push_back({q0, q1, k0, k1, options.causal_offset.value_or((k1 - k0) - (q1 - q0))});
  }
  p.precision = options.precision;
  p.softcap = static_cast<float>(options.softcap);
  p.block_q = options.block_q;
  p.block_kv = options.block_kv;
  p.threads = resolve_threads(options.threads);
  p.interrupt = options.interrupt;
  p.sinks = options.sinks;
  return p;
}

BackwardProblem make_backward_problem(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                      const TensorView& dout, const TensorView& q, const TensorView& k,
                                      const TensorView& v, const TensorView& out, const TensorView& lse,
                                      const Options& options, float* dsinks) {
  BackwardProblem p;
  p.fwd = make_problem(out, &lse, q, k, v, options);  // q, k, v, out, lse as the forward's
  const std::pair<const TensorView*, const char*> like_q[] = {{&dout, "dout"}, {&dq, "dq"}};
  const std::pair<const TensorView*, const char*> like_k[] = {{&dk, "dk"}, {&dv, "dv"}};
  for (const auto& [t, name] : like_q) {
    check_view(*t, name, 5, "[B,K,G,T,H]");
    check_same_shape(*t, name, q, "q");
  }
  for (const auto& [t, name] : like_k) {
    check_view(*t, name, 4, "[B,K,S,H]");
    check_same_shape(*t, name, k, "k");
  }
  // The gradients are written: distinct elements, apart from each other and from every input.
  const Extent inputs[] = {checked_extent(q, "q"), checked_extent(k, "k"), checked_extent(v, "v"),
                           checked_extent(out, "out"), checked_extent(lse, "lse"),
                           checked_extent(dout, "dout")};
  const char* input_names[] = {"q", "k", "v", "out", "lse", "dout"};
  const std::pair<const TensorView*, const char*> grads[] = {{&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}};
  Extent written[3];
  for (int i = 0; i < 3; ++i) {
    const auto& [t, name] = grads[i];
    written[i] = checked_extent(*t, name);
    check_distinct_elements(*t, name);
    for (int j = 0; j < 6; ++j)
      if (overlaps(written[i], inputs[j]))
        fail(std::string(name) + ": memory overlaps " + input_names[j] + ", expected a separate buffer");
    for (int j = 0; j < i; ++j)
      if (overlaps(written[i], written[j]))
        fail(std::string(name) + ": memory overlaps " + grads[j].second + ", expected a separate buffer");
  }
  p.dout = dout.data;
  p.dout_dtype = dout.dtype;
  copy_strides(p.dout_stride, dout, 4);
  p.dq = dq.data;
  p.dq_dtype = dq.dtype;
  copy_strides(p.dq_stride, dq, 4);
  p.dk = dk.data;
  p.dk_dtype = dk.dtype;
  copy_strides(p.dk_stride, dk, 3);
  p.dv = dv.data;
  p.dv_dtype = dv.dtype;
  copy_strides(p.dv_stride, dv, 3);
  if (dsinks != nullptr) {
    if (options.sinks == nullptr)
      fail("dsinks: given without Options::sinks, expected the forward's sinks (dsinks is their gradient)");
    const auto begin = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(dsinks));
    const std::int64_t heads = p.fwd.K * p.fwd.G;
    const Extent ed{begin, begin + heads * static_cast<std::int64_t>(sizeof(float))};
    const auto sb = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(options.sinks));
    const Extent es{sb, sb + heads * static_cast<std::int64_t>(sizeof(float))};
    for (const auto& [e, name] : {std::pair<const Extent*, const char*>{&written[0], "dq"}, {&written[1], "dk"}, {&written[2], "dv"},
                                  {&es, "sinks"}})
      if (overlaps(ed, *e)) fail(std::string("dsinks: memory overlaps ") + name + ", expected a separate buffer");
    for (int j = 0; j < 6; ++j)
      if (overlaps(ed, inputs[j]))
        fail(std::string("dsinks: memory overlaps ") + input_names[j] + ", expected a separate buffer");
    p.dsinks = dsinks;
  }
  return p;
}

}  // namespace flashgqa
