// Varlen multi-head self-attention over packed sequences, FP32 inside.
// One work item = (sequence, head); items are split over threads by cost (L^2) so that
// ragged batches stay balanced. Per item: K^T of the head is laid out [d][Lp] in the
// thread's scratch so that a query row's scores are vector FMAs over keys; softmax; then
// ctx = sum_j p_j v_j with the output rows held in registers.
// Rounding follows the numpy reference step for step: q.k and p.v as one FMA chain each over
// the inner index from 0 (what its BLAS does at these shapes), np.exp's kernel, numpy's
// pairwise sum, p = e / sum before p.v. The attention output is quantised for the next INT8
// GEMM, where a 1-ulp difference flips an integer step.
#include "kernels.h"
#include "np_sum.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {
namespace {

using T = V::T;
#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVX512)
constexpr int NQMAX = 4;  // query rows per pass (32 zmm registers)
constexpr int kVRegs = 32;
#elif defined(ZOI_ISA_AVX2)
constexpr int NQMAX = 4;  // 16 ymm: the scores of 4 rows go 2 vectors at a time (4 x 2 + 2 + 1)
constexpr int kVRegs = 16;
#else
constexpr int NQMAX = 2;
constexpr int kVRegs = 1 << 20;
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

// o_i[c0 : c0 + NV*N) = sum_j p_i[j] v_j for NQ rows, one FMA chain per output over j
template <int NQ, int NV, bool FULL>
inline void pv_block(const float* const* p, const float* v, int ldv, int L, int c0, int d, float* const* o) {
  T acc[NQ][NV];
#pragma GCC unroll 4
  for (int r = 0; r < NQ; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < NV; ++u) acc[r][u] = V::zero();
  for (int j = 0; j < L; ++j) {
    const float* vr = v + static_cast<size_t>(j) * ldv + c0;
    T vv[NV];
#pragma GCC unroll 4
    for (int u = 0; u < NV; ++u) vv[u] = FULL ? V::load(vr + u * V::N) : V::load_n(vr + u * V::N, d - c0 - u * V::N);
#pragma GCC unroll 4
    for (int r = 0; r < NQ; ++r) {
      const T pj = V::set(p[r][j]);
#pragma GCC unroll 4
      for (int u = 0; u < NV; ++u) acc[r][u] = V::fma_exact(pj, vv[u], acc[r][u]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NQ; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < NV; ++u) V::store_n(o[r] + c0 + u * V::N, acc[r][u], d - c0 - u * V::N);
}

// s[0:L) <- softmax(s[0:L)) as numpy: e = exp(s - max), p = e / sum(e)
inline void softmax_row(float* s, int L) {
  T mx = V::set(-INFINITY);
  int j = 0;
  for (; j + V::N <= L; j += V::N) mx = V::max(mx, V::load(s + j));
  float m = V::hmax(mx);
  for (; j < L; ++j) m = s[j] > m ? s[j] : m;
  const T vm = V::set(m);
  for (j = 0; j + V::N <= L; j += V::N) V::store(s + j, vexp_np<V>(V::sub(V::load(s + j), vm)));
  for (; j < L; ++j) s[j] = vexp_np<S1>(s[j] - m);
  const T sum = V::set(np_sum(s, L));
  for (j = 0; j < L; j += V::N) V::store_n(s + j, V::div(V::load_n(s + j, L - j), sum), L - j);
}

template <int NQ>
inline void query_rows(const AttnArgs& a, int i, const float* qb, const float* vb, const float* kt, int lp, int L,
                       int t0, int h, float* srow) {
  const int d = a.d, ld = a.ldqkv;
  const float* q[NQ];
  float* s[NQ];
  float* o[NQ];
  for (int r = 0; r < NQ; ++r) {
    q[r] = qb + static_cast<size_t>(i + r) * ld;
    s[r] = srow + static_cast<size_t>(r) * lp;
    o[r] = a.out + static_cast<size_t>(t0 + i + r) * a.ldo + h * d;
  }
  const T vscale = V::set(a.scale);
  constexpr int SNV = scores_nv<NQ>();
  int j = 0;
  for (; j + SNV * V::N <= lp; j += SNV * V::N) scores_block<NQ, SNV>(q, kt, lp, d, j, s, vscale);
  for (; j < lp; j += V::N) scores_block<NQ, 1>(q, kt, lp, d, j, s, vscale);
  for (int r = 0; r < NQ; ++r) softmax_row(s[r], L);
  int c = 0;
  for (; c + 2 * V::N <= d; c += 2 * V::N) pv_block<NQ, 2, true>(s, vb, ld, L, c, d, o);
  for (; c + V::N <= d; c += V::N) pv_block<NQ, 1, true>(s, vb, ld, L, c, d, o);
  if (c < d) pv_block<NQ, 1, false>(s, vb, ld, L, c, d, o);
}

void one_head(const AttnArgs& a, int t0, int L, int h, float* scratch) {
  const int H = a.heads * a.d, d = a.d, ld = a.ldqkv;
  const int lp = (L + V::N - 1) / V::N * V::N;
  float* kt = scratch;                               // [d][lp]
  float* s = scratch + static_cast<size_t>(d) * lp;  // [NQMAX][lp]
  const float* qb = a.qkv + static_cast<size_t>(t0) * ld + h * d;
  const float* kb = qb + H;
  const float* vb = qb + 2 * H;
  for (int j = 0; j < L; ++j)
    for (int c = 0; c < d; ++c) kt[static_cast<size_t>(c) * lp + j] = kb[static_cast<size_t>(j) * ld + c];
  for (int c = 0; c < d; ++c)
    for (int j = L; j < lp; ++j) kt[static_cast<size_t>(c) * lp + j] = 0.f;
  int i = 0;
  for (; i + NQMAX <= L; i += NQMAX) query_rows<NQMAX>(a, i, qb, vb, kt, lp, L, t0, h, s);
  for (; i + 2 <= L; i += 2) query_rows<2>(a, i, qb, vb, kt, lp, L, t0, h, s);
  if (i < L) query_rows<1>(a, i, qb, vb, kt, lp, L, t0, h, s);
}

}  // namespace

void attention(const AttnArgs& a, int tid, int nt) {
  // cost-balanced split: item k (sequence-major) goes to the thread owning its cost midpoint
  double total = 0;
  for (int b = 0; b < a.B; ++b) {
    const double L = a.cu[b + 1] - a.cu[b];
    total += L * (L + 8) * a.heads;
  }
  if (total <= 0) return;
  float* scratch = a.scratch + static_cast<size_t>(tid) * a.scratch_stride;
  double before = 0;
  for (int b = 0; b < a.B; ++b) {
    const int t0 = a.cu[b], L = a.cu[b + 1] - a.cu[b];
    const double c = static_cast<double>(L) * (L + 8);
    for (int h = 0; h < a.heads; ++h) {
      int owner = static_cast<int>((before + 0.5 * c) * nt / total);
      if (owner >= nt) owner = nt - 1;
      before += c;
      if (owner == tid) one_head(a, t0, L, h, scratch);
    }
  }
}

}  // namespace ZOI_NS
}  // namespace zoi
