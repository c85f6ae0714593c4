// Per-token dynamic (symmetric or asymmetric) or static per-tensor quantisation of float rows
// for the INT8 GEMM (numerics in qrow.h).
#include "qrow.h"

namespace zoi {
namespace ZOI_NS {

// x [M, ldx] -> qo.q [M, qo.ldq], qo.scale [M]; rows split over threads
void quantize_rows(const float* x, int ldx, int M, int K, const QuantOut& qo, int tid, int nt) {
  long lo, hi;
  split_range(M, tid, nt, &lo, &hi);
  for (long m = lo; m < hi; ++m)
    quantize_into(x + m * ldx, K, qo, static_cast<int>(m));
}

}  // namespace ZOI_NS
}  // namespace zoi
