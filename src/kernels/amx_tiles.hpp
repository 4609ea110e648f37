// The tile configuration the AMX kernels share (kernels_amx.cpp, kernels_amx_decode.cpp): all eight
// tiles 16 rows x 64 bytes, loaded on a thread once per hand-out of the set (see kernels_amx.cpp).
// Included only by translation units compiled with -mamx-tile.
#pragma once

namespace flashgqa::amx {

constexpr int kTileRows = 16;   // rows per hardware tile
constexpr int kTileBytes = 64;  // bytes per hardware tile row

// Loads the configuration on this thread unless it already holds it since amx_kernels() last ran.
void configure_tiles();

}  // namespace flashgqa::amx

namespace flashgqa {

struct DecodeQk;
// The amx set's Q.K for int8 rows on AMX-INT8 (kernels_amx_decode_i8.cpp): true where it took the call,
// false (nothing done) where the call is not its own: other dtypes, fewer than 16 rows, rows the tiles
// do not take (H not a multiple of 64, or over 256), no AMX-INT8, or Q rows the integers form does not
// take.
bool amx_decode_qk_rows_i8(const DecodeQk& t);

}  // namespace flashgqa
