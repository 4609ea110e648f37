// The nanobind module `flashgqa._flashgqa`: turns DLPack / buffer-protocol arrays into flashgqa
// TensorViews without copying and calls the library with the GIL released. This file holds the
// entry points and the module definition; the pieces they use live beside it:
//   - arrays.hpp: importing array arguments as views, the dtype mapping and q's layout;
//   - options.hpp: the Python option values as flashgqa::Options;
//   - interrupt.hpp: Ctrl-C during a call (run_interruptible).
//
// Contract with the pure-Python front (python/flashgqa/__init__.py), which picks the output kind
// and allocates the result:
//   - every array argument is a CPU array with DLPack or the buffer protocol; nothing is
//     converted or copied here (nanobind gets no dtype, order or device constraint, so it never
//     converts);
//   - dtypes: float32, float16, bfloat16, and uint16, which this module reads as raw bfloat16
//     bits (numpy's DLPack export does not know ml_dtypes.bfloat16: the front passes a uint16
//     view);
//   - q and out are [B,K,G,T,H], SDPA's [B,Hq,T,H] with Hq = K*G (K taken from k), or
//     FlashAttention's packed [total,Hq,H]; lse is [B,K,G,T], [B,Hq,T] or [total,Hq] to match; k, v
//     are [B,K,S,H] ([total,K,H] with a packed q). cu_seqlens_q/k arrive as contiguous int32. The backward's dout and dq are shaped
//     like q, dk and dv like k. A 4-D q (and everything shaped like it) goes through the library's
//     split_heads, so any strided 4-D view maps to a 5-D view without a copy;
//   - the options arrive as the user gave them (None for defaults): options.hpp converts them.
// Shapes, ranks, strides and option values are checked by the library alone: flashgqa::Error
// becomes ValueError with the library's message. What is checked here is only what the library
// cannot see (see arrays.hpp and options.hpp).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <exception>

#include "arrays.hpp"
#include "flashgqa/flashgqa.hpp"
#include "interrupt.hpp"
#include "options.hpp"

namespace nb = nanobind;

