// Helpers shared by the fast flash path's tests (flash_fast_test.cpp, flash_decode_test.cpp): run the
// path on a test case on a chosen instruction set, check it against the float64 reference, or collect
// its output and lse for bitwise comparisons.
#pragma once

#include <vector>

#include "core/problem.hpp"
#include "flash/flash_fast.hpp"
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
  flash_attention_fast(p, isa);
  return check_against_reference(p, reference_attention(p));
}

// out then lse of the fast path on `isa`, for random inputs of the shape (a fixed seed).
inline std::vector<float> run_flash_values(const Shape& shape, const Options& o, Isa isa,
                                           DType dtype = DType::bf16, Layout layout = Layout::contiguous) {
  AttentionCase c = make_case(shape, dtype, DType::f32, layout, 17);
  flash_attention_fast(flash_problem(c, o), isa);
  return c.out_and_lse_values();
}

}  // namespace flashgqa::testing
