// The plain parameter struct every algorithm, kernel, test and benchmark takes: pointers, shapes,
// strides (in elements), scale and mask. Built and validated once from the public views by
// make_problem; algorithms never see TensorView or Options.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "flashgqa/flashgqa.hpp"

namespace flashgqa {

// A half-open range of keys [begin, end); empty when end <= begin.
struct KeyRange {
  std::int64_t begin = 0, end = 0;
  bool empty() const { return end <= begin; }
  std::int64_t size() const { return end > begin ? end - begin : 0; }
  // This range within [lo, hi), as offsets from `base` (for masking one block of keys).
  KeyRange clamp_to(std::int64_t lo, std::int64_t hi, std::int64_t base) const {
    return {std::clamp(begin, lo, hi) - base, std::clamp(end, lo, hi) - base};
  }
};

struct Problem {
  std::int64_t B = 0, K = 0, G = 0, T = 0, S = 0, H = 0;

  // q [B,K,G,T,H], out [B,K,G,T,H]: strides of b, k, g, t (h is contiguous).
  const void* q = nullptr;
  DType q_dtype = DType::f32;
  std::int64_t q_stride[4] = {};
  void* out = nullptr;
  DType out_dtype = DType::f32;
  std::int64_t out_stride[4] = {};
  // k, v [B,K,S,H]: strides of b, k, s.
  const void* k = nullptr;
  DType k_dtype = DType::f32;
  std::int64_t k_stride[3] = {};
  const void* v = nullptr;
  DType v_dtype = DType::f32;
  std::int64_t v_stride[3] = {};
  // int8 k, v (the KV-cache API only; the decode path is the only one that reads them): key s of kv
  // head kh stands for k_row(b, kh, s)[h] * k_scale[b * k_scale_stride[0] + kh * [1] + s * [2]] (v
  // alike; with pages, b is the page). Null otherwise.
  const float* k_scale = nullptr;
  std::int64_t k_scale_stride[3] = {};
  const float* v_scale = nullptr;
  std::int64_t v_scale_stride[3] = {};
  // lse [B,K,G,T] fp32, or null: strides of b, k, g, t.
  float* lse = nullptr;
  std::int64_t lse_stride[4] = {};

  float scale = 1.0f;
  bool causal = false;
  // Query t sees key j iff j <= t + causal_offset (when causal). Any int64: visible_keys never overflows.
  std::int64_t causal_offset = 0;
  // A sliding window (FlashAttention's window_size; -1 = unbounded on that side): query t sees key j iff
  // t + causal_offset - window_left <= j <= t + causal_offset + window_right; causal sets the right side
  // to 0.
  std::int64_t window_left = -1, window_right = -1;
  // Packed sequences (Options::cu_seqlens_q/k, B = 1): empty for one plain sequence. Otherwise query t
  // of the sequence whose [q_begin, q_end) holds it sees only that sequence's keys [k_begin, k_end),
  // with the mask above applied to its positions within the sequence and the sequence's own offset
  // (Options::causal_offset, or its S_i - T_i by default). Sequences without queries are left out;
  // q_begin and k_begin never decrease.
  struct Sequence {
    std::int64_t q_begin = 0, q_end = 0, k_begin = 0, k_end = 0, offset = 0;
  };
  std::vector<Sequence> sequences;
  Precision precision = Precision::bf16;
  float softcap = 0.0f;  // Options::softcap: 0 = off, else logits s -> softcap tanh(s / softcap)
  std::int64_t block_q = 0;   // 0 = automatic
  std::int64_t block_kv = 0;  // 0 = automatic
  int threads = 1;            // resolved: >= 1
  const std::atomic<bool>* interrupt = nullptr;  // Options::interrupt
  // Options::sinks: K*G sink logits (sinks[kh*G + g]), or null; validated (no NaN, no +inf).
  const float* sinks = nullptr;

  // Throws Interrupted once the caller's interrupt flag is set (cheap: one relaxed load).
  void check_interrupt() const {
    if (interrupted()) throw Interrupted();
  }
  bool interrupted() const { return interrupt != nullptr && interrupt->load(std::memory_order_relaxed); }

