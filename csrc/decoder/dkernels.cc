// Decoder kernels (dkernels.h), compiled once per ISA with -DZOI_NS=<isa>.
#include "dkernels.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "../kernels/kernels.h"
#include "../kernels/simd.h"

namespace zoi {
namespace ZOI_NS {
namespace {

#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVX512)
constexpr int NB = 2, MR = 6;
#elif defined(ZOI_ISA_AVX2)
constexpr int NB = 4, MR = 3;
#elif defined(ZOI_ISA_NEON)
constexpr int NB = 8, MR = 2;  // 4-lane vectors: 16 accumulators + 8 weight vectors + the broadcast
#else
constexpr int NB = 32, MR = 2;
#endif
constexpr int PW = V::N * NB;
static_assert(PW == kDecPanel, "one packed layout for every ISA");
constexpr int MC = 96;   // rows per M chunk
constexpr int KC = 256;  // K per block (a panel block stays in L1 / L2 across the M tiles)

template <class WT>
ZOI_INLINE V::T wload(const WT* p);
template <>
ZOI_INLINE V::T wload<float>(const float* p) { return V::load(p); }
template <>
ZOI_INLINE V::T wload<int8_t>(const int8_t* p) {
#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVX512)
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(ZOI_ISA_AVX2)
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#elif defined(ZOI_ISA_NEON)
  int32_t v;  // 4 s8 -> s16 -> s32 -> f32 (exact)
  std::memcpy(&v, p, 4);
  const int16x8_t h = vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(v)));
  return vcvtq_f32_s32(vmovl_s16(vget_low_s16(h)));
#else
  return static_cast<float>(*p);
#endif
}

template <int R, class WT>
ZOI_INLINE void tile(const DecLinear& a, int m, int pn, int k0, int kc, bool first, bool last) {
  using T = V::T;
  const int n0 = pn * PW, nrem = a.N - n0;
  T acc[R][NB];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NB; ++j)
      acc[r][j] = first ? V::zero() : V::load_n(a.y + static_cast<size_t>(m + r) * a.ldy + n0 + j * V::N, nrem - j * V::N);
  const WT* w = static_cast<const WT*>(a.w) + (static_cast<size_t>(pn) * a.K + k0) * PW;
  const float* x = a.x + static_cast<size_t>(m) * a.ldx + k0;
  for (int k = 0; k < kc; ++k) {
    T b[NB];
#pragma GCC unroll 32
    for (int j = 0; j < NB; ++j) b[j] = wload<WT>(w + static_cast<size_t>(k) * PW + j * V::N);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const T xv = V::set(x[static_cast<size_t>(r) * a.ldx + k]);
#pragma GCC unroll 32
      for (int j = 0; j < NB; ++j) acc[r][j] = V::fma(xv, b[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float* y = a.y + static_cast<size_t>(m + r) * a.ldy + n0;
    const float* res = last && a.res ? a.res + static_cast<size_t>(m + r) * a.ldr + n0 : nullptr;
    for (int j = 0; j < NB; ++j) {
      const int n = nrem - j * V::N;
      if (n <= 0) break;
      T f = acc[r][j];
      if (last) {
        if (a.scale) f = V::mul(f, V::load_n(a.scale + n0 + j * V::N, n));
        if (a.bias) f = V::add(f, V::load_n(a.bias + n0 + j * V::N, n));
        if (res) f = V::add(f, V::load_n(res + j * V::N, n));
      }
      V::store_n(y + j * V::N, f, n);
    }
  }
}

template <int R, class WT>
ZOI_INLINE void tile_rows(int mr, const DecLinear& a, int m, int pn, int k0, int kc, bool first, bool last) {
  if (mr == R) tile<R, WT>(a, m, pn, k0, kc, first, last);
  else if constexpr (R > 1) tile_rows<R - 1, WT>(mr, a, m, pn, k0, kc, first, last);
}

template <class WT>
void linear_t(const DecLinear& a, int part, int parts) {
  const int npanels = (a.N + PW - 1) / PW;
  const int nch = (a.M + MC - 1) / MC;
  long lo, hi;
  split_range(static_cast<long>(nch) * npanels, part, parts, &lo, &hi);
  for (long it = lo; it < hi; ++it) {
    const int ch = static_cast<int>(it / npanels), pn = static_cast<int>(it % npanels);
    const int m0 = ch * MC, m1 = m0 + MC < a.M ? m0 + MC : a.M;
    if (a.K == 0) {
      for (int m = m0; m < m1; m += MR) tile_rows<MR, WT>(m1 - m < MR ? m1 - m : MR, a, m, pn, 0, 0, true, true);
      continue;
    }
    for (int k0 = 0; k0 < a.K; k0 += KC) {
      const int kc = a.K - k0 < KC ? a.K - k0 : KC;
      for (int m = m0; m < m1; m += MR)
        tile_rows<MR, WT>(m1 - m < MR ? m1 - m : MR, a, m, pn, k0, kc, k0 == 0, k0 + kc == a.K);
    }
  }
}

void linear(const DecLinear& a, int part, int parts) {
  if (a.M <= 0 || a.N <= 0) return;
  if (a.wtype == 1) linear_t<int8_t>(a, part, parts);
  else linear_t<float>(a, part, parts);
}

int linear_parts(int M, int N) {
  const long items = static_cast<long>((M + MC - 1) / MC) * ((N + PW - 1) / PW);
  return static_cast<int>(items < 1 ? 1 : items > 512 ? 512 : items);
}

ZOI_INLINE float dot(const float* a, const float* b, int n) {
  V::T s = V::zero();
  int i = 0;
  for (; i + V::N <= n; i += V::N) s = V::fma(V::load(a + i), V::load(b + i), s);
  if (i < n) s = V::fma(V::load_n(a + i, n - i), V::load_n(b + i, n - i), s);
  return V::hsum(s);
}

ZOI_INLINE void norm_row(const float* x, const float* w, float eps, int H, float* y) {
  const float ss = dot(x, x, H);
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(H) + eps);
  const V::T iv = V::set(inv);
  int i = 0;
  for (; i + V::N <= H; i += V::N) V::store(y + i, V::mul(V::mul(V::load(x + i), iv), V::load(w + i)));
  if (i < H) V::store_n(y + i, V::mul(V::mul(V::load_n(x + i, H - i), iv), V::load_n(w + i, H - i)), H - i);
}

void rmsnorm(const DecNorm& a, int part, int parts) {
  long lo, hi;
  split_range(a.M, part, parts, &lo, &hi);
  for (long m = lo; m < hi; ++m) {
    const long src = a.rows ? a.rows[m] : m;
    norm_row(a.x + src * a.ldx, a.w, a.eps, a.H, a.y + m * a.ldy);
  }
}

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

void qkv_post(const DecQkvPost& a, int part, int parts) {
  long lo, hi;
  split_range(a.T, part, parts, &lo, &hi);
  const int D = a.D, h = D / 2;
  for (long t = lo; t < hi; ++t) {
    float* row = a.qkv + t * a.ldqkv;
    const int p = a.pos[t];
    const float* c = a.cos + static_cast<size_t>(p) * h;
    const float* s = a.sin + static_cast<size_t>(p) * h;
    for (int i = 0; i < a.nh + a.nkv; ++i) {
      float* x = row + static_cast<size_t>(i) * D;
      const float* nw = i < a.nh ? a.qn : a.kn;
      if (nw) norm_row(x, nw, a.eps, D, x);
      rope(x, c, s, h);
    }
    const int blk = a.tables[static_cast<size_t>(a.row[t]) * a.ldt + p / a.bs], off = p % a.bs;
    for (int i = 0; i < a.nkv; ++i) {
      const size_t at = ((static_cast<size_t>(blk) * a.nkv + i) * a.bs + off) * D;
      std::memcpy(a.kc + at, row + static_cast<size_t>(a.nh + i) * D, D * sizeof(float));
      std::memcpy(a.vc + at, row + static_cast<size_t>(a.nh + a.nkv + i) * D, D * sizeof(float));
    }
  }
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void attn_item(const DecAttn& a, int t, int hk, int sp) {
  const int D = a.D, G = a.nh / a.nkv;
  const int L = a.pos[t] + 1;
  const int lo = sp * a.chunk, hi = lo + a.chunk < L ? lo + a.chunk : L;
  alignas(64) float acc[kDecMaxD];
  alignas(64) float sc[kDecMaxBlock + 16];
  const int32_t* tab = a.tables + static_cast<size_t>(a.row[t]) * a.ldt;
  for (int g = 0; g < G; ++g) {
    const int qh = hk * G + g;
    const float* q = a.q + static_cast<size_t>(t) * a.ldq + static_cast<size_t>(qh) * D;
    float m = kNegInf, l = 0.f;
    for (int d = 0; d < D; ++d) acc[d] = 0.f;
    for (int j0 = lo; j0 < hi;) {
      const int bi = j0 / a.bs, b0 = bi * a.bs;
      const int j1 = b0 + a.bs < hi ? b0 + a.bs : hi;
      const int n = j1 - j0;
      const size_t base = ((static_cast<size_t>(tab[bi]) * a.nkv + hk) * a.bs + (j0 - b0)) * D;
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
      float* pp = a.part + ((((static_cast<size_t>(t) * a.nkv + hk) * a.splits + sp) * G + g) * (D + 2));
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

void attention(const DecAttn& a, int part, int parts) {
  long lo, hi;
  split_range(static_cast<long>(a.T) * a.nkv * a.splits, part, parts, &lo, &hi);
  for (long it = lo; it < hi; ++it) {
    const int sp = static_cast<int>(it % a.splits);
    const long th = it / a.splits;
    attn_item(a, static_cast<int>(th / a.nkv), static_cast<int>(th % a.nkv), sp);
  }
}

void attn_merge(const DecAttn& a, int part, int parts) {
  if (a.splits <= 1) return;
  long lo, hi;
  split_range(static_cast<long>(a.T) * a.nkv, part, parts, &lo, &hi);
  const int D = a.D, G = a.nh / a.nkv;
  for (long it = lo; it < hi; ++it) {
    const int t = static_cast<int>(it / a.nkv), hk = static_cast<int>(it % a.nkv);
    for (int g = 0; g < G; ++g) {
      const float* base = a.part + ((static_cast<size_t>(t) * a.nkv + hk) * a.splits * G + g) * (D + 2);
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

constexpr int kSiluCols = 512;

void silu_mul(const float* gu, int ldgu, int M, int I, float* y, int ldy, int part, int parts) {
  const int nc = (I + kSiluCols - 1) / kSiluCols;
  long lo, hi;
  split_range(static_cast<long>(M) * nc, part, parts, &lo, &hi);
  const V::T one = V::set(1.f);
  for (long it = lo; it < hi; ++it) {
    const int m = static_cast<int>(it / nc), c0 = static_cast<int>(it % nc) * kSiluCols;
    const int c1 = c0 + kSiluCols < I ? c0 + kSiluCols : I;
    const float* g = gu + static_cast<size_t>(m) * ldgu;
    const float* u = g + I;
    float* o = y + static_cast<size_t>(m) * ldy;
    int i = c0;
    for (; i + V::N <= c1; i += V::N) {
      const V::T gv = V::load(g + i);
      const V::T s = V::div(gv, V::add(one, vexp<V>(V::sub(V::zero(), gv))));
      V::store(o + i, V::mul(s, V::load(u + i)));
    }
    for (; i < c1; ++i) o[i] = g[i] / (1.f + vexp<S1>(-g[i])) * u[i];
  }
}

}  // namespace

#if defined(ZOI_ISA_VNNI)
#define ZOI_DISA Isa::Vnni
#elif defined(ZOI_ISA_AVX512)
#define ZOI_DISA Isa::Avx512
#elif defined(ZOI_ISA_AVX2)
#define ZOI_DISA Isa::Avx2
#elif defined(ZOI_ISA_NEON)
#define ZOI_DISA Isa::Neon
#else
#define ZOI_DISA Isa::Scalar
#endif

const DecKernels& dec_table() {
  static const DecKernels t{ZOI_DISA, &linear, &linear_parts, &rmsnorm, &qkv_post, &attention, &attn_merge, &silu_mul};
  return t;
}

}  // namespace ZOI_NS
}  // namespace zoi
