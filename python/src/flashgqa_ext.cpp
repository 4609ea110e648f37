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
//   - q and out are [B,K,G,T,H], SDPA's [B,Hq,T,H] with Hq = K*G (K taken from k), or
//     FlashAttention's packed [total,Hq,H]; lse is [B,K,G,T], [B,Hq,T] or [total,Hq] to match; k, v
//     are [B,K,S,H] ([total,K,H] with a packed q). cu_seqlens_q/k arrive as contiguous int32. The backward's dout and dq are shaped
//     like q, dk and dv like k. A 4-D q (and everything shaped like it) goes through the library's
//     split_heads, so any strided 4-D view maps to a 5-D view without a copy;
//   - the options arrive as the user gave them (None for defaults): this module converts them to
//     the library's types, with TypeError for a wrong Python type and ValueError for an integer
//     that does not fit the C++ type; the algorithm and precision names go to the library's
//     parsers.
// Shapes, ranks, strides and option values are checked by the library alone: flashgqa::Error
// becomes ValueError with the library's message. What is checked here is only what the library
// cannot see: Python types, devices, the dtype mapping, ranks above TensorView::kMaxRank, and the
// rank of q, which picks the layout (and needs k's K to split a 4-D q).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <atomic>
#include <signal.h>
#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>

#include "flashgqa/flashgqa.hpp"

namespace nb = nanobind;

