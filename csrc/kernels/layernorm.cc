// LayerNorm over rows of H, fused with the residual add and, optionally, with the INT8
// quantisation of its output for the next GEMM. Float32 throughout, two passes for the
// variance (as the reference: var = mean((x - mu)^2)).
#include "kernels.h"
#include "np_sum.h"
#include "qrow.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {

// y[H] = LN(x (+ r)) * w + b with the reference's float32 operations in its order:
// s = x + r; mu = sum(s) / H; var = sum((s - mu)^2) / H; y = ((s - mu) / sqrt(var + eps)) * w + b.
// y may alias x (each element read before written). H <= kMaxLnH.
void ln_row(const float* x, const float* r, const float* w, const float* b, float eps, int H, float* y) {
  using T = V::T;
  alignas(64) float tmp[kMaxLnH];
  const float* src = x;
  if (r) {
    for (int k = 0; k < H; k += V::N) V::store_n(y + k, V::add(V::load_n(x + k, H - k), V::load_n(r + k, H - k)), H - k);
    src = y;
  }
  const float mu = np_sum(src, H) / static_cast<float>(H);
  const T vmu = V::set(mu);
  for (int k = 0; k < H; k += V::N) {
    const T d = V::sub(V::load_n(src + k, H - k), vmu);
    V::store_n(tmp + k, V::mul(d, d), H - k);
  }
  const float var = np_sum(tmp, H) / static_cast<float>(H);
  const T vs = V::set(std::sqrt(var + eps));
  for (int k = 0; k < H; k += V::N) {
    const int n = H - k;
    T v = V::div(V::sub(V::load_n(src + k, n), vmu), vs);
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
