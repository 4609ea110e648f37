// Array arguments of flashgqa._flashgqa: DLPack / buffer-protocol arrays imported as the library's
// TensorViews without copying, and the layout of q (5-D, SDPA's 4-D, FlashAttention's packed 3-D)
// that every array shaped like q shares. Separate from the entry points (flashgqa_ext.cpp) so that
// each entry point reads as "import, build options, call".
//
// What is checked here is only what the library cannot see: Python types, devices, the dtype
// mapping (float32, float16, bfloat16, uint16 read as raw bfloat16 bits, int8 for quantized caches),
// ranks above TensorView::kMaxRank, and the rank of q, which picks the layout. Shapes and strides
// are the library's to check.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>

#include "flashgqa/flashgqa.hpp"

namespace flashgqa::py {

namespace nb = nanobind;

using InArray = nb::ndarray<nb::ro>;  // any framework, device, dtype, rank; read-only access
using OutArray = nb::ndarray<>;       // the same, writable

// Imports one array argument without copying; TypeError when it is not an array at all, ValueError
// when it is not on the CPU. Defined for InArray and OutArray.
template <typename Array>
Array import_array(nb::handle obj, const char* name);

// The view of `a` as given (rank 0..5: a TensorView holds no more), in elements. Defined for
// InArray and OutArray.
template <typename Array>
flashgqa::TensorView plain_view(const Array& a, const char* name);

// One array argument, imported, and the library's view of it. The array keeps the producer's
// buffer alive until the call returns.
template <typename Array>
struct Operand {
  Array array;
  flashgqa::TensorView view;
};

// q's layout, which every array shaped like q (out, lse, dout, dq) shares: a 5-D q goes to the
// library as it is, a 4-D q (SDPA's) is split by k's K first, a 3-D q (FlashAttention's packed
// [total, Hq, H], with k, v [total, K, H]) is viewed as [1, Hq, total, H] and then split.
struct QLayout {
  bool sdpa = false, packed = false;
  int64_t K = 0;

  flashgqa::TensorView view(const flashgqa::TensorView& plain, const char* name) const;
  // k, v, dk, dv: as given, or [total, K, H] viewed as [1, K, total, H].
  flashgqa::TensorView kv_view(const flashgqa::TensorView& plain, const char* name) const;
};

// The rank of q picks the layout; every other check is the library's.
QLayout q_layout(const flashgqa::TensorView& q, const flashgqa::TensorView& k);

// Imports one argument; with a layout, as an array shaped like q. Defined for InArray and OutArray.
template <typename Array>
Operand<Array> import_operand(nb::handle obj, const char* name, const QLayout* layout = nullptr);

// An argument that is written when `writable` (a KV cache appended to, its scales) and only read
// otherwise; `view` is its view either way.
struct MaybeWritable {
  Operand<InArray> read;
  Operand<OutArray> written;
  flashgqa::TensorView view;
};
MaybeWritable import_maybe_writable(nb::handle obj, const char* name, bool writable);

// cache_seqlens [B] or block_table [B, max_pages]: a contiguous int32 array of `ndim` dimensions,
// B first (`what` names its rows in the message).
using Int32Matrix = nb::ndarray<const int32_t, nb::c_contig, nb::device::cpu>;
Int32Matrix import_int32(nb::handle h, const char* name, size_t ndim, int64_t B, const char* what);

}  // namespace flashgqa::py