  // Element addresses.
  const void* q_row(std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t) const {
    return static_cast<const char*>(q) +
           (b * q_stride[0] + kh * q_stride[1] + g * q_stride[2] + t * q_stride[3]) *
               static_cast<std::int64_t>(dtype_size(q_dtype));
  }
  void* out_row(std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t) const {
    return static_cast<char*>(out) +
           (b * out_stride[0] + kh * out_stride[1] + g * out_stride[2] + t * out_stride[3]) *
               static_cast<std::int64_t>(dtype_size(out_dtype));
  }
  const void* k_row(std::int64_t b, std::int64_t kh, std::int64_t s) const {
    return static_cast<const char*>(k) + (b * k_stride[0] + kh * k_stride[1] + s * k_stride[2]) *
                                             static_cast<std::int64_t>(dtype_size(k_dtype));
  }
  const void* v_row(std::int64_t b, std::int64_t kh, std::int64_t s) const {
    return static_cast<const char*>(v) + (b * v_stride[0] + kh * v_stride[1] + s * v_stride[2]) *
                                             static_cast<std::int64_t>(dtype_size(v_dtype));
  }
  // The sink logit of query head (kh, g); -inf (no sink) without Options::sinks.
  float sink(std::int64_t kh, std::int64_t g) const {
    return sinks != nullptr ? sinks[kh * G + g] : -std::numeric_limits<float>::infinity();
  }
  float* lse_at(std::int64_t b, std::int64_t kh, std::int64_t g, std::int64_t t) const {
    return lse + b * lse_stride[0] + kh * lse_stride[1] + g * lse_stride[2] + t * lse_stride[3];
  }

  // The keys query t may see, [begin, end) within [0, S). begin and end never decrease as t grows:
  // every mask is built that way (causal fills end, a window fills begin too; packed sequences come
  // in key order), and tile and block skipping rely on it (the first query of a block sees the first
  // keys, the last one the last keys).
  KeyRange visible_keys(std::int64_t t) const {
    if (sequences.empty()) return keys_within(t, causal_offset, S);
    const Sequence& s = sequence_of(t);
    const KeyRange r = keys_within(t - s.q_begin, s.offset, s.k_end - s.k_begin);
    return {r.begin + s.k_begin, r.end + s.k_begin};
  }
  // The sequence holding query t (sequences not empty, 0 <= t < T).
  const Sequence& sequence_of(std::int64_t t) const {
    const auto after = std::upper_bound(sequences.begin(), sequences.end(), t,
                                        [](std::int64_t x, const Sequence& s) { return x < s.q_begin; });
    return *(after - 1);
  }
  // The mask's keys for position t with `offset` among n keys, in [0, n). Computed in 128 bits, so no
  // offset or window, however large, overflows.
  KeyRange keys_within(std::int64_t t, std::int64_t offset, std::int64_t n) const {
    const std::int64_t right = causal ? 0 : window_right;
    const __int128 at = static_cast<__int128>(t) + offset;
    auto clamp = [n](__int128 x) { return static_cast<std::int64_t>(x < 0 ? 0 : x > n ? n : x); };
    return {window_left < 0 ? 0 : clamp(at - window_left), right < 0 ? n : clamp(at + right + 1)};
  }
  // The keys some query in [t0, t1) may see (t0 < t1): from the first query's begin to the last one's end.
  KeyRange visible_keys(std::int64_t t0, std::int64_t t1) const {
    return {visible_keys(t0).begin, visible_keys(t1 - 1).end};
  }
  // (query, key) pairs over all T queries of one head: the work a FLOP count should follow.
  std::int64_t visible_pairs() const {
    std::int64_t n = 0;
    for (std::int64_t t = 0; t < T; ++t) n += visible_keys(t).size();
    return n;
  }
};

// Validates q, k, v and the options alone (everything make_problem checks but out and lse), so a
// caller can reject bad inputs before it allocates the outputs. Throws Error as make_problem does.
// int8_kv: k and v may be int8 (the KV-cache API's quantized cache; make_problem's caller then sets
// the scales); otherwise every view must have a float dtype.
void check_inputs(const TensorView& q, const TensorView& k, const TensorView& v, const Options& options,
                  bool int8_kv = false);

// Validates the views and options and resolves the defaults (scale, causal offset, threads).
// `lse` may be null. Throws Error naming the argument, the value found and what was expected.
Problem make_problem(const TensorView& out, const TensorView* lse, const TensorView& q,
                     const TensorView& k, const TensorView& v, const Options& options, bool int8_kv = false);

// Whether two views' byte ranges overlap (each from its first to its last element; empty views never
// do). Throws Error, as make_problem, for a view whose offsets overflow.
bool views_overlap(const TensorView& a, const char* a_name, const TensorView& b, const char* b_name);

// Throws Error unless every element of the output view t (named `name`) has its own address.
void check_distinct_elements(const TensorView& t, const char* name);

// The number of OpenMP threads to use for `requested` (0 = all cores).
int resolve_threads(int requested);

}  // namespace flashgqa
