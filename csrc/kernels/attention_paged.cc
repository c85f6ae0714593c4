// Attention over a paged KV cache (kernels.h PagedQkvArgs / PagedAttnArgs): the decoder layer of
// generation, compiled once per ISA like every kernel here. Float32 throughout: the cache holds the
// rotated K rows and V rows as the layer's linear wrote them (the same numbers the varlen
// attention of attention.cc reads from the packed rows).
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {
namespace {

ZOI_INLINE float dot(const float* a, const float* b, int n) {
  V::T s = V::zero();
  int i = 0;
  for (; i + V::N <= n; i += V::N) s = V::fma(V::load(a + i), V::load(b + i), s);
  if (i < n) s = V::fma(V::load_n(a + i, n - i), V::load_n(b + i, n - i), s);
  return V::hsum(s);
}

// y = x / sqrt(mean(x^2) + eps) * w over n values (in place allowed)
ZOI_INLINE void rms_row(const float* x, const float* w, float eps, int n, float* y) {
  const float inv = 1.f / std::sqrt(dot(x, x, n) / static_cast<float>(n) + eps);
  const V::T iv = V::set(inv);
  int i = 0;
  for (; i + V::N <= n; i += V::N) V::store(y + i, V::mul(V::mul(V::load(x + i), iv), V::load(w + i)));
  if (i < n) V::store_n(y + i, V::mul(V::mul(V::load_n(x + i, n - i), iv), V::load_n(w + i, n - i)), n - i);
}

// rotate_half RoPE of one head: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s), h = d / 2
ZOI_INLINE void rope(float* x, const float* c, const float* s, int h) {
  int i = 0;
  for (; i + V::N <= h; i += V::N) {
    const V::T x1 = V::load(x + i), x2 = V::load(x + h + i), cv = V::load(c + i), sv = V::load(s + i);
    V::store(x + i, V::sub(V::mul(x1, cv), V::mul(x2, sv)));
    V::store(x + h + i, V::add(V::mul(x2, cv), V::mul(x1, sv)));
  }
  for (; i < h; ++i) {
    const float x1 = x[i], x2 = x[h + i];
    x[i] = x1 * c[i] - x2 * s[i];
    x[h + i] = x2 * c[i] + x1 * s[i];
  }
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// one (token, kv head, split): online softmax over the split's positions, block by block
void item(const PagedAttnArgs& a, int t, int hk, int sp) {
  const int D = a.d, G = a.heads / a.kv_heads;
  const int L = a.pos[t] + 1;
  const int lo = sp * a.chunk, hi = lo + a.chunk < L ? lo + a.chunk : L;
  alignas(64) float acc[kMaxHeadDim];
  alignas(64) float sc[kPagedMaxBlock + 16];
  const int32_t* tab = a.tables + static_cast<size_t>(a.row[t]) * a.ldt;
  for (int g = 0; g < G; ++g) {
    const int qh = hk * G + g;
    const float* q = a.q + static_cast<size_t>(t) * a.ldq + static_cast<size_t>(qh) * D;
    float m = kNegInf, l = 0.f;
    for (int d = 0; d < D; ++d) acc[d] = 0.f;
    for (int j0 = lo; j0 < hi;) {
      const int bi = j0 / a.block, b0 = bi * a.block;
      const int j1 = b0 + a.block < hi ? b0 + a.block : hi;
      const int n = j1 - j0;
      const size_t base = ((static_cast<size_t>(tab[bi]) * a.kv_heads + hk) * a.block + (j0 - b0)) * D;
      const float* K = a.kc + base;
      const float* Vv = a.vc + base;
      float mx = m;
      for (int j = 0; j < n; ++j) {
        sc[j] = dot(q, K + static_cast<size_t>(j) * D, D) * a.scale;
        mx = sc[j] > mx ? sc[j] : mx;
      }
      const float corr = m == kNegInf ? 0.f : std::exp(m - mx);
      int j = 0;
      const V::T mv = V::set(mx);
      V::T ls = V::zero();
      for (; j + V::N <= n; j += V::N) {
        const V::T e = vexp<V>(V::sub(V::load(sc + j), mv));
        V::store(sc + j, e);
        ls = V::add(ls, e);
      }
      float lsum = V::hsum(ls);
      for (; j < n; ++j) {
        sc[j] = vexp<S1>(sc[j] - mx);
        lsum += sc[j];
      }
      l = l * corr + lsum;
      const V::T cv = V::set(corr);
      int d = 0;
      for (; d + V::N <= D; d += V::N) {
        V::T s = V::mul(V::load(acc + d), cv);
        for (int jj = 0; jj < n; ++jj) s = V::fma(V::set(sc[jj]), V::load(Vv + static_cast<size_t>(jj) * D + d), s);
        V::store(acc + d, s);
      }
      if (d < D) {
        const int r = D - d;
        V::T s = V::mul(V::load_n(acc + d, r), cv);
        for (int jj = 0; jj < n; ++jj) s = V::fma(V::set(sc[jj]), V::load_n(Vv + static_cast<size_t>(jj) * D + d, r), s);
        V::store_n(acc + d, s, r);
      }
      m = mx;
      j0 = j1;
    }
    if (a.splits > 1) {
      float* pp = a.part + ((((static_cast<size_t>(t) * a.kv_heads + hk) * a.splits + sp) * G + g) * (D + 2));
      pp[0] = m;
      pp[1] = l;
      std::memcpy(pp + 2, acc, D * sizeof(float));
    } else {
      float* o = a.out + static_cast<size_t>(t) * a.ldo + static_cast<size_t>(qh) * D;
      const float inv = l > 0.f ? 1.f / l : 0.f;
      for (int d = 0; d < D; ++d) o[d] = acc[d] * inv;
    }
  }
}

}  // namespace

void paged_qkv(const PagedQkvArgs& a, int tid, int nt) {
  long lo, hi;
  split_range(a.T, tid, nt, &lo, &hi);
  const int D = a.d, h = D / 2;
  for (long t = lo; t < hi; ++t) {
    float* row = a.qkv + t * a.ldqkv;
    const int p = a.pos[t];
    const float* c = a.cos + static_cast<size_t>(p) * h;
    const float* s = a.sin + static_cast<size_t>(p) * h;
    for (int i = 0; i < a.heads + a.kv_heads; ++i) {
      float* x = row + static_cast<size_t>(i) * D;
      const float* nw = i < a.heads ? a.q_norm : a.k_norm;
      if (nw) rms_row(x, nw, a.qk_eps, D, x);
      rope(x, c, s, h);
    }
    const int blk = a.tables[static_cast<size_t>(a.row[t]) * a.ldt + p / a.block], off = p % a.block;
    for (int i = 0; i < a.kv_heads; ++i) {
      const size_t at = ((static_cast<size_t>(blk) * a.kv_heads + i) * a.block + off) * D;
      std::memcpy(a.kc + at, row + static_cast<size_t>(a.heads + i) * D, D * sizeof(float));
      std::memcpy(a.vc + at, row + static_cast<size_t>(a.heads + a.kv_heads + i) * D, D * sizeof(float));
    }
  }
}

void paged_attention(const PagedAttnArgs& a, int tid, int nt) {
  long lo, hi;
  split_range(static_cast<long>(a.T) * a.kv_heads * a.splits, tid, nt, &lo, &hi);
  for (long it = lo; it < hi; ++it) {
    const int sp = static_cast<int>(it % a.splits);
    const long th = it / a.splits;
    item(a, static_cast<int>(th / a.kv_heads), static_cast<int>(th % a.kv_heads), sp);
  }
}

void paged_merge(const PagedAttnArgs& a, int tid, int nt) {
  if (a.splits <= 1) return;
  long lo, hi;
  split_range(static_cast<long>(a.T) * a.kv_heads, tid, nt, &lo, &hi);
  const int D = a.d, G = a.heads / a.kv_heads;
  for (long it = lo; it < hi; ++it) {
    const int t = static_cast<int>(it / a.kv_heads), hk = static_cast<int>(it % a.kv_heads);
    for (int g = 0; g < G; ++g) {
      const float* base = a.part + ((static_cast<size_t>(t) * a.kv_heads + hk) * a.splits * G + g) * (D + 2);
      const size_t stride = static_cast<size_t>(G) * (D + 2);
      float M = kNegInf;
      for (int s = 0; s < a.splits; ++s) M = base[s * stride] > M ? base[s * stride] : M;
      float* o = a.out + static_cast<size_t>(t) * a.ldo + static_cast<size_t>(hk * G + g) * D;
      for (int d = 0; d < D; ++d) o[d] = 0.f;
      float L = 0.f;
      for (int s = 0; s < a.splits; ++s) {
        const float* pp = base + s * stride;
        if (pp[0] == kNegInf) continue;
        const float f = std::exp(pp[0] - M);
        L += pp[1] * f;
        for (int d = 0; d < D; ++d) o[d] += pp[2 + d] * f;
      }
      const float inv = L > 0.f ? 1.f / L : 0.f;
      for (int d = 0; d < D; ++d) o[d] *= inv;
    }
  }
}

}  // namespace ZOI_NS
}  // namespace zoi