namespace flashgqa::py {
namespace {

// q, k, v of one call and q's layout.
struct Inputs {
  Operand<InArray> q, k, v;
  QLayout layout;
};

Inputs import_inputs(nb::handle q, nb::handle k, nb::handle v) {
  Inputs in;
  in.q = import_operand<InArray>(q, "q");
  in.k = import_operand<InArray>(k, "k");
  in.v = import_operand<InArray>(v, "v");
  in.layout = q_layout(in.q.view, in.k.view);
  in.q.view = in.layout.view(in.q.view, "q");
  in.k.view = in.layout.kv_view(in.k.view, "k");
  in.v.view = in.layout.kv_view(in.v.view, "v");
  return in;
}

// The arrays of one forward call (attention, linear_attention); out and lse are written.
struct Call {
  Inputs in;
  Operand<OutArray> out, lse;
  bool has_out = false, has_lse = false;
};

Call make_call(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse) {
  Call c;
  c.in = import_inputs(q, k, v);
  if (!out.is_none()) {
    c.has_out = true;
    c.out = import_operand<OutArray>(out, "out", &c.in.layout);
  }
  if (!lse.is_none()) {
    c.has_lse = true;
    c.lse = import_operand<OutArray>(lse, "lse", &c.in.layout);
  }
  return c;
}

// The arrays of one backward call: dout, out and lse (the forward's) are read like q, k and v;
// dq (shaped like q), dk and dv (like k) are written.
struct BackwardCall {
  Inputs in;
  Operand<InArray> dout, out, lse;
  Operand<OutArray> dq, dk, dv;
};

BackwardCall make_backward_call(nb::handle dout, nb::handle q, nb::handle k, nb::handle v,
                                nb::handle out, nb::handle lse, nb::handle dq, nb::handle dk,
                                nb::handle dv) {
  BackwardCall c;
  c.in = import_inputs(q, k, v);
  c.dout = import_operand<InArray>(dout, "dout", &c.in.layout);
  c.out = import_operand<InArray>(out, "out", &c.in.layout);
  c.lse = import_operand<InArray>(lse, "lse", &c.in.layout);
  c.dq = import_operand<OutArray>(dq, "dq", &c.in.layout);
  c.dk = import_operand<OutArray>(dk, "dk");
  c.dv = import_operand<OutArray>(dv, "dv");
  c.dk.view = c.in.layout.kv_view(c.dk.view, "dk");
  c.dv.view = c.in.layout.kv_view(c.dv.view, "dv");
  return c;
}

void attention(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
               bool causal, nb::handle causal_offset, nb::handle window, nb::handle cu_seqlens_q,
               nb::handle cu_seqlens_k, nb::handle scale, nb::handle precision, nb::handle algo,
               nb::handle block_q, nb::handle block_kv, nb::handle threads, nb::handle softcap,
               nb::handle sinks) {
  const Call c = make_call(q, k, v, out, lse);
  if (!c.has_out) throw nb::type_error("out: None, expected a writable CPU array");
  flashgqa::Options o = make_options(causal, causal_offset, window, scale, precision, algo, block_q,
                                     block_kv, threads, softcap);
  const Packing packing = import_packing(cu_seqlens_q, cu_seqlens_k);
  packing.apply(o);
  Operand<InArray> sinks_operand;
  o.sinks = sinks_option(sinks, "sinks", c.in.q.view, sinks_operand);
  run_interruptible(o, [&](const flashgqa::Options& opts) {
    if (c.has_lse)
      flashgqa::attention(c.out.view, c.lse.view, c.in.q.view, c.in.k.view, c.in.v.view, opts);
    else
      flashgqa::attention(c.out.view, c.in.q.view, c.in.k.view, c.in.v.view, opts);
  });
}

// The KV-cache call (flashgqa::attention_with_kvcache): q and out (and lse) as attention's (5-D, or 4-D
// split by the cache's K), the caches [B,K,S_max,H] or paged [num_pages,K,page_size,H] as given and
// writable when k_new/v_new are appended into them; seqlens [B] and block_table [B, max_pages]
// contiguous int32 from the front.
void attention_with_kvcache(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle out, nb::handle lse,
                            nb::handle cache_seqlens, nb::handle block_table, nb::handle k_new, nb::handle v_new,
                            bool causal, nb::handle causal_offset, nb::handle window, nb::handle scale,
                            nb::handle precision, nb::handle block_kv, nb::handle threads, nb::handle softcap,
                            nb::handle sinks, nb::handle k_scale, nb::handle v_scale) {
  const bool append = !k_new.is_none() || !v_new.is_none();
  Operand<InArray> qo = import_operand<InArray>(q, "q");
  const MaybeWritable kc = import_maybe_writable(k_cache, "k_cache", append);
  const MaybeWritable vc = import_maybe_writable(v_cache, "v_cache", append);
  flashgqa::KvCache cache;
  cache.k = kc.view;
  cache.v = vc.view;
  const QLayout layout = q_layout(qo.view, cache.k);
  if (layout.packed) throw nb::value_error("q: rank 3 (packed), expected 5 [B,K,G,T,H] or 4 [B,Hq,T,H] with a KV cache");
  qo.view = layout.view(qo.view, "q");
  Operand<OutArray> oo = import_operand<OutArray>(out, "out", &layout), lo;
  if (!lse.is_none()) lo = import_operand<OutArray>(lse, "lse", &layout);
  const Int32Matrix seqlens = import_int32(cache_seqlens, "cache_seqlens", 1, qo.view.shape[0], "lengths");
  cache.seqlens = seqlens.data();
  Int32Matrix table;
  if (!block_table.is_none()) {
    table = import_int32(block_table, "block_table", 2, qo.view.shape[0], "rows");
    cache.block_table = table.data();
    cache.max_pages = static_cast<int64_t>(table.shape(1));
    if (cache.block_table == nullptr) {  // B = 0 or no pages: a table of nothing, still paged
      static const int32_t kNoPages = 0;
      cache.block_table = &kNoPages;
    }
  }
  Operand<InArray> kn, vn;
  if (append) {
    if (k_new.is_none() || v_new.is_none())
      throw nb::value_error("k_new, v_new: one given without the other, expected both (or neither)");
    kn = import_operand<InArray>(k_new, "k_new");
    vn = import_operand<InArray>(v_new, "v_new");
    cache.k_new = &kn.view;
    cache.v_new = &vn.view;
  }
  // An int8 cache's scales, written with it when k_new/v_new are appended.
  MaybeWritable ks, vs;
  if (!k_scale.is_none() || !v_scale.is_none()) {
    if (k_scale.is_none() || v_scale.is_none())
      throw nb::value_error("k_scale, v_scale: one given without the other, expected both (for an int8 cache) or neither");
    ks = import_maybe_writable(k_scale, "k_scale", append);
    vs = import_maybe_writable(v_scale, "v_scale", append);
    cache.k_scale = &ks.view;
    cache.v_scale = &vs.view;
  }
  flashgqa::Options o = make_options(causal, causal_offset, window, scale, precision, nb::none(), nb::none(),
                                     block_kv, threads, softcap);
  Operand<InArray> sinks_operand;
  o.sinks = sinks_option(sinks, "sinks", qo.view, sinks_operand);
  run_interruptible(o, [&](const flashgqa::Options& opts) {
    if (!lse.is_none())
      flashgqa::attention_with_kvcache(oo.view, lo.view, qo.view, cache, opts);
    else
      flashgqa::attention_with_kvcache(oo.view, qo.view, cache, opts);
  });
}

// flashgqa::quantize_kv: x (any float dtype) into x_int8 and scale, in place.
void quantize_kv(nb::handle x, nb::handle x_int8, nb::handle scale) {
  const InArray xa = import_array<InArray>(x, "x");
  const OutArray qa = import_array<OutArray>(x_int8, "x_int8"), sa = import_array<OutArray>(scale, "scale");
  const flashgqa::TensorView xv = plain_view(xa, "x"), qv = plain_view(qa, "x_int8"), sv = plain_view(sa, "scale");
  nb::gil_scoped_release release;
  flashgqa::quantize_kv(xv, qv, sv);
}

void linear_attention(nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal,
                      nb::handle causal_offset, nb::handle window, nb::handle scale, nb::handle precision,
                      nb::handle block_kv, nb::handle threads) {
  const Call c = make_call(q, k, v, out, nb::none());
  if (!c.has_out) throw nb::type_error("out: None, expected a writable CPU array");
  const flashgqa::Options o = make_options(causal, causal_offset, window, scale, precision, nb::none(),
                                           nb::none(), block_kv, threads);
  run_interruptible(o, [&](const flashgqa::Options& opts) {
    flashgqa::linear_attention(c.out.view, c.in.q.view, c.in.k.view, c.in.v.view, opts);
  });
}

void attention_backward(nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
                        nb::handle lse, nb::handle dq, nb::handle dk, nb::handle dv, bool causal,
                        nb::handle causal_offset, nb::handle window, nb::handle cu_seqlens_q,
                        nb::handle cu_seqlens_k, nb::handle scale, nb::handle precision,
                        nb::handle block_q, nb::handle block_kv, nb::handle threads,
                        nb::handle softcap, nb::handle sinks, nb::handle dsinks) {
  const BackwardCall c = make_backward_call(dout, q, k, v, out, lse, dq, dk, dv);
  flashgqa::Options o = make_options(causal, causal_offset, window, scale, precision, nb::none(),
                                     block_q, block_kv, threads, softcap);
  const Packing packing = import_packing(cu_seqlens_q, cu_seqlens_k);
  packing.apply(o);
  Operand<InArray> sinks_operand;
  Operand<OutArray> dsinks_operand;
  o.sinks = sinks_option(sinks, "sinks", c.in.q.view, sinks_operand);
  float* dsinks_data = sinks_option(dsinks, "dsinks", c.in.q.view, dsinks_operand);
  run_interruptible(o, [&](const flashgqa::Options& opts) {
    if (dsinks_data != nullptr)
      flashgqa::attention_backward(c.dq.view, c.dk.view, c.dv.view, dsinks_data, c.dout.view, c.in.q.view,
                                   c.in.k.view, c.in.v.view, c.out.view, c.lse.view, opts);
    else
      flashgqa::attention_backward(c.dq.view, c.dk.view, c.dv.view, c.dout.view, c.in.q.view,
                                   c.in.k.view, c.in.v.view, c.out.view, c.lse.view, opts);
  });
}

nb::dict describe(const flashgqa::TensorView& t) {
  nb::dict d;
  d["data"] = reinterpret_cast<std::uintptr_t>(t.data);
  d["dtype"] = flashgqa::dtype_name(t.dtype);
  nb::list shape, stride;
  for (int i = 0; i < t.rank; ++i) {
    shape.append(t.shape[static_cast<size_t>(i)]);
    stride.append(t.stride[static_cast<size_t>(i)]);
  }
  d["shape"] = nb::tuple(shape);
  d["strides"] = nb::tuple(stride);  // in elements
  return d;
}

// The views attention() would hand the library, for tests: {"q": {...}, "k": ..., "v": ...,
// "out"...}.
nb::dict views(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse) {
  const Call c = make_call(q, k, v, out, lse);
  nb::dict d;
  d["q"] = describe(c.in.q.view);
  d["k"] = describe(c.in.k.view);
  d["v"] = describe(c.in.v.view);
  if (c.has_out) d["out"] = describe(c.out.view);
  if (c.has_lse) d["lse"] = describe(c.lse.view);
  return d;
}

// The views attention_backward() would hand the library, for tests.
nb::dict backward_views(nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out,
                        nb::handle lse, nb::handle dq, nb::handle dk, nb::handle dv) {
  const BackwardCall c = make_backward_call(dout, q, k, v, out, lse, dq, dk, dv);
  nb::dict d;
  d["dout"] = describe(c.dout.view);
  d["q"] = describe(c.in.q.view);
  d["k"] = describe(c.in.k.view);
  d["v"] = describe(c.in.v.view);
  d["out"] = describe(c.out.view);
  d["lse"] = describe(c.lse.view);
  d["dq"] = describe(c.dq.view);
  d["dk"] = describe(c.dk.view);
  d["dv"] = describe(c.dv.view);
  return d;
}

}  // namespace
}  // namespace flashgqa::py

