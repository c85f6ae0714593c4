// LayerNorm over rows of H, fused with the residual add and, optionally, with the INT8
// quantisation of its output for the next GEMM. Float32 throughout, two passes for the
// variance (as the reference: var = mean((x - mu)^2)).
#include "kernels.h"
#include "np_sum.h"
#include "qrow.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {
namespace {

#if defined(__AVX2__)
// numpy's pairwise float32 sum (np_sum.h, same blocks, same order: bit-identical) of values that a
// functor produces: f.vec(i) the 8 values at i..i+7 (__m256), f.one(i) the value at i; each index is
// asked for exactly once. numpy's 8 leaf accumulators are the 8 lanes of one ymm, so the values need
// not be stored first (LayerNorm: s = x + r and (s - mu)^2 are summed as they are computed), and the
// leaf's lanes are combined in registers (np_sum's compiled leaf stored two 16-byte halves and
// reloaded them as one 32-byte vector: a failed store forward per leaf).
template <class F>
inline float np_sum_f(const F& f, int i0, int n) {
  if (n < 8) {
    float r = 0.f;
    for (int i = 0; i < n; ++i) r += f.one(i0 + i);
    return r;
  }
  if (n <= 128) {
    __m256 r = f.vec(i0);
    int i = 8;
    for (; i < n - (n % 8); i += 8) r = _mm256_add_ps(r, f.vec(i0 + i));
    // ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    const __m256 t = _mm256_add_ps(r, _mm256_movehdup_ps(r));                        // lanes 0,2,4,6: r0+r1, r2+r3, ...
    const __m256 u = _mm256_add_ps(t, _mm256_permute_ps(t, _MM_SHUFFLE(3, 2, 3, 2)));  // lanes 0, 4: the quads
    float res = _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
    for (; i < n; ++i) res += f.one(i0 + i);
    return res;
  }
  int n2 = n / 2;
  n2 -= n2 % 8;
  const float a = np_sum_f(f, i0, n2);
  return a + np_sum_f(f, i0 + n2, n - n2);
}

struct SumPlain {  // x[i]
  const float* x;
  ZOI_INLINE __m256 vec(int i) const { return _mm256_loadu_ps(x + i); }
  ZOI_INLINE float one(int i) const { return x[i]; }
};
struct SumAdd {  // s[i] = x[i] + r[i], stored to y[i] on the way
  const float* x; const float* r; float* y;
  ZOI_INLINE __m256 vec(int i) const {
    const __m256 s = _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(r + i));
    _mm256_storeu_ps(y + i, s);
    return s;
  }
  ZOI_INLINE float one(int i) const { return y[i] = x[i] + r[i]; }
};
struct SumSq {  // s[i]^2 (RMSNorm)
  const float* s;
  ZOI_INLINE __m256 vec(int i) const { const __m256 v = _mm256_loadu_ps(s + i); return _mm256_mul_ps(v, v); }
  ZOI_INLINE float one(int i) const { return s[i] * s[i]; }
};
struct SumSqDev {  // (s[i] - mu)^2, not fused (as numpy: a subtraction, then a product)
  const float* s; float mu;
  ZOI_INLINE __m256 vec(int i) const {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(s + i), _mm256_set1_ps(mu));
    return _mm256_mul_ps(d, d);
  }
  ZOI_INLINE float one(int i) const { const float d = s[i] - mu; return d * d; }
};
#endif

}  // namespace

