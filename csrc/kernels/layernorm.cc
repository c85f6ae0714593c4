// LayerNorm over rows of H, fused with the residual add and, optionally, with the INT8
// quantisation of its output for the next GEMM. Float32 throughout, two passes for the
// variance (as the reference: var = mean((x - mu)^2)).
#include "kernels.h"
#include "qrow.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {

// y[H] = LN(x (+ r)) * w + b; y may alias x (row-wise, each element read before written).
// Pass 1 stores x + r into y (so later passes read one stream), pass 2 the centred variance,
// pass 3 normalises with one reciprocal of the deviation per row.
void ln_row(const float* x, const float* r, const float* w, const float* b, float eps, int H, float* y) {
  using T = V::T;
  T s0 = V::zero(), s1 = V::zero();
  int k = 0;
  for (; k + 2 * V::N <= H; k += 2 * V::N) {
    T v0 = V::load(x + k), v1 = V::load(x + k + V::N);
    if (r) {
      v0 = V::add(v0, V::load(r + k));
      v1 = V::add(v1, V::load(r + k + V::N));
      V::store(y + k, v0);
      V::store(y + k + V::N, v1);
    }
    s0 = V::add(s0, v0);
    s1 = V::add(s1, v1);
  }
  for (; k < H; k += V::N) {
    const int n = H - k;
    T v = V::load_n(x + k, n);
    if (r) {
      v = V::add(v, V::load_n(r + k, n));
      V::store_n(y + k, v, n);
    }
    s0 = V::add(s0, v);
  }
  const float* src = r ? y : x;
  const float mu = V::hsum(V::add(s0, s1)) / static_cast<float>(H);
  const T vmu = V::set(mu);
  T q0 = V::zero(), q1 = V::zero();
  for (k = 0; k + 2 * V::N <= H; k += 2 * V::N) {
    T v0 = V::sub(V::load(src + k), vmu), v1 = V::sub(V::load(src + k + V::N), vmu);
    q0 = V::fma(v0, v0, q0);
    q1 = V::fma(v1, v1, q1);
  }
  for (; k + V::N <= H; k += V::N) {
    T v = V::sub(V::load(src + k), vmu);
    q0 = V::fma(v, v, q0);
  }
  // tail in scalar: masked lanes would count (0 - mu)^2
  float var_sum = V::hsum(V::add(q0, q1));
  for (int e = k; e < H; ++e) {
    const float v = src[e] - mu;
    var_sum += v * v;
  }
  const float rstd = 1.f / std::sqrt(var_sum / static_cast<float>(H) + eps);
  const T vr = V::set(rstd);
  for (k = 0; k < H; k += V::N) {
    const int n = H - k;
    T v = V::mul(V::sub(V::load_n(src + k, n), vmu), vr);
    V::store_n(y + k, V::add(V::mul(v, V::load_n(w + k, n)), V::load_n(b + k, n)), n);
  }
}

void layernorm(const LnArgs& a, int tid, int nt) {
  long lo, hi;
  split_range(a.M, tid, nt, &lo, &hi);
  for (long m = lo; m < hi; ++m) {
    float* y = a.y + m * a.ldy;
    ln_row(a.x + m * a.ldx, a.r ? a.r + m * a.ldr : nullptr, a.w, a.b, a.eps, a.H, y);
    if (a.qo.q) quantize_into(y, a.H, a.qo, static_cast<int>(m));
  }
}

}  // namespace ZOI_NS
}  // namespace zoi