namespace {

using InArray = nb::ndarray<nb::ro>;  // any framework, device, dtype, rank; read-only access
using OutArray = nb::ndarray<>;       // the same, writable

constexpr int kDLCPU = 1;       // DLPack device types the CPU can read directly
constexpr int kDLCUDAHost = 3;  // (pinned host memory)

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
    // int8: a quantized KV cache (the library refuses it anywhere else, naming the argument).
    if (dt.code == static_cast<uint8_t>(code::Int) && dt.bits == 8) return flashgqa::DType::i8;
  }
  throw nb::type_error((std::string(name) + ": dtype " + dtype_string(dt) + ", expected " +
                        flashgqa::join_names(flashgqa::kFloatDTypeNames))
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

// The view of `a` as given (rank 0..5: a TensorView holds no more), in elements.
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

// flashgqa::split_heads of a 4-D q, out or lse by k's K; the library's message says what was
// wrong, this adds where K came from.
flashgqa::TensorView split_by_k(const flashgqa::TensorView& t, int64_t K, const char* name) {
  try {
    return flashgqa::split_heads(t, K, name);
  } catch (const flashgqa::Error& e) {
    throw flashgqa::Error(std::string(e.what()) + " (K from k)");
  }
}

// One array argument, imported, and the library's view of it. The array keeps the producer's
// buffer alive until the call returns.
template <typename Array>
struct Operand {
  Array array;
  flashgqa::TensorView view;
};

// FlashAttention's packed layout viewed as one batch: [total, heads, H] (q-like, k-like) or
// [total, heads] (lse) as [1, heads, total, H] or [1, heads, total], without moving data.
flashgqa::TensorView packed_as_batch(const flashgqa::TensorView& t) {
  flashgqa::TensorView v = t;
  v.rank = t.rank + 1;
  v.shape = {1, t.shape[1], t.shape[0], t.rank == 3 ? t.shape[2] : 0, 0};
  v.stride = {0, t.stride[1], t.stride[0], t.rank == 3 ? t.stride[2] : 0, 0};
  return v;
}

// q's layout, which every array shaped like q (out, lse, dout, dq) shares: a 5-D q goes to the
// library as it is, a 4-D q (SDPA's) is split by k's K first, a 3-D q (FlashAttention's packed
// [total, Hq, H], with k, v [total, K, H]) is viewed as [1, Hq, total, H] and then split.
struct QLayout {
  bool sdpa = false, packed = false;
  int64_t K = 0;

  flashgqa::TensorView view(const flashgqa::TensorView& plain, const char* name) const {
    if (packed) {
      if (plain.rank != 3 && plain.rank != 2)
        throw nb::value_error((std::string(name) + ": rank " + std::to_string(plain.rank) +
                               ", expected the packed layout of q: [total, Hq, H] (lse [total, Hq])")
                                  .c_str());
      return split_by_k(packed_as_batch(plain), K, name);
    }
    return sdpa ? split_by_k(plain, K, name) : plain;
  }
  // k, v, dk, dv: as given, or [total, K, H] viewed as [1, K, total, H].
  flashgqa::TensorView kv_view(const flashgqa::TensorView& plain, const char* name) const {
    if (!packed) return plain;
    if (plain.rank != 3)
      throw nb::value_error((std::string(name) + ": rank " + std::to_string(plain.rank) +
                             ", expected 3 [total, K, H] (the packed layout of q)")
                                .c_str());
    return packed_as_batch(plain);
  }
};

// The rank of q picks the layout; every other check is the library's.
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

// Imports one argument; with a layout, as an array shaped like q.
template <typename Array>
Operand<Array> import_operand(nb::handle obj, const char* name, const QLayout* layout = nullptr) {
  Operand<Array> o;
  o.array = import_array<Array>(obj, name);
  const flashgqa::TensorView plain = plain_view(o.array, name);
  o.view = layout != nullptr ? layout->view(plain, name) : plain;
  return o;
}

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

std::string repr_string(nb::handle h) { return nb::repr(h).c_str(); }

// Options::sinks, or the backward's dsinks: None, or K*G float32 values in a 1-D contiguous array (the
// front converts any float array of shape [K, G] or [Hq] to one), K and G from q's view. The array is
// kept in `keep` until the call returns.
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

std::optional<int64_t> int64_option(nb::handle h, const char* name) {
  return int_option(h, name, INT64_MIN, INT64_MAX, "int64");
}

// A float option: None -> nullopt; a float, int or anything with __float__ or __index__.
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

// window: None (unbounded) or a pair (left, right) of ints, -1 = unbounded on that side.
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

// The packed sequences' offsets: contiguous int32 arrays from the front (or None), kept alive
// for the call.
using Offsets = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
struct Packing {
  Offsets cu_q, cu_k;
  bool given = false;

  void apply(flashgqa::Options& o) const {
    if (!given) return;
    o.cu_seqlens_q = cu_q.data();
    o.cu_seqlens_k = cu_k.data();
    // n + 1 offsets give n sequences; two lengths that differ leave the library a clear error.
    o.num_sequences = cu_q.shape(0) == cu_k.shape(0) ? static_cast<int64_t>(cu_q.shape(0)) - 1 : -1;
  }
};

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

// The library's Options from the Python arguments (None = the library's default).
flashgqa::Options make_options(bool causal, nb::handle causal_offset, nb::handle window, nb::handle scale,
                               nb::handle precision, nb::handle algo, nb::handle block_q,
                               nb::handle block_kv, nb::handle threads) {
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
  return o;
}

// Ctrl-C during a call from Python's main thread (where Python delivers KeyboardInterrupt). While
// such a call runs, SIGINT only sets g_sigint (one lock-free store: async-signal-safe); the library
// polls it between tasks (Options::interrupt) and stops with flashgqa::Interrupted, which becomes
// KeyboardInterrupt. Python's handler is restored when the call returns, and a SIGINT that came too
// late to stop the call is raised again then, so Python still sees it. Calls from other threads, and
// processes that ignore SIGINT, leave the handler alone.
static_assert(std::atomic<bool>::is_always_lock_free, "the SIGINT handler needs a lock-free flag");
std::atomic<bool> g_sigint{false};

extern "C" void on_sigint(int) { g_sigint.store(true, std::memory_order_relaxed); }

class SigintWatch {
 public:
  SigintWatch() {
    if (!PyGILState_Check() || PyThread_get_thread_ident() != main_thread_ident()) return;
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGINT, nullptr, &previous_) != 0 || previous_.sa_handler == SIG_IGN) return;
    g_sigint.store(false);
    installed_ = sigaction(SIGINT, &sa, nullptr) == 0;
  }
  ~SigintWatch() {
    if (!installed_) return;
    sigaction(SIGINT, &previous_, nullptr);
    if (g_sigint.exchange(false) && !stopped) raise(SIGINT);  // too late to stop the call: Python's turn
  }
  SigintWatch(const SigintWatch&) = delete;
  SigintWatch& operator=(const SigintWatch&) = delete;
  bool installed() const { return installed_; }
  bool stopped = false;  // the call threw Interrupted: KeyboardInterrupt is already on its way

 private:
  static unsigned long main_thread_ident() {
    static const unsigned long ident = [] {
      nb::object threading = nb::module_::import_("threading");
      return nb::cast<unsigned long>(threading.attr("main_thread")().attr("ident"));
    }();
    return ident;
  }
  struct sigaction previous_ {};
  bool installed_ = false;
};

