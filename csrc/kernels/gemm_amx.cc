// AMX-INT8 GEMM (tdpbusd) for the `amx` ISA: vnni's kernel table with this gemm_i8 (and vnni's
// attention entry that may run prec 3 on AMX-BF16 tiles, attention_amx.h). Compiled once,
// with the vnni flags + -mamx-tile -mamx-int8 and ZOI_ISA_VNNI (so qrow.h / simd.h are vnni's:
// A rows u8 = q + 128 (symmetric) / q (asymmetric), zp' = zp + off, and the same epilogue maths).
//
// Weights: vnni's packed panels, unchanged ([panel of 48 columns][Kp/4][48][4] s8, colsum), so a
// weight packed once serves both kernels and small M goes to vnni's gemm_i8 (amx_min_m below).
// The panel already is AMX's B layout: a B tile (16 k-groups x 16 columns x 4 bytes) is 16 rows of
// 64 bytes at a stride of 48 * 4 = 192 bytes; a panel is 3 B tiles per 64 k.
// Tiles: C0-C2 = 16 rows x 48 columns of s32 (one row block x one panel), A (16 rows x 64 u8,
// stride lda), B0-B2. Per 64 k: 1 A load + 3 B loads + 3 tdpbusd (16 x 16 x 64 MACs each).
// K tail (Kp % 64 = 4..60, k-groups < 16) and M tail (< 16 rows: copied into a zero-padded
// 16-row buffer) without a second tile config: the tail k-groups are added with vpdpbusd on the
// stored C tile. Then the s32 tile (per thread, L1) goes through the same epilogue as vnni's
// gemm_int8.cc: float(sum - zp' colsum) * (a_scale * w_scale) + bias, activation, residual, or the
// s32 rows, or the quantised output rows: bit-exact with vnni (the integer sums are exact in both).
// Tile state: ldtilecfg at the start of every gemm_i8 call on its thread, tilerelease at the end.
// Float outputs >= 12 MiB with 64-byte aligned rows go out through streaming stores (no RFO:
// 0.6-0.7x the time at M = 4096, lab/cpu/README.md "AMX"); the values are the same.
#include <immintrin.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels.h"
#include "qrow.h"
#include "simd.h"

