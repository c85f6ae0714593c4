// Tiny SIMD layer: one vector type per ISA (V), plus a scalar one (S1), with the same
// static functions. Every elementwise kernel and the math below is written once over V
// and compiled per ISA (this header is included by files built with -DZOI_ISA_<X>).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels.h"

#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVX512) || defined(ZOI_ISA_AVX2)
#include <immintrin.h>
#elif defined(ZOI_ISA_NEON)
#include <arm_neon.h>
#endif

#define ZOI_INLINE inline __attribute__((always_inline))

namespace zoi {
namespace ZOI_NS {

struct S1 {  // one float lane: scalar fallback and loop tails
  using T = float;
  static constexpr int N = 1;
  static T zero() { return 0.f; }
  static T set(float x) { return x; }
  static T load(const float* p) { return *p; }
  static void store(float* p, T x) { *p = x; }
  static T load_n(const float* p, int n) { return n > 0 ? *p : 0.f; }
  static void store_n(float* p, T x, int n) { if (n > 0) *p = x; }
  static T add(T a, T b) { return a + b; }
  static T sub(T a, T b) { return a - b; }
  static T mul(T a, T b) { return a * b; }
  static T div(T a, T b) { return a / b; }
  static T fma(T a, T b, T c) { return a * b + c; }  // not fused: no libm call without FMA
  static T fma_exact(T a, T b, T c) { return std::fma(a, b, c); }  // fused, as the vector ISAs
  static T max(T a, T b) { return a > b ? a : b; }
  static T min(T a, T b) { return a < b ? a : b; }
  static T abs(T a) { return std::fabs(a); }
  static T sel_lt(T a, T b, T x, T y) { return a < b ? x : y; }  // a < b ? x : y
  static T round(T a) { return std::nearbyint(a); }               // to nearest even
  static T pow2n(T n) {  // 2^n for integral n in [-126, 127]; NaN stays NaN
    if (!(n == n)) return n;  // (casting NaN to int and shifting a negative int are undefined: UBSan)
    uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  static T scale2n(T x, T n) { return x * pow2n(n < -126.f ? -126.f : n); }
  static float hsum(T a) { return a; }
  static float hmax(T a) { return a; }
};

#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVX512)
struct V16 {
  using T = __m512;
  static constexpr int N = 16;
  static __mmask16 mask(int n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n < 0 ? 0 : n)) - 1); }
  static T zero() { return _mm512_setzero_ps(); }
  static T set(float x) { return _mm512_set1_ps(x); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T x) { _mm512_storeu_ps(p, x); }
  static T load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  static void store_n(float* p, T x, int n) { _mm512_mask_storeu_ps(p, mask(n), x); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T div(T a, T b) { return _mm512_div_ps(a, b); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T fma_exact(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static T min(T a, T b) { return _mm512_min_ps(a, b); }
  static T abs(T a) { return _mm512_abs_ps(a); }
  static T sel_lt(T a, T b, T x, T y) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), y, x); }
  static T round(T a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static T pow2n(T n) {
    __m512i i = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_castsi512_ps(i);
  }
  static T scale2n(T x, T n) { return _mm512_scalef_ps(x, n); }  // x * 2^n, n integral
  static float hsum(T a) { return _mm512_reduce_add_ps(a); }
  static float hmax(T a) { return _mm512_reduce_max_ps(a); }
};
using V = V16;
#elif defined(ZOI_ISA_AVX2)
struct V8 {
  using T = __m256;
  static constexpr int N = 8;
  static __m256i mask(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
  static T zero() { return _mm256_setzero_ps(); }
  static T set(float x) { return _mm256_set1_ps(x); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T x) { _mm256_storeu_ps(p, x); }
  // n >= 8: a plain load / store (every full vector of a row goes through here); vmaskmovps only
  // for a tail (masked stores cost several uops on Intel, more on some AMD cores)
  static T load_n(const float* p, int n) { return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask(n)); }
  static void store_n(float* p, T x, int n) {
    if (n >= 8) _mm256_storeu_ps(p, x);
    else _mm256_maskstore_ps(p, mask(n), x);
  }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T div(T a, T b) { return _mm256_div_ps(a, b); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T fma_exact(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static T min(T a, T b) { return _mm256_min_ps(a, b); }
  static T abs(T a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.f), a); }
  static T sel_lt(T a, T b, T x, T y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_LT_OQ)); }
  static T round(T a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static T pow2n(T n) {
    __m256i i = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_castsi256_ps(i);
  }
  static T scale2n(T x, T n) { return _mm256_mul_ps(x, pow2n(_mm256_max_ps(n, _mm256_set1_ps(-126.f)))); }
  static float hsum(T a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float hmax(T a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};
using V = V8;
#elif defined(ZOI_ISA_NEON)
// aarch64 Advanced SIMD (neon, dotprod, i8mm builds): 4 float lanes. max / min / sel_lt keep
// x86's and S1's operand rule (a NaN in either operand gives the second one) rather than fmax's
// NaN propagation, so that every kernel written over V takes the same branch of a NaN as the
// scalar and x86 builds (the quantisers' clamps, vexp2's clamp); 2 instructions instead of 1.
struct V4 {
  using T = float32x4_t;
  static constexpr int N = 4;
  static T zero() { return vdupq_n_f32(0.f); }
  static T set(float x) { return vdupq_n_f32(x); }
  static T load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, T x) { vst1q_f32(p, x); }
  // a tail (n < 4) lane by lane: no element of p past n is touched; the other lanes load as 0
  static T load_n(const float* p, int n) {
    if (n >= 4) return vld1q_f32(p);
    T r = vdupq_n_f32(0.f);
    if (n > 0) r = vld1q_lane_f32(p, r, 0);
    if (n > 1) r = vld1q_lane_f32(p + 1, r, 1);
    if (n > 2) r = vld1q_lane_f32(p + 2, r, 2);
    return r;
  }
  static void store_n(float* p, T x, int n) {
    if (n >= 4) {
      vst1q_f32(p, x);
      return;
    }
    if (n > 0) vst1q_lane_f32(p, x, 0);
    if (n > 1) vst1q_lane_f32(p + 1, x, 1);
    if (n > 2) vst1q_lane_f32(p + 2, x, 2);
  }
  static T add(T a, T b) { return vaddq_f32(a, b); }
  static T sub(T a, T b) { return vsubq_f32(a, b); }
  static T mul(T a, T b) { return vmulq_f32(a, b); }
  static T div(T a, T b) { return vdivq_f32(a, b); }
  static T fma(T a, T b, T c) { return vfmaq_f32(c, a, b); }  // fused, as the x86 vector ISAs
  static T fma_exact(T a, T b, T c) { return vfmaq_f32(c, a, b); }
  static T max(T a, T b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
  static T min(T a, T b) { return vbslq_f32(vcltq_f32(a, b), a, b); }
  static T abs(T a) { return vabsq_f32(a); }
  static T sel_lt(T a, T b, T x, T y) { return vbslq_f32(vcltq_f32(a, b), x, y); }
  static T round(T a) { return vrndnq_f32(a); }  // to nearest even
  static T pow2n(T n) {
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
  }
  static T scale2n(T x, T n) { return vmulq_f32(x, pow2n(max(n, vdupq_n_f32(-126.f)))); }
  static float hsum(T a) { return vaddvq_f32(a); }
  static float hmax(T a) {  // S1::max over the lanes, in lane order
    float r = vgetq_lane_f32(a, 0);
    r = S1::max(r, vgetq_lane_f32(a, 1));
    r = S1::max(r, vgetq_lane_f32(a, 2));
    return S1::max(r, vgetq_lane_f32(a, 3));
  }
};
using V = V4;
#else
using V = S1;
#endif

// Four independent vectors processed in lock-step: the math below instantiated over X4
// interleaves four dependency chains (a GELU is ~35 dependent operations).
template <class W>
struct X4 {
  struct T {
    typename W::T v[4];
  };
  static constexpr int N = 4 * W::N;
#define ZOI_X4_1(name)                               \
  ZOI_INLINE static T name(T a) {                    \
    T r;                                             \
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) r.v[i] = W::name(a.v[i]); \
    return r;                                        \
  }
#define ZOI_X4_2(name)                                          \
  ZOI_INLINE static T name(T a, T b) {                          \
    T r;                                                        \
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) r.v[i] = W::name(a.v[i], b.v[i]); \
    return r;                                                   \
  }
  ZOI_INLINE static T zero() { T r; for (int i = 0; i < 4; ++i) r.v[i] = W::zero(); return r; }
  ZOI_INLINE static T set(float x) { T r; for (int i = 0; i < 4; ++i) r.v[i] = W::set(x); return r; }
  ZOI_INLINE static T load(const float* p) { T r; for (int i = 0; i < 4; ++i) r.v[i] = W::load(p + i * W::N); return r; }
  ZOI_INLINE static void store(float* p, T x) { for (int i = 0; i < 4; ++i) W::store(p + i * W::N, x.v[i]); }
  ZOI_X4_2(add) ZOI_X4_2(sub) ZOI_X4_2(mul) ZOI_X4_2(div) ZOI_X4_2(max) ZOI_X4_2(min)
  ZOI_X4_1(abs) ZOI_X4_1(round) ZOI_X4_1(pow2n) ZOI_X4_2(scale2n)
  ZOI_INLINE static T fma_exact(T a, T b, T c) { T r; for (int i = 0; i < 4; ++i) r.v[i] = W::fma_exact(a.v[i], b.v[i], c.v[i]); return r; }
  ZOI_INLINE static T fma(T a, T b, T c) { T r; for (int i = 0; i < 4; ++i) r.v[i] = W::fma(a.v[i], b.v[i], c.v[i]); return r; }
  ZOI_INLINE static T sel_lt(T a, T b, T x, T y) {
    T r;
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) r.v[i] = W::sel_lt(a.v[i], b.v[i], x.v[i], y.v[i]);
    return r;
  }
