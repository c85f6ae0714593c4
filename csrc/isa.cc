#include "isa.h"

#if defined(ZOI_ARCH_X86)
#include <cpuid.h>
#endif
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(ZOI_ARCH_ARM64) && defined(__linux__)
#include <sys/auxv.h>

#include <fstream>
#endif
#if defined(ZOI_ARCH_ARM64) && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

namespace zoi {
namespace {

#if defined(ZOI_ARCH_X86)
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
#elif defined(ZOI_ARCH_ARM64)
#if defined(__linux__)
// the kernel's HWCAP bits (asm/hwcap.h), spelled out for older C libraries' headers
constexpr unsigned long kHwcapAsimd = 1ul << 1, kHwcapAsimddp = 1ul << 20, kHwcapSve = 1ul << 22;
constexpr unsigned long kHwcap2Sve2 = 1ul << 1, kHwcap2I8mm = 1ul << 13;

// "Neoverse-N1", ... from /proc/cpuinfo's first "CPU part" (Arm Ltd. cores; others by number)
std::string arm_brand() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, impl, part;
  while (std::getline(in, line) && (impl.empty() || part.empty())) {
    const size_t c = line.find(':');
    if (c == std::string::npos) continue;
    std::string v = line.substr(c + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    if (line.rfind("CPU implementer", 0) == 0 && impl.empty()) impl = v;
    if (line.rfind("CPU part", 0) == 0 && part.empty()) part = v;
  }
  if (part.empty()) return "";
  if (impl == "0x41") {
    static const struct { const char* part; const char* name; } kArm[] = {
        {"0xd03", "Cortex-A53"}, {"0xd05", "Cortex-A55"}, {"0xd07", "Cortex-A57"}, {"0xd08", "Cortex-A72"},
        {"0xd0b", "Cortex-A76"}, {"0xd0c", "Neoverse-N1"}, {"0xd40", "Neoverse-V1"}, {"0xd41", "Cortex-A78"},
        {"0xd46", "Cortex-A510"}, {"0xd47", "Cortex-A710"}, {"0xd49", "Neoverse-N2"}, {"0xd4f", "Neoverse-V2"},
        {"0xd8e", "Neoverse-N3"}, {"0xd84", "Neoverse-V3"}};
    for (const auto& k : kArm)
      if (part == k.part) return k.name;
  }
  return "implementer " + impl + " part " + part;
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__linux__)
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  f.asimd = hw & kHwcapAsimd;
  f.asimddp = hw & kHwcapAsimddp;
  f.sve = hw & kHwcapSve;
  f.sve2 = hw2 & kHwcap2Sve2;
  f.i8mm = hw2 & kHwcap2I8mm;
  f.vendor = "arm";
  f.brand = arm_brand();
#elif defined(__APPLE__)
  auto flag = [](const char* name) {
    int v = 0;
    size_t len = sizeof(v);
    return sysctlbyname(name, &v, &len, nullptr, 0) == 0 && v != 0;
  };
  f.asimd = true;  // Advanced SIMD is part of every Apple arm64 CPU (and of the arm64 ABI)
  f.asimddp = flag("hw.optional.arm.FEAT_DotProd");
  f.i8mm = flag("hw.optional.arm.FEAT_I8MM");
  f.vendor = "apple";
  char brand[128] = {0};
  size_t len = sizeof(brand) - 1;
  if (sysctlbyname("machdep.cpu.brand_string", brand, &len, nullptr, 0) == 0) f.brand = brand;
#else
  f.asimd = true;  // other aarch64 systems: Advanced SIMD only (the arm64 ABIs require it)
#endif
  return f;
}
#else
CpuFeatures detect() { return CpuFeatures{}; }  // portable build: the scalar table only
#endif

bool request_amx() {
#if defined(ZOI_ARCH_X86) && defined(__linux__) && defined(SYS_arch_prctl)
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
    // x86 builds have no ARM tables and aarch64 builds no x86 ones: the features of the other
    // architecture are never set, so those ISAs are never supported
    case Isa::Neon: return f.asimd;
    case Isa::Dotprod: return f.asimd && f.asimddp;
    case Isa::I8mm: return f.asimd && f.asimddp && f.i8mm;
  }
  return false;
}

Isa best_isa() {
  // AVX-VNNI (Alder Lake+, Zen 5 client) after AVX-512: a CPU with both has AVX-512 VNNI too.
  // amx first: cpuid AMX-TILE + AMX-INT8, XCR0 tile state, and Linux's XTILEDATA permission
  // (refused: vnni). Its GEMM is bit-identical to vnni's (tests/cpu/test_amx.py).
  for (Isa i : {Isa::Amx, Isa::Vnni, Isa::Avx512, Isa::AvxVnni, Isa::Avx2, Isa::I8mm, Isa::Dotprod, Isa::Neon})
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
    case Isa::Neon: return "neon";
    case Isa::Dotprod: return "dotprod";
    case Isa::I8mm: return "i8mm";
  }
  return "?";
}

bool parse_isa(const std::string& s, Isa* out) {
  for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Vnni, Isa::AvxVnni, Isa::Amx, Isa::Neon, Isa::Dotprod,
                Isa::I8mm})
    if (s == isa_name(i)) { *out = i; return true; }
  return false;
}

namespace {
std::atomic<int> g_forced_isa{-1};  // an Isa, or -1: best_isa()
std::atomic<int> g_amx_min_m{kAmxMinMDefault};
std::atomic<long> g_amx_nt_bytes{kAmxNtBytesDefault};
}  // namespace

void set_forced_isa(const std::string& name) {
  if (name.empty()) {
    g_forced_isa.store(-1, std::memory_order_relaxed);
    return;
  }
  Isa want;
  if (!parse_isa(name, &want))
    throw std::invalid_argument("isa '" + name +
#if defined(ZOI_ARCH_ARM64)
                                "' is not one of i8mm, dotprod, neon, scalar");
#else
                                "' is not one of amx, vnni, avx512, avxvnni, avx2, scalar");
#endif
  if (!isa_supported(want))
    throw std::invalid_argument("isa '" + name + "' is not supported by this CPU (best: " + isa_name(best_isa()) + ")");
  g_forced_isa.store(static_cast<int>(want), std::memory_order_relaxed);
}

Isa active_isa() {
  const int v = g_forced_isa.load(std::memory_order_relaxed);
  return v < 0 ? best_isa() : static_cast<Isa>(v);
}

void set_amx_thresholds(int min_m, long nt_bytes) {
  if (min_m < 1) throw std::invalid_argument("amx_min_m must be >= 1, got " + std::to_string(min_m));
  if (nt_bytes < 0) throw std::invalid_argument("amx_nt_bytes must be >= 0 (0: never), got " + std::to_string(nt_bytes));
  g_amx_min_m.store(min_m, std::memory_order_relaxed);
  g_amx_nt_bytes.store(nt_bytes, std::memory_order_relaxed);
}

int amx_min_m_option() { return g_amx_min_m.load(std::memory_order_relaxed); }
long amx_nt_bytes_option() { return g_amx_nt_bytes.load(std::memory_order_relaxed); }

}  // namespace zoi
