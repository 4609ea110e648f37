// quantize_kv (flashgqa.hpp): every row of x (its last axis) to int8 with one float32 scale, by
// quantize_row (core/quantize_row.hpp), the same rule the KV-cache API applies to k_new/v_new appended
// to an int8 cache. Every row is checked for NaN and infinities before anything is written.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <string>

#include "core/error_text.hpp"
#include "core/names.hpp"
#include "core/problem.hpp"
#include "core/quantize_row.hpp"
#include "flashgqa/flashgqa.hpp"

namespace flashgqa {
namespace {

// Calls f(x_offset, x8_offset, scale_offset) (elements) for each row of x, in C order.
template <typename F>
void for_each_row(const TensorView& x, const TensorView& x8, const TensorView& scale, F f) {
  const int outer = x.rank - 1;
  std::array<std::int64_t, TensorView::kMaxRank> index{};
  std::int64_t rows = 1;
  for (int d = 0; d < outer; ++d) rows *= x.shape[static_cast<std::size_t>(d)];
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t ox = 0, o8 = 0, os = 0;
    for (int d = 0; d < outer; ++d) {
      const auto i = static_cast<std::size_t>(d);
      ox += index[i] * x.stride[i];
      o8 += index[i] * x8.stride[i];
      os += index[i] * scale.stride[i];
    }
    f(ox, o8, os);
    for (int d = outer - 1; d >= 0; --d) {  // next index, last axis fastest
      const auto i = static_cast<std::size_t>(d);
      if (++index[i] < x.shape[i]) break;
      index[i] = 0;
    }
  }
}

std::string index_string(const TensorView& x, std::int64_t row) {
  std::string s;
  for (int d = x.rank - 2; d >= 0; --d) {
    const std::int64_t n = x.shape[static_cast<std::size_t>(d)];
    s = std::to_string(row % n) + (s.empty() ? "" : ",") + s;
    row /= n;
  }
  return "[" + s + "]";
}

void check(const TensorView& x, const TensorView& x8, const TensorView& scale) {
  if (x.rank < 1 || x.rank > TensorView::kMaxRank)
    fail("x: rank " + std::to_string(x.rank) + ", expected 1 to " + std::to_string(TensorView::kMaxRank) +
         " (rows along the last axis)");
  if (!is_float_dtype(x.dtype))
    fail(std::string("x: dtype ") + dtype_name(x.dtype) + ", expected " + join_names(kFloatDTypeNames));
  if (x8.dtype != DType::i8) fail(std::string("x_int8: dtype ") + dtype_name(x8.dtype) + ", expected int8");
  if (scale.dtype != DType::f32) fail(std::string("scale: dtype ") + dtype_name(scale.dtype) + ", expected float32");
  if (x8.rank != x.rank || !std::equal(x.shape.begin(), x.shape.begin() + x.rank, x8.shape.begin()))
    fail("x_int8: shape " + shape_string(x8) + ", expected x's shape " + shape_string(x));
  if (scale.rank != x.rank - 1 || !std::equal(x.shape.begin(), x.shape.begin() + x.rank - 1, scale.shape.begin()))
    fail("scale: shape " + shape_string(scale) + ", expected x's shape without its last axis");
  for (int d = 0; d < x.rank; ++d)
    if (x.shape[static_cast<std::size_t>(d)] < 0) fail("x: negative dimension in shape " + shape_string(x));
  const auto last = static_cast<std::size_t>(x.rank - 1);
  for (const auto& [t, name] : {std::pair{&x, "x"}, std::pair{&x8, "x_int8"}}) {
    if (t->shape[last] > 1 && t->stride[last] != 1)
      fail(std::string(name) + ": innermost stride " + std::to_string(t->stride[last]) + ", expected 1");
    if (t->data == nullptr && t->numel() > 0) fail(std::string(name) + ": null data pointer");
  }
  if (scale.data == nullptr && scale.numel() > 0) fail("scale: null data pointer");
  check_distinct_elements(x8, "x_int8");
  check_distinct_elements(scale, "scale");
  if (views_overlap(x8, "x_int8", x, "x") || views_overlap(scale, "scale", x, "x") ||
      views_overlap(scale, "scale", x8, "x_int8"))
    fail("x_int8, scale: memory overlaps x or each other, expected separate buffers");
}

}  // namespace

void quantize_kv(const TensorView& x, const TensorView& x_int8, const TensorView& scale) {
  check(x, x_int8, scale);
  const std::int64_t H = x.shape[static_cast<std::size_t>(x.rank - 1)];
  const auto xb = static_cast<const char*>(x.data);
  const auto esize = static_cast<std::int64_t>(dtype_size(x.dtype));
  std::int64_t row = 0;
  for_each_row(x, x_int8, scale, [&](std::int64_t ox, std::int64_t, std::int64_t) {
    const std::int64_t h = first_non_finite(xb + ox * esize, x.dtype, H);
    if (h >= 0)
      fail("x: row " + index_string(x, row) + " has a non-finite value at " + std::to_string(h) +
           ", expected finite values (a NaN or infinity has no int8 scale)");
    ++row;
  });
  for_each_row(x, x_int8, scale, [&](std::int64_t ox, std::int64_t o8, std::int64_t os) {
    static_cast<float*>(scale.data)[os] =
        quantize_row(static_cast<std::int8_t*>(x_int8.data) + o8, xb + ox * esize, x.dtype, H);
  });
}

}  // namespace flashgqa
