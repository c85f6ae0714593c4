// Per-row symmetric INT8 quantisation into the ISA's GEMM A format (see kernels.h):
//   amax = max|x| (or the static amax), inv = 127 / amax (float32; amax 0 -> q = 0, scale 0),
//   q = clip(rint(x * inv), -127, 127), scale = amax / 127  -- exactly zoi.quant.primitives.
#pragma once
#include "kernels.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {

inline float row_absmax(const float* x, int K) {
  V::T m = V::zero();
  int k = 0;
  for (; k + V::N <= K; k += V::N) m = V::max(m, V::abs(V::load(x + k)));
  if (k < K) m = V::max(m, V::abs(V::load_n(x + k, K - k)));
  return V::hmax(m);
}

// x [K] -> q row (ldq >= round_up(K, KG) elements, padding written) ; returns the scale
inline float quantize_row(const float* x, int K, void* qrow, int ldq, float static_amax) {
  const float amax = static_amax >= 0.f ? static_amax : row_absmax(x, K);
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  const V::T vinv = V::set(inv), lo = V::set(-127.f), hi = V::set(127.f);
  int k = 0;
#if defined(ZOI_ISA_VNNI)
  uint8_t* q = static_cast<uint8_t*>(qrow);
  const __m512i off = _mm512_set1_epi32(128);
  for (; k < K; k += 16) {
    const int n = K - k;
    V::T t = V::min(V::max(V::round(V::mul(V::load_n(x + k, n), vinv)), lo), hi);
    __m512i i = _mm512_add_epi32(_mm512_cvttps_epi32(t), off);
    _mm512_mask_cvtepi32_storeu_epi8(q + k, V16::mask(n), i);
  }
  for (k = K; k < ldq; ++k) q[k] = 128;
#elif defined(ZOI_ISA_AVX512)
  int16_t* q = static_cast<int16_t*>(qrow);
  for (; k < K; k += 16) {
    const int n = K - k;
    V::T t = V::min(V::max(V::round(V::mul(V::load_n(x + k, n), vinv)), lo), hi);
    _mm512_mask_cvtepi32_storeu_epi16(q + k, V16::mask(n), _mm512_cvttps_epi32(t));
  }
  for (k = K; k < ldq; ++k) q[k] = 0;
#elif defined(ZOI_ISA_AVX2)
  int16_t* q = static_cast<int16_t*>(qrow);
  for (; k + 8 <= K; k += 8) {
    V::T t = V::min(V::max(V::round(V::mul(V::load(x + k), vinv)), lo), hi);
    __m256i i = _mm256_cvttps_epi32(t);
    __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + k), p);
  }
  for (; k < K; ++k) q[k] = static_cast<int16_t>(S1::min(S1::max(S1::round(x[k] * inv), -127.f), 127.f));
  for (k = K; k < ldq; ++k) q[k] = 0;
#else
  int16_t* q = static_cast<int16_t*>(qrow);
  (void)vinv; (void)lo; (void)hi;
  for (; k < K; ++k) q[k] = static_cast<int16_t>(S1::min(S1::max(S1::round(x[k] * inv), -127.f), 127.f));
  for (k = K; k < ldq; ++k) q[k] = 0;
#endif
  return amax / 127.f;
}

inline void* qrow_ptr(const QuantOut& qo, int row) {
#if defined(ZOI_ISA_VNNI)
  return static_cast<uint8_t*>(qo.q) + static_cast<size_t>(row) * qo.ldq;
#else
  return static_cast<int16_t*>(qo.q) + static_cast<size_t>(row) * qo.ldq;
#endif
}

}  // namespace ZOI_NS
}  // namespace zoi
