// The public views: TensorView::numel, contiguous_view, split_heads (SDPA's head axis into K x G)
// and the named layouts built on them (sdpa_q_view, fa_q_view, fa_kv_view).
#include <cstdint>
#include <string>

#include "core/error_text.hpp"
#include "flashgqa/flashgqa.hpp"

namespace flashgqa {

std::size_t dtype_size(DType dtype) { return dtype == DType::f32 ? 4 : dtype == DType::i8 ? 1 : 2; }

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;  // saturates at INT64_MAX instead of overflowing
  for (int d = 0; d < rank; ++d)
    if (__builtin_mul_overflow(n, shape[static_cast<std::size_t>(d)], &n)) return INT64_MAX;
  return n;
}

TensorView contiguous_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  if (shape.size() > static_cast<std::size_t>(TensorView::kMaxRank))
    fail("shape: rank " + std::to_string(shape.size()) + ", expected at most 5");
  t.rank = static_cast<int>(shape.size());
  std::int64_t stride = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    const auto i = static_cast<std::size_t>(d);
    t.shape[i] = shape.begin()[i];
    t.stride[i] = stride;
    stride *= t.shape[i];
  }
  return t;
}

TensorView contiguous_view(const void* data, DType dtype, std::initializer_list<std::int64_t> shape) {
  return contiguous_view(const_cast<void*>(data), dtype, shape);
}

TensorView split_heads(const TensorView& heads, std::int64_t K, const std::string& name) {
  // [B, Hq, T, H] (or [B, Hq, T]) -> [B, K, G, T, H] (or [B, K, G, T]): head h = k*G + g, so the
  // head axis of stride s becomes k of stride G*s and g of stride s; the other axes move one place.
  const char* layout = heads.rank == 4 ? "[B,Hq,T,H]" : "[B,Hq,T]";
  if (heads.rank != 4 && heads.rank != 3)
    fail(name + ": rank " + std::to_string(heads.rank) +
         ", expected 4 [B,Hq,T,H] (or 3 [B,Hq,T], as lse) to split its heads");
  for (int d = 0; d < heads.rank; ++d)
    if (heads.shape[static_cast<std::size_t>(d)] < 0)
      fail(name + ": negative dimension in shape " + shape_string(heads) + " " + layout +
           ", expected sizes >= 0");
  const std::int64_t Hq = heads.shape[1];
  if (K < 1)
    fail(name + ": K = " + std::to_string(K) + " kv heads to split the Hq = " + std::to_string(Hq) +
         " query heads of shape " + shape_string(heads) + " " + layout + ", expected K >= 1");
  if (Hq % K != 0)
    fail(name + ": shape " + shape_string(heads) + " " + layout + " has Hq = " + std::to_string(Hq) +
         " query heads, expected a multiple of K = " + std::to_string(K) + " kv heads");
  const std::int64_t G = Hq / K;
  std::int64_t k_stride = 0;
  if (__builtin_mul_overflow(G, heads.stride[1], &k_stride))
    fail(name + ": head stride " + std::to_string(heads.stride[1]) + " times G = " +
         std::to_string(G) + " overflows 64 bits, expected smaller strides");

  TensorView split = heads;
  split.rank = heads.rank + 1;
  split.shape[1] = K;
  split.stride[1] = k_stride;
  split.shape[2] = G;
  split.stride[2] = heads.stride[1];
  for (int d = 2; d < heads.rank; ++d) {
    split.shape[static_cast<std::size_t>(d) + 1] = heads.shape[static_cast<std::size_t>(d)];
    split.stride[static_cast<std::size_t>(d) + 1] = heads.stride[static_cast<std::size_t>(d)];
  }
  return split;
}

TensorView sdpa_q_view(void* data, DType dtype, std::int64_t B, std::int64_t K, std::int64_t G,
                       std::int64_t T, std::int64_t H) {
  return split_heads(contiguous_view(data, dtype, {B, K * G, T, H}), K, "q");
}

TensorView fa_q_view(void* data, DType dtype, std::int64_t B, std::int64_t K, std::int64_t G,
                     std::int64_t T, std::int64_t H) {
  // [B, T, K*G, H] contiguous viewed as [B, K, G, T, H].
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.rank = 5;
  t.shape = {B, K, G, T, H};
  t.stride = {T * K * G * H, G * H, H, K * G * H, 1};
  return t;
}

TensorView fa_kv_view(void* data, DType dtype, std::int64_t B, std::int64_t K, std::int64_t S,
                      std::int64_t H) {
  // [B, S, K, H] contiguous viewed as [B, K, S, H].
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.rank = 4;
  t.shape = {B, K, S, H};
  t.stride = {S * K * H, H, K * H, 1};
  return t;
}

}  // namespace flashgqa