#undef ZOI_X4_1
#undef ZOI_X4_2
};

// ---- math over any lane type (same polynomial for vector bodies and scalar tails) ----

// exp(x), cephes-style: x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial; ~1-2 ulp.
template <class W>
ZOI_INLINE typename W::T vexp(typename W::T x) {
  using T = typename W::T;
  x = W::min(W::max(x, W::set(-87.33f)), W::set(88.37f));
  T n = W::round(W::mul(x, W::set(1.44269504088896341f)));
  T r = W::fma(n, W::set(-0.693359375f), x);
  r = W::fma(n, W::set(2.12194440e-4f), r);
  T p = W::set(1.9875691500e-4f);
  p = W::fma(p, r, W::set(1.3981999507e-3f));
  p = W::fma(p, r, W::set(8.3334519073e-3f));
  p = W::fma(p, r, W::set(4.1665795894e-2f));
  p = W::fma(p, r, W::set(1.6666665459e-1f));
  p = W::fma(p, r, W::set(5.0000001201e-1f));
  p = W::fma(p, W::mul(r, r), W::add(r, W::set(1.f)));
  return W::scale2n(p, n);
}

// exp(x) exactly as numpy's float32 SIMD kernel (AVX512F simd_exp_FLOAT: Cody-Waite reduction,
// rational P5/Q2, scalef), for x <= 0 (softmax): bit-identical to np.exp on the AVX-512 builds;
// the AVX2 / scalar builds scale by 2^k with an exponent add (identical down to 2^-126).
template <class W>
ZOI_INLINE typename W::T vexp_np(typename W::T x_in) {
  using T = typename W::T;
  const T xmin = W::set(-103.97208404541015625f);
  const T under = W::sel_lt(xmin, x_in, W::zero(), W::set(1.f));  // 1 where x <= xmin
  const T x = W::sel_lt(xmin, x_in, x_in, W::zero());
  T q = W::mul(x, W::set(1.442695040888963407359924681001892137f));
  q = W::sub(W::add(q, W::set(12582912.f)), W::set(12582912.f));  // rint via 0x1.8p23
  T y = W::fma_exact(q, W::set(-6.93145752e-1f), x);
  y = W::fma_exact(q, W::set(-1.42860677e-6f), y);
  y = W::fma_exact(q, W::zero(), y);
  T num = W::fma_exact(W::set(5.082762527590693718096e-04f), y, W::set(6.757896990527504603057e-03f));
  num = W::fma_exact(num, y, W::set(5.114512081637298353406e-02f));
  num = W::fma_exact(num, y, W::set(2.473615434895520810817e-01f));
  num = W::fma_exact(num, y, W::set(7.257664613233124478488e-01f));
  num = W::fma_exact(num, y, W::set(9.999999999980870924916e-01f));
  T den = W::fma_exact(W::set(2.159509375685829852307e-02f), y, W::set(-2.742335390411667452936e-01f));
  den = W::fma_exact(den, y, W::set(1.f));
  const T r = W::scale2n(W::div(num, den), q);
  return W::sel_lt(under, W::set(0.5f), r, W::zero());
}

