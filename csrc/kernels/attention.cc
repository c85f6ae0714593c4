// Varlen multi-head self-attention over packed sequences, FP32 inside. Optional (AttnArgs):
// MPNet's relative position bias added to the scaled scores, ModernBERT's local window (a block
// of query rows computes only the keys of its windows; softmax over each row's own keys) and
// RoPE (q rows rotated into the scratch, k rotated while K^T is laid out).
// One work item = (sequence, head); items are split over threads by cost (L^2) so that
// ragged batches stay balanced, and each thread prefetches its next item's q / k / v rows
// into L2 while it computes the current one. Per item: K^T of the head is laid out [d][Lp]
// in the thread's scratch (16 x 16 blocks transposed in registers) so that a query row's
// scores are vector FMAs over keys, and V's rows are copied out of the 3H stride; softmax
// without division (e = 2^(s log2 e - m log2 e) by `vexp2`, the sum in vector lanes); then
// ctx = (sum_j e_j v_j) / sum with the output rows held in registers.
// Numerics: to tolerance of the numpy reference, not step for step (until 2026-12-01 it was
// bit-identical where BLAS uses one FMA chain: np.exp's kernel with its division, numpy's
// pairwise sum, p = e / sum before p.v; that softmax cost ~27% of the kernel). Against the
// float64 reference the error stays within 4x the float32 numpy reference's own
// (tests/cpu/test_attention_fast.py, tests/ops/test_attention*.py).
// Opt-in (AttnArgs::prec, VNNI builds): q.k^T, and optionally p.v, in INT8 with
// vpdpbusd (attention_i8.h, vnni / amx tables), or both in BF16 on AMX tiles (attention_amx.h,
// the amx table only: attention_amx);
// tests/cpu/test_attention_i8.py, lab/cpu/README.md for the figures.
#if defined(ZOI_ISA_VNNI)
#include <cpuid.h>  // attention_amx.h: AMX-BF16 / AVX512-BF16 bits
#endif

