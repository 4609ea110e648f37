// The nanobind module `flashgqa._flashgqa_jax`: flashgqa's attention and its backward as XLA FFI
// handlers for JAX on the CPU (python/flashgqa/jax.py registers them with jax.ffi and calls them
// through jax.ffi.ffi_call, so they run inside jax.jit with no host callback and no copy).
//
// Buffers arrive dense and row-major (XLA's default layouts), so each gets contiguous strides here.
// `layout_rank` is q's rank as the user wrote it: 5 ([B,K,G,T,H]) or 4 (SDPA's [B,Hq,T,H], split by
// k's K through flashgqa::split_heads); a buffer of higher rank carries leading batch axes (jax.vmap
// with vmap_method="broadcast_all"), folded into B, which is free for dense buffers. Every other check
// is the library's: flashgqa::Error comes back as an FFI error with its message (XlaRuntimeError).
// Attention sinks travel as a float32 operand, empty for none (and their gradient as a result of the
// same size); a call with sinks is vmapped sequentially, as sinks are per head, not per batch.
#include <nanobind/nanobind.h>

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <utility>

#include "flashgqa/flashgqa.hpp"
#include "xla/ffi/api/ffi.h"

namespace nb = nanobind;
namespace ffi = xla::ffi;

namespace {

flashgqa::DType to_dtype(ffi::DataType t, const char* name) {
  switch (t) {
    case ffi::DataType::F32:
      return flashgqa::DType::f32;
    case ffi::DataType::BF16:
      return flashgqa::DType::bf16;
    case ffi::DataType::F16:
      return flashgqa::DType::f16;
    default:
      throw flashgqa::Error(std::string(name) + ": XLA dtype code " + std::to_string(static_cast<int>(t)) +
                            ", expected " + flashgqa::join_names(flashgqa::kFloatDTypeNames));
  }
}

// A dense row-major buffer of rank `rank` + extra leading axes, as a view of rank `rank` whose first
// axis holds the leading ones too.
flashgqa::TensorView dense_view(const ffi::AnyBuffer& b, int rank, const char* name) {
  const auto dims = b.dimensions();
  const int extra = static_cast<int>(dims.size()) - rank;
  if (extra < 0 || rank > flashgqa::TensorView::kMaxRank)
    throw flashgqa::Error(std::string(name) + ": rank " + std::to_string(dims.size()) + ", expected at least " +
                          std::to_string(rank));
  flashgqa::TensorView t;
  t.data = b.untyped_data();
  t.dtype = to_dtype(b.element_type(), name);
  t.rank = rank;
  std::int64_t lead = 1;
  for (int d = 0; d <= extra; ++d) lead *= dims[static_cast<std::size_t>(d)];
  t.shape[0] = lead;
  for (int d = 1; d < rank; ++d) t.shape[static_cast<std::size_t>(d)] = dims[static_cast<std::size_t>(extra + d)];
  std::int64_t stride = 1;
  for (int d = rank; d-- > 0;) {
    t.stride[static_cast<std::size_t>(d)] = stride;
    stride *= t.shape[static_cast<std::size_t>(d)];
  }
  return t;
}

// The arrays shaped like q (q, out, dout, dq: `rank` = layout_rank; lse: layout_rank - 1) as the
// library's 5-D (4-D for lse) views.
flashgqa::TensorView q_like(const ffi::AnyBuffer& b, std::int64_t layout_rank, bool lse, std::int64_t K,
                            const char* name) {
  const int rank = static_cast<int>(layout_rank) - (lse ? 1 : 0);
  const flashgqa::TensorView t = dense_view(b, rank, name);
  return layout_rank == 4 ? flashgqa::split_heads(t, K, name) : t;
}

struct Attrs {
  bool causal;
  bool has_causal_offset;
  std::int64_t causal_offset;
  std::int64_t window_left, window_right;
  bool has_scale;
  double scale;
  std::string_view precision;
  std::int64_t threads;
  std::int64_t layout_rank;
  double softcap;
};

flashgqa::Options options_of(const Attrs& a) {
  flashgqa::Options o;
  o.causal = a.causal;
  if (a.has_causal_offset) o.causal_offset = a.causal_offset;
  o.window_left = a.window_left;
  o.window_right = a.window_right;
  if (a.has_scale) o.scale = a.scale;
  o.precision = flashgqa::parse_precision(std::string(a.precision), "precision");
  o.threads = static_cast<int>(a.threads);
  o.softcap = a.softcap;
  return o;
}

// Runs `body`, turning the library's exceptions into FFI errors.
template <typename Body>
ffi::Error guarded(Body body) {
  try {
    body();
    return ffi::Error::Success();
  } catch (const flashgqa::Error& e) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, std::string("flashgqa: ") + e.what());
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("flashgqa: ") + e.what());
  }
}

// The sinks operand: empty for none, else exactly the K*G float32 logits of Options::sinks (the library
// takes a pointer, so their count is checked here). Returns the pointer, or null for none.
const float* sinks_of(ffi::Buffer<ffi::F32>& sinks, const flashgqa::TensorView& q) {
  const std::int64_t n = static_cast<std::int64_t>(sinks.element_count());
  if (n == 0) return nullptr;
  if (n != q.shape[1] * q.shape[2])
    throw flashgqa::Error("sinks: " + std::to_string(n) + " values, expected K*G = " +
                          std::to_string(q.shape[1] * q.shape[2]) + " (one per query head)");
  return sinks.typed_data();
}

