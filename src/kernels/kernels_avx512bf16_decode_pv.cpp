// The avx512bf16 decode PV kernels: avx512_decode_pv.hpp with vdpbf16ps, and with two FMAs per pair
// for CPUs whose vdpbf16ps issues at half the FMA rate; int8 V on both with int16 weights (vpdpwssd).
#include "kernels/avx512_decode_pv.hpp"

namespace flashgqa {

void avx512bf16_decode_pv_rows(const DecodePv& t) {
  if (decode_avx512::decode_pv_rows_i8(t)) return;
  decode_avx512::decode_pv_rows<decode_avx512::DotBf16>(t);
}

void avx512bf16_fma_decode_pv_rows(const DecodePv& t) {
  if (decode_avx512::decode_pv_rows_i8<true>(t)) return;
  decode_avx512::decode_pv_rows<decode_avx512::FmaPairsCvt<false>>(t);
}

}  // namespace flashgqa
