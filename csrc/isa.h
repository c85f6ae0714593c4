// CPU feature detection (cpuid + xgetbv) and the ISA the dispatcher picks.
#pragma once
#include <string>

namespace zoi {

// AvxVnni: AVX2 + VEX vpdpbusd ymm; Amx: the vnni kernels + the AMX-INT8 tile GEMM (tdpbusd)
enum class Isa : int { Scalar = 0, Avx2 = 1, Avx512 = 2, Vnni = 3, AvxVnni = 4, Amx = 5 };

struct CpuFeatures {
  bool avx2 = false, fma = false, avx512f = false, avx512bw = false, avx512vl = false,
       avx512vnni = false, avx_vnni = false, os_avx = false, os_avx512 = false,
       amx_tile = false, amx_int8 = false, os_amx = false;  // os_amx: XCR0 bits 17-18 (XTILECFG, XTILEDATA)
  std::string vendor, brand;
};

const CpuFeatures& cpu_features();
Isa best_isa();                 // best ISA this CPU + OS support
Isa active_isa();               // best_isa(), or ZOI_CPU_ISA when set (and supported)
bool isa_supported(Isa isa);
const char* isa_name(Isa isa);  // "scalar" | "avx2" | "avx512" | "vnni" | "avxvnni" | "amx"
// Linux: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) once per process (the first call
// asks, later calls return the answer); false when refused or not Linux. isa_supported(Amx) needs it.
bool amx_permission();
bool parse_isa(const std::string& s, Isa* out);

}  // namespace zoi
