// The nanobind module `flashgqa._flashgqa`: turns DLPack / buffer-protocol arrays into flashgqa
// TensorViews without copying and calls the library with the GIL released.
//
// Contract with the pure-Python front (python/flashgqa/__init__.py), which picks the output kind
// and allocates the result:
//   - every array argument is a CPU array with DLPack or the buffer protocol; nothing is
//     converted or copied here (nanobind gets no dtype, order or device constraint, so it never
//     converts);
//   - dtypes: float32, float16, bfloat16, and uint16, which this module reads as raw bfloat16
//     bits (numpy's DLPack export does not know ml_dtypes.bfloat16: the front passes a uint16
//     view);
//   - q and out are [B,K,G,T,H] or SDPA's [B,Hq,T,H] with Hq = K*G (K taken from k); lse is
//     [B,K,G,T] or [B,Hq,T] to match; k, v are [B,K,S,H]. A head axis Hq of stride s splits into
//     (K, G) with strides (G*s, s), so any strided 4-D view maps to a 5-D view without a copy.
// Errors: flashgqa::Error and bad shapes -> ValueError; bad types and dtypes -> TypeError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>

#include "flashgqa/flashgqa.hpp"

namespace nb = nanobind;

namespace {

using InArray = nb::ndarray<nb::ro>;  // any framework, device, dtype, rank; read-only access
using OutArray = nb::ndarray<>;       // the same, writable

constexpr int kDLCPU = 1;       // DLPack device types the CPU can read directly
constexpr int kDLCUDAHost = 3;  // (pinned host memory)

std::string shape_string(const int64_t* shape, size_t rank) {
  std::ostringstream os;
  os << '[';
  for (size_t d = 0; d < rank; ++d) os << (d ? "," : "") << shape[d];
  os << ']';
  return os.str();
}

std::string dtype_string(nb::dlpack::dtype dt) {
  const char* kind = "unknown";
  switch (static_cast<nb::dlpack::dtype_code>(dt.code)) {
    case nb::dlpack::dtype_code::Int:
      kind = "int";
      break;
    case nb::dlpack::dtype_code::UInt:
      kind = "uint";
      break;
    case nb::dlpack::dtype_code::Float:
      kind = "float";
      break;
    case nb::dlpack::dtype_code::Bfloat:
      kind = "bfloat";
      break;
    case nb::dlpack::dtype_code::Complex:
      kind = "complex";
      break;
    case nb::dlpack::dtype_code::Bool:
      kind = "bool";
      break;
    default:
      break;
  }
  std::string s = std::string(kind) + std::to_string(dt.bits);
  if (dt.lanes != 1) s += "x" + std::to_string(dt.lanes);
  return s;
}

flashgqa::DType to_dtype(nb::dlpack::dtype dt, const char* name) {
  using code = nb::dlpack::dtype_code;
  if (dt.lanes == 1) {
    if (dt.code == static_cast<uint8_t>(code::Float) && dt.bits == 32) return flashgqa::DType::f32;
    if (dt.code == static_cast<uint8_t>(code::Float) && dt.bits == 16) return flashgqa::DType::f16;
    if (dt.code == static_cast<uint8_t>(code::Bfloat) && dt.bits == 16)
      return flashgqa::DType::bf16;
    if (dt.code == static_cast<uint8_t>(code::UInt) && dt.bits == 16) return flashgqa::DType::bf16;
  }
  throw nb::type_error((std::string(name) + ": dtype " + dtype_string(dt) +
                        ", expected float32, float16 or bfloat16")
                           .c_str());
}

// Imports one array argument without copying; TypeError when it is not an array at all.
template <typename Array>
Array import_array(nb::handle obj, const char* name) {
  Array a;
  if (!nb::try_cast(obj, a, /*convert=*/false)) {
    const std::string type = nb::type_name(obj.type()).c_str();
    throw nb::type_error((std::string(name) + ": got " + type +
                          (std::is_const_v<typename Array::Scalar>
                               ? ", expected a CPU array with DLPack or the buffer protocol"
                               : ", expected a writable CPU array with DLPack or the buffer "
                                 "protocol"))
                             .c_str());
  }
  if (a.device_type() != kDLCPU && a.device_type() != kDLCUDAHost)
    throw nb::value_error((std::string(name) + ": array on DLPack device type " +
                           std::to_string(a.device_type()) + ", expected a CPU array")
                              .c_str());
  return a;
}

// The view of `a` as given (rank 1..5), in elements.
template <typename Array>
flashgqa::TensorView plain_view(const Array& a, const char* name) {
  flashgqa::TensorView t;
  const size_t rank = a.ndim();
  if (rank < 1 || rank > static_cast<size_t>(flashgqa::TensorView::kMaxRank))
    throw nb::value_error(
        (std::string(name) + ": rank " + std::to_string(rank) + ", expected at most 5 dimensions")
            .c_str());
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.dtype = to_dtype(a.dtype(), name);
  t.rank = static_cast<int>(rank);
  for (size_t d = 0; d < rank; ++d) {
    t.shape[d] = static_cast<int64_t>(a.shape(d));
    t.stride[d] = a.stride(d);
  }
  if (a.size() == 0) {  // no element is read or written: producers report any strides (numpy: 0)
    int64_t stride = 1;
    for (size_t d = rank; d-- > 0;) {
      t.stride[d] = stride;
      stride *= std::max<int64_t>(t.shape[d], 1);
    }
  }
  return t;
}

// Splits axis 1 of `t` (a head axis of K*G heads) into (K, G): [B,Hq,...] -> [B,K,G,...].
flashgqa::TensorView split_heads(const flashgqa::TensorView& t, int64_t K, const char* name,
                                 const char* layout) {
  const int64_t Hq = t.shape[1];
  if (K < 1 || Hq % K != 0)
    throw nb::value_error((std::string(name) + ": shape " +
                           shape_string(t.shape.data(), static_cast<size_t>(t.rank)) + " " +
                           layout + " has Hq = " + std::to_string(Hq) +
                           " query heads, expected a multiple of K = " + std::to_string(K) +
                           " kv heads (from k)")
                              .c_str());
  flashgqa::TensorView s = t;
  s.rank = t.rank + 1;
  s.shape[0] = t.shape[0];
  s.stride[0] = t.stride[0];
  s.shape[1] = K;
  s.stride[1] = (Hq / K) * t.stride[1];
  s.shape[2] = Hq / K;
  s.stride[2] = t.stride[1];
  for (int d = 2; d < t.rank; ++d) {
    s.shape[static_cast<size_t>(d) + 1] = t.shape[static_cast<size_t>(d)];
    s.stride[static_cast<size_t>(d) + 1] = t.stride[static_cast<size_t>(d)];
  }
  return s;
}

// The arrays of one call, imported, and the library views built from them. The arrays keep the
// producers' buffers alive until the call returns.
struct Call {
  InArray q, k, v;
  OutArray out, lse;
  flashgqa::TensorView qv, kv, vv, outv, lsev;
  bool has_out = false, has_lse = false;
};

Call make_call(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse) {
  Call c;
  c.q = import_array<InArray>(q, "q");
  c.k = import_array<InArray>(k, "k");
  c.v = import_array<InArray>(v, "v");
  c.kv = plain_view(c.k, "k");
  c.vv = plain_view(c.v, "v");
  if (c.kv.rank != 4)
    throw nb::value_error(
        ("k: rank " + std::to_string(c.kv.rank) + ", expected 4 [B,K,S,H]").c_str());
  const int64_t K = c.kv.shape[1];
  const flashgqa::TensorView q_plain = plain_view(c.q, "q");
  const bool sdpa = q_plain.rank == 4;
  if (q_plain.rank != 4 && q_plain.rank != 5)
    throw nb::value_error(
        ("q: rank " + std::to_string(q_plain.rank) + ", expected 5 [B,K,G,T,H] or 4 [B,Hq,T,H]")
            .c_str());
  c.qv = sdpa ? split_heads(q_plain, K, "q", "[B,Hq,T,H]") : q_plain;
  if (!out.is_none()) {
    c.has_out = true;
    c.out = import_array<OutArray>(out, "out");
    const flashgqa::TensorView o = plain_view(c.out, "out");
    if (o.rank != q_plain.rank)
      throw nb::value_error(("out: rank " + std::to_string(o.rank) + ", expected " +
                             std::to_string(q_plain.rank) + " (the rank of q)")
                                .c_str());
    c.outv = sdpa ? split_heads(o, K, "out", "[B,Hq,T,H]") : o;
  }
  if (!lse.is_none()) {
    c.has_lse = true;
    c.lse = import_array<OutArray>(lse, "lse");
    const flashgqa::TensorView l = plain_view(c.lse, "lse");
    if (l.rank != q_plain.rank - 1)
      throw nb::value_error(("lse: rank " + std::to_string(l.rank) + ", expected " +
                             std::to_string(q_plain.rank - 1) + " (the rank of q less one)")
                                .c_str());
    c.lsev = sdpa ? split_heads(l, K, "lse", "[B,Hq,T]") : l;
  }
  return c;
}

flashgqa::Options make_options(bool causal, std::optional<int64_t> causal_offset,
                               std::optional<double> scale, const std::string& precision,
                               const std::string& algo, int64_t block_q, int64_t block_kv,
                               int threads) {
  flashgqa::Options o;
  o.algorithm = flashgqa::parse_algorithm(algo);
  o.precision = flashgqa::parse_precision(precision);
  o.scale = scale;
  o.causal = causal;
  o.causal_offset = causal_offset;
  o.block_q = block_q;
  o.block_kv = block_kv;
  o.threads = threads;
  return o;
}

void attention(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
               bool causal, std::optional<int64_t> causal_offset, std::optional<double> scale,
               const std::string& precision, const std::string& algo, int64_t block_q,
               int64_t block_kv, int threads) {
  const Call c = make_call(q, k, v, out, lse);
  if (!c.has_out) throw nb::type_error("out: None, expected a writable CPU array");
  const flashgqa::Options o =
      make_options(causal, causal_offset, scale, precision, algo, block_q, block_kv, threads);
  nb::gil_scoped_release release;
  if (c.has_lse)
    flashgqa::attention(c.outv, c.lsev, c.qv, c.kv, c.vv, o);
  else
    flashgqa::attention(c.outv, c.qv, c.kv, c.vv, o);
}

void linear_attention(nb::handle q, nb::handle k, nb::handle v, nb::handle out, bool causal,
                      std::optional<int64_t> causal_offset, std::optional<double> scale,
                      const std::string& precision, int64_t block_kv, int threads) {
  const Call c = make_call(q, k, v, out, nb::none());
  if (!c.has_out) throw nb::type_error("out: None, expected a writable CPU array");
  const flashgqa::Options o =
      make_options(causal, causal_offset, scale, precision, "flash", 0, block_kv, threads);
  nb::gil_scoped_release release;
  flashgqa::linear_attention(c.outv, c.qv, c.kv, c.vv, o);
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
  d["q"] = describe(c.qv);
  d["k"] = describe(c.kv);
  d["v"] = describe(c.vv);
  if (c.has_out) d["out"] = describe(c.outv);
  if (c.has_lse) d["lse"] = describe(c.lsev);
  return d;
}

}  // namespace

NB_MODULE(_flashgqa, m) {
  m.doc() = "flashgqa's C++ binding; use the functions of the flashgqa package instead.";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const flashgqa::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  m.def("attention", &attention, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse").none(), nb::kw_only(), nb::arg("causal"), nb::arg("causal_offset").none(),
        nb::arg("scale").none(), nb::arg("precision"), nb::arg("algo"), nb::arg("block_q"),
        nb::arg("block_kv"), nb::arg("threads"),
        "Writes out (and lse, unless None) in place; q/out [B,K,G,T,H] or [B,Hq,T,H], k, v "
        "[B,K,S,H]. uint16 arrays are read as bfloat16 bits.");
  m.def("linear_attention", &linear_attention, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out"), nb::kw_only(), nb::arg("causal"), nb::arg("causal_offset").none(),
        nb::arg("scale").none(), nb::arg("precision"), nb::arg("block_kv"), nb::arg("threads"),
        "Writes the seed's linear attention into out in place; shapes as attention.");
  m.def("_views", &views, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out").none() = nb::none(), nb::arg("lse").none() = nb::none(),
        "The views (data pointer, dtype, shape, strides in elements) attention() would pass to the "
        "library, without computing anything: evidence that nothing is copied.");
}
