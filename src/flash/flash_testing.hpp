// Helpers shared by the fast flash path's tests (flash_packed_test.cpp, flash_decode_test.cpp): run the
// path on a test case on a chosen instruction set, check it against the float64 reference, or collect
// its output and lse for bitwise comparisons.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "flash/flash_packed.hpp"
#include "reference/reference.hpp"
#include "reference/tolerance.hpp"
#include "testing/attention_case.hpp"

namespace flashgqa::testing {

inline Problem flash_problem(AttentionCase& c, const Options& o, bool with_lse = true) {
  Options flash = o;
  flash.algorithm = Algorithm::flash;
  return make_problem(c.out, with_lse ? &c.lse : nullptr, c.q, c.k, c.v, flash);
}

// Runs the fast path on `isa` and compares out and lse with the reference.
inline ErrorReport run_flash_and_check(AttentionCase& c, const Options& o, Isa isa) {
  const Problem p = flash_problem(c, o);
  flash_attention(p, isa);
  return check_against_reference(p, reference_attention(p));
}

// out then lse of the fast path on `isa`, for random inputs of the shape (a fixed seed).
inline std::vector<float> run_flash_values(const Shape& shape, const Options& o, Isa isa,
                                           DType dtype = DType::bf16, Layout layout = Layout::contiguous) {
  AttentionCase c = make_case(shape, dtype, DType::f32, layout, 17);
  flash_attention(flash_problem(c, o), isa);
  return c.out_and_lse_values();
}

// The fast path on `isa` gives the same out and lse bits with 1, 2 and 3 threads (o.threads is set).
inline void expect_same_bits_for_thread_counts(const Shape& shape, Options o, Isa isa) {
  std::vector<float> results[3];
  for (int threads : {1, 2, 3}) {
    o.threads = threads;
    results[threads - 1] = run_flash_values(shape, o, isa);
  }
  EXPECT_TRUE(bitwise_equal(results[0], results[1])) << to_string(shape);
  EXPECT_TRUE(bitwise_equal(results[0], results[2])) << to_string(shape);
}

// Sliding windows (Options::window_left, window_right; -1 unbounded) that cut blocks at both ends, with
// and without causal, at several offsets: the key-range masks' lower side in every path.
struct WindowCase {
  std::int64_t left, right;
  bool causal;
  std::optional<std::int64_t> offset;
};
inline const WindowCase kWindowCases[] = {
    {5, 3, false, {}},  {0, 0, false, {}}, {40, -1, false, {}}, {-1, 7, false, 0}, {17, -1, true, {}},
    {3, 9, true, -5},   {1, 0, true, 20},  {60, 60, false, -30}, {1000, 2, false, {}},
};

// Runs the fast path with window w and compares with the reference; `values` gets out then lse.
inline ErrorReport run_flash_window_and_check(AttentionCase& c, Options o, const WindowCase& w, Isa isa,
                                              std::vector<float>* values = nullptr) {
  o.causal = w.causal;
  o.causal_offset = w.offset;
  o.window_left = w.left;
  o.window_right = w.right;
  const Problem p = flash_problem(c, o);
  flash_attention(p, isa);
  if (values) *values = c.out_and_lse_values();
  return check_against_reference(p, reference_attention(p));
}

inline std::string to_string(const WindowCase& w) {
  return "window (" + std::to_string(w.left) + ", " + std::to_string(w.right) + ")" + (w.causal ? " causal" : "") +
         " offset " + (w.offset ? std::to_string(*w.offset) : "default");
}

}  // namespace flashgqa::testing
