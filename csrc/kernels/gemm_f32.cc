// FP32 GEMM with fused epilogue (bias, activation, residual), compiled once per ISA.
// Weights packed per panel of NB vectors: [panel][K][PW]; micro-kernel MR x NB vectors of FMA
// with the A element broadcast. Work items are (panel, M chunk), panel-major, so the threads
// split N and each packed weight byte is read from memory once; M <= MR (generation's few rows)
// is one row tile per panel (on zmm over all of K): the weights stream once, at the memory's
// rate. Every output element is one FMA chain over k in order, whatever M, the blocking or the
// threads: bit for bit the results of the kernel before this layout (zmm 6 x 4, K blocks of 256).
#include "kernels.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {
namespace {

#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVX512)
// 12 x 2 zmm: 24 accumulators, 2 weight loads and 12 broadcasts per 24 FMAs; M <= 12 is one
// tile, and 32-column panels divide every decoder width (896, 4864, 151936) with no padding to
// stream and split N finely between the threads. Zen 4, interleaved against 8 x 3 / 6 x 4 /
// 14 x 2: equal within noise at M = 128, ahead at M = 1..8 (lab/cpu/gemm_f32_ab.py)
constexpr int MR = 12, NB = 2;
#elif defined(ZOI_ISA_AVX2)
constexpr int MR = 6, NB = 2;  // 12 ymm accumulators + 2 weight vectors + the broadcast of 16
#elif defined(ZOI_ISA_NEON)
constexpr int MR = 6, NB = 4;  // 24 accumulators + 4 weight vectors + the broadcast: 29 of 32 registers
#else
constexpr int MR = 4, NB = 4;
#endif
constexpr int PW = V::N * NB;
// rows per M chunk: M = 128 (an encoder's 1x128) is one chunk, so its panels are split between
// the threads rather than its rows (which made both threads stream every panel)
constexpr int MC = 128;
// K blocks: a block of a panel is read by every row tile of the chunk. zmm: only where a panel's
// K rows outgrow a share of L2 (blocks of 2048 k), which saves the accumulators' round trip
// through y per block (MiniLM's K = 384 / 1536 ran 4-6% faster than with blocks of 256 k, Zen 4,
// one thread).
// The others keep blocks of 256 k (16 KiB of a panel: L1-resident on NEON), and on AVX2 even for
// M <= MR, where the next-block prefetch below needs them: unblocked, M = 4..8 at N = 9728,
// K = 896 ran 1.12-1.24x slower (Zen 4 forced to avx2)
#if defined(ZOI_ISA_VNNI) || defined(ZOI_ISA_AVX512)
constexpr long kBlockBytes = 256 * 1024;
#else
constexpr long kBlockBytes = 16 * 1024;
#endif
#if defined(ZOI_ISA_AVX2)
constexpr bool kPrefetchNext = true;
#else
constexpr bool kPrefetchNext = false;
#endif

// The first row tile of a (panel, K block) streams the block from memory at the FMA rate (one
// 64-byte line per k on AVX2: ~40 GB/s), faster than DRAM / a shared L3 deliver it; so every tile
// also prefetches (into L2) its share of the next block, which is contiguous in the packed
// layout: [pf, pf + pf_bytes)
ZOI_INLINE void prefetch_l2(const char* pf, long pf_bytes) {
  for (long o = 0; o < pf_bytes; o += 64) __builtin_prefetch(pf + o, 0, 2);
}

// rows m .. m + R - 1, columns n0 .. n0 + PW - 1 (masked past N), k in [k0, k0 + kc): the
// accumulators start at 0 (first block) or at y (a later block), end in y (not the last block)
// or through the epilogue act(acc + bias) + res
template <int R>
inline void tile(const GemmF32Args& p, int m, int n0, const float* wpanel, int k0, int kc, bool first, bool last,
                 const char* pf, long pf_bytes) {
  using T = V::T;
  if (kPrefetchNext) prefetch_l2(pf, pf_bytes);
  T acc[R][NB];
  const int nrem = p.N - n0;
  if (first) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) acc[r][j] = V::zero();
  } else {
#pragma GCC unroll 16
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
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const T av = V::set(a[static_cast<size_t>(r) * p.lda + k]);
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) acc[r][j] = V::fma(av, b[j], acc[r][j]);
    }
  }
  if (!last) {  // a later K block continues from y
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j)
        V::store_n(p.y + static_cast<size_t>(m + r) * p.ldy + n0 + j * V::N, acc[r][j], nrem - j * V::N);
    return;
  }
  // bias is padded to the panel width (GemmF32Args): full loads
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) {
    const T bj = V::load(p.bias + n0 + j * V::N);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r][j] = V::add(acc[r][j], bj);
  }
  if (p.act) {  // the activation over the L1-hot tile, 4 vectors at a time (vact_inplace)
    alignas(64) float t[R * PW];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) V::store(t + r * PW + j * V::N, acc[r][j]);
    vact_inplace(t, R * PW, p.act);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) acc[r][j] = V::load(t + r * PW + j * V::N);
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    float* y = p.y + static_cast<size_t>(m + r) * p.ldy + n0;
    const float* res = p.res ? p.res + static_cast<size_t>(m + r) * p.ldr + n0 : nullptr;
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      T f = acc[r][j];
      if (res) f = V::add(f, V::load_n(res + j * V::N, nrem - j * V::N));
      V::store_n(y + j * V::N, f, nrem - j * V::N);  // nothing past N (n <= 0: no lane)
    }
  }
}