#include "kernels.h"
#include "np_sum.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {
namespace {

using T = V::T;
// grouped KV heads: the offset in a qkv row of the KV head that head h reads, and the width of
// the k (or v) block (kv_heads 0: as many as heads)
inline size_t kv_width(const AttnArgs& a) {
  return static_cast<size_t>(a.kv_heads > 0 ? a.kv_heads : a.heads) * a.d;
}
inline size_t kv_off(const AttnArgs& a, int h) {
  const int group = a.kv_heads > 0 ? a.heads / a.kv_heads : 1;
  return static_cast<size_t>(a.heads) * a.d + static_cast<size_t>(h / group) * a.d;
}
#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVX512)
constexpr int NQMAX_ISA = 4;  // query rows per pass (32 zmm registers)
constexpr int kVRegs = 32;
#elif defined(ZOI_ISA_AVX2)
constexpr int NQMAX_ISA = 4;  // 16 ymm: the scores of 4 rows go 2 vectors at a time (4 x 2 + 2 + 1)
constexpr int kVRegs = 16;
#elif defined(ZOI_ISA_NEON)
constexpr int NQMAX_ISA = 4;  // 32 q registers, as the zmm builds
constexpr int kVRegs = 32;
#else
constexpr int NQMAX_ISA = 2;
constexpr int kVRegs = 1 << 20;
#endif
// lab/cpu/attn_ab.sh EXTRA=-DZOI_ATTN_NQ=8: the query-blocking experiment (at most 8: the
// scratch holds 8 score rows)
#ifdef ZOI_ATTN_NQ
constexpr int NQMAX = ZOI_ATTN_NQ;
#else
constexpr int NQMAX = NQMAX_ISA;
#endif
// key vectors per scores block: as many as the accumulators NQ x NV + NV keys + 1 fit registers
template <int NQ>
constexpr int scores_nv() { return NQ * 4 + 4 + 1 <= kVRegs ? 4 : 2; }

// s_i[j : j + NV*N) = scale * q_i . k_j for NQ query rows at once (K^T loads shared)
template <int NQ, int NV>
inline void scores_block(const float* const* q, const float* kt, int lp, int d, int j, float* const* s, T scale) {
  T acc[NQ][NV];
#pragma GCC unroll 4
  for (int r = 0; r < NQ; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < NV; ++u) acc[r][u] = V::zero();
  for (int c = 0; c < d; ++c) {
    const float* kr = kt + static_cast<size_t>(c) * lp + j;
    T k[NV];
#pragma GCC unroll 4
    for (int u = 0; u < NV; ++u) k[u] = V::load(kr + u * V::N);
#pragma GCC unroll 4
    for (int r = 0; r < NQ; ++r) {
      T qc = V::set(q[r][c]);
#pragma GCC unroll 4
      for (int u = 0; u < NV; ++u) acc[r][u] = V::fma_exact(qc, k[u], acc[r][u]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NQ; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < NV; ++u) V::store(s[r] + j + u * V::N, V::mul(acc[r][u], scale));
}

// o_i[c0 : c0 + NV*N) = inv_i sum_j e_i[j] v_j for NQ rows. With 32 registers the even and odd
// keys go to two sets of accumulators (2 NQ NV independent FMA chains: 8 were too few to cover
// the FMA latency), added at the end.
constexpr int kPvSplit = kVRegs >= 32 ? 2 : 1;
template <int NQ, int NV, bool FULL>
inline void pv_block(const float* const* p, const float* v, int ldv, int ja, int jb, int c0, int d, float* const* o,
                     const float* inv) {
  constexpr int JS = kPvSplit * NV * (NQ + 1) + 1 <= kVRegs ? kPvSplit : 1;
  T acc[JS][NQ][NV];
#pragma GCC unroll 2
  for (int g = 0; g < JS; ++g)
#pragma GCC unroll 4
    for (int r = 0; r < NQ; ++r)
#pragma GCC unroll 4
      for (int u = 0; u < NV; ++u) acc[g][r][u] = V::zero();
  int j = ja;
  for (; j + JS <= jb; j += JS) {
#pragma GCC unroll 2
    for (int g = 0; g < JS; ++g) {
      const float* vr = v + static_cast<size_t>(j + g) * ldv + c0;
      T vv[NV];
#pragma GCC unroll 4
      for (int u = 0; u < NV; ++u) vv[u] = FULL ? V::load(vr + u * V::N) : V::load_n(vr + u * V::N, d - c0 - u * V::N);
#pragma GCC unroll 4
      for (int r = 0; r < NQ; ++r) {
        const T pj = V::set(p[r][j + g]);
#pragma GCC unroll 4
        for (int u = 0; u < NV; ++u) acc[g][r][u] = V::fma_exact(pj, vv[u], acc[g][r][u]);
      }
    }
  }
  for (; j < jb; ++j) {
    const float* vr = v + static_cast<size_t>(j) * ldv + c0;
    T vv[NV];
#pragma GCC unroll 4
    for (int u = 0; u < NV; ++u) vv[u] = FULL ? V::load(vr + u * V::N) : V::load_n(vr + u * V::N, d - c0 - u * V::N);
#pragma GCC unroll 4
    for (int r = 0; r < NQ; ++r) {
      const T pj = V::set(p[r][j]);
#pragma GCC unroll 4
      for (int u = 0; u < NV; ++u) acc[0][r][u] = V::fma_exact(pj, vv[u], acc[0][r][u]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NQ; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < NV; ++u) {
      T t = acc[0][r][u];
      if (JS == 2) t = V::add(t, acc[JS - 1][r][u]);
      V::store_n(o[r] + c0 + u * V::N, V::mul(t, V::set(inv[r])), d - c0 - u * V::N);
    }
}

// s[0:L) <- exp(s[0:L) - max) (unnormalised); returns 1 / sum. exp(s - m) = 2^t with
// t = s log2(e) - m log2(e) (one FMA), `vexp2` of simd.h (10 operations, no division); the sum
// accumulated in vector lanes as the exps are produced; the normalisation is applied to the
// L-times-smaller output row (pv_block).
inline float softmax_row(float* s, int L) {
  constexpr float kLog2e = 1.44269504088896341f;
  T mx = V::set(-INFINITY);
  int j = 0;
  for (; j + V::N <= L; j += V::N) mx = V::max(mx, V::load(s + j));
  float m = V::hmax(mx);
  for (; j < L; ++j) m = s[j] > m ? s[j] : m;
  const float nm = -m * kLog2e;
  const T vl = V::set(kLog2e), vnm = V::set(nm);
  T sum0 = V::zero(), sum1 = V::zero();
  for (j = 0; j + 2 * V::N <= L; j += 2 * V::N) {
    const T e0 = vexp2<V>(V::fma(V::load(s + j), vl, vnm));
    const T e1 = vexp2<V>(V::fma(V::load(s + j + V::N), vl, vnm));
    V::store(s + j, e0);
    V::store(s + j + V::N, e1);
    sum0 = V::add(sum0, e0);
    sum1 = V::add(sum1, e1);
  }
  for (; j + V::N <= L; j += V::N) {
    const T e = vexp2<V>(V::fma(V::load(s + j), vl, vnm));
    V::store(s + j, e);
    sum0 = V::add(sum0, e);
  }
  float tail = 0.f;
  for (; j < L; ++j) {
    s[j] = vexp2<S1>(S1::fma(s[j], kLog2e, nm));
    tail += s[j];
  }
  // the scalar build's two running sums would be chains of L/2 additions: numpy's pairwise sum
  if (V::N == 1) return 1.f / np_sum(s, L);
  return 1.f / (V::hsum(V::add(sum0, sum1)) + tail);
}

// x * cos + rotate_half(x) * sin of one row (d even) at position p, rounded as the reference:
// two products, then their sum (no FMA: -ffp-contract=off)
// y[c * ldy] for c < d (ldy = 1: a row; lp: a column of K^T)
inline void rope_row(const float* x, int d, const float* cs, const float* sn, float* y, size_t ldy) {
  const int h = d / 2;
  for (int c = 0; c < h; ++c) {
    const float x1 = x[c], x2 = x[c + h];
    const float a = x1 * cs[c], b = -x2 * sn[c];
    const float e = x2 * cs[c], f = x1 * sn[c];
    y[c * ldy] = a + b;
    y[(c + h) * ldy] = e + f;
  }
}

// The register transpose of transpose_k, written once over the vector width (zmm: 16 x 16, ymm:
// 8 x 8). Stages 1 and 2 are the same instructions at either width (they act within 128-bit
// lanes); stage 3 transposes the 128-bit lanes: 4 x 4 of them (zmm), 2 x 2 (ymm).
#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVX512)
ZOI_INLINE __m512 unpacklo(__m512 a, __m512 b) { return _mm512_unpacklo_ps(a, b); }
ZOI_INLINE __m512 unpackhi(__m512 a, __m512 b) { return _mm512_unpackhi_ps(a, b); }
template <int IMM>
ZOI_INLINE __m512 shuf(__m512 a, __m512 b) { return _mm512_shuffle_ps(a, b, IMM); }
// r[4g + m], 128-bit lane k: column 4k + m of rows 4g .. 4g + 3  ->  t[c]: column c
ZOI_INLINE void lanes(const __m512* r, __m512* t) {
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m) {
    const __m512 x0 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x88), x1 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xDD);
    const __m512 y0 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x88), y1 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xDD);
    t[m] = _mm512_shuffle_f32x4(x0, y0, 0x88);       // column m
    t[4 + m] = _mm512_shuffle_f32x4(x1, y1, 0x88);   // column 4 + m
    t[8 + m] = _mm512_shuffle_f32x4(x0, y0, 0xDD);   // column 8 + m
    t[12 + m] = _mm512_shuffle_f32x4(x1, y1, 0xDD);  // column 12 + m
  }
}
#elif defined(ZOI_ISA_AVX2)
ZOI_INLINE __m256 unpacklo(__m256 a, __m256 b) { return _mm256_unpacklo_ps(a, b); }
ZOI_INLINE __m256 unpackhi(__m256 a, __m256 b) { return _mm256_unpackhi_ps(a, b); }
template <int IMM>
ZOI_INLINE __m256 shuf(__m256 a, __m256 b) { return _mm256_shuffle_ps(a, b, IMM); }
// r[4g + m], 128-bit lane k: column 4k + m of rows 4g .. 4g + 3  ->  t[c]: column c
ZOI_INLINE void lanes(const __m256* r, __m256* t) {
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m) {
    t[m] = _mm256_permute2f128_ps(r[m], r[4 + m], 0x20);      // column m
    t[4 + m] = _mm256_permute2f128_ps(r[m], r[4 + m], 0x31);  // column 4 + m
  }
}
#elif defined(ZOI_ISA_NEON)
// 4 x 4: stages 1 and 2 as x86's unpcklps / unpckhps and shufps 0x44 / 0xEE (zip of 32-bit, then of
// 64-bit halves); one 128-bit lane, so stage 3 has nothing to do
ZOI_INLINE float32x4_t unpacklo(float32x4_t a, float32x4_t b) { return vzip1q_f32(a, b); }
ZOI_INLINE float32x4_t unpackhi(float32x4_t a, float32x4_t b) { return vzip2q_f32(a, b); }
template <int IMM>
ZOI_INLINE float32x4_t shuf(float32x4_t a, float32x4_t b) {
  static_assert(IMM == 0x44 || IMM == 0xEE, "the two shuffles of the transpose");
  const float64x2_t x = vreinterpretq_f64_f32(a), y = vreinterpretq_f64_f32(b);
  return vreinterpretq_f32_f64(IMM == 0x44 ? vzip1q_f64(x, y) : vzip2q_f64(x, y));
}
ZOI_INLINE void lanes(const float32x4_t* r, float32x4_t* t) {
  for (int m = 0; m < 4; ++m) t[m] = r[m];
}
#endif