// 2^t for t in [-inf, 127] (softmax: t = (s - max) log2 e <= 0): t clamped at -126,
// t = n + f with n = rint(t), |f| <= 1/2, a degree-6 fit of 2^f (relative error <= 7.9e-8 over
// [-1/2, 1/2] with fused Horner steps), scaled by 2^n. 10 operations and no division (vexp_np
// has one per vector); ~1-2 ulp against exp2 (tests/cpu/test_attention_fast.py).
template <class W>
ZOI_INLINE typename W::T vexp2(typename W::T t) {
  using T = typename W::T;
  t = W::max(W::set(-126.f), t);  // this order keeps a NaN (max returns its second operand)
  const T n = W::round(t);
  const T f = W::sub(t, n);  // exact
  T p = W::fma(W::set(1.5337577497120947e-4f), f, W::set(1.3399859890341759e-3f));
  p = W::fma(p, f, W::set(9.618519805371761e-3f));
  p = W::fma(p, f, W::set(5.550329014658928e-2f));
  p = W::fma(p, f, W::set(2.4022646248340607e-1f));
  p = W::fma(p, f, W::set(6.931471824645996e-1f));
  p = W::fma(p, f, W::set(1.f));
  return W::scale2n(p, n);
}

// erf(x) for float32: odd/even rational minimax fit on [-4, 4] (Eigen's generic_fast_erf_float),
// a few ulp; |x| >= 4 is +-1 in float32.
template <class W>
ZOI_INLINE typename W::T verf(typename W::T a) {
  using T = typename W::T;
  const T x = W::max(W::min(a, W::set(4.f)), W::set(-4.f));
  const T x2 = W::mul(x, x);
  T p = W::fma(x2, W::set(-2.72614225801306e-10f), W::set(2.77068142495902e-08f));
  p = W::fma(x2, p, W::set(-2.10102402082508e-06f));
  p = W::fma(x2, p, W::set(-5.69250639462346e-05f));
  p = W::fma(x2, p, W::set(-7.34990630326855e-04f));
  p = W::fma(x2, p, W::set(-2.95459980854025e-03f));
  p = W::fma(x2, p, W::set(-1.60960333262415e-02f));
  p = W::mul(x, p);
  T q = W::fma(x2, W::set(-1.45660718464996e-05f), W::set(-2.13374055278905e-04f));
  q = W::fma(x2, q, W::set(-1.68282697438203e-03f));
  q = W::fma(x2, q, W::set(-7.37332916720468e-03f));
  q = W::fma(x2, q, W::set(-1.42647390514189e-02f));
  return W::div(p, q);
}

