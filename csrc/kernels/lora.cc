// The task adapters' term of a linear (LoRA, jina-embeddings-v3): after the linear's GEMM wrote
// y = x W^T + b (no activation, no residual), each row m whose sequence runs task t gets
// y[m] += (x[m] A_t^T) B_t^T, then every row y = act(y) (+ res). The reference's order
// (zoi.numerics.reference.lora_delta): r dot products over K, then one product per output.
// Rows are split over threads and each row is computed alone, in the same order whatever the
// batch: a row's numbers depend on its own task only (a mixed batch equals its tasks run alone).
#include "kernels.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {

namespace {

// xa[j] = x . a[j] for j < r (a: r rows of K), four rows of A per pass over x
void dots(const float* x, const float* a, int K, int r, float* xa) {
  int j = 0;
  for (; j + 4 <= r; j += 4) {
    const float* a0 = a + static_cast<size_t>(j) * K;
    V::T s0 = V::zero(), s1 = V::zero(), s2 = V::zero(), s3 = V::zero();
    for (int k = 0; k < K; k += V::N) {
      const int n = K - k;
      const V::T xv = V::load_n(x + k, n);
      s0 = V::fma(xv, V::load_n(a0 + k, n), s0);
      s1 = V::fma(xv, V::load_n(a0 + K + k, n), s1);
      s2 = V::fma(xv, V::load_n(a0 + 2 * K + k, n), s2);
      s3 = V::fma(xv, V::load_n(a0 + 3 * K + k, n), s3);
    }
    xa[j] = V::hsum(s0);
    xa[j + 1] = V::hsum(s1);
    xa[j + 2] = V::hsum(s2);
    xa[j + 3] = V::hsum(s3);
  }
  for (; j < r; ++j) {
    const float* aj = a + static_cast<size_t>(j) * K;
    V::T s = V::zero();
    for (int k = 0; k < K; k += V::N) s = V::fma(V::load_n(x + k, K - k), V::load_n(aj + k, K - k), s);
    xa[j] = V::hsum(s);
  }
}

}  // namespace

void lora(const LoraArgs& p, int tid, int nt) {
  long lo, hi;
  split_range(p.M, tid, nt, &lo, &hi);
  const int N = p.N, K = p.K, r = p.r;
  float xa[kMaxLoraRank];
  for (long m = lo; m < hi; ++m) {
    float* y = p.y + m * p.ldy;
    const int t = p.tok_task ? p.tok_task[m] : -1;
    if (t >= 0) {
      dots(p.x + m * p.ldx, p.a + static_cast<size_t>(t) * r * K, K, r, xa);
      const float* bt = p.bt + static_cast<size_t>(t) * r * N;
      for (int n = 0; n < N; n += V::N) {
        const int c = N - n;
        V::T d = V::mul(V::set(xa[0]), V::load_n(bt + n, c));
        for (int j = 1; j < r; ++j) d = V::fma(V::set(xa[j]), V::load_n(bt + static_cast<size_t>(j) * N + n, c), d);
        V::store_n(y + n, V::add(V::load_n(y + n, c), d), c);
      }
    }
    vact_inplace(y, N, p.act);
    if (p.res) {
      const float* rr = p.res + m * p.ldr;
      for (int n = 0; n < N; n += V::N) V::store_n(y + n, V::add(V::load_n(y + n, N - n), V::load_n(rr + n, N - n)), N - n);
    }
  }
}

}  // namespace ZOI_NS
}  // namespace zoi
