// Reading and writing NumPy .npy files: C-order float32 ('<f4'), float16 ('<f2') and bfloat16 (the
// '<V2' descr numpy writes for ml_dtypes.bfloat16; the descr 'bfloat16' is accepted too).
// Reads format versions 1.0, 2.0 and 3.0; writes 1.0, or 2.0 when the header does not fit 1.0.
// Every failure throws flashgqa::Error naming the file, what was wrong and what was expected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flashgqa/flashgqa.hpp"

namespace flashgqa {

// An array read from a .npy file: its elements in C order, as stored (little-endian).
struct NpyArray {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;  // empty for a 0-d array (one element)
  std::vector<std::byte> data;      // numel() * dtype_size(dtype) bytes

  std::int64_t numel() const;
  // A contiguous view of data; throws Error when the rank is above TensorView::kMaxRank.
  TensorView view();
};

// Reads the whole file at `path`.
NpyArray read_npy(const std::string& path);
// The same from the `size` bytes of a .npy file in memory; `name` stands for the path in messages.
NpyArray parse_npy(const void* bytes, std::size_t size, const std::string& name);

// Writes `data` (C order, numel(shape) elements of `dtype`) as a .npy file at `path`, replacing it.
// `data` may be null when the shape has no elements.
void write_npy(const std::string& path, DType dtype, const std::vector<std::int64_t>& shape,
               const void* data);

// Throws Error (as write_npy would) when write_npy could not create or replace the file at `path`
// now: its folder missing or not writable, the file not writable, or the path a folder. Creates
// nothing, so a tool can check its output paths before it computes.
void check_writable_npy(const std::string& path);

// The header text that write_npy puts after the preamble, e.g.
// "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }" (without padding).
std::string npy_header_dict(DType dtype, const std::vector<std::int64_t>& shape);

}  // namespace flashgqa
