// Pieces of the Error messages that validation (problem.cpp) and the views (views.cpp) share:
// "[2,3,4]" for a view's shape or strides, and fail(), which throws the Error.
#pragma once

#include <sstream>
#include <string>

#include "flashgqa/flashgqa.hpp"

namespace flashgqa {

[[noreturn]] inline void fail(const std::string& message) { throw Error(message); }

// "[a,b,...]" of the first t.rank entries of `values` (t.shape or t.stride).
inline std::string dims_string(const TensorView& t,
                               const std::array<std::int64_t, TensorView::kMaxRank>& values) {
  std::ostringstream os;
  os << '[';
  for (int d = 0; d < t.rank; ++d) os << (d ? "," : "") << values[static_cast<std::size_t>(d)];
  os << ']';
  return os.str();
}

inline std::string shape_string(const TensorView& t) { return dims_string(t, t.shape); }
inline std::string stride_string(const TensorView& t) { return dims_string(t, t.stride); }

}  // namespace flashgqa
