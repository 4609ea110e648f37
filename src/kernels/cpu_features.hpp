// Which instruction sets this CPU (and its operating system) supports, and which one the kernels use.
//
// The choice is made once, on first use: the best supported path, unless the environment variable
// FLASHGQA_ISA names another (amx | avx512bf16 | avx512f | avx2 | portable on x86-64; neon-bf16 | neon |
// portable on aarch64). set_isa() changes it later (tests,
// the CLI's --isa, benchmarks). Naming a path this machine cannot run is an Error, never a crash.
#pragma once

#include <string>
#include <vector>

namespace flashgqa {

// Ordered from the most portable to the fastest.
enum class Isa : int {
  portable,    // plain C++, any CPU
  avx2,        // AVX2 + FMA + F16C: bf16 widened to fp32, 8-lane FMA
  avx512f,     // AVX-512F/DQ/BW/VL: bf16 widened to fp32, 16-lane FMA
  avx512bf16,  // AVX-512 + AVX512_BF16 + AVX512_VNNI (every CPU with the first has the second):
               // vdpbf16ps, 32 multiply-adds per instruction; int8 V in decode on vpdpwssd
  neon,        // aarch64 Advanced SIMD: bf16 widened to fp32, 4-lane FMLA
  neon_bf16,   // aarch64 Advanced SIMD + FEAT_BF16: BFDOT, 8 multiply-adds per instruction
  amx,         // avx512bf16 + AMX-BF16 (Sapphire Rapids on): tdpbf16ps, 16x16x32 multiply-adds per instruction
};
// Each CPU supports the paths of one architecture only, so "most portable first" holds within each:
// portable, avx2, avx512f, avx512bf16, amx on x86-64; portable, neon, neon_bf16 on aarch64. (amx comes
// last in the enum only so that the numbers of the others stay as they were.)

// "portable", "avx2", "avx512f", "avx512bf16", "amx", "neon", "neon-bf16".
const char* isa_name(Isa isa);
// Parses a name as printed by isa_name; throws Error for anything else.
Isa parse_isa(const std::string& name);

// Whether this CPU and OS can run the path (x86-64: cpuid feature bits and XGETBV register state; for
// amx also Linux's permission to use the tile data, asked for once per process with
// arch_prctl(ARCH_REQ_XCOMP_PERM); aarch64: the kernel's hardware capabilities, getauxval(AT_HWCAP) and getauxval(AT_HWCAP2)).
bool isa_supported(Isa isa);
// Every supported path, most portable first.
std::vector<Isa> supported_isas();
// The best supported path.
Isa best_isa();

// Whether this CPU's vdpbf16ps issues at half its fp32 FMA rate, so that two FMAs per bf16 pair run
// faster (Intel cores: 160 vs 333 GFLOP/s measured on an Emerald Rapids-class Xeon; AMD's Zen 4 and
// Zen 5 issue it at the FMA rate; docs/performance.md, session 9). Read from the CPUID vendor, so a
// machine always makes the same choice; kernels_for() and decode_kernels_for() use it.
bool bf16_dot_half_rate();

// The path in use: set_isa's value, else FLASHGQA_ISA's, else best_isa(). Throws Error when
// FLASHGQA_ISA names an unknown or unsupported path.
Isa active_isa();
// Selects the path for all later calls. Throws Error when this machine does not support it.
void set_isa(Isa isa);
// set_isa(parse_isa(name)), for the CLI's --isa.
void set_isa(const std::string& name);

}  // namespace flashgqa
