// Per-row INT8 quantisation into the ISA's GEMM A format (see kernels.h), exactly
// zoi.numerics.primitives (every step in float32, round half to even):
//   x' = (x - shift) * mul                                   (optional, two roundings)
//   symmetric:  amax = max|x'| (or the static amax), inv = 127 / amax (amax 0 -> q 0, scale 0),
//               q = clip(rint(x' * inv), -127, 127), scale = amax / 127
//   asymmetric: lo = min(min x', 0), hi = max(max x', 0), r = hi - lo, inv = 255 / r (r 0 -> 0),
//               zp = clip(rint(-lo * inv), 0, 255), q = clip(rint(x' * inv) + zp, 0, 255),
//               scale = r / 255
//   first row of a sequence (QuantOut::q2): r = x' - float(q - zp) * scale (two roundings),
//               s2 = scale * 2^-8, q2 = clip(rint(r / s2), -127, 127) (IEEE division; q2 = 0
//               where s2 is not finite and > 0), in the same pass as q
#pragma once
#include <limits>

#include "kernels.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {

// The A operand of the INT8 GEMM (kernels.h), per ISA build: stored a = q + off with
//   vnni, avxvnni: u8, off = 128 (symmetric) / 0 (asymmetric)      -> vpdpbusd's unsigned operand
//   avx512, avx2:  s8, off = 0 (symmetric) / -128 (asymmetric), and a copy |a| (u8 <= 128) at
//                  +ldq bytes of each row (the sign trick of gemm_int8.cc: |a| x sign(w, a))
//   scalar:        s8, off = 0 / -128
//   neon, dotprod, i8mm: scalar's (smull / sdot / smmla multiply s8 by s8)
// and the stored zero point zp' = zp + off (symmetric: zp = 0), so that
// sum_k a[k] w[k] - zp' colsum = sum_k (q[k] - zp) w[k] in every format.
#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVXVNNI)
constexpr bool kASigned = false, kAAbs = false;
constexpr int kAOffSym = 128, kAOffAsym = 0;
#elif defined(ZOI_ISA_AVX512) || defined(ZOI_ISA_AVX2)
constexpr bool kASigned = true, kAAbs = true;
constexpr int kAOffSym = 0, kAOffAsym = -128;
#else
constexpr bool kASigned = true, kAAbs = false;
constexpr int kAOffSym = 0, kAOffAsym = -128;
#endif
constexpr int kABytes = kAAbs ? 2 : 1;  // bytes of A buffer per element (rows of kABytes * ldq)

// stored value at (m, k) of an A buffer with rows of ldq elements; a_set also writes |v|
inline int a_get(const void* q, int ldq, int m, int k) {
  const uint8_t b = static_cast<const uint8_t*>(q)[static_cast<size_t>(m) * ldq * kABytes + k];
  return kASigned ? static_cast<int>(static_cast<int8_t>(b)) : static_cast<int>(b);
}
inline void a_set(void* q, int ldq, int m, int k, int v) {
  uint8_t* row = static_cast<uint8_t*>(q) + static_cast<size_t>(m) * ldq * kABytes;
  row[k] = static_cast<uint8_t>(v);
  if (kAAbs) row[ldq + k] = static_cast<uint8_t>(v < 0 ? -v : v);
}

template <class W>
inline typename W::T qx_load(const float* x, const QuantOut& qo, int k, int n) {
  typename W::T v = W::load_n(x + k, n);
  if (qo.shift) v = W::sub(v, W::load_n(qo.shift + k, n));
  if (qo.mul) v = W::mul(v, W::load_n(qo.mul + k, n));
  return v;
}

