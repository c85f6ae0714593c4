#include "sampler.h"

#include <algorithm>
#include <cmath>

namespace zoi {

namespace {
uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

int32_t sample_token(const float* lg, int V, double temp, long top_k, double top_p, uint64_t seed, int64_t index,
                     int32_t* idx, double* cum) {
  if (temp <= 0.0 || top_k == 1) {
    int best = 0;
    for (int i = 1; i < V; ++i)
      if (lg[i] > lg[best]) best = i;
    return best;
  }
  for (int i = 0; i < V; ++i) idx[i] = i;
  auto before = [&](int32_t a, int32_t c) {
    const double za = lg[a] / temp, zc = lg[c] / temp;
    return za > zc || (za == zc && a < c);
  };
  int n = V;
  if (top_k > 0 && top_k < V) {
    n = static_cast<int>(top_k);
    std::partial_sort(idx, idx + n, idx + V, before);
  } else {
    std::sort(idx, idx + V, before);
  }
  const double z0 = lg[idx[0]] / temp;
  double acc = 0.0;
  for (int i = 0; i < n; ++i) {
    acc += std::exp(lg[idx[i]] / temp - z0);
    cum[i] = acc;
  }
  int keep = n;
  if (top_p < 1.0) {
    const double target = top_p * cum[n - 1];
    keep = static_cast<int>(std::lower_bound(cum, cum + n, target) - cum) + 1;
    keep = std::min(std::max(keep, 1), n);
  }
  const uint64_t r = mix64(mix64(seed) ^ static_cast<uint64_t>(index));
  const double u = static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0) * cum[keep - 1];
  const int j = static_cast<int>(std::upper_bound(cum, cum + keep, u) - cum);
  return idx[std::min(j, keep - 1)];
}

}  // namespace zoi
