// Pooling over each packed sequence (mean / CLS / max) and L2 normalisation of the rows.
#include <cmath>

#include "kernels.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {

// out[b] = mean / first / max of x[cu[b]:cu[b+1]]; sequences split over threads
void pool(const PoolArgs& a, int tid, int nt) {
  long lo, hi;
  if (a.mode == 3) {  // splade: log1p(relu(max over tokens)); [B, vocab]: split over column blocks
    constexpr int kBlk = 512;
    const long nb = (a.H + kBlk - 1) / kBlk;
    split_range(a.B * nb, tid, nt, &lo, &hi);
    for (long i = lo; i < hi; ++i) {
      const long b = i / nb;
      const int k0 = static_cast<int>(i % nb) * kBlk, k1 = k0 + kBlk < a.H ? k0 + kBlk : a.H;
      const int s = a.cu[b], e = a.cu[b + 1];
      float* o = a.out + b * a.ldo;
      for (int k = k0; k < k1; k += V::N) {
        const int n = k1 - k < V::N ? k1 - k : V::N;
        V::T acc = V::load_n(a.x + static_cast<size_t>(s) * a.ldx + k, n);
        for (int t = s + 1; t < e; ++t) acc = V::max(acc, V::load_n(a.x + static_cast<size_t>(t) * a.ldx + k, n));
        V::store_n(o + k, V::max(acc, V::zero()), n);
      }
      for (int k = k0; k < k1; ++k) o[k] = std::log1p(o[k]);
    }
    return;
  }
  split_range(a.B, tid, nt, &lo, &hi);
  for (long b = lo; b < hi; ++b) {
    const int s = a.cu[b], e = a.cu[b + 1];
    float* o = a.out + b * a.ldo;
    for (int k = 0; k < a.H; k += V::N) {
      const int n = a.H - k;
      V::T acc = V::load_n(a.x + static_cast<size_t>(s) * a.ldx + k, n);
      if (a.mode == 0) {
        for (int t = s + 1; t < e; ++t) acc = V::add(acc, V::load_n(a.x + static_cast<size_t>(t) * a.ldx + k, n));
        acc = V::div(acc, V::set(static_cast<float>(e - s)));
      } else if (a.mode == 2) {
        for (int t = s + 1; t < e; ++t) acc = V::max(acc, V::load_n(a.x + static_cast<size_t>(t) * a.ldx + k, n));
      } else if (a.mode == 4) {  // the last token (decoder embedders)
        acc = V::load_n(a.x + static_cast<size_t>(e - 1) * a.ldx + k, n);
      }
      V::store_n(o + k, acc, n);
    }
  }
}

// p[b] /= max(||p[b]||_2, 1e-12), the norm in float64 as the reference
void normalize(float* p, int ld, int B, int H, int tid, int nt) {
  long lo, hi;
  split_range(B, tid, nt, &lo, &hi);
  for (long b = lo; b < hi; ++b) {
    float* r = p + b * ld;
    double s = 0;
    for (int k = 0; k < H; ++k) s += static_cast<double>(r[k]) * r[k];
    double n = std::sqrt(s);
    if (n < 1e-12) n = 1e-12;
    for (int k = 0; k < H; ++k) r[k] = static_cast<float>(r[k] / n);
  }
}

void activation(float* x, size_t n, int act) {
  for (size_t k = 0; k < n; k += 1 << 20) vact_inplace(x + k, static_cast<int>(n - k < (1u << 20) ? n - k : 1u << 20), act);
}

}  // namespace ZOI_NS
}  // namespace zoi
