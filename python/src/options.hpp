// Options of flashgqa._flashgqa: the Python values the user gave (None for the library's default)
// converted to flashgqa::Options, with TypeError for a wrong Python type and ValueError for an
// integer that does not fit the C++ type; the algorithm and precision names go to the library's
// parsers, and their values are the library's to check. Separate from the entry points
// (flashgqa_ext.cpp) so that each one builds its Options in one call.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>

#include "arrays.hpp"
#include "flashgqa/flashgqa.hpp"

namespace flashgqa::py {

// An int64 option: None -> nullopt; a Python int or anything with __index__ (numpy integers), but
// not bool.
std::optional<int64_t> int64_option(nb::handle h, const char* name);

// A float option: None -> nullopt; a float, int or anything with __float__ or __index__.
std::optional<double> float_option(nb::handle h, const char* name);

// window: None (unbounded) or a pair (left, right) of ints, -1 = unbounded on that side.
void set_window(flashgqa::Options& o, nb::handle window);

// The library's Options from the Python arguments (None = the library's default); softcap None is
// off, like the library's 0.
flashgqa::Options make_options(bool causal, nb::handle causal_offset, nb::handle window, nb::handle scale,
                               nb::handle precision, nb::handle algo, nb::handle block_q,
                               nb::handle block_kv, nb::handle threads, nb::handle softcap = nb::none());

// The packed sequences' offsets: contiguous int32 arrays from the front (or None), kept alive
// for the call.
using Offsets = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
struct Packing {
  Offsets cu_q, cu_k;
  bool given = false;

  // Options::cu_seqlens_q/k and num_sequences, when given.
  void apply(flashgqa::Options& o) const;
};

Packing import_packing(nb::handle cu_q, nb::handle cu_k);

// Options::sinks, or the backward's dsinks: None, or K*G float32 values in a 1-D contiguous array
// (the front converts any float array of shape [K, G] or [Hq] to one), K and G from q's view. The
// array is kept in `keep` until the call returns. Defined for InArray (sinks) and OutArray (dsinks).
template <typename Array>
float* sinks_option(nb::handle obj, const char* name, const flashgqa::TensorView& q, Operand<Array>& keep);

}  // namespace flashgqa::py
