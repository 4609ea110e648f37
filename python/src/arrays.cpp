// Array arguments of flashgqa._flashgqa (see arrays.hpp): the DLPack dtype mapping, the import of
// one array without copying, and q's layout (split_heads of a 4-D q, the packed layout viewed as
// one batch).
#include "arrays.hpp"

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>

namespace flashgqa::py {

namespace {

constexpr int kDLCPU = 1;       // DLPack device types the CPU can read directly
constexpr int kDLCUDAHost = 3;  // (pinned host memory)

std::string dtype_string(nb::dlpack::dtype dt) {
  using code = nb::dlpack::dtype_code;
  static constexpr std::pair<code, const char*> kKinds[] = {
      {code::Int, "int"},       {code::UInt, "uint"},       {code::Float, "float"},
      {code::Bfloat, "bfloat"}, {code::Complex, "complex"}, {code::Bool, "bool"}};
  const char* kind = "unknown";
  for (const auto& [c, n] : kKinds)
    if (static_cast<code>(dt.code) == c) kind = n;
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
    // int8: a quantized KV cache (the library refuses it anywhere else, naming the argument).
    if (dt.code == static_cast<uint8_t>(code::Int) && dt.bits == 8) return flashgqa::DType::i8;
  }
  throw nb::type_error((std::string(name) + ": dtype " + dtype_string(dt) + ", expected " +
                        flashgqa::join_names(flashgqa::kFloatDTypeNames))
                           .c_str());
}

// flashgqa::split_heads of a 4-D q, out or lse by k's K; the library's message says what was
// wrong, this adds where K came from.
flashgqa::TensorView split_by_k(const flashgqa::TensorView& t, int64_t K, const char* name) {
  try {
    return flashgqa::split_heads(t, K, name);
  } catch (const flashgqa::Error& e) {
    throw flashgqa::Error(std::string(e.what()) + " (K from k)");
  }
}

// FlashAttention's packed layout viewed as one batch: [total, heads, H] (q-like, k-like) or
// [total, heads] (lse) as [1, heads, total, H] or [1, heads, total], without moving data.
flashgqa::TensorView packed_as_batch(const flashgqa::TensorView& t) {
  flashgqa::TensorView v = t;
  v.rank = t.rank + 1;
  v.shape = {1, t.shape[1], t.shape[0], t.rank == 3 ? t.shape[2] : 0, 0};
  v.stride = {0, t.stride[1], t.stride[0], t.rank == 3 ? t.stride[2] : 0, 0};
  return v;
}

}  // namespace

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

template <typename Array>
flashgqa::TensorView plain_view(const Array& a, const char* name) {
  flashgqa::TensorView t;
  const size_t rank = a.ndim();
  if (rank > static_cast<size_t>(flashgqa::TensorView::kMaxRank))
    throw nb::value_error((std::string(name) + ": rank " + std::to_string(rank) +
                           ", expected at most " +
                           std::to_string(flashgqa::TensorView::kMaxRank) + " dimensions")
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

flashgqa::TensorView QLayout::view(const flashgqa::TensorView& plain, const char* name) const {
  if (packed) {
    if (plain.rank != 3 && plain.rank != 2)
      throw nb::value_error((std::string(name) + ": rank " + std::to_string(plain.rank) +
                             ", expected the packed layout of q: [total, Hq, H] (lse [total, Hq])")
                                .c_str());
    return split_by_k(packed_as_batch(plain), K, name);
  }
  return sdpa ? split_by_k(plain, K, name) : plain;
}

flashgqa::TensorView QLayout::kv_view(const flashgqa::TensorView& plain, const char* name) const {
  if (!packed) return plain;
  if (plain.rank != 3)
    throw nb::value_error((std::string(name) + ": rank " + std::to_string(plain.rank) +
                           ", expected 3 [total, K, H] (the packed layout of q)")
                              .c_str());
  return packed_as_batch(plain);
}

QLayout q_layout(const flashgqa::TensorView& q, const flashgqa::TensorView& k) {
  if (q.rank < 3 || q.rank > 5)
    throw nb::value_error(("q: rank " + std::to_string(q.rank) +
                           ", expected 5 [B,K,G,T,H], 4 [B,Hq,T,H] or 3 [total,Hq,H] (packed)")
                              .c_str());
  QLayout layout;
  layout.sdpa = q.rank == 4;
  layout.packed = q.rank == 3;
  const int k_rank = layout.packed ? 3 : 4;
  if (q.rank != 5 && k.rank != k_rank)  // (for a 5-D q the library reports it)
    throw nb::value_error(("k: rank " + std::to_string(k.rank) + ", expected " +
                           (layout.packed ? "3 [total,K,H] (the packed layout of q)"
                                          : "4 [B,K,S,H] (its K splits the heads of the 4-D q)"))
                              .c_str());
  layout.K = layout.sdpa ? k.shape[1] : layout.packed ? k.shape[1] : 0;
  return layout;
}

template <typename Array>
Operand<Array> import_operand(nb::handle obj, const char* name, const QLayout* layout) {
  Operand<Array> o;
  o.array = import_array<Array>(obj, name);
  const flashgqa::TensorView plain = plain_view(o.array, name);
  o.view = layout != nullptr ? layout->view(plain, name) : plain;
  return o;
}

MaybeWritable import_maybe_writable(nb::handle obj, const char* name, bool writable) {
  MaybeWritable m;
  if (writable) {
    m.written = import_operand<OutArray>(obj, name);
    m.view = m.written.view;
  } else {
    m.read = import_operand<InArray>(obj, name);
    m.view = m.read.view;
  }
  return m;
}

Int32Matrix import_int32(nb::handle h, const char* name, size_t ndim, int64_t B, const char* what) {
  Int32Matrix a;
  if (!nb::try_cast(h, a, /*convert=*/false) || a.ndim() != ndim)
    throw nb::type_error((std::string(name) + ": expected a " + std::to_string(ndim) +
                          "-D contiguous int32 CPU array").c_str());
  if (a.shape(0) != static_cast<size_t>(B))
    throw nb::value_error((std::string(name) + ": " + std::to_string(a.shape(0)) + " " + what + ", expected B = " +
                           std::to_string(B) + " (from q)").c_str());
  return a;
}

// The two array kinds the entry points use.
template InArray import_array<InArray>(nb::handle, const char*);
template OutArray import_array<OutArray>(nb::handle, const char*);
template flashgqa::TensorView plain_view<InArray>(const InArray&, const char*);
template flashgqa::TensorView plain_view<OutArray>(const OutArray&, const char*);
template Operand<InArray> import_operand<InArray>(nb::handle, const char*, const QLayout*);
template Operand<OutArray> import_operand<OutArray>(nb::handle, const char*, const QLayout*);

}  // namespace flashgqa::py