// stores lanes [k, k+n) of integer-valued floats t (already in the stored range), and |t| at
// +ldq when the format keeps it
inline void q_store(void* qrow, int ldq, int k, V::T t, int n) {
  uint8_t* q = static_cast<uint8_t*>(qrow) + k;
#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVX512)
  const __m512i i = _mm512_cvttps_epi32(t);
  _mm512_mask_cvtepi32_storeu_epi8(q, V16::mask(n), i);  // truncating: -128 -> 0x80
  if (kAAbs) _mm512_mask_cvtepi32_storeu_epi8(q + ldq, V16::mask(n), _mm512_abs_epi32(i));
#elif defined(ZOI_ISA_AVX2)
  const __m256i i = _mm256_cvttps_epi32(t);
  const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  // lanes 0..7 in order (no saturation: in range; u8 0..255 on avxvnni)
  const __m128i b8 = kASigned ? _mm_packs_epi16(w16, w16) : _mm_packus_epi16(w16, w16);
  const __m128i a8 = _mm_abs_epi8(b8);           // |-128| = 0x80 = 128 as u8
  if (n >= 8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q), b8);
    if (kAAbs) _mm_storel_epi64(reinterpret_cast<__m128i*>(q + ldq), a8);
  } else {
    alignas(16) uint8_t tb[16], ta[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(tb), b8);
    _mm_store_si128(reinterpret_cast<__m128i*>(ta), a8);
    for (int e = 0; e < n; ++e) {
      q[e] = tb[e];
      if (kAAbs) q[ldq + e] = ta[e];
    }
  }
#elif defined(ZOI_ISA_NEON)
  (void)ldq;  // no |a| copy (kAAbs is false)
  const int32x4_t i = vcvtq_s32_f32(t);  // integral already: the conversion is exact
  const int16x4_t h = vmovn_s32(i);       // in range: narrowing keeps the low bits, -128 -> 0x80
  const int8x8_t b = vmovn_s16(vcombine_s16(h, h));
  if (n >= 4) {
    const int32_t w = vget_lane_s32(vreinterpret_s32_s8(b), 0);
    std::memcpy(q, &w, 4);
  } else {
    int8_t tb[8];
    vst1_s8(tb, b);
    for (int e = 0; e < n; ++e) q[e] = static_cast<uint8_t>(tb[e]);
  }
#else
  (void)ldq;
  if (n > 0) *q = static_cast<uint8_t>(static_cast<int8_t>(t));
#endif
}

#if defined(ZOI_ISA_AVX2)
// 32 stored values (and their |a| at +ldq) from 4 vectors of integer-valued floats in the stored
// range, lanes in order: 4 conversions, 3 packs and one lane permutation per 32 bytes instead of a
// conversion, 2 packs and 64-bit stores per 8 (q_store)
ZOI_INLINE void q_store32(void* qrow, int ldq, int k, V::T t0, V::T t1, V::T t2, V::T t3) {
  uint8_t* q = static_cast<uint8_t*>(qrow) + k;
  // packs work within 128-bit lanes: dwords come out as t0[0:4] t1[0:4] t2[0:4] t3[0:4] | t0[4:8] ...
  const __m256i w01 = _mm256_packs_epi32(_mm256_cvttps_epi32(t0), _mm256_cvttps_epi32(t1));
  const __m256i w23 = _mm256_packs_epi32(_mm256_cvttps_epi32(t2), _mm256_cvttps_epi32(t3));
  const __m256i b = _mm256_permutevar8x32_epi32(kASigned ? _mm256_packs_epi16(w01, w23) : _mm256_packus_epi16(w01, w23),
                                                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), b);
  if (kAAbs) _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + ldq), _mm256_abs_epi8(b));  // |-128| = 128 as u8
}
#endif

// The range of a row x' as quantize_row gathers it, vector by vector in row order (masked tail
// lanes 0): symmetric: mx = max |x'|; asymmetric: mn = min x', mx = max x' (both from 0). A producer
// that holds the row's values (LayerNorm's last pass) gathers it, so quantize_row reads the row once.
// chk: the sum of x' - x' (0, or NaN once a NaN or an infinity was seen). maxps / minps return their
// second operand when one is NaN, so a NaN inside a row could drop out of mx (the row then
// quantised with a finite scale: a NaN input made finite); with chk the scale becomes NaN, as the
// reference's np.max gives it.
struct QAcc {
  V::T mn, mx, chk;
  QAcc() : mn(V::zero()), mx(V::zero()), chk(V::zero()) {}
  ZOI_INLINE void add(int asym, V::T v) {
    if (asym) {
      mn = V::min(mn, v);
      mx = V::max(mx, v);
    } else {
      mx = V::max(mx, V::abs(v));
    }
    chk = V::add(chk, V::sub(v, v));
  }
  // a NaN seen (or an infinity: then the range is infinite already, and kept)
  bool nonfinite() const { const float c = V::hsum(chk); return c != c; }
};