// GELU, erf form, as BERT and the reference: (0.5 x) (1 + erf(x / sqrt 2))
template <class W>
ZOI_INLINE typename W::T vgelu(typename W::T x) {
  const typename W::T e = verf<W>(W::mul(x, W::set(0.70710678118654752f)));
  return W::mul(W::mul(W::set(0.5f), x), W::add(W::set(1.f), e));
}

// GELU, tanh form: 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3)
template <class W>
ZOI_INLINE typename W::T vgelu_tanh(typename W::T x) {
  using T = typename W::T;
  T x3 = W::mul(W::mul(x, x), x);
  T u2 = W::mul(W::set(-2.f * 0.7978845608028654f), W::fma(W::set(0.044715f), x3, x));
  return W::div(x, W::add(W::set(1.f), vexp<W>(u2)));
}

template <class W>
ZOI_INLINE typename W::T vsigmoid(typename W::T x) {
  return W::div(W::set(1.f), W::add(W::set(1.f), vexp<W>(W::sub(W::zero(), x))));
}

// tanh(x) = sign(x) (1 - e) / (1 + e), e = exp(-2|x|) (absolute error ~1e-7: a pooler's output)
template <class W>
ZOI_INLINE typename W::T vtanh(typename W::T x) {
  using T = typename W::T;
  const T ax = W::max(x, W::sub(W::zero(), x));
  const T e = vexp<W>(W::mul(ax, W::set(-2.f)));
  const T r = W::div(W::sub(W::set(1.f), e), W::add(W::set(1.f), e));
  return W::sel_lt(x, W::zero(), W::sub(W::zero(), r), r);
}