// Runs call(options) with the GIL released and, from the main thread, Ctrl-C watched.
template <typename Call>
void run_interruptible(flashgqa::Options options, Call call) {
  SigintWatch watch;
  if (watch.installed()) options.interrupt = &g_sigint;
  try {
    nb::gil_scoped_release release;
    call(options);
  } catch (const flashgqa::Interrupted&) {
    watch.stopped = true;
    throw;
  }
}

void attention(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
               bool causal, nb::handle causal_offset, nb::handle window, nb::handle cu_seqlens_q,
               nb::handle cu_seqlens_k, nb::handle scale, nb::handle precision, nb::handle algo,
               nb::handle block_q, nb::handle block_kv, nb::handle threads, nb::handle softcap,
               nb::handle sinks) {
  const Call c = make_call(q, k, v, out, lse);
  if (!c.has_out) throw nb::type_error("out: None, expected a writable CPU array");
  flashgqa::Options o =
      make_options(causal, causal_offset, window, scale, precision, algo, block_q, block_kv, threads);
  o.softcap = float_option(softcap, "softcap").value_or(0.0);  // None = off; the library checks it
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
using Int32Matrix = nb::ndarray<const int32_t, nb::c_contig, nb::device::cpu>;
// cache_seqlens [B] or block_table [B, max_pages]: a contiguous int32 array of `ndim` dimensions, B first.
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
void attention_with_kvcache(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle out, nb::handle lse,
                            nb::handle cache_seqlens, nb::handle block_table, nb::handle k_new, nb::handle v_new,
                            bool causal, nb::handle causal_offset, nb::handle window, nb::handle scale,
                            nb::handle precision, nb::handle block_kv, nb::handle threads, nb::handle softcap,
                            nb::handle sinks, nb::handle k_scale, nb::handle v_scale) {
  const bool append = !k_new.is_none() || !v_new.is_none();
  Operand<InArray> qo = import_operand<InArray>(q, "q");
  Operand<OutArray> kw, vw;
  Operand<InArray> kr, vr;
  flashgqa::KvCache cache;
  if (append) {
    kw = import_operand<OutArray>(k_cache, "k_cache");
    vw = import_operand<OutArray>(v_cache, "v_cache");
    cache.k = kw.view;
    cache.v = vw.view;
  } else {
    kr = import_operand<InArray>(k_cache, "k_cache");
    vr = import_operand<InArray>(v_cache, "v_cache");
    cache.k = kr.view;
    cache.v = vr.view;
  }
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
  Operand<OutArray> ksw, vsw;
  Operand<InArray> ksr, vsr;
  if (!k_scale.is_none() || !v_scale.is_none()) {
    if (k_scale.is_none() || v_scale.is_none())
      throw nb::value_error("k_scale, v_scale: one given without the other, expected both (for an int8 cache) or neither");
    if (append) {
      ksw = import_operand<OutArray>(k_scale, "k_scale");
      vsw = import_operand<OutArray>(v_scale, "v_scale");
      cache.k_scale = &ksw.view;
      cache.v_scale = &vsw.view;
    } else {
      ksr = import_operand<InArray>(k_scale, "k_scale");
      vsr = import_operand<InArray>(v_scale, "v_scale");
      cache.k_scale = &ksr.view;
      cache.v_scale = &vsr.view;
    }
  }
  flashgqa::Options o = make_options(causal, causal_offset, window, scale, precision, nb::none(), nb::none(),
                                     block_kv, threads);
  o.softcap = float_option(softcap, "softcap").value_or(0.0);
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
                                     block_q, block_kv, threads);
  o.softcap = float_option(softcap, "softcap").value_or(0.0);  // None = off; the library checks it
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

NB_MODULE(_flashgqa, m) {
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
  m.def("_views", &views, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out").none() = nb::none(), nb::arg("lse").none() = nb::none(),
        "The views (data pointer, dtype, shape, strides in elements) attention() would pass to the "
        "library, without computing anything: evidence that nothing is copied.");
  m.def("_backward_views", &backward_views, nb::arg("dout"), nb::arg("q"), nb::arg("k"),
        nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"),
        "The views attention_backward() would pass to the library, without computing anything.");
}
