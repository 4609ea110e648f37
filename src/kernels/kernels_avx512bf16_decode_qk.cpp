// The avx512bf16 decode QK kernels: avx512_decode_qk.hpp with vdpbf16ps, and with two FMAs per pair
// (int8 rounded by vcvtne2ps2bf16) for CPUs whose vdpbf16ps issues at half the FMA rate; both on the
// Q rows as pack_q_row writes them; int8 K on both with vpdpwssd (DotI16) where it applies.
#include "kernels/avx512_decode_qk.hpp"

namespace flashgqa {

void avx512bf16_decode_qk_rows(const DecodeQk& t) {
  if (decode_avx512::decode_qk_rows_i8(t)) return;
  decode_avx512::decode_qk_rows<decode_avx512::DotBf16>(t, {static_cast<const char*>(t.q), t.ldq * 2});
}

void avx512bf16_fma_decode_qk_rows(const DecodeQk& t) {
  if (decode_avx512::decode_qk_rows_i8<decode_avx512::DotI16Ahead>(t)) return;
  decode_avx512::decode_qk_rows_fma<decode_avx512::FmaPairsCvt>(t);
}

}  // namespace flashgqa
