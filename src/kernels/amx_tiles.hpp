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
