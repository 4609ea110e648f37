// The avx512f decode PV kernel: avx512_decode_pv.hpp with two fp32 FMAs per bf16 pair (FmaPairs).
#include "kernels/avx512_decode_pv.hpp"

namespace flashgqa {

void avx512f_decode_pv_rows(const DecodePv& t) { decode_avx512::decode_pv_rows<decode_avx512::FmaPairs<false>>(t); }

}  // namespace flashgqa
