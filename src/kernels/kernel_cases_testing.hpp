// What the kernel set tests share (microkernels_test.cpp: the tiles and packing;
// softmax_kernels_test.cpp: the softmax and the elementwise kernels): every (path, precision) this
// machine runs, and a name for each.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu_features.hpp"
#include "kernels/microkernels.hpp"

namespace flashgqa::kernel_testing {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

struct KernelCase {
  Isa isa;
  Precision precision;
  const FlashKernels* kern;
};

// Every (path, precision) this machine runs, with kernels_for's set; and on AVX512_BF16 CPUs the
// avx512bf16 set itself too, where kernels_for hands out the fp32 one (bf16_dot_half_rate()).
inline std::vector<KernelCase> supported_cases() {
  std::vector<KernelCase> out;
  for (Isa isa : supported_isas())
    for (Precision p : {Precision::bf16, Precision::f32}) out.push_back({isa, p, &kernels_for(isa, p)});
#if defined(__x86_64__)
  if (isa_supported(Isa::avx512bf16) && &kernels_for(Isa::avx512bf16, Precision::bf16) != &avx512bf16_kernels())
    out.push_back({Isa::avx512bf16, Precision::bf16, &avx512bf16_kernels()});
#endif
  return out;
}

inline std::string name(const KernelCase& c) {
  return std::string(isa_name(c.isa)) + "/" + precision_name(c.precision) + " (" + c.kern->name + ")";
}

}  // namespace flashgqa::kernel_testing