// whether quantize_row needs the row's range (not for a calibrated static amax)
inline bool q_needs_range(const QuantOut& qo) { return qo.asym || qo.static_amax < 0.f; }

// x [K] -> stored row (ldq >= round_up(K, KG) elements, padding written); returns a_scale, *zp_out.
// acc: the row's range gathered by the caller (QAcc), else a pass over x here.
// R (a sequence's first row): also the residual's row q2row (same format and ldq) and *s2_out, in
// the same pass: its step s2 = scale * 2^-8 is known once scale is, so each q2 code needs only its
// own element (zoi.numerics.primitives.first_row_residual)
template <bool R = false>
inline float quantize_row(const float* x, int K, void* qrow, const QuantOut& qo, int32_t* zp_out,
                          const QAcc* acc = nullptr, void* q2row = nullptr, float* s2_out = nullptr) {
  using T = V::T;
  QAcc own;
  if (!acc && q_needs_range(qo)) {
    for (int k = 0; k < K; k += V::N) own.add(qo.asym, qx_load<V>(x, qo, k, K - k));
    acc = &own;
  }
  float inv, scale, zpf, lo_clip, hi_clip, off;
  if (qo.asym) {
    const float lo = -V::hmax(V::sub(V::zero(), acc->mn));
    float hi = V::hmax(acc->mx);
    if (acc->nonfinite() && hi - lo != std::numeric_limits<float>::infinity()) hi = std::numeric_limits<float>::quiet_NaN();
    const float r = hi - lo;
    inv = r > 0.f ? 255.f / r : 0.f;
    zpf = S1::min(S1::max(S1::round(-lo * inv), 0.f), 255.f);
    scale = r / 255.f;
    lo_clip = 0.f;
    hi_clip = 255.f;
    off = static_cast<float>(kAOffAsym);
    *zp_out = static_cast<int32_t>(zpf) + kAOffAsym;
  } else {
    float amax = qo.static_amax;
    if (amax < 0.f) {
      amax = V::hmax(acc->mx);
      if (acc->nonfinite() && amax != std::numeric_limits<float>::infinity()) amax = std::numeric_limits<float>::quiet_NaN();
    }
    inv = amax > 0.f ? 127.f / amax : 0.f;
    scale = amax / 127.f;
    zpf = 0.f;
    lo_clip = -127.f;
    hi_clip = 127.f;
    off = static_cast<float>(kAOffSym);
    *zp_out = kAOffSym;
  }
  const T vinv = V::set(inv), vzp = V::set(zpf), vlo = V::set(lo_clip), vhi = V::set(hi_clip), voff = V::set(off);
  // static (a calibrated amax): no range pass saw the row, so this pass checks it for a NaN
  // (the clamp below would turn one into a finite code): x - x is NaN for NaN and +-inf
  const bool check = !q_needs_range(qo);
  T chk = V::zero();
  // the residual's step; a row whose s2 is 0, NaN or infinite gets q2 = 0 (its output is NaN
  // or it has none to add), written after the loop
  const float s2 = scale * 0x1p-8f;
  const bool r_on = R && s2 > 0.f && s2 <= std::numeric_limits<float>::max();
  const T vscale = V::set(scale), vs2 = V::set(s2), vq2max = V::set(127.f), vq2min = V::set(-127.f),
          vq2off = V::set(static_cast<float>(kAOffSym));
  auto qv = [&](int k, int n) __attribute__((always_inline)) {
    const T xv = qx_load<V>(x, qo, k, n);
    if (check) chk = V::add(chk, V::sub(xv, xv));
    const T t = V::min(V::max(V::add(V::round(V::mul(xv, vinv)), vzp), vlo), vhi);
    if constexpr (R) {
      if (r_on) {  // r = x' - float(q - zp) * scale: the product rounded, then the difference
        const T r = V::sub(xv, V::mul(V::sub(t, vzp), vscale));
        const T t2 = V::min(V::max(V::round(V::div(r, vs2)), vq2min), vq2max);
        q_store(q2row, qo.ldq, k, V::add(t2, vq2off), n);
      }
    }
    return V::add(t, voff);
  };
  int k = 0;
#if defined(ZOI_ISA_AVX2)
  if constexpr (!R)
    for (; k + 4 * V::N <= K; k += 4 * V::N)
      q_store32(qrow, qo.ldq, k, qv(k, V::N), qv(k + V::N, V::N), qv(k + 2 * V::N, V::N), qv(k + 3 * V::N, V::N));
#endif
  for (; k < K; k += V::N) q_store(qrow, qo.ldq, k, qv(k, K - k), K - k);
  if (check) {  // an infinity saturates (the reference's clip); only a NaN makes the scale NaN
    const float c = V::hsum(chk);
    if (c != c)
      for (int kk = 0; kk < K; ++kk)
        if (x[kk] != x[kk]) {
          scale = std::numeric_limits<float>::quiet_NaN();
          break;
        }
  }
  // padding: the stored value of a zero (its weight is 0 anyway)
  const int pad = static_cast<int>(off + zpf);
  for (int kk = K; kk < qo.ldq; ++kk) a_set(qrow, qo.ldq, 0, kk, pad);
  if constexpr (R) {
    // a static row found to hold a NaN above: its scale, so s2, is NaN and its codes 0
    const bool wrote = r_on && scale == scale;
    for (int kk = wrote ? K : 0; kk < qo.ldq; ++kk) a_set(q2row, qo.ldq, 0, kk, kAOffSym);
    *s2_out = scale * 0x1p-8f;
  }
  return scale;
}

