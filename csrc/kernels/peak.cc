// Register-only throughput loop of the ISA's INT8 dot instruction (the GEMM's roofline):
// vnni: vpdpbusd zmm (64 MACs), avx512: vpmaddwd+vpaddd zmm (32 MACs), avx2: ymm (16 MACs).
// 24 independent accumulators hide the latency. Returns the integer ops (2 per MAC) done.
#include "kernels.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {

double peak_i8(long iters) {
#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVX512) || defined(ZOI_ISA_AVX2)
  // inline asm: 24 independent accumulators (zmm/ymm 8..31 or ymm 4..15), sources in 0 and 1
  if (iters < 1) return 0;
#if defined(ZOI_ISA_VNNI)
#define ZOI_OP(r) "vpdpbusd %%zmm1, %%zmm0, %%zmm" #r "\n\t"
  constexpr double per_iter = 24 * 64;
#elif defined(ZOI_ISA_AVX512)
#define ZOI_OP(r) "vpmaddwd %%zmm1, %%zmm0, %%zmm2\n\tvpaddd %%zmm2, %%zmm" #r ", %%zmm" #r "\n\t"
  constexpr double per_iter = 24 * 32;
#endif
#if defined(ZOI_ISA_AVX2)
#undef ZOI_OP
#define ZOI_OP(r) "vpmaddwd %%ymm1, %%ymm0, %%ymm2\n\tvpaddd %%ymm2, %%ymm" #r ", %%ymm" #r "\n\t"
  constexpr double per_iter = 12 * 16;
  long n = iters;
  __asm__ volatile(
      "vpxor %%ymm0, %%ymm0, %%ymm0\n\tvpxor %%ymm1, %%ymm1, %%ymm1\n\t"
      "1:\n\t" ZOI_OP(3) ZOI_OP(4) ZOI_OP(5) ZOI_OP(6) ZOI_OP(7) ZOI_OP(8) ZOI_OP(9) ZOI_OP(10) ZOI_OP(11)
      ZOI_OP(12) ZOI_OP(13) ZOI_OP(14) "dec %0\n\tjnz 1b\n\t"
      : "+r"(n)
      :
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
        "xmm13", "xmm14", "cc");
#else
  long n = iters;
  __asm__ volatile(
      "vpxord %%zmm0, %%zmm0, %%zmm0\n\tvpxord %%zmm1, %%zmm1, %%zmm1\n\t"
      "1:\n\t" ZOI_OP(8) ZOI_OP(9) ZOI_OP(10) ZOI_OP(11) ZOI_OP(12) ZOI_OP(13) ZOI_OP(14) ZOI_OP(15) ZOI_OP(16)
      ZOI_OP(17) ZOI_OP(18) ZOI_OP(19) ZOI_OP(20) ZOI_OP(21) ZOI_OP(22) ZOI_OP(23) ZOI_OP(24) ZOI_OP(25) ZOI_OP(26)
      ZOI_OP(27) ZOI_OP(28) ZOI_OP(29) ZOI_OP(30) ZOI_OP(31) "dec %0\n\tjnz 1b\n\t"
      : "+r"(n)
      :
      : "xmm0", "xmm1", "xmm2", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16",
        "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28",
        "xmm29", "xmm30", "xmm31", "cc");
#endif
#undef ZOI_OP
  __asm__ volatile("vzeroupper" ::: "memory");
  return per_iter * 2 * static_cast<double>(iters);  // 2 ops per MAC
#else
  int32_t acc[8] = {0};
  for (long it = 0; it < iters; ++it)
    for (int i = 0; i < 8; ++i) acc[i] += static_cast<int32_t>(it) * (i + 1);
  volatile int32_t sink = acc[0] + acc[7];
  (void)sink;
  return static_cast<double>(iters) * 8 * 2;
#endif
}

}  // namespace ZOI_NS
}  // namespace zoi
