// The avx512f decode QK kernel: avx512_decode_qk.hpp with two fp32 FMAs per bf16 pair (FmaPairs), on
// the Q rows as this path's decode set writes them (bf16 pairs, avx512f_decode_kernels()).
#include "kernels/avx512_decode_qk.hpp"

namespace flashgqa {

void avx512f_decode_qk_rows(const DecodeQk& t) { decode_avx512::decode_qk_rows_fma<decode_avx512::FmaPairs>(t); }

}  // namespace flashgqa
