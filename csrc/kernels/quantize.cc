// Per-token dynamic (or static per-tensor) quantisation of float rows for the INT8 GEMM.
#include "qrow.h"

namespace zoi {
namespace ZOI_NS {

// x [M, ldx] -> qo.q [M, qo.ldq], qo.scale [M]; rows split over threads
void quantize_rows(const float* x, int ldx, int M, int K, const QuantOut& qo, int tid, int nt) {
  long lo, hi;
  split_range(M, tid, nt, &lo, &hi);
  for (long m = lo; m < hi; ++m)
    qo.scale[m] = quantize_row(x + m * ldx, K, qrow_ptr(qo, static_cast<int>(m)), qo.ldq, qo.static_amax);
}

}  // namespace ZOI_NS
}  // namespace zoi
