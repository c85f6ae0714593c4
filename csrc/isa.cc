#include "isa.h"

#include <cpuid.h>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace zoi {
namespace {

unsigned long long xgetbv0() {
  unsigned int eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<unsigned long long>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned int a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  unsigned int max_leaf = a;
  char vendor[13];
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  vendor[12] = 0;
  f.vendor = vendor;
  __get_cpuid(1, &a, &b, &c, &d);
  bool osxsave = c & (1u << 27);
  f.fma = c & (1u << 12);
  bool avx = c & (1u << 28);
  if (osxsave && avx) {
    unsigned long long xcr0 = xgetbv0();
    f.os_avx = (xcr0 & 0x6) == 0x6;              // XMM + YMM state
    f.os_avx512 = (xcr0 & 0xE6) == 0xE6;         // + opmask, ZMM_Hi256, Hi16_ZMM
    f.os_amx = (xcr0 & 0x60000) == 0x60000;      // XTILECFG (17) + XTILEDATA (18)
  }
  if (max_leaf >= 7) {
    __get_cpuid_count(7, 0, &a, &b, &c, &d);
    f.avx2 = f.os_avx && (b & (1u << 5));
    f.avx512f = f.os_avx512 && (b & (1u << 16));
    f.avx512bw = f.os_avx512 && (b & (1u << 30));
    f.avx512vl = f.os_avx512 && (b & (1u << 31));
    f.avx512vnni = f.os_avx512 && (c & (1u << 11));
    f.amx_tile = f.os_amx && (d & (1u << 24));
    f.amx_int8 = f.os_amx && (d & (1u << 25));
    __get_cpuid_count(7, 1, &a, &b, &c, &d);
    f.avx_vnni = f.os_avx && (a & (1u << 4));
  }
  f.fma = f.fma && f.os_avx;
  unsigned int ext = __get_cpuid_max(0x80000000, nullptr);
  if (ext >= 0x80000004) {
    char brand[49] = {0};
    for (unsigned int i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002 + i, &a, &b, &c, &d);
      std::memcpy(brand + 16 * i, &a, 4);
      std::memcpy(brand + 16 * i + 4, &b, 4);
      std::memcpy(brand + 16 * i + 8, &c, 4);
      std::memcpy(brand + 16 * i + 12, &d, 4);
    }
    f.brand = brand;
    while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
    size_t s = f.brand.find_first_not_of(' ');
    f.brand = s == std::string::npos ? "" : f.brand.substr(s);
  }
  return f;
}

bool request_amx() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr long kReqXcompPerm = 0x1023, kGetXcompPerm = 0x1022, kXtiledata = 18;
  if (syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) != 0) return false;
  unsigned long long mask = 0;
  if (syscall(SYS_arch_prctl, kGetXcompPerm, &mask) != 0) return false;
  return (mask >> kXtiledata) & 1;
#else
  return false;
#endif
}

}  // namespace

bool amx_permission() {
  static const bool ok = [] {
    const CpuFeatures& f = cpu_features();
    return f.amx_tile && f.amx_int8 && request_amx();
  }();
  return ok;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

bool isa_supported(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2: return f.avx2 && f.fma;
    case Isa::Avx512: return f.avx512f && f.avx512bw && f.avx512vl && f.fma;
    case Isa::Vnni: return f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni && f.fma;
    case Isa::AvxVnni: return f.avx2 && f.fma && f.avx_vnni;
    case Isa::Amx: return isa_supported(Isa::Vnni) && f.amx_tile && f.amx_int8 && amx_permission();
  }
  return false;
}

Isa best_isa() {
  // AVX-VNNI (Alder Lake+, Zen 5 client) after AVX-512: a CPU with both has AVX-512 VNNI too.
  // amx first: cpuid AMX-TILE + AMX-INT8, XCR0 tile state, and Linux's XTILEDATA permission
  // (refused: vnni). Its GEMM is bit-identical to vnni's (tests/cpu/test_amx.py).
  for (Isa i : {Isa::Amx, Isa::Vnni, Isa::Avx512, Isa::AvxVnni, Isa::Avx2})
    if (isa_supported(i)) return i;
  return Isa::Scalar;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Vnni: return "vnni";
    case Isa::AvxVnni: return "avxvnni";
    case Isa::Amx: return "amx";
  }
  return "?";
}

bool parse_isa(const std::string& s, Isa* out) {
  for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Vnni, Isa::AvxVnni, Isa::Amx})
    if (s == isa_name(i)) { *out = i; return true; }
  return false;
}

Isa active_isa() {
  const char* env = std::getenv("ZOI_CPU_ISA");
  if (env && *env) {
    Isa want;
    if (!parse_isa(env, &want))
      throw std::invalid_argument(std::string("ZOI_CPU_ISA=") + env +
                                  " is not one of amx, vnni, avx512, avxvnni, avx2, scalar");
    if (!isa_supported(want))
      throw std::invalid_argument(std::string("ZOI_CPU_ISA=") + env +
                                  " is not supported by this CPU (best: " + isa_name(best_isa()) + ")");
    return want;
  }
  return best_isa();
}

}  // namespace zoi