ffi::Error attention_impl(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::Buffer<ffi::F32> sinks,
                          ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse, Attrs a) {
  return guarded([&] {
    const flashgqa::TensorView kv = dense_view(k, 4, "k"), vv = dense_view(v, 4, "v");
    const std::int64_t K = kv.shape[1];
    const flashgqa::TensorView qv = q_like(q, a.layout_rank, false, K, "q");
    flashgqa::Options o = options_of(a);
    o.sinks = sinks_of(sinks, qv);
    flashgqa::attention(q_like(*out, a.layout_rank, false, K, "out"), q_like(*lse, a.layout_rank, true, K, "lse"),
                        qv, kv, vv, o);
  });
}

ffi::Error backward_impl(ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                         ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::Buffer<ffi::F32> sinks,
                         ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                         ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::Buffer<ffi::F32>> dsinks, Attrs a) {
  return guarded([&] {
    const flashgqa::TensorView kv = dense_view(k, 4, "k"), vv = dense_view(v, 4, "v");
    const std::int64_t K = kv.shape[1], r = a.layout_rank;
    const flashgqa::TensorView qv = q_like(q, r, false, K, "q");
    flashgqa::Options o = options_of(a);
    o.sinks = sinks_of(sinks, qv);
    const flashgqa::TensorView dqv = q_like(*dq, r, false, K, "dq"), dkv = dense_view(*dk, 4, "dk"),
                               dvv = dense_view(*dv, 4, "dv"), doutv = q_like(dout, r, false, K, "dout"),
                               outv = q_like(out, r, false, K, "out"), lsev = q_like(lse, r, true, K, "lse");
    if (o.sinks != nullptr) {
      if (dsinks->element_count() != sinks.element_count())
        throw flashgqa::Error("dsinks: " + std::to_string(dsinks->element_count()) + " values, expected " +
                              std::to_string(sinks.element_count()) + " (one per query head, as sinks)");
      flashgqa::attention_backward(dqv, dkv, dvv, dsinks->typed_data(), doutv, qv, kv, vv, outv, lsev, o);
    }
    else
      flashgqa::attention_backward(dqv, dkv, dvv, doutv, qv, kv, vv, outv, lsev, o);
  });
}

// The attributes, by name, as python/flashgqa/jax.py passes them (numpy scalars of these types).
template <typename Binding>
auto with_attrs(Binding b) {
  return std::move(b).template Attr<bool>("causal")
      .template Attr<bool>("has_causal_offset")
      .template Attr<std::int64_t>("causal_offset")
      .template Attr<std::int64_t>("window_left")
      .template Attr<std::int64_t>("window_right")
      .template Attr<bool>("has_scale")
      .template Attr<double>("scale")
      .template Attr<std::string_view>("precision")
      .template Attr<std::int64_t>("threads")
      .template Attr<std::int64_t>("layout_rank")
      .template Attr<double>("softcap");
}

ffi::Error attention_entry(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::Buffer<ffi::F32> sinks,
                           ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse, bool causal, bool has_causal_offset,
                           std::int64_t causal_offset, std::int64_t window_left, std::int64_t window_right,
                           bool has_scale, double scale, std::string_view precision, std::int64_t threads,
                           std::int64_t layout_rank, double softcap) {
  return attention_impl(q, k, v, sinks, out, lse,
                        {causal, has_causal_offset, causal_offset, window_left, window_right, has_scale, scale,
                         precision, threads, layout_rank, softcap});
}

ffi::Error backward_entry(ffi::AnyBuffer dout, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                          ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::Buffer<ffi::F32> sinks,
                          ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                          ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::Buffer<ffi::F32>> dsinks, bool causal,
                          bool has_causal_offset, std::int64_t causal_offset, std::int64_t window_left,
                          std::int64_t window_right, bool has_scale, double scale, std::string_view precision,
                          std::int64_t threads, std::int64_t layout_rank, double softcap) {
  return backward_impl(dout, q, k, v, out, lse, sinks, dq, dk, dv, dsinks,
                       {causal, has_causal_offset, causal_offset, window_left, window_right, has_scale, scale,
                        precision, threads, layout_rank, softcap});
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(flashgqa_attention_ffi, attention_entry,
                              with_attrs(ffi::Ffi::Bind()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::Buffer<ffi::F32>>()
                                             .Ret<ffi::AnyBuffer>()
                                             .Ret<ffi::AnyBuffer>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(flashgqa_attention_backward_ffi, backward_entry,
                              with_attrs(ffi::Ffi::Bind()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::Buffer<ffi::F32>>()
                                             .Ret<ffi::AnyBuffer>()
                                             .Ret<ffi::AnyBuffer>()
                                             .Ret<ffi::AnyBuffer>()
                                             .Ret<ffi::Buffer<ffi::F32>>()));

NB_MODULE(_flashgqa_jax, m) {
  m.doc() = "flashgqa's XLA FFI handlers; use flashgqa.jax instead.";
  m.def("handlers", [] {
    nb::dict d;
    d["flashgqa_attention"] = nb::capsule(reinterpret_cast<void*>(&flashgqa_attention_ffi));
    d["flashgqa_attention_backward"] = nb::capsule(reinterpret_cast<void*>(&flashgqa_attention_backward_ffi));
    return d;
  });
}