template <class W>
ZOI_INLINE typename W::T vact(typename W::T x, int act) {
  switch (act) {
    case ACT_GELU: return vgelu<W>(x);
    case ACT_GELU_TANH: return vgelu_tanh<W>(x);
    case ACT_RELU: return W::max(x, W::zero());
    case ACT_SIGMOID: return vsigmoid<W>(x);
    case ACT_TANH: return vtanh<W>(x);
    case ACT_SILU: return W::div(x, W::add(W::set(1.f), vexp<W>(W::sub(W::zero(), x))));  // x sigmoid(x)
    default: return x;
  }
}

// act over p[0:n) in place (4 vectors at a time, then single vectors, then the tail as one masked
// vector: the same fused operations as the other lanes, so an element's result does not depend on
// its position; S1's multiply-adds are not fused); one loop per activation so the math is inlined
// with its constants hoisted
template <int ACT>
inline void act_loop(float* p, int n) {
  int k = 0;
  for (; k + 4 * V::N <= n; k += 4 * V::N) X4<V>::store(p + k, vact<X4<V>>(X4<V>::load(p + k), ACT));
  for (; k + V::N <= n; k += V::N) V::store(p + k, vact<V>(V::load(p + k), ACT));
  if (k < n) V::store_n(p + k, vact<V>(V::load_n(p + k, n - k), ACT), n - k);
}

inline void vact_inplace(float* p, int n, int act) {
  switch (act) {
    case ACT_GELU: act_loop<ACT_GELU>(p, n); break;
    case ACT_GELU_TANH: act_loop<ACT_GELU_TANH>(p, n); break;
    case ACT_RELU: act_loop<ACT_RELU>(p, n); break;
    case ACT_SIGMOID: act_loop<ACT_SIGMOID>(p, n); break;
    case ACT_TANH: act_loop<ACT_TANH>(p, n); break;
    case ACT_SILU: act_loop<ACT_SILU>(p, n); break;
    default: break;
  }
}

}  // namespace ZOI_NS
}  // namespace zoi
