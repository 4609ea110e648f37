// The KV-cache entry point (attention_with_kvcache, flashgqa.hpp): validate the cache, lengths and page
// tables once, before anything is written; append k_new/v_new at each sequence's end; then run each
// sequence as a B = 1 problem on its own L_b keys (Problem::S = L_b, the causal offset L_b - T), so a
// per-sequence length is nothing but a per-sequence key range and every variant (windows, softcap,
// sinks) comes with it.
//
// Which path: the decode kernels where the kernel set has them (avx512bf16 and neon-bf16, under
// Precision::bf16) and G <= kDecodeMaxRows, reading dense rows in place and paged rows page by page
// (flash_decode.hpp: KvPages), T in row groups; otherwise fast flash's own choice (flash_attention) on
// the dense view, a paged sequence first gathered into a dense copy (the packed path packs K/V anyway).
// An int8 cache (k_scale, v_scale): the decode kernels scale its rows as they read them; the other
// paths get a dense float32 copy of the same products (dense_sequence). Appending k_new/v_new
// to it quantizes them as quantize_kv does (core/quantize_row.hpp).
// The decode kernels' sequences run together, in one parallel region (a region per sequence costs a
// start-up and a barrier each, which on a busy machine can cost more than the work); the others run one
// after another. Each sequence is planned as alone, so nothing depends on the thread count.
#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error_text.hpp"
#include "core/int_math.hpp"
#include "core/problem.hpp"
#include "core/quantize_row.hpp"
#include "core/names.hpp"
#include "flash/flash_decode.hpp"
#include "flash/flash_packed.hpp"
#include "flashgqa/flashgqa.hpp"
#include "kernels/cpu_features.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa {
namespace {

std::int64_t esize(const TensorView& t) { return static_cast<std::int64_t>(dtype_size(t.dtype)); }

// Batch entry b of t as a batch of one.
TensorView batch_entry(const TensorView& t, std::int64_t b) {
  TensorView e = t;
  e.shape[0] = 1;
  e.data = static_cast<char*>(t.data) + b * t.stride[0] * esize(t);
  return e;
}

struct CacheShape {
  bool paged = false;
  bool int8 = false;  // k and v int8, with k_scale, v_scale
  std::int64_t B = 0, K = 0, T = 0, H = 0;
  std::int64_t rows = 0;      // S_max (dense) or page_size (paged): dimension 2 of the cache
  std::int64_t capacity = 0;  // keys a sequence can hold: S_max, or max_pages * page_size
  // Keys of sequence b in this call (with the appended ones).
  std::int64_t length(const KvCache& c, std::int64_t b) const { return c.seqlens[b] + (c.k_new ? T : 0); }
};

// Element offset of key s of kv head kh of sequence b in a view laid out as the cache is (k, v, or
// their scales: dimensions 0..2 are the batch entry or page, kv head, row).
std::int64_t key_offset(const TensorView& t, const KvCache& c, const CacheShape& cs, std::int64_t b,
                        std::int64_t kh, std::int64_t s) {
  if (cs.paged)
    return c.block_table[b * c.max_pages + s / cs.rows] * t.stride[0] + kh * t.stride[1] + (s % cs.rows) * t.stride[2];
  return b * t.stride[0] + kh * t.stride[1] + s * t.stride[2];
}

// Address of key s of kv head kh of sequence b in the cache view t (k or v).
char* cache_row(const TensorView& t, const KvCache& c, const CacheShape& cs, std::int64_t b, std::int64_t kh,
                std::int64_t s) {
  return static_cast<char*>(t.data) + key_offset(t, c, cs, b, kh, s) * esize(t);
}

// Its scale in the scale view t (k_scale or v_scale).
float* scale_at(const TensorView& t, const KvCache& c, const CacheShape& cs, std::int64_t b, std::int64_t kh,
                std::int64_t s) {
  return static_cast<float*>(t.data) + key_offset(t, c, cs, b, kh, s);
}

// Row i of kv head kh of sequence b in k_new or v_new ([B, K, T, H]).
const char* new_row(const TensorView& t, std::int64_t b, std::int64_t kh, std::int64_t i) {
  return static_cast<const char*>(t.data) + (b * t.stride[0] + kh * t.stride[1] + i * t.stride[2]) * esize(t);
}

void check_kv_view(const TensorView& t, const char* name, const CacheShape& cs, const char* layout) {
  if (t.rank != 4) fail(std::string(name) + ": rank " + std::to_string(t.rank) + ", expected 4 " + layout);
  if (t.shape[1] != cs.K || t.shape[3] != cs.H)
    fail(std::string(name) + ": shape " + shape_string(t) + ", expected " + layout + " with K = " +
         std::to_string(cs.K) + " and H = " + std::to_string(cs.H) + " (from q)");
  if (t.shape[3] > 1 && t.stride[3] != 1)
    fail(std::string(name) + ": innermost stride " + std::to_string(t.stride[3]) + ", expected 1");
  for (int d = 0; d < 4; ++d)
    if (t.shape[static_cast<std::size_t>(d)] < 0) fail(std::string(name) + ": negative dimension in " + shape_string(t));
}

// The scales of an int8 cache (k_scale, v_scale: float32, the cache's shape without H), or none.
void check_scales(const KvCache& c, CacheShape& cs) {
  cs.int8 = c.k.dtype == DType::i8 || c.v.dtype == DType::i8;
  if (!cs.int8) {
    if (c.k_scale != nullptr || c.v_scale != nullptr)
      fail(std::string(c.k_scale != nullptr ? "k_scale" : "v_scale") + ": given for a " + dtype_name(c.k.dtype) +
           " cache, expected null (scales go with an int8 k_cache and v_cache)");
    return;
  }
  if (c.k.dtype != c.v.dtype)
    fail(std::string(c.k.dtype == DType::i8 ? "v_cache" : "k_cache") + ": dtype " +
         dtype_name(c.k.dtype == DType::i8 ? c.v.dtype : c.k.dtype) +
         " beside an int8 cache, expected int8 (k and v are quantized together)");
  for (const auto& [t, name, like] : {std::tuple{c.k_scale, "k_scale", &c.k}, std::tuple{c.v_scale, "v_scale", &c.v}}) {
    const std::string expected =
        std::string(cs.paged ? "[num_pages,K,page_size]" : "[B,K,S_max]") + " = " +
        "[" + std::to_string(like->shape[0]) + "," + std::to_string(like->shape[1]) + "," +
        std::to_string(like->shape[2]) + "]";
    if (t == nullptr) fail(std::string(name) + ": null, expected float32 scales " + expected + " for the int8 cache");
    if (t->dtype != DType::f32)
      fail(std::string(name) + ": dtype " + dtype_name(t->dtype) + ", expected float32");
    if (t->rank != 3 || !std::equal(like->shape.begin(), like->shape.begin() + 3, t->shape.begin()))
      fail(std::string(name) + ": shape " + shape_string(*t) + ", expected " + expected);
    if (t->data == nullptr && t->numel() > 0) fail(std::string(name) + ": null data pointer");
    views_overlap(*t, name, *t, name);  // throws for strides that overflow
  }
}

// The first non-finite value of k_new/v_new, which an int8 cache cannot quantize: an Error before
// anything is written.
void check_new_keys_finite(const KvCache& c, const CacheShape& cs) {
  for (const auto& [t, name] : {std::pair{c.k_new, "k_new"}, std::pair{c.v_new, "v_new"}})
    for (std::int64_t b = 0; b < cs.B; ++b)
      for (std::int64_t kh = 0; kh < cs.K; ++kh)
        for (std::int64_t i = 0; i < cs.T; ++i) {
          const std::int64_t h = first_non_finite(new_row(*t, b, kh, i), t->dtype, cs.H);
          if (h >= 0)
            fail(std::string(name) + ": [" + std::to_string(b) + "," + std::to_string(kh) + "," + std::to_string(i) +
                 "," + std::to_string(h) + "] is not finite, expected finite values for an int8 cache (a NaN or "
                 "infinity has no int8 scale)");
        }
}

// A paged call with k_new writes rows of the pages its block tables name: each appended row must be
// held by its own sequence's key alone, or the append would overwrite a key that another sequence (or
// the same one at another position) reads in this call, or another sequence's append (one key lost,
// and a wrong answer with no error). Pages shared by several tables (a common prefix) stay allowed
// where nothing is appended into them. Work: the pages the call reads, a bit test each, and a search
// where the bit of the page's index mod 4096 is set (64 sequences of 32768 keys in pages of 16: 2.9M
// instructions, against 12.1M with a search for every page; callgrind).
void check_appends_are_private(const KvCache& c, const CacheShape& cs) {
  struct Append {
    std::int32_t page;
    std::int64_t b, i, r0, r1;  // rows [r0, r1) of the page, sequence b's page i
  };
  std::vector<Append> appends;
  for (std::int64_t b = 0; b < cs.B; ++b)
    for (std::int64_t i = c.seqlens[b] / cs.rows; i * cs.rows < cs.length(c, b); ++i)
      appends.push_back({c.block_table[b * c.max_pages + i], b, i, std::max<std::int64_t>(c.seqlens[b] - i * cs.rows, 0),
                         std::min(cs.length(c, b) - i * cs.rows, cs.rows)});
  const auto by_page = [](const Append& x, const Append& y) { return x.page < y.page; };
  std::sort(appends.begin(), appends.end(), by_page);
  std::array<std::uint64_t, 64> may_append{};  // bit page mod 4096: set for every appended page
  const auto bit = [](std::int32_t page) { return std::pair{(page >> 6) & 63, std::uint64_t{1} << (page & 63)}; };
  for (const Append& a : appends) may_append[bit(a.page).first] |= bit(a.page).second;
  const auto where = [](std::int64_t b, std::int64_t i) {
    return "block_table[" + std::to_string(b) + "][" + std::to_string(i) + "]";
  };
  for (std::int64_t b = 0; b < cs.B; ++b)
    for (std::int64_t i = 0; i * cs.rows < cs.length(c, b); ++i) {
      const std::int32_t page = c.block_table[b * c.max_pages + i];
      if ((may_append[bit(page).first] & bit(page).second) == 0) continue;
      const std::int64_t held = std::min(cs.length(c, b) - i * cs.rows, cs.rows);  // rows [0, held)
      const auto [first, last] = std::equal_range(appends.begin(), appends.end(), Append{page, 0, 0, 0, 0}, by_page);
      for (auto a = first; a != last; ++a)
        if ((a->b != b || a->i != i) && a->r0 < held)
          fail(where(a->b, a->i) + " = " + std::to_string(page) + ": sequence " + std::to_string(a->b) +
               " appends k_new/v_new into rows " + std::to_string(a->r0) + ".." + std::to_string(a->r1 - 1) +
               " of page " + std::to_string(page) + ", which " +
               (a->b == b ? "it also holds at " : "sequence " + std::to_string(b) + " also holds (") + where(b, i) +
               (a->b == b ? "" : ")") + ", rows 0.." + std::to_string(held - 1) +
               "; expected each appended row held by its own sequence alone (the pages of a shared prefix take "
               "no new keys)");
    }
}

// Everything but the per-sequence problems (make_problem checks those): throws before any write.
CacheShape check_cache(const TensorView& out, const TensorView* lse, const TensorView& q, const KvCache& c,
                       const Options& o) {
  if (q.rank != 5) fail("q: rank " + std::to_string(q.rank) + ", expected 5 [B,K,G,T,H]");
  if (o.cu_seqlens_q != nullptr || o.cu_seqlens_k != nullptr || o.num_sequences != 0)
    fail("cu_seqlens: packed sequences with a KV cache, expected none (the cache's seqlens give the lengths)");
  CacheShape cs;
  cs.paged = c.block_table != nullptr;
  cs.B = q.shape[0];
  cs.K = q.shape[1];
  cs.T = q.shape[3];
  cs.H = q.shape[4];
  const char* layout = cs.paged ? "[num_pages,K,page_size,H]" : "[B,K,S_max,H]";
  check_kv_view(c.k, "k_cache", cs, layout);
  check_kv_view(c.v, "v_cache", cs, layout);
  if (!std::equal(c.k.shape.begin(), c.k.shape.begin() + 4, c.v.shape.begin()))
    fail("v_cache: shape " + shape_string(c.v) + ", expected the shape of k_cache " + shape_string(c.k));
  cs.rows = c.k.shape[2];
  check_scales(c, cs);
  if (cs.paged) {
    if (cs.rows < kPageAlign || cs.rows % kPageAlign != 0)
      fail("k_cache: page_size " + std::to_string(cs.rows) + " (dimension 2 of " + shape_string(c.k) +
           "), expected a multiple of " + std::to_string(kPageAlign));
    if (c.max_pages < 0 || c.max_pages > std::int64_t{1} << 31)
      fail("max_pages: " + std::to_string(c.max_pages) + ", expected 0 to 2^31 (a row of block_table)");
    cs.capacity = c.max_pages * cs.rows;
  } else {
    if (c.k.shape[0] != cs.B)
      fail("k_cache: shape " + shape_string(c.k) + " has B = " + std::to_string(c.k.shape[0]) + ", expected " +
           std::to_string(cs.B) + " (from q)");
    cs.capacity = cs.rows;
  }
  if ((c.k_new == nullptr) != (c.v_new == nullptr))
    fail(std::string(c.k_new == nullptr ? "k_new" : "v_new") + ": null, expected both k_new and v_new or neither");
  if (c.k_new != nullptr)
    for (const auto& [t, name, like] : {std::tuple{c.k_new, "k_new", &c.k}, std::tuple{c.v_new, "v_new", &c.v}}) {
      if (t->rank != 4 || t->shape[0] != cs.B || t->shape[1] != cs.K || t->shape[2] != cs.T || t->shape[3] != cs.H)
        fail(std::string(name) + ": shape " + shape_string(*t) + ", expected [B,K,T,H] = [" + std::to_string(cs.B) +
             "," + std::to_string(cs.K) + "," + std::to_string(cs.T) + "," + std::to_string(cs.H) + "] (from q)");
      if (cs.int8 ? !is_float_dtype(t->dtype) : t->dtype != like->dtype)
        fail(std::string(name) + ": dtype " + dtype_name(t->dtype) + ", expected " +
             (cs.int8 ? join_names(kFloatDTypeNames) + " (quantized into the int8 cache)"
                      : "the cache's " + std::string(dtype_name(like->dtype))));
      if (cs.H > 1 && t->stride[3] != 1)
        fail(std::string(name) + ": innermost stride " + std::to_string(t->stride[3]) + ", expected 1");
      if (t->data == nullptr && t->numel() > 0) fail(std::string(name) + ": null data pointer");
    }
  if (cs.B > 0 && c.seqlens == nullptr) fail("seqlens: null, expected B = " + std::to_string(cs.B) + " int32 lengths");
  if (cs.paged && cs.B > 0 && c.max_pages > 0 && c.block_table == nullptr) fail("block_table: null");
  for (std::int64_t b = 0; b < cs.B; ++b) {
    const std::int64_t L = c.seqlens[b], n = cs.length(c, b);
    if (L < 0 || n > cs.capacity)
      fail("seqlens[" + std::to_string(b) + "] = " + std::to_string(L) +
           (c.k_new ? " (+ T = " + std::to_string(cs.T) + " new keys)" : std::string()) +
           ", expected a length in [0, " + std::to_string(cs.capacity) + "]: the cache holds " +
           std::to_string(cs.capacity) + " keys per sequence" +
           (cs.paged ? " (max_pages * page_size)" : " (S_max)"));
    if (cs.paged)
      for (std::int64_t i = 0; i < ceil_div(n, cs.rows); ++i) {
        const std::int32_t page = c.block_table[b * c.max_pages + i];
        if (page < 0 || page >= c.k.shape[0])
          fail("block_table[" + std::to_string(b) + "][" + std::to_string(i) + "] = " + std::to_string(page) +
               ", expected a page index in [0, " + std::to_string(c.k.shape[0]) + ") (sequence " + std::to_string(b) +
               " has " + std::to_string(n) + " keys)");
      }
  }
  // q, out and lse as attention() checks them, against a cache of no keys (the cache is checked above).
  TensorView k0 = c.k, v0 = c.v;
  k0.shape[0] = v0.shape[0] = cs.B;
  k0.shape[2] = v0.shape[2] = 0;
  Options checked = o;
  checked.algorithm = Algorithm::flash;
  make_problem(out, lse, q, k0, v0, checked, cs.int8);
  std::vector<std::pair<const TensorView*, const char*>> written = {{&out, "out"}};
  if (lse != nullptr) written.push_back({lse, "lse"});
  std::vector<std::pair<const TensorView*, const char*>> read = {{&c.k, "k_cache"}, {&c.v, "v_cache"}};
  if (cs.int8) read.insert(read.end(), {{c.k_scale, "k_scale"}, {c.v_scale, "v_scale"}});
  if (c.k_new != nullptr) read.insert(read.end(), {{c.k_new, "k_new"}, {c.v_new, "v_new"}});
  for (const auto& [w, wn] : written)
    for (const auto& [r, rn] : read)
      if (views_overlap(*w, wn, *r, rn)) fail(std::string(wn) + ": memory overlaps " + rn + ", expected a separate buffer");
  if (c.k_new != nullptr) {  // the append writes the cache (and scales): nothing it reads may live there
    std::vector<std::pair<const TensorView*, const char*>> appended = {{&c.k, "k_cache"}, {&c.v, "v_cache"}};
    if (cs.int8) appended.insert(appended.end(), {{c.k_scale, "k_scale"}, {c.v_scale, "v_scale"}});
    for (const auto& [r, rn] : {std::pair{&q, "q"}, {c.k_new, "k_new"}, {c.v_new, "v_new"}})
      for (const auto& [w, wn] : appended)
        if (views_overlap(*r, rn, *w, wn))
          fail(std::string(rn) + ": memory overlaps " + wn + ", which k_new/v_new are written into; expected a separate buffer");
    // Every appended row and scale must have its own address (a broadcast scale would have one append
    // overwrite another), and no two of the four views may be one array passed twice. (Views that
    // interleave in one buffer, k and v halves of a [.., 2, ..] array, stay allowed: byte ranges
    // would refuse them.)
    for (const auto& [w, wn] : appended) check_distinct_elements(*w, wn);
    for (std::size_t i = 0; i < appended.size(); ++i)
      for (std::size_t j = i + 1; j < appended.size(); ++j)
        if (appended[i].first->data == appended[j].first->data && appended[i].first->numel() > 0 &&
            appended[j].first->numel() > 0)
          fail(std::string(appended[j].second) + ": the same memory as " + appended[i].second +
               ", which k_new/v_new are also written into; expected separate buffers");
    if (cs.int8) check_new_keys_finite(c, cs);
    if (cs.paged && cs.T > 0) check_appends_are_private(c, cs);
  }
  return cs;
}

// k_new, v_new into keys seqlens[b] .. + T of each sequence (quantized, with their scales, into an
// int8 cache).
void append_new_keys(const KvCache& c, const CacheShape& cs) {
  for (const auto& [src, dst, scale] :
       {std::tuple{c.k_new, &c.k, c.k_scale}, std::tuple{c.v_new, &c.v, c.v_scale}})
    for (std::int64_t b = 0; b < cs.B; ++b)
      for (std::int64_t kh = 0; kh < cs.K; ++kh)
        for (std::int64_t t = 0; t < cs.T; ++t) {
          const std::int64_t s = c.seqlens[b] + t;
          const char* row = new_row(*src, b, kh, t);
          if (cs.int8)
            *scale_at(*scale, c, cs, b, kh, s) =
                quantize_row(reinterpret_cast<std::int8_t*>(cache_row(*dst, c, cs, b, kh, s)), row, src->dtype, cs.H);
          else
            std::memcpy(cache_row(*dst, c, cs, b, kh, s), row, static_cast<std::size_t>(cs.H * esize(*src)));
        }
}

// Sequence b's L keys of cache view t as a dense [1, K, L, H] copy of dense_dtype(cs, t): the rows
// as they are, or for an int8 cache (scale: its k_scale or v_scale) float32 values, each the fp32
// product of the int8 value and its key's scale (what the decode kernels round to bf16).
DType dense_dtype(const CacheShape& cs, const TensorView& t) { return cs.int8 ? DType::f32 : t.dtype; }
std::vector<std::byte> dense_sequence(const TensorView& t, const TensorView* scale, const KvCache& c,
                                      const CacheShape& cs, std::int64_t b, std::int64_t L) {
  const std::int64_t row_bytes = cs.H * static_cast<std::int64_t>(dtype_size(dense_dtype(cs, t)));
  std::vector<std::byte> dense(static_cast<std::size_t>(cs.K * L * row_bytes));
  for (std::int64_t kh = 0; kh < cs.K; ++kh)
    for (std::int64_t s = 0; s < L; ++s) {
      std::byte* d = dense.data() + (kh * L + s) * row_bytes;
      const char* row = cache_row(t, c, cs, b, kh, s);
      if (!cs.int8) {
        std::memcpy(d, row, static_cast<std::size_t>(row_bytes));
        continue;
      }
      const float x = *scale_at(*scale, c, cs, b, kh, s);
      auto* df = reinterpret_cast<float*>(d);  // operator new's alignment suits float
      for (std::int64_t h = 0; h < cs.H; ++h) df[h] = static_cast<float>(reinterpret_cast<const std::int8_t*>(row)[h]) * x;
    }
  return dense;
}

// The decode kernels' share of a call: each sequence's problem and pages, run in one parallel region.
struct DecodeBatch {
  std::vector<Problem> problems;
  std::vector<KvPages> pages;
  std::vector<bool> paged;
};

// Problem p reads the int8 cache's scales: key s of kv head kh at scale[entry * stride[0] + kh *
// stride[1] + s * stride[2]], entry = batch entry b (dense; p's own batch is that one entry) or the page.
void set_scales(Problem& p, const KvCache& c, const CacheShape& cs, std::int64_t b) {
  for (const auto& [t, base, stride] : {std::tuple{c.k_scale, &p.k_scale, p.k_scale_stride},
                                        std::tuple{c.v_scale, &p.v_scale, p.v_scale_stride}}) {
    *base = static_cast<const float*>(t->data) + (cs.paged ? 0 : b * t->stride[0]);
    for (int d = 0; d < 3; ++d) stride[d] = t->stride[static_cast<std::size_t>(d)];
  }
}

// Sequence b: appended to `decode` when the decode kernels take it, else run here by fast flash's own
// path on the dense rows in place, or on a dense copy: a paged sequence gathered, an int8 one
// dequantized to float32 (the values the decode kernels compute).
void plan_or_run_sequence(const TensorView& out, const TensorView* lse, const TensorView& q, const KvCache& c,
                          const CacheShape& cs, const Options& options, std::int64_t b, DecodeBatch& decode) {
  const std::int64_t L = cs.length(c, b);
  Options o = options;
  o.algorithm = Algorithm::flash;
  o.causal_offset = options.causal_offset.value_or(L - cs.T);
  const TensorView out_b = batch_entry(out, b), q_b = batch_entry(q, b);
  TensorView lse_b;
  if (lse != nullptr) lse_b = batch_entry(*lse, b);
  const TensorView* lse_p = lse != nullptr ? &lse_b : nullptr;
  const Isa isa = active_isa();
  const FlashKernels& kern = decode_kernels_for(isa, o.precision);
  if (!cs.paged || L == 0) {  // the cache rows in place
    TensorView k = c.k, v = c.v;
    if (!cs.paged) k = batch_entry(c.k, b), v = batch_entry(c.v, b);
    k.shape[0] = v.shape[0] = 1;
    k.shape[2] = v.shape[2] = L;
    Problem p = make_problem(out_b, lse_p, q_b, k, v, o, cs.int8);
    if (flash_decode_row_groups_apply(p, kern)) {
      if (cs.int8) set_scales(p, c, cs, b);
      decode.problems.push_back(std::move(p));
      decode.pages.push_back({});
      decode.paged.push_back(false);
      return;
    }
    if (!cs.int8) return flash_attention(p, isa);
  } else {
    const std::int32_t* table = c.block_table + b * c.max_pages;
    const TensorView k_page = batch_entry(c.k, table[0]), v_page = batch_entry(c.v, table[0]);
    Problem p = make_problem(out_b, lse_p, q_b, k_page, v_page, o, cs.int8);  // validated on its first page
    if (flash_decode_row_groups_apply(p, kern)) {
      p.S = L;
      p.k = c.k.data;
      p.v = c.v.data;
      if (cs.int8) set_scales(p, c, cs, b);
      decode.problems.push_back(std::move(p));
      decode.pages.push_back({table, cs.rows, c.k.stride[0], c.v.stride[0]});
      decode.paged.push_back(true);
      return;
    }
  }
  const std::vector<std::byte> k_dense = dense_sequence(c.k, c.k_scale, c, cs, b, L);
  const std::vector<std::byte> v_dense = dense_sequence(c.v, c.v_scale, c, cs, b, L);
  const DType dtype = dense_dtype(cs, c.k);
  const TensorView k = contiguous_view(k_dense.data(), dtype, {1, cs.K, L, cs.H});
  const TensorView v = contiguous_view(v_dense.data(), dtype, {1, cs.K, L, cs.H});
  flash_attention(make_problem(out_b, lse_p, q_b, k, v, o), isa);
}

void run(const TensorView& out, const TensorView* lse, const TensorView& q, const KvCache& cache,
         const Options& options) {
  const CacheShape cs = check_cache(out, lse, q, cache, options);
  if (cache.k_new != nullptr) append_new_keys(cache, cs);
  if (cs.B * cs.K * q.shape[2] * cs.T == 0) return;  // nothing to write
  DecodeBatch decode;
  for (std::int64_t b = 0; b < cs.B; ++b) plan_or_run_sequence(out, lse, q, cache, cs, options, b, decode);
  if (decode.problems.empty()) return;
  std::vector<const Problem*> problems;
  std::vector<const KvPages*> pages;
  for (std::size_t i = 0; i < decode.problems.size(); ++i) {
    problems.push_back(&decode.problems[i]);
    pages.push_back(decode.paged[i] ? &decode.pages[i] : nullptr);
  }
  flash_attention_decode(problems, decode_kernels_for(active_isa(), options.precision), pages);
}

}  // namespace