NB_MODULE(_flashgqa, m) {
  using namespace flashgqa::py;
  m.doc() = "flashgqa's C++ binding; use the functions of the flashgqa package instead.";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const flashgqa::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const flashgqa::Interrupted&) {
      PyErr_SetNone(PyExc_KeyboardInterrupt);
    }
  });

  // The library's dtype names, for the front's checks of framework dtypes.
  nb::list dtype_names;
  for (const auto& e : flashgqa::kFloatDTypeNames) dtype_names.append(e.name);
  m.attr("DTYPE_NAMES") = nb::tuple(dtype_names);

  // Every option may be None (the library's default); see make_options.
  m.def("attention", &attention, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse").none(), nb::kw_only(), nb::arg("causal"), nb::arg("causal_offset").none(),
        nb::arg("window").none(), nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_k").none(),
        nb::arg("scale").none(), nb::arg("precision").none(), nb::arg("algo").none(),
        nb::arg("block_q").none(), nb::arg("block_kv").none(), nb::arg("threads").none(),
        nb::arg("softcap").none() = nb::none(), nb::arg("sinks").none() = nb::none(),
        "Writes out (and lse, unless None) in place; q/out [B,K,G,T,H] or [B,Hq,T,H], k, v "
        "[B,K,S,H]; sinks None or K*G contiguous float32. uint16 arrays are read as bfloat16 bits.");
  m.def("attention_with_kvcache", &attention_with_kvcache, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"),
        nb::arg("out"), nb::arg("lse").none(), nb::kw_only(), nb::arg("cache_seqlens"),
        nb::arg("block_table").none(), nb::arg("k_new").none(), nb::arg("v_new").none(), nb::arg("causal"),
        nb::arg("causal_offset").none(), nb::arg("window").none(), nb::arg("scale").none(),
        nb::arg("precision").none(), nb::arg("block_kv").none(), nb::arg("threads").none(),
        nb::arg("softcap").none(), nb::arg("sinks").none(), nb::arg("k_scale").none() = nb::none(),
        nb::arg("v_scale").none() = nb::none(),
        "Writes out (and lse) in place from q and a KV cache (dense [B,K,S_max,H] or paged "
        "[num_pages,K,page_size,H] with block_table; int8 with k_scale/v_scale), first appending "
        "k_new/v_new into the cache.");
  m.def("quantize_kv", &quantize_kv, nb::arg("x"), nb::arg("x_int8"), nb::arg("scale"),
        "Writes x's rows (last axis) quantized to int8 into x_int8 and their float32 scales into scale.");
  m.def("linear_attention", &linear_attention, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out"), nb::kw_only(), nb::arg("causal"), nb::arg("causal_offset").none(),
        nb::arg("window").none(), nb::arg("scale").none(), nb::arg("precision").none(), nb::arg("block_kv").none(),
        nb::arg("threads").none(),
        "Writes the seed's linear attention into out in place; shapes as attention.");
  m.def("attention_backward", &attention_backward, nb::arg("dout"), nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
        nb::kw_only(), nb::arg("causal"), nb::arg("causal_offset").none(), nb::arg("window").none(),
        nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_k").none(), nb::arg("scale").none(),
        nb::arg("precision").none(), nb::arg("block_q").none(), nb::arg("block_kv").none(),
        nb::arg("threads").none(), nb::arg("softcap").none() = nb::none(),
        nb::arg("sinks").none() = nb::none(), nb::arg("dsinks").none() = nb::none(),
        "Writes dq (shaped like q), dk and dv (like k) in place from dout and the forward's q, k, "
        "v, out and lse; dout, out, dq like q, lse [B,K,G,T] or [B,Hq,T]; sinks and dsinks (written, "
        "needs sinks) None or K*G contiguous float32. uint16 arrays are read as bfloat16 bits.");
  m.def("kvcache_int8_form", [] { return std::string(flashgqa::kvcache_int8_form()); },
        "How attention_with_kvcache computes with an int8 cache on the path in use: \"products\" or "
        "\"integers\" (see flashgqa.hpp).");
  m.def("kvcache_int8_form",
        [](std::int64_t G, std::int64_t T, std::int64_t H) { return std::string(flashgqa::kvcache_int8_form(G, T, H)); },
        nb::arg("G"), nb::arg("T"), nb::arg("H"),
        "The form a call of G query heads per kv head, T new tokens and head size H takes.");
  m.def("free_workspace_cache", [] { return static_cast<std::uint64_t>(flashgqa::free_workspace_cache()); },
        "Hands the workspace blocks kept across calls (up to 64 MiB) back to the system; returns their bytes.");
  m.def("_views", &views, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out").none() = nb::none(), nb::arg("lse").none() = nb::none(),
        "The views (data pointer, dtype, shape, strides in elements) attention() would pass to the "
        "library, without computing anything: evidence that nothing is copied.");
  m.def("_backward_views", &backward_views, nb::arg("dout"), nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
        "The views attention_backward() would pass to the library, without computing anything.");
}
