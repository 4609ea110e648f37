#include "kernels/cpu_features.hpp"

#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "flashgqa/flashgqa.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define FLASHGQA_X86 1
#endif
#if defined(FLASHGQA_X86) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define FLASHGQA_X86_LINUX 1
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#define FLASHGQA_ARM_LINUX 1
#endif

namespace flashgqa {
namespace {

struct Features {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512dq = false, avx512bw = false, avx512vl = false, avx512bf16 = false;
  bool avx512vnni = false;
  bool amx_tile = false, amx_bf16 = false;
  bool os_amx = false;  // XCR0 tile state + Linux's permission
  bool os_ymm = false, os_zmm = false;  // XCR0 says the OS saves the AVX / AVX-512 registers
  bool asimd = false, bf16 = false;     // aarch64 Advanced SIMD (HWCAP_ASIMD), FEAT_BF16 (HWCAP2_BF16)
  bool intel = false;                   // CPUID vendor "GenuineIntel"
};

#ifdef FLASHGQA_X86
std::uint64_t read_xcr0() {
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

// Linux keeps the 8 KiB of tile data off by default: a process asks once (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, Linux 5.16 on), and every thread may then use it. A
// refusal (an older kernel, a seccomp filter) leaves amx unsupported.
bool request_amx_permission() {
#ifdef FLASHGQA_X86_LINUX
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#endif

Features detect() {
  Features f;
#ifdef FLASHGQA_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  f.intel = b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;  // "Genu" "ineI" "ntel"
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1u;
  f.fma = (c >> 12) & 1u;
  f.f16c = (c >> 29) & 1u;
  if (osxsave) {
    const std::uint64_t xcr0 = read_xcr0();
    f.os_ymm = (xcr0 & 0x6u) == 0x6u;    // SSE and AVX state
    f.os_zmm = (xcr0 & 0xe6u) == 0xe6u;  // plus opmask, ZMM_Hi256, Hi16_ZMM
    f.os_amx = (xcr0 & 0x60000u) == 0x60000u;  // XTILECFG, XTILEDATA
  }
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = (b >> 5) & 1u;
    f.avx512f = (b >> 16) & 1u;
    f.avx512dq = (b >> 17) & 1u;
    f.avx512bw = (b >> 30) & 1u;
    f.avx512vl = (b >> 31) & 1u;
    f.avx512vnni = (c >> 11) & 1u;
    f.amx_bf16 = (d >> 22) & 1u;
    f.amx_tile = (d >> 24) & 1u;
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512bf16 = (a >> 5) & 1u;
  }
  if (f.os_amx && f.amx_tile && f.amx_bf16) f.os_amx = request_amx_permission();
#endif
#ifdef FLASHGQA_ARM_LINUX
  constexpr unsigned long kHwcapAsimd = 1ul << 1;  // HWCAP_ASIMD, <asm/hwcap.h>
  constexpr unsigned long kHwcap2Bf16 = 1ul << 14;  // HWCAP2_BF16
  f.asimd = (getauxval(AT_HWCAP) & kHwcapAsimd) != 0;
  f.bf16 = (getauxval(AT_HWCAP2) & kHwcap2Bf16) != 0;
#endif
  return f;
}

const Features& features() {
  static const Features f = detect();
  return f;
}

// Most portable first within each architecture (supported_isas, best_isa).
constexpr Isa kIsas[] = {Isa::portable, Isa::avx2, Isa::avx512f, Isa::avx512bf16, Isa::amx, Isa::neon, Isa::neon_bf16};
constexpr const char* kExpected = "expected amx, avx512bf16, avx512f, avx2, neon-bf16, neon or portable";

constexpr int kUnset = -1;
std::atomic<int> g_isa{kUnset};

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::portable: return "portable";
    case Isa::avx2: return "avx2";
    case Isa::avx512f: return "avx512f";
    case Isa::avx512bf16: return "avx512bf16";
    case Isa::amx: return "amx";
    case Isa::neon: return "neon";
    case Isa::neon_bf16: return "neon-bf16";
  }
  return "unknown";
}

Isa parse_isa(const std::string& name) {
  for (Isa isa : kIsas)
    if (name == isa_name(isa)) return isa;
  throw Error("isa: '" + name + "', " + kExpected);
}

bool isa_supported(Isa isa) {
  const Features& f = features();
  const bool avx2 = f.os_ymm && f.avx2 && f.fma && f.f16c;
  const bool avx512 = avx2 && f.os_zmm && f.avx512f && f.avx512dq && f.avx512bw && f.avx512vl;
  switch (isa) {
    case Isa::portable: return true;
    case Isa::avx2: return avx2;
    case Isa::avx512f: return avx512;
    case Isa::avx512bf16: return avx512 && f.avx512bf16 && f.avx512vnni;
    case Isa::amx: return avx512 && f.avx512bf16 && f.avx512vnni && f.amx_tile && f.amx_bf16 && f.os_amx;
    case Isa::neon: return f.asimd;
    case Isa::neon_bf16: return f.asimd && f.bf16;
  }
  return false;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : kIsas)
    if (isa_supported(isa)) out.push_back(isa);
  return out;
}

Isa best_isa() { return supported_isas().back(); }

bool bf16_dot_half_rate() { return features().intel; }

void set_isa(Isa isa) {
  if (!isa_supported(isa))
    throw Error(std::string("isa: '") + isa_name(isa) +
                "' is not supported by this CPU, expected one of the supported paths (best: " +
                isa_name(best_isa()) + ")");
  g_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}

void set_isa(const std::string& name) { set_isa(parse_isa(name)); }

Isa active_isa() {
  const int current = g_isa.load(std::memory_order_relaxed);
  if (current != kUnset) return static_cast<Isa>(current);
  Isa chosen = best_isa();
  if (const char* env = std::getenv("FLASHGQA_ISA"); env != nullptr && *env != '\0') {
    Isa requested = Isa::portable;
    try {
      requested = parse_isa(env);
    } catch (const Error&) {
      throw Error(std::string("FLASHGQA_ISA: '") + env + "', " + kExpected);
    }
    if (!isa_supported(requested))
      throw Error(std::string("FLASHGQA_ISA: '") + env +
                  "' is not supported by this CPU, expected one of the supported paths (best: " +
                  isa_name(best_isa()) + ")");
    chosen = requested;
  }
  int expected = kUnset;
  g_isa.compare_exchange_strong(expected, static_cast<int>(chosen), std::memory_order_relaxed);
  return static_cast<Isa>(g_isa.load(std::memory_order_relaxed));
}

}  // namespace flashgqa