inline void* qrow_ptr(const QuantOut& qo, int row) {
  return static_cast<uint8_t*>(qo.q) + static_cast<size_t>(row) * qo.ldq * kABytes;
}

// the sequence b whose first row is `row` (row == cu[b]), or -1; cu [B + 1] increasing
inline int first_row_seq(const int32_t* cu, int B, int row) {
  int lo = 0, hi = B;  // the first b in [0, B) with cu[b] >= row
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (cu[mid] < row) lo = mid + 1;
    else hi = mid;
  }
  return lo < B && cu[lo] == row ? lo : -1;
}

// quantize_row into row `row` of qo; a sequence's first row (QuantOut::q2 on) also gets its
// residual into row b of q2 / scale2 / zp2
inline void quantize_into(const float* x, int K, const QuantOut& qo, int row, const QAcc* acc = nullptr) {
  const int b = qo.q2 ? first_row_seq(qo.cu, qo.B, row) : -1;
  if (b < 0) {
    qo.scale[row] = quantize_row(x, K, qrow_ptr(qo, row), qo, qo.zp + row, acc);
    return;
  }
  void* q2row = static_cast<uint8_t*>(qo.q2) + static_cast<size_t>(b) * qo.ldq * kABytes;
  qo.scale[row] = quantize_row<true>(x, K, qrow_ptr(qo, row), qo, qo.zp + row, acc, q2row, qo.scale2 + b);
  qo.zp2[b] = kAOffSym;
}

// the first rows of sequences among rows [g0, g0 + n) of cu's numbering: fills seq[i] = b with
// cu[b] = g0 + i (or -1); returns how many
inline int first_rows_in(const int32_t* cu, int B, int g0, int n, int* seq) {
  for (int i = 0; i < n; ++i) seq[i] = -1;
  int b = first_row_seq(cu, B, g0);
  if (b < 0) {  // the first b with cu[b] > g0
    int lo = 0, hi = B;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (cu[mid] <= g0) lo = mid + 1;
      else hi = mid;
    }
    b = lo;
  }
  int c = 0;
  for (; b < B && cu[b] < g0 + n; ++b, ++c) seq[cu[b] - g0] = b;
  return c;
}

}  // namespace ZOI_NS
}  // namespace zoi
