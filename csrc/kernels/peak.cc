// Register-only throughput loop of the ISA's INT8 dot instruction (the GEMM's roofline):
// vnni: vpdpbusd zmm (64 MACs), avx512: vpmaddwd+vpaddd zmm (32 MACs), avx2: ymm (16 MACs).
// 24 independent accumulators hide the latency. Returns the integer ops (2 per MAC) done.
#include "kernels.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {

double peak_i8(long iters) {
#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVX512) || defined(ZOI_ISA_AVX2)
#if defined(ZOI_ISA_AVX2)
  using IV = __m256i;
  constexpr double macs = 16;
#define ZOI_SET1(x) _mm256_set1_epi32(x)
#elif defined(ZOI_ISA_VNNI)
  using IV = __m512i;
  constexpr double macs = 64;
#define ZOI_SET1(x) _mm512_set1_epi32(x)
#else
  using IV = __m512i;
  constexpr double macs = 32;
#define ZOI_SET1(x) _mm512_set1_epi32(x)
#endif
  IV acc[24];
  for (int i = 0; i < 24; ++i) acc[i] = ZOI_SET1(i);
  IV a = ZOI_SET1(0x01010101), b = ZOI_SET1(0x02010201);
  for (long it = 0; it < iters; ++it) {
    for (int i = 0; i < 24; ++i) {
#if defined(ZOI_ISA_VNNI)
      acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
#elif defined(ZOI_ISA_AVX512)
      acc[i] = _mm512_add_epi32(acc[i], _mm512_madd_epi16(a, b));
#else
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(a, b));
#endif
    }
    __asm__ volatile("" : "+x"(a));  // keep the loop from being folded
  }
  IV s = acc[0];
  for (int i = 1; i < 24; ++i) {
#if defined(ZOI_ISA_AVX2)
    s = _mm256_add_epi32(s, acc[i]);
#else
    s = _mm512_add_epi32(s, acc[i]);
#endif
  }
  alignas(64) int32_t tmp[16];
  std::memcpy(tmp, &s, sizeof(s));
  volatile int32_t sink = tmp[0];
  (void)sink;
#undef ZOI_SET1
  return static_cast<double>(iters) * 24 * macs * 2;
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
