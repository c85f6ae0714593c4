// CPU feature detection and the ISA the dispatcher picks: cpuid + xgetbv on x86-64; on aarch64 the
// kernel's hardware capabilities (Linux getauxval, macOS sysctl).
#pragma once
#include <string>

// The architecture of this build: which ISA kernel tables CMake compiled in (CMakeLists.txt picks
// them from CMAKE_SYSTEM_PROCESSOR; any other architecture gets the portable scalar table only).
#if defined(__x86_64__) || defined(_M_X64)
#define ZOI_ARCH_X86 1
#elif defined(__aarch64__) || defined(_M_ARM64)
#define ZOI_ARCH_ARM64 1
#endif

namespace zoi {

// AvxVnni: AVX2 + VEX vpdpbusd ymm; Amx: the vnni kernels + the AMX-INT8 tile GEMM (tdpbusd).
// aarch64: Neon (Armv8.0 Advanced SIMD), Dotprod (+ sdot, Armv8.2 FEAT_DotProd), I8mm (+ smmla,
// FEAT_I8MM); each one a superset of the one before.
enum class Isa : int { Scalar = 0, Avx2 = 1, Avx512 = 2, Vnni = 3, AvxVnni = 4, Amx = 5, Neon = 6, Dotprod = 7, I8mm = 8 };

struct CpuFeatures {
  bool avx2 = false, fma = false, avx512f = false, avx512bw = false, avx512vl = false,
       avx512vnni = false, avx_vnni = false, os_avx = false, os_avx512 = false,
       amx_tile = false, amx_int8 = false, os_amx = false;  // os_amx: XCR0 bits 17-18 (XTILECFG, XTILEDATA)
  // aarch64 (Linux HWCAP names): asimd, asimddp (sdot / udot), i8mm (smmla / usmmla), sve, sve2
  bool asimd = false, asimddp = false, i8mm = false, sve = false, sve2 = false;
  std::string vendor, brand;
};

const CpuFeatures& cpu_features();
Isa best_isa();                 // best ISA this CPU + OS support
Isa active_isa();               // best_isa(), or the ISA set_forced_isa chose
bool isa_supported(Isa isa);
// "scalar" | "avx2" | "avx512" | "vnni" | "avxvnni" | "amx" | "neon" | "dotprod" | "i8mm"
const char* isa_name(Isa isa);
// Linux: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) once per process (the first call
// asks, later calls return the answer); false when refused or not Linux. isa_supported(Amx) needs it.
bool amx_permission();
bool parse_isa(const std::string& s, Isa* out);  // any name above, whether or not this build has it

// The CPU options (zoi.backends.cpu.options.CpuOptions): set from Python, at the API's edge, before an
// engine is built; the core reads no environment variable. Process-wide, like the thread pool.
// The ISA an engine of isa "" (and active_isa) uses: "" = best_isa(); a name this CPU lacks or an
// unknown one throws std::invalid_argument (the setting is kept).
void set_forced_isa(const std::string& name);
// The AMX-INT8 GEMM's thresholds (kernels/gemm_amx.cc): below min_m rows, vnni's kernel (measured:
// lab/cpu/README.md "AMX"); float outputs of nt_bytes or more leave through streaming stores (0:
// never). Read at every GEMM call. min_m < 1 or nt_bytes < 0 throws std::invalid_argument.
constexpr int kAmxMinMDefault = 16;
constexpr long kAmxNtBytesDefault = 12l << 20;
void set_amx_thresholds(int min_m, long nt_bytes);
int amx_min_m_option();
long amx_nt_bytes_option();

}  // namespace zoi
