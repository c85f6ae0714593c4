// Varlen multi-head self-attention over packed sequences, FP32 inside.
// One work item = (sequence, head); items are split over threads by cost (L^2) so that
// ragged batches stay balanced. Per item: K^T of the head is laid out [d][Lp] in the
// thread's scratch so that a query row's scores are vector FMAs over keys; softmax with a
// vector exp; then ctx = sum_j p_j v_j with the output row held in registers.
#include "kernels.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {
namespace {

using T = V::T;

// s[0:Lp) = Kt^T q for one query row, nv key vectors at a time
template <int NV>
inline void scores_block(const float* q, const float* kt, int lp, int d, int j, float* s, T scale) {
  T acc[NV];
  for (int u = 0; u < NV; ++u) acc[u] = V::zero();
  for (int c = 0; c < d; ++c) {
    T qc = V::set(q[c]);
    const float* kr = kt + static_cast<size_t>(c) * lp + j;
    for (int u = 0; u < NV; ++u) acc[u] = V::fma(qc, V::load(kr + u * V::N), acc[u]);
  }
  for (int u = 0; u < NV; ++u) V::store(s + j + u * V::N, V::mul(acc[u], scale));
}

// o[c0 : c0 + NV*N) = sum_j p_j v_j[c0 : ...], divided by sum
template <int NV>
inline void pv_block(const float* p, const float* v, int ldv, int L, int c0, int d, float* o, T inv_sum_div) {
  T acc[NV];
  for (int u = 0; u < NV; ++u) acc[u] = V::zero();
  for (int j = 0; j < L; ++j) {
    T pj = V::set(p[j]);
    const float* vr = v + static_cast<size_t>(j) * ldv + c0;
    for (int u = 0; u < NV; ++u) acc[u] = V::fma(pj, V::load_n(vr + u * V::N, d - c0 - u * V::N), acc[u]);
  }
  for (int u = 0; u < NV; ++u) V::store_n(o + c0 + u * V::N, V::div(acc[u], inv_sum_div), d - c0 - u * V::N);
}

void one_head(const AttnArgs& a, int t0, int L, int h, float* scratch) {
  const int H = a.heads * a.d, d = a.d, ld = a.ldqkv;
  const int lp = (L + V::N - 1) / V::N * V::N;
  float* kt = scratch;                               // [d][lp]
  float* s = scratch + static_cast<size_t>(d) * lp;  // [lp]
  const float* qb = a.qkv + static_cast<size_t>(t0) * ld + h * d;
  const float* kb = qb + H;
  const float* vb = qb + 2 * H;
  for (int j = 0; j < L; ++j)
    for (int c = 0; c < d; ++c) kt[static_cast<size_t>(c) * lp + j] = kb[static_cast<size_t>(j) * ld + c];
  for (int c = 0; c < d; ++c)
    for (int j = L; j < lp; ++j) kt[static_cast<size_t>(c) * lp + j] = 0.f;
  const T vscale = V::set(a.scale);
  for (int i = 0; i < L; ++i) {
    const float* q = qb + static_cast<size_t>(i) * ld;
    int j = 0;
    for (; j + 4 * V::N <= lp; j += 4 * V::N) scores_block<4>(q, kt, lp, d, j, s, vscale);
    for (; j < lp; j += V::N) scores_block<1>(q, kt, lp, d, j, s, vscale);
    // softmax over s[0:L)
    T mx = V::set(-INFINITY);
    for (j = 0; j + V::N <= L; j += V::N) mx = V::max(mx, V::load(s + j));
    float m = V::hmax(mx);
    for (; j < L; ++j) m = s[j] > m ? s[j] : m;
    const T vm = V::set(m);
    T sum = V::zero();
    for (j = 0; j + V::N <= L; j += V::N) {
      T e = vexp<V>(V::sub(V::load(s + j), vm));
      V::store(s + j, e);
      sum = V::add(sum, e);
    }
    float ssum = V::hsum(sum);
    for (; j < L; ++j) {
      float e = vexp<S1>(s[j] - m);
      s[j] = e;
      ssum += e;
    }
    float* o = a.out + static_cast<size_t>(t0 + i) * a.ldo + h * d;
    const T vsum = V::set(ssum);
    int c = 0;
    for (; c + 4 * V::N <= d; c += 4 * V::N) pv_block<4>(s, vb, ld, L, c, d, o, vsum);
    for (; c < d; c += V::N) pv_block<1>(s, vb, ld, L, c, d, o, vsum);
  }
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