// y[H] = LN(x (+ r)) * w + b with the reference's float32 operations in its order:
// s = x + r; mu = sum(s) / H; var = sum((s - mu)^2) / H; y = ((s - mu) / sqrt(var + eps)) * w + b.
// y may alias x (each element read before written). H <= kMaxLnH.
// acc (optional): the range of y (transformed by qo's shift / mul) as quantize_row accumulates it,
// gathered in the last pass so the fused quantisation need not read y twice.
void ln_row_q(const float* x, const float* r, const float* w, const float* b, float eps, int H, float* y,
              const QuantOut* qo, QAcc* acc, bool rms = false, bool post = false) {
  using T = V::T;
  // post: r is added after the norm (y may not alias r then; x is read before y is written)
  const float* pr = post ? r : nullptr;
  if (post) r = nullptr;
  const float* src = r ? y : x;
  float mu = 0.f, var;
#if defined(__AVX2__)
  if (rms) {
    if (r) np_sum_f(SumAdd{x, r, y}, 0, H);  // s = x + r into y (its sum unused)
    var = np_sum_f(SumSq{src}, 0, H) / static_cast<float>(H);
  } else {
    const float sum = r ? np_sum_f(SumAdd{x, r, y}, 0, H) : np_sum_f(SumPlain{x}, 0, H);
    mu = sum / static_cast<float>(H);
    var = np_sum_f(SumSqDev{src, mu}, 0, H) / static_cast<float>(H);
  }
#else
  alignas(64) float tmp[kMaxLnH];
  if (r) {
    for (int k = 0; k < H; k += V::N) V::store_n(y + k, V::add(V::load_n(x + k, H - k), V::load_n(r + k, H - k)), H - k);
  }
  if (!rms) mu = np_sum(src, H) / static_cast<float>(H);
  for (int k = 0; k < H; k += V::N) {
    const T d = V::sub(V::load_n(src + k, H - k), V::set(mu));
    V::store_n(tmp + k, V::mul(d, d), H - k);
  }
  var = np_sum(tmp, H) / static_cast<float>(H);
#endif
  const T vmu = V::set(mu);  // 0 for RMSNorm: s - 0 is s exactly
  const T vs = V::set(std::sqrt(var + eps));
  int k = 0;
  for (; k + V::N <= H; k += V::N) {
    const T v = V::div(V::sub(V::load(src + k), vmu), vs);
    T o = V::add(V::mul(v, V::load(w + k)), V::load(b + k));
    if (pr) o = V::add(o, V::load(pr + k));
    V::store(y + k, o);
    if (acc) {
      T t = o;
      if (qo->shift) t = V::sub(t, V::load(qo->shift + k));
      if (qo->mul) t = V::mul(t, V::load(qo->mul + k));
      acc->add(qo->asym, t);
    }
  }
  if (k < H) {
    const int n = H - k;
    const T v = V::div(V::sub(V::load_n(src + k, n), vmu), vs);
    T o = V::add(V::mul(v, V::load_n(w + k, n)), V::load_n(b + k, n));
    if (pr) o = V::add(o, V::load_n(pr + k, n));
    V::store_n(y + k, o, n);
    if (acc) acc->add(qo->asym, qx_load<V>(y, *qo, k, n));  // masked lanes 0, as quantize_row reads them
  }
}

void ln_row(const float* x, const float* r, const float* w, const float* b, float eps, int H, float* y) {
  ln_row_q(x, r, w, b, eps, H, y, nullptr, nullptr);
}

// y = LN(x (+ r)) * w + b, then (qo.q set) its INT8 copy for the next GEMM, with the row's range
// taken in LayerNorm's last pass
void ln_row_quant(const float* x, const float* r, const float* w, const float* b, float eps, int H, float* y,
                  const QuantOut& qo, int row, bool rms, bool post) {
  if (!qo.q) {
    ln_row_q(x, r, w, b, eps, H, y, nullptr, nullptr, rms, post);
    return;
  }
  QAcc acc;
  const bool range = q_needs_range(qo);
  ln_row_q(x, r, w, b, eps, H, y, &qo, range ? &acc : nullptr, rms, post);
  quantize_into(y, H, qo, row, range ? &acc : nullptr);
}

void layernorm(const LnArgs& a, int tid, int nt) {
  long lo, hi;
  split_range(a.M, tid, nt, &lo, &hi);
  for (long m = lo; m < hi; ++m)
    ln_row_quant(a.x + m * a.ldx, a.r ? a.r + m * a.ldr : nullptr, a.w, a.b, a.eps, a.H, a.y + m * a.ldy, a.qo,
                 static_cast<int>(m), a.rms, a.post);
}

}  // namespace ZOI_NS
}  // namespace zoi
