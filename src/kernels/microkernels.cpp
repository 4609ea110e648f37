// The one place that maps (instruction set, precision) to a kernel set.
#include "kernels/microkernels.hpp"

#include <string>

namespace flashgqa {

const FlashKernels& kernels_for(Isa isa, Precision precision) {
  if (!isa_supported(isa))
    throw Error(std::string("isa: '") + isa_name(isa) +
                "' is not supported by this CPU, expected one of the supported paths");
#ifdef FLASHGQA_X86_KERNELS
  switch (isa) {
    case Isa::amx: return precision == Precision::bf16 ? amx_kernels() : avx512f_kernels();
    case Isa::avx512bf16:  // where vdpbf16ps is half rate, the fp32 FMAs are faster (see the header)
      return precision == Precision::bf16 && !bf16_dot_half_rate() ? avx512bf16_kernels() : avx512f_kernels();
    case Isa::avx512f: return avx512f_kernels();
    case Isa::avx2: return avx2_kernels();
    case Isa::portable: return portable_kernels();
    case Isa::neon:
    case Isa::neon_bf16: break;  // not supported on x86-64 (checked above)
  }
#elif defined(FLASHGQA_ARM_KERNELS)
  switch (isa) {
    case Isa::neon_bf16: return precision == Precision::bf16 ? neon_bf16_kernels() : neon_kernels();
    case Isa::neon: return neon_kernels();
    default: break;
  }
#else
  (void)precision;
  if (isa != Isa::portable)
    throw Error(std::string("isa: '") + isa_name(isa) +
                "' is not compiled into this build, expected portable");
#endif
  return portable_kernels();
}

#ifdef FLASHGQA_X86_KERNELS
const FlashKernels& avx512bf16_fma_decode_kernels() {
  static const FlashKernels k = [] {
    FlashKernels f = avx512bf16_kernels();
    f.name = "avx512bf16 (fma decode)";
    f.decode_qk_rows = avx512bf16_fma_decode_qk_rows;
    f.decode_pv_rows = avx512bf16_fma_decode_pv_rows;
    // Its tiles' vdpbf16ps run at half rate there: packed blocks on the avx512f tiles instead (fp32
    // operands widened as packed) from 64 rows (T = 16 at G = 4: 1.35x faster than the row groups;
    // at 32 rows the row groups were 1.04-1.15x faster dense and even paged). int8 stays on the
    // integers form (its 8-row groups: dense T = 8 1.3x, T = 16 1.2x faster than the rows converted
    // to their products and packed). No overlap: with Q.K and P.V prefetching their rows line by line
    // (FmaPairs::kPrefetchRows) its pieces only cost (T = 2 1.15x, T = 4 1.05x faster without).
    // docs/performance.md, session 42.
    f.decode_tiles = &avx512f_kernels();
    f.decode_packed_rows = 64;
    f.decode_overlap_rows = 0;
    f.decode_int8_rows_to_bf16 = nullptr;
    return f;
  }();
  return k;
}
#endif

const FlashKernels& decode_kernels_for(Isa isa, Precision precision) {
  const FlashKernels& k = kernels_for(isa, precision);
#ifdef FLASHGQA_X86_KERNELS
  if (precision == Precision::bf16) {
    if (isa == Isa::avx512f) return avx512f_decode_kernels();
    if (isa == Isa::avx2) return avx2_decode_kernels();
    if (isa == Isa::avx512bf16 && bf16_dot_half_rate()) return avx512bf16_fma_decode_kernels();
  }
#endif
  return k;
}

}  // namespace flashgqa