const char* kvcache_int8_form() {
  return decode_kernels_for(active_isa(), Precision::bf16).int8_on_integers ? "integers" : "products";
}

const char* kvcache_int8_form(std::int64_t G, std::int64_t T, std::int64_t H) {
  if (G < 1 || T < 1 || H < 1)
    throw Error("kvcache_int8_form: G, T and H must be at least 1, got G = " + std::to_string(G) + ", T = " +
                std::to_string(T) + ", H = " + std::to_string(H));
  const FlashKernels& k = decode_kernels_for(active_isa(), Precision::bf16);
  // The decode kernels take the call, their Q.K rows up to H = 256, and the rows stay int8 (not
  // converted to their bf16 products once per block): the decode path's own rules on such a call.
  Problem p;
  p.B = p.K = 1, p.G = G, p.T = T, p.H = H;
  p.k_dtype = p.v_dtype = DType::i8;
  const bool on_int8 = flash_decode_row_groups_apply(p, k) && H <= 256 && !decode_converts_rows(p, k, DType::i8);
  return k.int8_on_integers && on_int8 ? "integers" : "products";
}

void attention_with_kvcache(const TensorView& out, const TensorView& q, const KvCache& cache, const Options& options) {
  run(out, nullptr, q, cache, options);
}

void attention_with_kvcache(const TensorView& out, const TensorView& lse, const TensorView& q, const KvCache& cache,
                            const Options& options) {
  run(out, &lse, q, cache, options);
}

}  // namespace flashgqa
