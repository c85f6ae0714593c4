// LayerNorm over rows of H, fused with the residual add and, optionally, with the INT8
// quantisation of its output for the next GEMM. Float32 throughout, two passes for the
// variance (as the reference: var = mean((x - mu)^2)).
#include "kernels.h"
#include "qrow.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {

// y[H] = LN(x (+ r)) * w + b; y may alias x (row-wise, each element read before written)
void ln_row(const float* x, const float* r, const float* w, const float* b, float eps, int H, float* y) {
  using T = V::T;
  T s = V::zero();
  int k = 0;
  for (; k + V::N <= H; k += V::N) {
    T v = V::load(x + k);
    if (r) v = V::add(v, V::load(r + k));
    s = V::add(s, v);
  }
  if (k < H) {
    T v = V::load_n(x + k, H - k);
    if (r) v = V::add(v, V::load_n(r + k, H - k));
    s = V::add(s, v);
  }
  const float mu = V::hsum(s) / static_cast<float>(H);
  const T vmu = V::set(mu);
  T q = V::zero();
  for (k = 0; k + V::N <= H; k += V::N) {
    T v = V::load(x + k);
    if (r) v = V::add(v, V::load(r + k));
    v = V::sub(v, vmu);
    q = V::fma(v, v, q);
  }
  // tail in scalar: masked lanes of load_n are 0, and (0 - mu)^2 must not count
  float var_sum = V::hsum(q);
  for (int e = k; e < H; ++e) {
    float v = x[e] + (r ? r[e] : 0.f) - mu;
    var_sum += v * v;
  }
  const float sd = std::sqrt(var_sum / static_cast<float>(H) + eps);
  const T vsd = V::set(sd);
  for (k = 0; k < H; k += V::N) {
    const int n = H - k;
    T v = V::load_n(x + k, n);
    if (r) v = V::add(v, V::load_n(r + k, n));
    v = V::add(V::mul(V::div(V::sub(v, vmu), vsd), V::load_n(w + k, n)), V::load_n(b + k, n));
    V::store_n(y + k, v, n);
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