#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVX512) || defined(ZOI_ISA_AVX2) || defined(ZOI_ISA_NEON)
// kt[c * lp + j] = kb[j * ld + c] for j < L, c < d, and 0 for L <= j < lp (lp a multiple of 16):
// K^T of one head, W::N x W::N blocks transposed in registers (the strided scalar loop cost ~18%
// of the attention at MiniLM 32x128)
template <class W>
inline void transpose_k_simd(const float* kb, size_t ld, int L, int d, int lp, float* kt) {
  constexpr int N = W::N;
  for (int j0 = 0; j0 < lp; j0 += N) {
    for (int c0 = 0; c0 < d; c0 += N) {
      const int nc = d - c0 < N ? d - c0 : N;
      typename W::T r[N], t[N];
#pragma GCC unroll 16
      for (int i = 0; i < N; ++i) r[i] = j0 + i < L ? W::load_n(kb + static_cast<size_t>(j0 + i) * ld + c0, nc) : W::zero();
#pragma GCC unroll 8
      for (int i = 0; i < N / 2; ++i) {
        t[2 * i] = unpacklo(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = unpackhi(r[2 * i], r[2 * i + 1]);
      }
#pragma GCC unroll 4
      for (int g = 0; g < N / 4; ++g) {
        r[4 * g + 0] = shuf<0x44>(t[4 * g], t[4 * g + 2]);
        r[4 * g + 1] = shuf<0xEE>(t[4 * g], t[4 * g + 2]);
        r[4 * g + 2] = shuf<0x44>(t[4 * g + 1], t[4 * g + 3]);
        r[4 * g + 3] = shuf<0xEE>(t[4 * g + 1], t[4 * g + 3]);
      }
      lanes(r, t);
#pragma GCC unroll 16
      for (int c = 0; c < N; ++c)
        if (c < nc) W::store(kt + static_cast<size_t>(c0 + c) * lp + j0, t[c]);
    }
  }
}
#endif

inline void transpose_k(const float* kb, size_t ld, int L, int d, int lp, float* kt) {
#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVX512) || defined(ZOI_ISA_AVX2) || defined(ZOI_ISA_NEON)
  transpose_k_simd<V>(kb, ld, L, d, lp, kt);
#else
  for (int j = 0; j < L; ++j)
    for (int c = 0; c < d; ++c) kt[static_cast<size_t>(c) * lp + j] = kb[static_cast<size_t>(j) * ld + c];
  for (int c = 0; c < d; ++c)
    for (int j = L; j < lp; ++j) kt[static_cast<size_t>(c) * lp + j] = 0.f;
#endif
}

template <int NQ>
inline void query_rows(const AttnArgs& a, int i, const float* qb, int ldq, const float* vb, int ld, const float* kt,
                       int lp, int L, int t0, int h, float* srow) {
  const int d = a.d;
  const float* q[NQ];
  float* s[NQ];
  float* o[NQ];
  int lo[NQ], hi[NQ];  // each row's keys
  for (int r = 0; r < NQ; ++r) {
    q[r] = qb + static_cast<size_t>(i + r) * ldq;
    s[r] = srow + static_cast<size_t>(r) * lp;
    o[r] = a.out + static_cast<size_t>(t0 + i + r) * a.ldo + h * d;
    lo[r] = 0;
    hi[r] = L;
  }
  int ja = 0, jb = L;  // keys of the block (the union of the rows' keys)
  const bool masked = a.window > 0 || a.causal;
  if (masked) {
    for (int r = 0; r < NQ; ++r) {
      if (a.window > 0) {
        lo[r] = i + r - a.window > 0 ? i + r - a.window : 0;
        hi[r] = i + r + a.window + 1 < L ? i + r + a.window + 1 : L;
      }
      if (a.causal && hi[r] > i + r + 1) hi[r] = i + r + 1;  // keys j <= i
    }
    ja = lo[0];
    jb = hi[NQ - 1];
  }
  const T vscale = V::set(a.scale);
  constexpr int SNV = scores_nv<NQ>();
  int j = ja / V::N * V::N;
  const int je = (jb + V::N - 1) / V::N * V::N;  // <= lp
  for (; j + SNV * V::N <= je; j += SNV * V::N) scores_block<NQ, SNV>(q, kt, lp, d, j, s, vscale);
  for (; j < je; j += V::N) scores_block<NQ, 1>(q, kt, lp, d, j, s, vscale);
  if (a.bias) {  // + bias[h][j - i + span - 1], after the scale (the reference's two roundings)
    const int span = a.bias_span;
    for (int r = 0; r < NQ; ++r) {
      const float* br = a.bias + static_cast<size_t>(h) * (2 * span - 1) + (span - 1) - (i + r);
      for (int k = lo[r]; k < hi[r]; k += V::N) {
        const int n = hi[r] - k;
        V::store_n(s[r] + k, V::add(V::load_n(s[r] + k, n), V::load_n(br + k, n)), n);
      }
    }
  }
  float inv[NQ];
  for (int r = 0; r < NQ; ++r) inv[r] = softmax_row(s[r] + lo[r], hi[r] - lo[r]);
  if (masked) {  // p = 0 outside a row's keys (its chain then starts at lo: fma(0, v, 0) = 0)
    for (int r = 0; r < NQ; ++r) {
      for (int k = ja; k < lo[r]; ++k) s[r][k] = 0.f;
      for (int k = hi[r]; k < jb; ++k) s[r][k] = 0.f;
    }
  }
  int c = 0;
  for (; c + 2 * V::N <= d; c += 2 * V::N) pv_block<NQ, 2, true>(s, vb, ld, ja, jb, c, d, o, inv);
  for (; c + V::N <= d; c += V::N) pv_block<NQ, 1, true>(s, vb, ld, ja, jb, c, d, o, inv);
  if (c < d) pv_block<NQ, 1, false>(s, vb, ld, ja, jb, c, d, o, inv);
}

// the q, k, v rows [r0, r1) of head h of the sequence at t0 into L2 (the next item of this
// thread, during the current one: its rows are 3H floats apart, a stride the hardware
// prefetcher does not follow)
inline void prefetch_rows(const AttnArgs& a, int t0, int h, int r0, int r1) {
  const size_t bytes = static_cast<size_t>(a.d) * sizeof(float);
  const size_t ko = kv_off(a, h), vo = ko + kv_width(a);
  for (int r = r0; r < r1; ++r) {
    const float* row = a.qkv + static_cast<size_t>(t0 + r) * a.ldqkv;
    const char* q = reinterpret_cast<const char*>(row + h * a.d);
    const char* k = reinterpret_cast<const char*>(row + ko);
    const char* v = reinterpret_cast<const char*>(row + vo);
    for (size_t b = 0; b < bytes; b += 64) {
      __builtin_prefetch(q + b, 0, 2);
      __builtin_prefetch(k + b, 0, 2);
      __builtin_prefetch(v + b, 0, 2);
    }
  }
}

// y[c] = x[c] / sqrt(mean(x^2) + eps) * w[c] (the q / k RMSNorm of one head, float32 as the
// reference: the mean of the squares, then one division and one product per element)
inline void rms_head(const float* x, int d, const float* w, float eps, float* y) {
  float ss = 0.f;
  for (int c = 0; c < d; ++c) ss += x[c] * x[c];
  const float s = std::sqrt(ss / static_cast<float>(d) + eps);
  for (int c = 0; c < d; ++c) y[c] = x[c] / s * w[c];
}

// nt0 / nL / nh: the next item of this thread (nL = 0: none)
void one_head(const AttnArgs& a, int t0, int L, int h, float* scratch, int nt0, int nL, int nh) {
  const int d = a.d, ld = a.ldqkv;
  const int lp = (L + 15) / 16 * 16;
  float* kt = scratch;                               // [d][lp]
  float* vc = kt + static_cast<size_t>(d) * lp;      // [L][d]
  float* s = vc + static_cast<size_t>(d) * lp;       // [NQMAX][lp]
  const float* row0 = a.qkv + static_cast<size_t>(t0) * ld;
  const float* qb = row0 + h * d;
  const float* kb = row0 + kv_off(a, h);
  const float* vb = kb + kv_width(a);
  int ldq = ld;
  if (a.rope_cos || a.q_norm) {  // normed / rotated K into K^T, Q rows into the scratch
    float* qr = s + static_cast<size_t>(NQMAX) * lp;  // [L][d]
    const int half = d / 2;
    alignas(64) float tq[kMaxHeadDim], tk[kMaxHeadDim];
    for (int j = 0; j < L; ++j) {
      const float* q = qb + static_cast<size_t>(j) * ld;
      const float* k = kb + static_cast<size_t>(j) * ld;
      if (a.q_norm) {
        rms_head(q, d, a.q_norm, a.qk_eps, tq);
        rms_head(k, d, a.k_norm, a.qk_eps, tk);
        q = tq;
        k = tk;
      }
      if (a.rope_cos) {
        const float* cs = a.rope_cos + static_cast<size_t>(j) * half;
        const float* sn = a.rope_sin + static_cast<size_t>(j) * half;
        rope_row(q, d, cs, sn, qr + static_cast<size_t>(j) * d, 1);
        rope_row(k, d, cs, sn, kt + j, lp);
      } else {
        for (int c = 0; c < d; ++c) qr[static_cast<size_t>(j) * d + c] = q[c];
        for (int c = 0; c < d; ++c) kt[static_cast<size_t>(c) * lp + j] = k[c];
      }
    }
    for (int c = 0; c < d; ++c)
      for (int j = L; j < lp; ++j) kt[static_cast<size_t>(c) * lp + j] = 0.f;
    qb = qr;
    ldq = d;
  } else {
    transpose_k(kb, ld, L, d, lp, kt);
  }
  // V rows of the head made contiguous: in place their stride (3H floats, 4.5 KiB for MiniLM)
  // maps the 128-byte rows onto a few L1 sets, and p.v re-reads all of V per query block
  for (int j = 0; j < L; ++j) {
    const float* src = vb + static_cast<size_t>(j) * ld;
    float* dst = vc + static_cast<size_t>(j) * d;
    int c = 0;
    for (; c + V::N <= d; c += V::N) V::store(dst + c, V::load(src + c));
    if (c < d) V::store_n(dst + c, V::load_n(src + c, d - c), d - c);
  }
  int i = 0, pf = 0;  // next item's rows prefetched so far, spread over the query blocks
  for (; i + NQMAX <= L; i += NQMAX) {
    const int pe = static_cast<int>((static_cast<long>(i + NQMAX) * nL + L - 1) / L);
    prefetch_rows(a, nt0, nh, pf, pe);
    pf = pe;
    query_rows<NQMAX>(a, i, qb, ldq, vc, d, kt, lp, L, t0, h, s);
  }
  prefetch_rows(a, nt0, nh, pf, nL);
  for (; i + 2 <= L; i += 2) query_rows<2>(a, i, qb, ldq, vc, d, kt, lp, L, t0, h, s);
  if (i < L) query_rows<1>(a, i, qb, ldq, vc, d, kt, lp, L, t0, h, s);
}

#include "attention_i8.h"   // the opt-in INT8 item (AttnArgs::prec 1, 2)
#include "attention_amx.h"  // the opt-in AMX-BF16 item (AttnArgs::prec 3)

// keys a query sees (the cost of an item is L * (keys + 8))
inline double keys(const AttnArgs& a, double L) {
  const double k = a.window > 0 && 2.0 * a.window + 1 < L ? 2.0 * a.window + 1 : L;
  return a.causal ? 0.5 * k + 0.5 : k;
}

// kBf16: prec 3 may run on AMX-BF16 tiles (the amx table's entry, attention_amx below); the
// other tables' entry (attention) never touches tiles, so a forced ISA (ZOI_CPU_ISA=vnni)
// runs the FP32 kernel for prec 3, as every ISA without a mode's kernel does
template <bool kBf16>
void attention_items(const AttnArgs& a, int tid, int nt) {
  // cost-balanced split: item k (sequence-major) goes to the thread owning its cost midpoint
  double total = 0;
  for (int b = 0; b < a.B; ++b) {
    const double L = a.cu[b + 1] - a.cu[b];
    total += L * (keys(a, L) + 8) * a.heads;
  }
  if (total <= 0) return;
  float* scratch = a.scratch + static_cast<size_t>(tid) * a.scratch_stride;
  double before = 0;
  const int path = kAttnI8 && attn_i8_ok(a) ? 1 : kBf16 && attn_amx_ok(a) ? 2 : 0;
  auto item = [&](int t0, int L, int h, int nt0, int nL, int nh) {
    if (path == 1)
      one_head_i8(a, t0, L, h, scratch, nt0, nL, nh);
    else if (path == 2)
      one_head_bf16(a, t0, L, h, scratch, nt0, nL, nh);
    else
      one_head(a, t0, L, h, scratch, nt0, nL, nh);
  };
  int pt0 = 0, pL = 0, ph = 0;  // this thread's previous item, run once the next one is known
  for (int b = 0; b < a.B; ++b) {
    const int t0 = a.cu[b], L = a.cu[b + 1] - a.cu[b];
    const double c = static_cast<double>(L) * (keys(a, L) + 8);
    for (int h = 0; h < a.heads; ++h) {
      int owner = static_cast<int>((before + 0.5 * c) * nt / total);
      if (owner >= nt) owner = nt - 1;
      before += c;
      if (owner != tid || L <= 0) continue;
      if (pL > 0) item(pt0, pL, ph, t0, L, h);
      pt0 = t0, pL = L, ph = h;
    }
  }
  if (pL > 0) item(pt0, pL, ph, 0, 0, 0);
}

}  // namespace

void attention(const AttnArgs& a, int tid, int nt) { attention_items<false>(a, tid, nt); }

#if defined(ZOI_ISA_VNNI)
// the amx table's attention (gemm_amx.cc): vnni's, with prec 3 on AMX-BF16 where the CPU has it
void attention_amx(const AttnArgs& a, int tid, int nt) { attention_items<true>(a, tid, nt); }
#endif

}  // namespace ZOI_NS
}  // namespace zoi
