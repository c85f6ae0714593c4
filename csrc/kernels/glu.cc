// Gated linear unit (ModernBERT's GeGLU): y[m, k] = act(x[m, k]) * x[m, n + k] for k < n, rows
// split over threads; optional fused quantisation of y for the next INT8 GEMM. Float32 as the
// reference (zoi.numerics.reference.glu): the activation's kernel, then one product.
#include "kernels.h"
#include "qrow.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {

void glu(const GluArgs& a, int tid, int nt) {
  long lo, hi;
  split_range(a.M, tid, nt, &lo, &hi);
  const int n = a.n;
  for (long m = lo; m < hi; ++m) {
    const float* x = a.x + m * a.ldx;
    float* y = a.y + m * a.ldy;
    for (int k = 0; k < n; k += V::N) V::store_n(y + k, V::load_n(x + k, n - k), n - k);
    vact_inplace(y, n, a.act);
    for (int k = 0; k < n; k += V::N)
      V::store_n(y + k, V::mul(V::load_n(y + k, n - k), V::load_n(x + n + k, n - k)), n - k);
    if (a.qo.q) quantize_into(y, n, a.qo, static_cast<int>(m));
  }
}

}  // namespace ZOI_NS
}  // namespace zoi
