// Register-only throughput loop of the ISA's INT8 dot sequence (the GEMM's roofline), the very
// instructions of the gemm_int8.cc micro-kernel:
//   vnni:   vpdpbusd zmm (64 MACs), 24 independent accumulators
//   avxvnni: {vex} vpdpbusd ymm (32 MACs), 14 independent accumulators
//   avx512: sign trick, zmm: vpblendmb (w * sign(a) from w, -w), vpmaddubsw, vpmaddwd (ones), vpaddd (64 MACs)
//   avx2:   sign trick, ymm: vpsignb, vpmaddubsw, vpmaddwd (ones), vpaddd (32 MACs)
//   aarch64: neon smull, smlal, smull2, smlal2, 2 sadalp (32 MACs); dotprod sdot by element (16
//           MACs); i8mm smmla (32 MACs); 24 independent accumulators each
// Independent accumulators hide the latency. Returns the integer ops (2 per MAC) done.
#include "kernels.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {

double peak_i8(long iters) {
#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVX512) || defined(ZOI_ISA_AVX2)
  if (iters < 1) return 0;
  long n = iters;
#if defined(ZOI_ISA_AVXVNNI)
  // ymm 2..15 accumulate ({vex}: the AVX-VNNI encoding, not the EVEX AVX512-VL one)
#define ZOI_OP(r) "%{vex%} vpdpbusd %%ymm1, %%ymm0, %%ymm" #r "\n\t"
  constexpr double per_iter = 14 * 32;
  __asm__ volatile(
      "vpxor %%ymm0, %%ymm0, %%ymm0\n\tvpxor %%ymm1, %%ymm1, %%ymm1\n\t"
      "1:\n\t" ZOI_OP(2) ZOI_OP(3) ZOI_OP(4) ZOI_OP(5) ZOI_OP(6) ZOI_OP(7) ZOI_OP(8) ZOI_OP(9) ZOI_OP(10)
      ZOI_OP(11) ZOI_OP(12) ZOI_OP(13) ZOI_OP(14) ZOI_OP(15) "dec %0\n\tjnz 1b\n\t"
      : "+r"(n)
      :
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
        "xmm13", "xmm14", "xmm15", "cc");
#elif defined(ZOI_ISA_VNNI)
  // zmm 8..31 accumulate, sources in 0 and 1
#define ZOI_OP(r) "vpdpbusd %%zmm1, %%zmm0, %%zmm" #r "\n\t"
  constexpr double per_iter = 24 * 64;
  __asm__ volatile(
      "vpxord %%zmm0, %%zmm0, %%zmm0\n\tvpxord %%zmm1, %%zmm1, %%zmm1\n\t"
      "1:\n\t" ZOI_OP(8) ZOI_OP(9) ZOI_OP(10) ZOI_OP(11) ZOI_OP(12) ZOI_OP(13) ZOI_OP(14) ZOI_OP(15) ZOI_OP(16)
      ZOI_OP(17) ZOI_OP(18) ZOI_OP(19) ZOI_OP(20) ZOI_OP(21) ZOI_OP(22) ZOI_OP(23) ZOI_OP(24) ZOI_OP(25) ZOI_OP(26)
      ZOI_OP(27) ZOI_OP(28) ZOI_OP(29) ZOI_OP(30) ZOI_OP(31) "dec %0\n\tjnz 1b\n\t"
      : "+r"(n)
      :
      : "xmm0", "xmm1", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16",
        "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28",
        "xmm29", "xmm30", "xmm31", "cc");
#elif defined(ZOI_ISA_AVX512)
  // zmm0 a (k1: a < 0), zmm1 |a|, zmm2 w, zmm3 ones, zmm4 -w; temporaries zmm5..7 (t = k1 ? -w : w);
  // accumulators zmm8..31
#define ZOI_OP(t, r)                                                                             \
  "vpblendmb %%zmm4, %%zmm2, %%zmm" #t "%{%%k1%}\n\t"                                            \
  "vpmaddubsw %%zmm" #t ", %%zmm1, %%zmm" #t "\n\tvpmaddwd %%zmm3, %%zmm" #t ", %%zmm" #t "\n\t" \
  "vpaddd %%zmm" #t ", %%zmm" #r ", %%zmm" #r "\n\t"
  constexpr double per_iter = 24 * 64;
  __asm__ volatile(
      "vpxord %%zmm0, %%zmm0, %%zmm0\n\tvpxord %%zmm1, %%zmm1, %%zmm1\n\tvpxord %%zmm2, %%zmm2, %%zmm2\n\t"
      "vpxord %%zmm3, %%zmm3, %%zmm3\n\tvpxord %%zmm4, %%zmm4, %%zmm4\n\tvpmovb2m %%zmm0, %%k1\n\t"
      "1:\n\t" ZOI_OP(5, 8) ZOI_OP(6, 9) ZOI_OP(7, 10) ZOI_OP(5, 11) ZOI_OP(6, 12) ZOI_OP(7, 13) ZOI_OP(5, 14)
      ZOI_OP(6, 15) ZOI_OP(7, 16) ZOI_OP(5, 17) ZOI_OP(6, 18) ZOI_OP(7, 19) ZOI_OP(5, 20) ZOI_OP(6, 21) ZOI_OP(7, 22)
      ZOI_OP(5, 23) ZOI_OP(6, 24) ZOI_OP(7, 25) ZOI_OP(5, 26) ZOI_OP(6, 27) ZOI_OP(7, 28) ZOI_OP(5, 29) ZOI_OP(6, 30)
      ZOI_OP(7, 31) "dec %0\n\tjnz 1b\n\t"
      : "+r"(n)
      :
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
        "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24",
        "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31", "k1", "cc");
#else
  // ymm0 a, ymm1 |a|, ymm2 w, ymm3 ones; temporaries ymm4..7; accumulators ymm8..15
#define ZOI_OP(t, r)                                                                             \
  "vpsignb %%ymm0, %%ymm2, %%ymm" #t "\n\tvpmaddubsw %%ymm" #t ", %%ymm1, %%ymm" #t "\n\t"       \
  "vpmaddwd %%ymm3, %%ymm" #t ", %%ymm" #t "\n\tvpaddd %%ymm" #t ", %%ymm" #r ", %%ymm" #r "\n\t"
  constexpr double per_iter = 8 * 32;
  __asm__ volatile(
      "vpxor %%ymm0, %%ymm0, %%ymm0\n\tvpxor %%ymm1, %%ymm1, %%ymm1\n\tvpxor %%ymm2, %%ymm2, %%ymm2\n\t"
      "vpxor %%ymm3, %%ymm3, %%ymm3\n\t"
      "1:\n\t" ZOI_OP(4, 8) ZOI_OP(5, 9) ZOI_OP(6, 10) ZOI_OP(7, 11) ZOI_OP(4, 12) ZOI_OP(5, 13) ZOI_OP(6, 14)
      ZOI_OP(7, 15) "dec %0\n\tjnz 1b\n\t"
      : "+r"(n)
      :
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
        "xmm13", "xmm14", "xmm15", "cc");
#endif
#undef ZOI_OP
  __asm__ volatile("vzeroupper" ::: "memory");
  return per_iter * 2 * static_cast<double>(iters);  // 2 ops per MAC
#elif defined(ZOI_ISA_NEON)
  if (iters < 1) return 0;
  long n = iters;
#define ZOI_ACC24(OP)                                                                                  \
  OP(8) OP(9) OP(10) OP(11) OP(12) OP(13) OP(14) OP(15) OP(16) OP(17) OP(18) OP(19) OP(20) OP(21) OP(22) \
  OP(23) OP(24) OP(25) OP(26) OP(27) OP(28) OP(29) OP(30) OP(31)
#if defined(ZOI_ISA_I8MM)
#define ZOI_OP(r) "smmla v" #r ".4s, v0.16b, v1.16b\n\t"
  constexpr double per_iter = 24 * 32;
  __asm__ volatile("movi v0.16b, #1\n\tmovi v1.16b, #1\n\t"
                   "1:\n\t" ZOI_ACC24(ZOI_OP) "subs %x0, %x0, #1\n\tb.ne 1b\n\t"
                   : "+r"(n)
                   :
                   : "v0", "v1", "v8", "v9", "v10", "v11", "v12", "v13", "v14", "v15", "v16", "v17", "v18", "v19",
                     "v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27", "v28", "v29", "v30", "v31", "cc");
#elif defined(ZOI_ISA_DOTPROD)
#define ZOI_OP(r) "sdot v" #r ".4s, v0.16b, v1.4b[0]\n\t"
  constexpr double per_iter = 24 * 16;
  __asm__ volatile("movi v0.16b, #1\n\tmovi v1.16b, #1\n\t"
                   "1:\n\t" ZOI_ACC24(ZOI_OP) "subs %x0, %x0, #1\n\tb.ne 1b\n\t"
                   : "+r"(n)
                   :
                   : "v0", "v1", "v8", "v9", "v10", "v11", "v12", "v13", "v14", "v15", "v16", "v17", "v18", "v19",
                     "v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27", "v28", "v29", "v30", "v31", "cc");
#else
  // the GEMM's sequence per weight vector and 2 groups: v0 / v1 the A broadcasts, v2 / v3 the weights;
  // temporaries v4..v7 (2 blocks in flight), accumulators v8..v31 in pairs (lo, hi)
#define ZOI_OP2(t, u, r, s)                                                                  \
  "smull v" #t ".8h, v0.8b, v2.8b\n\tsmull2 v" #u ".8h, v0.16b, v2.16b\n\t"                 \
  "smlal v" #t ".8h, v1.8b, v3.8b\n\tsmlal2 v" #u ".8h, v1.16b, v3.16b\n\t"                 \
  "sadalp v" #r ".4s, v" #t ".8h\n\tsadalp v" #s ".4s, v" #u ".8h\n\t"
  constexpr double per_iter = 12 * 32;
  __asm__ volatile("movi v0.16b, #1\n\tmovi v1.16b, #1\n\tmovi v2.16b, #1\n\tmovi v3.16b, #1\n\t"
                   "1:\n\t" ZOI_OP2(4, 5, 8, 9) ZOI_OP2(6, 7, 10, 11) ZOI_OP2(4, 5, 12, 13) ZOI_OP2(6, 7, 14, 15)
                   ZOI_OP2(4, 5, 16, 17) ZOI_OP2(6, 7, 18, 19) ZOI_OP2(4, 5, 20, 21) ZOI_OP2(6, 7, 22, 23)
                   ZOI_OP2(4, 5, 24, 25) ZOI_OP2(6, 7, 26, 27) ZOI_OP2(4, 5, 28, 29) ZOI_OP2(6, 7, 30, 31)
                   "subs %x0, %x0, #1\n\tb.ne 1b\n\t"
                   : "+r"(n)
                   :
                   : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "v12", "v13", "v14",
                     "v15", "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27", "v28",
                     "v29", "v30", "v31", "cc");
#undef ZOI_OP2
#endif
#undef ZOI_OP
#undef ZOI_ACC24
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
