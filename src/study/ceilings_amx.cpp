// Ceilings micro-benchmark loop for AMX-BF16 (compiled with -mamx-tile -mamx-bf16; run only where
// isa_supported(Isa::amx), which has also asked Linux for the tile data).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "study/ceilings.hpp"

namespace flashgqa::study::detail {

// Four independent tdpbf16ps chains (C tiles tmm0..3) from two A and two B tiles that stay in their
// registers: 16 x 16 x 32 multiply-adds = 16384 FLOPs per instruction, no memory traffic in the loop.
double amx_dot_loop(long iterations, float* sink) {
  struct alignas(64) Config {
    std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
    std::uint16_t colsb[16] = {};
    std::uint8_t rows[16] = {};
  } config;
  for (int i = 0; i < 8; ++i) config.colsb[i] = 64, config.rows[i] = 16;
  alignas(64) std::uint16_t ab[16 * 32];
  for (std::uint16_t& x : ab) x = 0x0001;  // tiny bf16: the sums stay finite
  alignas(64) float c[16 * 16];
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_loadd(6, ab, 64);
  _tile_loadd(7, ab, 64);
  for (long i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  *sink += c[0];
  return static_cast<double>(iterations) * 4 * 16384.0;
}

}  // namespace flashgqa::study::detail
