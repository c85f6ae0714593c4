// FP32 GEMM with fused epilogue (bias, activation, residual), compiled once per ISA.
// Weights packed per panel of NB vectors: [panel][K][PW]; micro-kernel MR x NB vectors of FMA
// with the A element broadcast; K is cut into blocks of KC so a panel block stays in L1/L2.
#include "kernels.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {
namespace {

#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVX512)
constexpr int MR = 6, NB = 4;
#elif defined(ZOI_ISA_AVX2)
constexpr int MR = 6, NB = 2;
#elif defined(ZOI_ISA_NEON)
constexpr int MR = 6, NB = 4;  // 24 accumulators + 4 weight vectors + the broadcast: 29 of 32 registers
#else
constexpr int MR = 4, NB = 4;
#endif
constexpr int PW = V::N * NB;
constexpr int MC = 96;
#if defined(ZOI_ISA_AVX2)
constexpr bool kPrefetchNext = true;
#else
constexpr bool kPrefetchNext = false;
#endif
constexpr int KC = 256;
static_assert(MC % MR == 0, "MC must be a multiple of MR");

// The first row tile of a (panel, K block) streams the block from memory at the FMA rate (one
// 64-byte line per k on AVX2: ~40 GB/s), faster than DRAM / a shared L3 deliver it; so every tile
// also prefetches (into L2) its share of the next block, which is contiguous in the packed
// layout: [pf, pf + pf_bytes)
ZOI_INLINE void prefetch_l2(const char* pf, int pf_bytes) {
  for (int o = 0; o < pf_bytes; o += 64) __builtin_prefetch(pf + o, 0, 2);
}

template <int R>
inline void tile(const GemmF32Args& p, int m, int n0, const float* wpanel, int k0, int kc, bool first, bool last,
                 const char* pf, int pf_bytes) {
  using T = V::T;
  prefetch_l2(pf, pf_bytes);
  T acc[R][NB];
  const int nrem = p.N - n0;
  if (first) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) acc[r][j] = V::zero();
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j)
        acc[r][j] = V::load_n(p.y + static_cast<size_t>(m + r) * p.ldy + n0 + j * V::N, nrem - j * V::N);
  }
  const float* a = p.a + static_cast<size_t>(m) * p.lda + k0;
  const float* w = wpanel + static_cast<size_t>(k0) * PW;
  for (int k = 0; k < kc; ++k) {
    T b[NB];
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) b[j] = V::load(w + static_cast<size_t>(k) * PW + j * V::N);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      T av = V::set(a[static_cast<size_t>(r) * p.lda + k]);
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) acc[r][j] = V::fma(av, b[j], acc[r][j]);
    }
  }
  alignas(64) float t[R * PW];  // spill once to the L1-hot tile, then the epilogue
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) V::store(t + r * PW + j * V::N, acc[r][j]);
  const int ncols = nrem < PW ? nrem : PW;
  if (last) {
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NB; ++j)
        V::store(t + r * PW + j * V::N, V::add(V::load(t + r * PW + j * V::N), V::load(p.bias + n0 + j * V::N)));
    vact_inplace(t, R * PW, p.act);
  }
  for (int r = 0; r < R; ++r) {
    const int row = m + r;
    float* y = p.y + static_cast<size_t>(row) * p.ldy + n0;
    const float* res = last && p.res ? p.res + static_cast<size_t>(row) * p.ldr + n0 : nullptr;
    for (int c = 0; c < ncols; c += V::N) {
      T f = V::load(t + r * PW + c);
      if (res) f = V::add(f, V::load_n(res + c, ncols - c));
      V::store_n(y + c, f, ncols - c);
    }
  }
}

template <int R>
inline void tile_rows(int mr, const GemmF32Args& p, int m, int n0, const float* wp, int k0, int kc, bool first,
                      bool last, const char* pf = nullptr, int pf_bytes = 0) {
  if (mr == R) tile<R>(p, m, n0, wp, k0, kc, first, last, pf, pf_bytes);
  else if constexpr (R > 1) tile_rows<R - 1>(mr, p, m, n0, wp, k0, kc, first, last, pf, pf_bytes);
}

}  // namespace

size_t pack_f32_bytes(int N, int K) { return static_cast<size_t>(round_up(N, PW)) * K * sizeof(float); }

void pack_f32(const float* w, int N, int K, float* dst) {
  const int Np = round_up(N, PW);
  for (int p = 0; p < Np / PW; ++p)
    for (int k = 0; k < K; ++k)
      for (int c = 0; c < PW; ++c) {
        const int n = p * PW + c;
        *dst++ = n < N ? w[static_cast<size_t>(n) * K + k] : 0.f;
      }
}

void gemm_f32(const GemmF32Args& p, int tid, int nt) {
  if (p.M <= 0 || p.N <= 0) return;
  const int npanels = round_up(p.N, PW) / PW;
  const int nch = (p.M + MC - 1) / MC;
  const int mc = round_up((p.M + nch - 1) / nch, MR);
  long lo, hi;
  split_range(static_cast<long>(nch) * npanels, tid, nt, &lo, &hi);
  const size_t panel_elems = static_cast<size_t>(p.K) * PW;
  // the next-block prefetch only where it measured faster (interleaved A/B, MiniLM FP32 1x128, one
  // thread CPU time: avx2 25.1-25.9 -> 22.3-22.5 ms; zmm builds 11.6-12.1 -> 12.2-12.5 ms, off)
  const char* w_end = reinterpret_cast<const char*>(p.w + (kPrefetchNext ? npanels * panel_elems : 0));
  for (long it = lo; it < hi; ++it) {
    const int ch = static_cast<int>(it / npanels), pn = static_cast<int>(it % npanels);
    const int m0 = ch * mc, m1 = m0 + mc < p.M ? m0 + mc : p.M;
    const float* wp = p.w + pn * panel_elems;
    if (p.K == 0) {  // degenerate: bias only
      for (int m = m0; m < m1; m += MR)
        tile_rows<MR>(m1 - m < MR ? m1 - m : MR, p, m, pn * PW, wp, 0, 0, true, true);
      continue;
    }
    for (int k0 = 0; k0 < p.K; k0 += KC) {
      const int kc = p.K - k0 < KC ? p.K - k0 : KC;
      // the next block: the rest of this panel, else the next panel's first block (none after the last)
      const char* nb = reinterpret_cast<const char*>(wp + static_cast<size_t>(k0 + kc) * PW);
      const size_t left = nb < w_end ? static_cast<size_t>(w_end - nb) : 0;
      const int nb_bytes = static_cast<int>(left < static_cast<size_t>(KC) * PW * 4 ? left : static_cast<size_t>(KC) * PW * 4);
      const int ntiles = (m1 - m0 + MR - 1) / MR;
      const int share = (nb_bytes / ntiles + 63) / 64 * 64;
      int i = 0;
      for (int m = m0; m < m1; m += MR, ++i) {
        const int o = i * share < nb_bytes ? i * share : nb_bytes;
        const int len = o + share < nb_bytes ? share : nb_bytes - o;
        tile_rows<MR>(m1 - m < MR ? m1 - m : MR, p, m, pn * PW, wp, k0, kc, k0 == 0, k0 + kc == p.K, nb + o, len);
      }
    }
  }
}

int f32_panel() { return PW; }

}  // namespace ZOI_NS
}  // namespace zoi
