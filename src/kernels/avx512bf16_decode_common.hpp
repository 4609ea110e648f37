// Shared by the avx512bf16 decode kernels, kernels_avx512bf16_decode_qk.cpp and _pv.cpp (contract in
// microkernels.hpp): K and V read straight from their rows, whole rows in address order, for tasks of at
// most kDecodeMaxRows query rows. Included only by those two translation units, which are compiled with
// the flags of kernels_avx512bf16.cpp (CMakeLists.txt).
//
// Decode does ~G FLOPs per K/V byte, so it is bound by the DRAM stream, not by vdpbf16ps: these
// kernels spend instructions (a transpose-add, permutes) to avoid any packed copy. What decides their
// speed is the order of the loads and the instructions per key: the hardware prefetchers keep a stream
// going only when the rows are read line after line, so the kernels issue no software prefetch
// (docs/performance.md, decode I).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/avx512_helpers.hpp"
#include "kernels/microkernels.hpp"
#include "kernels/row_count.hpp"

namespace flashgqa::decode_avx512bf16 {

constexpr int kQkGroup = 16;  // keys per transpose-add
constexpr int kPvGroup = 32;  // keys per pass over the columns (8 KiB of bf16 V at H = 128: L1)
constexpr int kPvFastGroupBytes = 8192;  // of V per group on the fast path (32 keys at H = 128)
using word_t = std::uint32_t __attribute__((may_alias));

inline std::int64_t elem_bytes(DType d) { return d == DType::f32 ? 4 : 2; }

// 32 operands of a source row from column h0, as bf16: a plain load when the row is bf16 and H is a
// multiple of 32 (kPlain), otherwise converted, rounded and masked by load32_bf16.
template <bool kPlain>
inline __m512i load_row32(const char* row, DType dtype, std::int64_t h0, std::int64_t H) {
  if (kPlain) return _mm512_loadu_si512(reinterpret_cast<const std::uint16_t*>(row) + h0);
  return load32_bf16(row, dtype, h0, H);
}

}  // namespace flashgqa::decode_avx512bf16
