// numpy's float32 reductions, reproduced operation for operation (the reference engine is
// numpy: matching its rounding keeps the INT8 quantisation that follows a float op exact).
#pragma once
#include "kernels.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {

// numpy's float32 sum of a contiguous row (pairwise_sum in numpy's loops_utils): blocks of at
// most 128 summed with 8 strided accumulators combined as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)),
// halves (rounded to multiples of 8) above that. Reproducing the order makes LayerNorm and
// softmax sums bit-identical to the reference.
inline float np_sum(const float* a, int n) {
  if (n < 8) {
    float r = 0.f;
    for (int i = 0; i < n; ++i) r += a[i];
    return r;
  }
  if (n <= 128) {
    float r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int n2 = n / 2;
  n2 -= n2 % 8;
  return np_sum(a, n2) + np_sum(a + n2, n - n2);
}

}  // namespace ZOI_NS
}  // namespace zoi