template <int R>
inline void tile_rows(int mr, const GemmF32Args& p, int m, int n0, const float* wp, int k0, int kc, bool first,
                      bool last, const char* pf = nullptr, long pf_bytes = 0) {
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
  // K blocks of kBlockBytes of a panel; one block when M is a single row tile (nothing re-reads
  // a block), unless the next-block prefetch is on
  constexpr int kc_max = static_cast<int>(kBlockBytes / (PW * sizeof(float)));
  const int kcb = (p.M <= MR && !kPrefetchNext) || p.K <= kc_max ? p.K : kc_max;
  long lo, hi;
  split_range(static_cast<long>(nch) * npanels, tid, nt, &lo, &hi);
  const size_t panel_elems = static_cast<size_t>(p.K) * PW;
  // the next-block prefetch only where it measured faster (interleaved A/B, MiniLM FP32 1x128, one
  // thread CPU time: avx2 25.1-25.9 -> 22.3-22.5 ms; zmm builds 11.6-12.1 -> 12.2-12.5 ms, off)
  const char* w_end = reinterpret_cast<const char*>(p.w + (kPrefetchNext ? npanels * panel_elems : 0));
  for (long it = lo; it < hi; ++it) {
    const int pn = static_cast<int>(it / nch), ch = static_cast<int>(it % nch);
    const int m0 = ch * mc, m1 = m0 + mc < p.M ? m0 + mc : p.M;
    if (m0 >= m1) continue;  // mc rounded up to MR: the last chunks can be empty
    const float* wp = p.w + pn * panel_elems;
    if (p.K == 0) {  // degenerate: bias only
      for (int m = m0; m < m1; m += MR)
        tile_rows<MR>(m1 - m < MR ? m1 - m : MR, p, m, pn * PW, wp, 0, 0, true, true);
      continue;
    }
    for (int k0 = 0; k0 < p.K; k0 += kcb) {
      const int kc = p.K - k0 < kcb ? p.K - k0 : kcb;
      // the next block: the rest of this panel, else (after this panel's last M chunk) the next
      // panel's first block; none after the last panel
      const char* nb = reinterpret_cast<const char*>(wp + static_cast<size_t>(k0 + kc) * PW);
      const long left = nb < w_end ? static_cast<long>(w_end - nb) : 0;
      const long blk = static_cast<long>(kcb) * PW * 4;
      const long nb_bytes = k0 + kc == p.K && ch + 1 < nch ? 0 : left < blk ? left : blk;
      const int ntiles = (m1 - m0 + MR - 1) / MR;
      const long share = (nb_bytes / ntiles + 63) / 64 * 64;
      int i = 0;
      for (int m = m0; m < m1; m += MR, ++i) {
        const long o = i * share < nb_bytes ? i * share : nb_bytes;
        const long len = o + share < nb_bytes ? share : nb_bytes - o;
        tile_rows<MR>(m1 - m < MR ? m1 - m : MR, p, m, pn * PW, wp, k0, kc, k0 == 0, k0 + kc == p.K, nb + o, len);
      }
    }
  }
}

int f32_panel() { return PW; }

}  // namespace ZOI_NS
}  // namespace zoi