namespace zoi {
namespace vnni {
size_t pack_i8_bytes(int N, int K);
void pack_i8(const int8_t* w, int N, int K, void* dst, int32_t* colsum);
void gemm_i8(const GemmI8Args& a, int tid, int nt);
int i8_panel();
double peak_i8(long iters);
void attention_amx(const AttnArgs& a, int tid, int nt);  // attention.cc: prec 3 on AMX-BF16 tiles too
}  // namespace vnni

namespace ZOI_NS {
namespace {

static_assert(kABytes == 1 && !kASigned, "the amx build uses vnni's u8 A rows");

constexpr int PW = 48;          // vnni's panel width
constexpr int TR = 16;          // rows per tile
constexpr int KB = 64;          // k per tile step (16 k-groups of 4)
constexpr int BSTRIDE = PW * 4; // bytes between k-groups in a panel
constexpr int MC = 256;         // rows per M chunk (A chunk + one panel in L2)
constexpr int MQ = 64;          // rows per chunk when the GEMM quantises its output rows
static_assert(MQ <= kI8QChunkRows, "y_scratch holds kI8QChunkRows rows");
// below this M, vnni's kernel (default kAmxMinMDefault = 16, measured: lab/cpu/README.md "AMX");
// CpuOptions.amx_min_m sets it (isa.h)
int amx_min_m() { return amx_min_m_option(); }

long nt_min_bytes() { return amx_nt_bytes_option(); }  // CpuOptions.amx_nt_bytes (0: never)

struct alignas(64) TileCfg {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void load_cfg() {
  TileCfg c;
  for (int t = 0; t < 7; ++t) { c.colsb[t] = 64; c.rows[t] = TR; }
  _tile_loadconfig(&c);
}

struct Scratch {
  // [TR][Kp] u8: the M tail's rows, zero-padded; grow-only. Not a std::vector: its out-of-line
  // members would be weak symbols compiled with AMX / AVX-512 flags that the linker may pick for
  // baseline callers too (csrc/check_isa_symbols.py)
  uint8_t* apad = nullptr;
  size_t apad_cap = 0;
  ~Scratch() { std::free(apad); }
  alignas(64) int32_t c[TR * PW];
  alignas(64) float t[TR * PW];
};
thread_local Scratch tls;

// s32 sums of rows a[0..16) (stride lda bytes) x one panel into c[16][48]
inline void tile_sums(const uint8_t* a, size_t lda, const int8_t* panel, int Kp, int32_t* c) {
  const int nkb = Kp / KB;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  for (int kb = 0; kb < nkb; ++kb) {
    const int8_t* b = panel + static_cast<size_t>(kb) * (KB / 4) * BSTRIDE;
    _tile_loadd(3, a + kb * KB, lda);
    _tile_loadd(4, b, BSTRIDE);
    _tile_loadd(5, b + 64, BSTRIDE);
    _tile_loadd(6, b + 128, BSTRIDE);
    _tile_dpbusd(0, 3, 4);
    _tile_dpbusd(1, 3, 5);
    _tile_dpbusd(2, 3, 6);
  }
  _tile_stored(0, c, PW * 4);
  _tile_stored(1, c + 16, PW * 4);
  _tile_stored(2, c + 32, PW * 4);
  const int g0 = nkb * (KB / 4), g1 = Kp / 4;
  if (g0 == g1) return;
  for (int r = 0; r < TR; ++r) {  // the K tail: vpdpbusd on the stored tile
    __m512i acc0 = _mm512_load_si512(c + r * PW), acc1 = _mm512_load_si512(c + r * PW + 16),
            acc2 = _mm512_load_si512(c + r * PW + 32);
    for (int g = g0; g < g1; ++g) {
      int32_t v;
      std::memcpy(&v, a + r * lda + g * 4, 4);
      const __m512i av = _mm512_set1_epi32(v);
      const int8_t* w = panel + static_cast<size_t>(g) * BSTRIDE;
      acc0 = _mm512_dpbusd_epi32(acc0, av, _mm512_load_si512(w));
      acc1 = _mm512_dpbusd_epi32(acc1, av, _mm512_load_si512(w + 64));
      acc2 = _mm512_dpbusd_epi32(acc2, av, _mm512_load_si512(w + 128));
    }
    _mm512_store_si512(c + r * PW, acc0);
    _mm512_store_si512(c + r * PW + 16, acc1);
    _mm512_store_si512(c + r * PW + 32, acc2);
  }
}

// gemm_int8.cc's epilogue of rows [m, m + mr) x columns [n0, n0 + 48) from the s32 sums c, in its
// order of roundings (float(sum - zp colsum) * (as * ws) + bias, then act, then + res)
inline void epilogue(const GemmI8Args& p, int m, int mr, int n0, const int32_t* c, float* t, bool nt_store) {
  const int ncols = p.N - n0 < PW ? p.N - n0 : PW;
  if (p.y_i32) {
    for (int r = 0; r < mr; ++r) {
      const int zp = p.a_zp[m + r];
      int32_t* dst = p.y_i32 + static_cast<size_t>(m + r) * p.ldy + n0;
      for (int e = 0; e < ncols; ++e) dst[e] = c[r * PW + e] - zp * p.colsum[n0 + e];
    }
    return;
  }
  V::T ws[3], bs[3];
  __m512i cs[3];
  for (int j = 0; j < 3; ++j) {
    ws[j] = V::load(p.w_scale + n0 + j * 16);
    bs[j] = V::load(p.bias + n0 + j * 16);
    cs[j] = _mm512_loadu_si512(p.colsum + n0 + j * 16);
  }
  for (int r = 0; r < mr; ++r) {
    const V::T as = V::set(p.a_scale[m + r]);
    const __m512i zp = _mm512_set1_epi32(p.a_zp[m + r]);
    for (int j = 0; j < 3; ++j) {
      const __m512i s = _mm512_sub_epi32(_mm512_load_si512(c + r * PW + j * 16), _mm512_mullo_epi32(zp, cs[j]));
      V::store(t + r * PW + j * 16, V::add(V::mul(_mm512_cvtepi32_ps(s), V::mul(as, ws[j])), bs[j]));
    }
  }
  if (p.a2) {  // the first rows' second quantisation (GemmI8Args::a2), as gemm_int8.cc adds it
    int seq[TR];
    if (first_rows_in(p.cu, p.B, p.row0 + m, mr, seq) > 0) {
      const int8_t* panel = static_cast<const int8_t*>(p.w) + static_cast<size_t>(n0 / PW) * p.Kp * PW;
      for (int r = 0; r < mr; ++r) {
        const int b = seq[r];
        if (b < 0) continue;
        const uint8_t* a2 = static_cast<const uint8_t*>(p.a2) + static_cast<size_t>(b) * p.lda;
        __m512i acc[3] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
        for (int g = 0; g < p.Kp / 4; ++g) {
          int32_t v;
          std::memcpy(&v, a2 + g * 4, 4);
          const __m512i av = _mm512_set1_epi32(v);
          const int8_t* w = panel + static_cast<size_t>(g) * BSTRIDE;
          for (int j = 0; j < 3; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], av, _mm512_load_si512(w + 64 * j));
        }
        const V::T s2 = V::set(p.a2_scale[b]);
        const __m512i zp2 = _mm512_set1_epi32(p.a2_zp[b]);
        for (int j = 0; j < 3; ++j) {
          const __m512i sum = _mm512_sub_epi32(acc[j], _mm512_mullo_epi32(zp2, cs[j]));
          const V::T d = V::mul(_mm512_cvtepi32_ps(sum), V::mul(s2, ws[j]));
          V::store(t + r * PW + j * 16, V::add(V::load(t + r * PW + j * 16), d));
        }
      }
    }
  }
  if (p.act != ACT_NONE) vact_inplace(t, mr * PW, p.act);
  if (nt_store && ncols == PW) {  // large outputs: streaming stores (no read-for-ownership)
    for (int r = 0; r < mr; ++r) {
      const int row = m + r;
      float* y = p.y + static_cast<size_t>(row) * p.ldy + n0;
      const float* res = p.res ? p.res + static_cast<size_t>(row) * p.ldr + n0 : nullptr;
      for (int cc = 0; cc < PW; cc += 16) {
        V::T f = V::load(t + r * PW + cc);
        if (res) f = V::add(f, V::load(res + cc));
        _mm512_stream_ps(y + cc, f);
      }
    }
    return;
  }
  for (int r = 0; r < mr; ++r) {
    const int row = m + r;
    float* y = p.y + static_cast<size_t>(row) * p.ldy + n0;
    const float* res = p.res ? p.res + static_cast<size_t>(row) * p.ldr + n0 : nullptr;
    for (int cc = 0; cc < ncols; cc += 16) {
      V::T f = V::load(t + r * PW + cc);
      if (res) f = V::add(f, V::load_n(res + cc, ncols - cc));
      V::store_n(y + cc, f, ncols - cc);
    }
  }
}

// rows [m, m + mr) (mr <= 16) x panel pn
inline void block(const GemmI8Args& p, int m, int mr, int pn, bool nt_store = false) {
  Scratch& s = tls;
  const int8_t* panel = static_cast<const int8_t*>(p.w) + static_cast<size_t>(pn) * p.Kp * PW;
  const uint8_t* a = static_cast<const uint8_t*>(p.a) + static_cast<size_t>(m) * p.lda;
  size_t lda = static_cast<size_t>(p.lda);
  if (mr < TR) {
    const size_t need = static_cast<size_t>(TR) * p.Kp;
    if (s.apad_cap < need) {
      std::free(s.apad);
      s.apad = static_cast<uint8_t*>(std::malloc(need));
      if (!s.apad) { s.apad_cap = 0; throw std::bad_alloc(); }
      s.apad_cap = need;
    }
    std::memset(s.apad, 0, need);
    for (int r = 0; r < mr; ++r) std::memcpy(s.apad + static_cast<size_t>(r) * p.Kp, a + r * lda, p.Kp);
    a = s.apad;
    lda = p.Kp;
    // the tile loads are asm without a memory operand (GCC's amxtileintrin.h): a compiler barrier so
    // the stores of the copy cannot be sunk past them
    __asm__ volatile("" ::: "memory");
  }
  tile_sums(a, lda, panel, p.Kp, s.c);
  epilogue(p, m, mr, pn * PW, s.c, s.t, nt_store);
}

void gemm(const GemmI8Args& p, int tid, int nt) {
  if (p.M <= 0 || p.N <= 0) return;
  if (p.M < amx_min_m()) {
    vnni::gemm_i8(p, tid, nt);
    return;
  }
  const int npanels = round_up(p.N, PW) / PW;
  long lo, hi;
  load_cfg();
  if (p.qo.q) {  // split over row chunks; each chunk: every panel, then its rows quantised
    const int nch = (p.M + MQ - 1) / MQ;
    split_range(nch, tid, nt, &lo, &hi);
    const bool to_scratch = p.y_scratch && !p.y_i32;  // y has no reader: the chunk's rows stay in scratch
    for (long ch = lo; ch < hi; ++ch) {
      const int m0 = static_cast<int>(ch) * MQ, m1 = m0 + MQ < p.M ? m0 + MQ : p.M;
      // the chunk as a GEMM of its own: into the per-thread scratch (row 0 = m0), or into y
      const GemmI8Args c = to_scratch ? i8_chunk_to_scratch(p, m0, m1 - m0, static_cast<size_t>(p.lda)) : p;
      const int c0 = to_scratch ? 0 : m0, c1 = to_scratch ? m1 - m0 : m1;
      for (int pn = 0; pn < npanels; ++pn)
        for (int m = c0; m < c1; m += TR) block(c, m, c1 - m < TR ? c1 - m : TR, pn);
      for (int m = c0; m < c1; ++m) quantize_into(c.y + static_cast<size_t>(m) * c.ldy, p.N, p.qo, m - c0 + m0);
    }
  } else {
    const int nch = (p.M + MC - 1) / MC;
    const int mc = round_up((p.M + nch - 1) / nch, TR);  // equal chunks: balanced split over M
    // float outputs over kNtBytes (past what L2 + this core's share of L3 hold) are streamed;
    // needs 64-byte aligned rows (y, ldy)
    // (named `stream`, not `nt`: `nt` is the thread count; a bool `nt` here once shadowed it and
    // split_range divided by the bool, so every thread computed every panel; UBSan found it)
    const bool stream = nt_min_bytes() > 0 && !p.y_i32 &&
                        static_cast<size_t>(p.M) * p.N * 4 >= static_cast<size_t>(nt_min_bytes()) &&
                        (reinterpret_cast<uintptr_t>(p.y) & 63) == 0 && p.ldy % 16 == 0;
    split_range(static_cast<long>(nch) * npanels, tid, nt, &lo, &hi);
    for (long it = lo; it < hi; ++it) {
      const int ch = static_cast<int>(it / npanels), pn = static_cast<int>(it % npanels);
      const int m0 = ch * mc, m1 = m0 + mc < p.M ? m0 + mc : p.M;
      for (int m = m0; m < m1; m += TR) block(p, m, m1 - m < TR ? m1 - m : TR, pn, stream);
    }
    if (stream) _mm_sfence();
  }
  _tile_release();
}

// AMX roofline: 3 independent C tiles, tdpbusd from tiles already loaded (no memory traffic)
double peak(long iters) {
  load_cfg();
  alignas(64) static uint8_t buf[TR * 64];
  std::memset(buf, 1, sizeof buf);
  _tile_loadd(3, buf, 64);
  _tile_loadd(4, buf, 64);
  _tile_loadd(5, buf, 64);
  _tile_loadd(6, buf, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  for (long i = 0; i < iters; ++i) {
    _tile_dpbusd(0, 3, 4);
    _tile_dpbusd(1, 3, 5);
    _tile_dpbusd(2, 3, 6);
    _tile_dpbusd(0, 3, 6);
  }
  alignas(64) static int32_t out[TR * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  __asm__ volatile("" : : "r"(out) : "memory");
  return static_cast<double>(iters) * 4 * TR * 16 * 64 * 2;
}

}  // namespace

const KernelTable& table() {
  static const KernelTable t = [] {
    KernelTable k = vnni::table();
    k.isa = Isa::Amx;
    k.gemm_i8 = gemm;
    k.peak_i8 = peak;
    k.attention = vnni::attention_amx;  // the only table whose attention runs AMX-BF16 (prec 3)
    return k;
  }();
  return t;
}

}  // namespace ZOI_NS
}  // namespace zoi
