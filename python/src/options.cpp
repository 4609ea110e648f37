// Options of flashgqa._flashgqa (see options.hpp): Python ints, floats, names, the window pair, the
// packed sequences' offsets and the sinks, converted to flashgqa::Options.
#include "options.hpp"

#include <array>
#include <climits>
#include <cstddef>
#include <string>
#include <tuple>

#include <nanobind/stl/string.h>

namespace flashgqa::py {

namespace {

std::string repr_string(nb::handle h) { return nb::repr(h).c_str(); }

// An integer option: None -> nullopt; a Python int or anything with __index__ (numpy integers),
// but not bool, in the C++ type's range [min, max].
std::optional<int64_t> int_option(nb::handle h, const char* name, int64_t min, int64_t max,
                                  const char* ctype) {
  if (h.is_none()) return std::nullopt;
  if (PyBool_Check(h.ptr()) || !PyIndex_Check(h.ptr()))
    throw nb::type_error(
        (std::string(name) + ": " + repr_string(h) + ", expected an int or None").c_str());
  const nb::object index = nb::steal(PyNumber_Index(h.ptr()));
  if (!index.is_valid()) throw nb::python_error();
  int overflow = 0;
  const long long value = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (value == -1 && PyErr_Occurred()) throw nb::python_error();
  if (overflow != 0 || value < min || value > max)
    throw nb::value_error((std::string(name) + ": " + repr_string(index) +
                           " does not fit in a C++ " + ctype + ", expected an int in [" +
                           std::to_string(min) + ", " + std::to_string(max) + "]")
                              .c_str());
  return value;
}

// A name option (algo, precision): a str, parsed by the library's parser for its table.
template <typename Enum, size_t N>
std::string name_option(nb::handle h, const char* name,
                        const std::array<flashgqa::EnumName<Enum>, N>& table) {
  if (!nb::isinstance<nb::str>(h))
    throw nb::type_error((std::string(name) + ": " + repr_string(h) + ", expected a str, one of " +
                          flashgqa::join_names(table))
                             .c_str());
  return nb::cast<std::string>(h);
}

}  // namespace

std::optional<int64_t> int64_option(nb::handle h, const char* name) {
  return int_option(h, name, INT64_MIN, INT64_MAX, "int64");
}

std::optional<double> float_option(nb::handle h, const char* name) {
  if (h.is_none()) return std::nullopt;
  const double value = PyFloat_AsDouble(h.ptr());
  if (value == -1.0 && PyErr_Occurred()) {
    const bool overflow = PyErr_ExceptionMatches(PyExc_OverflowError);
    PyErr_Clear();
    if (overflow)
      throw nb::value_error((std::string(name) + ": " + repr_string(h) +
                             " does not fit in a double, expected a finite number")
                                .c_str());
    throw nb::type_error(
        (std::string(name) + ": " + repr_string(h) + ", expected a float or None").c_str());
  }
  return value;
}

void set_window(flashgqa::Options& o, nb::handle window) {
  if (window.is_none()) return;
  const auto expected = [&] {
    return nb::type_error(("window: " + repr_string(window) +
                           ", expected None or a pair (left, right) of ints (-1: unbounded)")
                              .c_str());
  };
  if (!PySequence_Check(window.ptr()) || nb::isinstance<nb::str>(window)) throw expected();
  const Py_ssize_t n = PySequence_Size(window.ptr());
  if (n < 0) throw nb::python_error();
  if (n != 2) throw expected();
  const nb::object left = nb::steal(PySequence_GetItem(window.ptr(), 0));
  const nb::object right = nb::steal(PySequence_GetItem(window.ptr(), 1));
  if (!left.is_valid() || !right.is_valid()) throw nb::python_error();
  if (left.is_none() || right.is_none()) throw expected();
  o.window_left = *int64_option(left, "window[0]");
  o.window_right = *int64_option(right, "window[1]");
}

flashgqa::Options make_options(bool causal, nb::handle causal_offset, nb::handle window, nb::handle scale,
                               nb::handle precision, nb::handle algo, nb::handle block_q,
                               nb::handle block_kv, nb::handle threads, nb::handle softcap) {
  flashgqa::Options o;
  set_window(o, window);
  if (!algo.is_none())
    o.algorithm =
        flashgqa::parse_algorithm(name_option(algo, "algo", flashgqa::kAlgorithmNames), "algo");
  if (!precision.is_none())
    o.precision = flashgqa::parse_precision(
        name_option(precision, "precision", flashgqa::kPrecisionNames), "precision");
  o.scale = float_option(scale, "scale");
  o.causal = causal;
  o.causal_offset = int64_option(causal_offset, "causal_offset");
  o.block_q = int64_option(block_q, "block_q").value_or(0);
  o.block_kv = int64_option(block_kv, "block_kv").value_or(0);
  o.threads = static_cast<int>(
      int_option(threads, "threads", INT_MIN, INT_MAX, "int").value_or(0));
  o.softcap = float_option(softcap, "softcap").value_or(0.0);  // None = off; the library checks it
  return o;
}

void Packing::apply(flashgqa::Options& o) const {
  if (!given) return;
  o.cu_seqlens_q = cu_q.data();
  o.cu_seqlens_k = cu_k.data();
  // n + 1 offsets give n sequences; two lengths that differ leave the library a clear error.
  o.num_sequences = cu_q.shape(0) == cu_k.shape(0) ? static_cast<int64_t>(cu_q.shape(0)) - 1 : -1;
}

Packing import_packing(nb::handle cu_q, nb::handle cu_k) {
  Packing p;
  if (cu_q.is_none() && cu_k.is_none()) return p;
  if (cu_q.is_none() || cu_k.is_none())
    throw nb::value_error("cu_seqlens_q, cu_seqlens_k: one given without the other, expected both "
                          "(or neither)");
  for (const auto& [h, a, name] : {std::tuple{cu_q, &p.cu_q, "cu_seqlens_q"}, std::tuple{cu_k, &p.cu_k, "cu_seqlens_k"}})
    if (!nb::try_cast(h, *a, /*convert=*/false))
      throw nb::type_error((std::string(name) + ": " + nb::type_name(h.type()).c_str() +
                            ", expected a 1-D contiguous int32 CPU array")
                               .c_str());
  if (p.cu_q.shape(0) != p.cu_k.shape(0))
    throw nb::value_error(("cu_seqlens_q, cu_seqlens_k: lengths " + std::to_string(p.cu_q.shape(0)) +
                           " and " + std::to_string(p.cu_k.shape(0)) + ", expected the same (n + 1 offsets)")
                              .c_str());
  if (p.cu_q.shape(0) < 2)
    throw nb::value_error(("cu_seqlens_q: " + std::to_string(p.cu_q.shape(0)) +
                           " offsets, expected n + 1 >= 2 (0, then each sequence's end)")
                              .c_str());
  p.given = true;
  return p;
}

template <typename Array>
float* sinks_option(nb::handle obj, const char* name, const flashgqa::TensorView& q, Operand<Array>& keep) {
  if (obj.is_none()) return nullptr;
  keep = import_operand<Array>(obj, name);
  const flashgqa::TensorView& t = keep.view;
  const int64_t heads = q.rank == 5 ? q.shape[1] * q.shape[2] : -1;
  if (t.rank != 1 || t.dtype != flashgqa::DType::f32 || (t.shape[0] > 1 && t.stride[0] != 1) ||
      t.shape[0] != heads)
    throw nb::value_error((std::string(name) + ": rank " + std::to_string(t.rank) + " " +
                           flashgqa::dtype_name(t.dtype) + " array of " + std::to_string(t.numel()) +
                           " values, expected a contiguous float32 array of K*G = " + std::to_string(heads) +
                           " values")
                              .c_str());
  return static_cast<float*>(t.data);
}

template float* sinks_option<InArray>(nb::handle, const char*, const flashgqa::TensorView&, Operand<InArray>&);
template float* sinks_option<OutArray>(nb::handle, const char*, const flashgqa::TensorView&, Operand<OutArray>&);

}  // namespace flashgqa::py
