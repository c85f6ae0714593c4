// Per-row INT8 quantisation into the ISA's GEMM A format (see kernels.h), exactly
// zoi.quant.primitives (every step in float32, round half to even):
//   x' = (x - shift) * mul                                   (optional, two roundings)
//   symmetric:  amax = max|x'| (or the static amax), inv = 127 / amax (amax 0 -> q 0, scale 0),
//               q = clip(rint(x' * inv), -127, 127), scale = amax / 127
//   asymmetric: lo = min(min x', 0), hi = max(max x', 0), r = hi - lo, inv = 255 / r (r 0 -> 0),
//               zp = clip(rint(-lo * inv), 0, 255), q = clip(rint(x' * inv) + zp, 0, 255),
//               scale = r / 255
#pragma once
#include "kernels.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {

#if defined(ZOI_ISA_VNNI)
constexpr bool kA8 = true;  // u8 A rows
#else
constexpr bool kA8 = false;  // s16 A rows
#endif

template <class W>
inline typename W::T qx_load(const float* x, const QuantOut& qo, int k, int n) {
  typename W::T v = W::load_n(x + k, n);
  if (qo.shift) v = W::sub(v, W::load_n(qo.shift + k, n));
  if (qo.mul) v = W::mul(v, W::load_n(qo.mul + k, n));
  return v;
}

// stores lanes [k, k+n) of integer-valued floats t (already in the stored range)
inline void q_store(void* qrow, int k, V::T t, int n) {
#if defined(ZOI_ISA_VNNI)
  _mm512_mask_cvtepi32_storeu_epi8(static_cast<uint8_t*>(qrow) + k, V16::mask(n), _mm512_cvttps_epi32(t));
#elif defined(ZOI_ISA_AVX512)
  _mm512_mask_cvtepi32_storeu_epi16(static_cast<int16_t*>(qrow) + k, V16::mask(n), _mm512_cvttps_epi32(t));
#else
  alignas(32) float tmp[V::N];
  V::store(tmp, t);
  int16_t* q = static_cast<int16_t*>(qrow) + k;
  for (int e = 0; e < n && e < V::N; ++e) q[e] = static_cast<int16_t>(tmp[e]);
#endif
}

// x [K] -> stored row (ldq >= round_up(K, KG) elements, padding written); returns a_scale, *zp_out
inline float quantize_row(const float* x, int K, void* qrow, const QuantOut& qo, int32_t* zp_out) {
  using T = V::T;
  float inv, scale, zpf, lo_clip, hi_clip, off;
  if (qo.asym) {
    T mn = V::zero(), mx = V::zero();  // the range always includes 0
    for (int k = 0; k < K; k += V::N) {
      T v = qx_load<V>(x, qo, k, K - k);  // masked lanes are 0: harmless here
      mn = V::min(mn, v);
      mx = V::max(mx, v);
    }
    const float lo = -V::hmax(V::sub(V::zero(), mn)), hi = V::hmax(mx);
    const float r = hi - lo;
    inv = r > 0.f ? 255.f / r : 0.f;
    zpf = S1::min(S1::max(S1::round(-lo * inv), 0.f), 255.f);
    scale = r / 255.f;
    lo_clip = 0.f;
    hi_clip = 255.f;
    off = 0.f;
    *zp_out = static_cast<int32_t>(zpf);
  } else {
    float amax = qo.static_amax;
    if (amax < 0.f) {
      T m = V::zero();
      for (int k = 0; k < K; k += V::N) m = V::max(m, V::abs(qx_load<V>(x, qo, k, K - k)));
      amax = V::hmax(m);
    }
    inv = amax > 0.f ? 127.f / amax : 0.f;
    scale = amax / 127.f;
    zpf = 0.f;
    lo_clip = -127.f;
    hi_clip = 127.f;
    off = kA8 ? 128.f : 0.f;  // vnni stores q + 128 (u8)
    *zp_out = kA8 ? 128 : 0;
  }
  const T vinv = V::set(inv), vzp = V::set(zpf), vlo = V::set(lo_clip), vhi = V::set(hi_clip), voff = V::set(off);
  for (int k = 0; k < K; k += V::N) {
    const int n = K - k;
    T t = V::add(V::round(V::mul(qx_load<V>(x, qo, k, n), vinv)), vzp);
    t = V::add(V::min(V::max(t, vlo), vhi), voff);
    q_store(qrow, k, t, n);
  }
  // padding: the stored value of a zero (its weight is 0 anyway)
  const int pad = static_cast<int>(off + zpf);
  if (kA8)
    for (int k = K; k < qo.ldq; ++k) static_cast<uint8_t*>(qrow)[k] = static_cast<uint8_t>(pad);
  else
    for (int k = K; k < qo.ldq; ++k) static_cast<int16_t*>(qrow)[k] = static_cast<int16_t>(pad);
  return scale;
}

inline void* qrow_ptr(const QuantOut& qo, int row) {
  if (kA8) return static_cast<uint8_t*>(qo.q) + static_cast<size_t>(row) * qo.ldq;
  return static_cast<int16_t*>(qo.q) + static_cast<size_t>(row) * qo.ldq;
}

inline void quantize_into(const float* x, int K, const QuantOut& qo, int row) {
  qo.scale[row] = quantize_row(x, K, qrow_ptr(qo, row), qo, qo.zp + row);
}

}  // namespace ZOI_NS
}  // namespace zoi
