// LAB VARIANT, not built into zoi (lab/cpu/README.md "AMX, second pass"): the AMX GEMM with 2 x 2
// blocks above K = 512 (1 x 3 below), an epilogue specialised per block width, and a software
// pipeline (block i's K loop with block i-1's epilogue interleaved between its k-steps). Bit-identical
// to vnni, but not faster than csrc/kernels/gemm_amx.cc on the loaded 2-vCPU host of 2026-12-01
// (0.67-1.12x at the MiniLM shapes); kept for a rerun on a quiet machine:
//   NEW_SRC=lab/cpu/amx_gemm_pipelined.cc lab/cpu/amx_ab.sh HEAD -- 1 7 5
// AMX-INT8 GEMM (tdpbusd) for the `amx` ISA: vnni's kernel table with this gemm_i8. Compiled once,
// with the vnni flags + -mamx-tile -mamx-int8 and ZOI_ISA_VNNI (so qrow.h / simd.h are vnni's:
// A rows u8 = q + 128 (symmetric) / q (asymmetric), zp' = zp + off, and the same epilogue maths).
//
// Weights: vnni's packed panels, unchanged ([panel of 48 columns][Kp/4][48][4] s8, colsum), so a
// weight packed once serves both kernels and small M goes to vnni's gemm_i8 (kAmxMinM below).
// The panel already is AMX's B layout: a B tile (16 k-groups x 16 columns x 4 bytes) is 16 rows of
// 64 bytes at a stride of 48 * 4 = 192 bytes; a panel holds 3 such column groups side by side, and
// any group g of the weight is at panel g / 3, byte offset (g % 3) * 64.
//
// Blocking 2 x 2 (lab/cpu/README.md "AMX, second pass"): a block is 2 row tiles (32 rows) x 2 column
// groups (32 columns); C00 C01 C10 C11 = tiles 0-3, A0 A1 = 4-5, B0 B1 = 6-7; per 64 k: 2 A + 2 B
// loads, 4 tdpbusd on 4 independent accumulators (tdpbusd's latency is ~3-4x its issue interval, so
// the 3 accumulators of a 16 x 48 block left the tile unit idle part of the time), 1 load per tdpbusd
// (16 x 48: 4 per 3). Edge blocks: 1 row tile and / or 1 group (same code, fewer tiles).
// Software pipeline: the K loop of block i is issued with the epilogue of block i - 1 interleaved
// between its k-steps (that block's sums were stored to a per-thread s32 buffer), so the vector
// epilogue (dequantise, bias, GELU, residual, stores) runs while the tile unit computes.
// K tail (Kp % 64 = 4..60, k-groups < 16) by vpdpbusd on the stored sums, M tail (< 16 rows) through a
// zero-padded 16-row copy: one tile config, loaded once per call, no reconfiguration.
// The epilogue is gemm_int8.cc's in its order of roundings: float(sum - zp' colsum) * (a_scale *
// w_scale) + bias, activation, residual; or the s32 rows; or the quantised output rows per 64-row
// chunk: bit-exact with vnni (the integer sums are exact in both).
// Float outputs >= 12 MiB with 64-byte aligned rows go out through streaming stores (no RFO:
// 0.6-0.7x the time at M = 4096, lab/cpu/README.md "AMX"); the values are the same.
#include <immintrin.h>

#include <cstdlib>
#include <cstring>
#include <vector>

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
}  // namespace vnni

namespace ZOI_NS {
namespace {

static_assert(kABytes == 1 && !kASigned, "the amx build uses vnni's u8 A rows");

constexpr int PW = 48;          // vnni's panel width
constexpr int TR = 16;          // rows per tile
constexpr int GW = 16;          // columns per B tile (a column group)
constexpr int KB = 64;          // k per tile step (16 k-groups of 4)
constexpr int BSTRIDE = PW * 4; // bytes between k-groups in a panel
constexpr int BR = 2 * TR;      // rows per block
constexpr int BC = 3 * GW;      // columns of the s32 sums buffer (a 1 x 3 block; a 2 x 2 one uses 32)
constexpr int kK2x2 = 512;      // the 2 x 2 blocks above this K
constexpr int MC = 256;         // rows per M chunk (A chunk + one panel in L2)
constexpr int MQ = 64;          // rows per chunk when the GEMM quantises its output rows
// below this M, vnni's kernel (measured: lab/cpu/README.md "AMX"); ZOI_AMX_MIN_M overrides (tests)
constexpr int kAmxMinM = 16;
#ifndef ZOI_AMX_INTERLEAVE
#define ZOI_AMX_INTERLEAVE 1
#endif
constexpr bool kInterleave = ZOI_AMX_INTERLEAVE;  // the previous block's epilogue between the k-steps

int amx_min_m() {
  const char* e = std::getenv("ZOI_AMX_MIN_M");
  if (e && *e) return std::atoi(e);
  return kAmxMinM;
}

long nt_min_bytes() {  // ZOI_AMX_NT_BYTES overrides (0: never)
  const char* e = std::getenv("ZOI_AMX_NT_BYTES");
  if (e && *e) return std::atol(e);
  return 12l << 20;
}

struct alignas(64) TileCfg {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void load_cfg() {
  TileCfg c;
  for (int t = 0; t < 8; ++t) { c.colsb[t] = 64; c.rows[t] = TR; }
  _tile_loadconfig(&c);
}

// the tile loads are asm without a memory operand: the compiler must not sink stores to the rows
// they read (the padded M tail) past them
inline void mem_barrier() { __asm__ volatile("" ::: "memory"); }

struct Scratch {
  std::vector<uint8_t> apad;  // [TR][Kp] u8: the M tail's rows, zero-padded
  const void* apad_src = nullptr;  // what apad holds (rows from apad_m of apad_src), reset per call
  int apad_m = -1;
  // the s32 sums of two blocks (the pipeline's current and previous), the float tile
  alignas(64) int32_t c0[BR * BC];
  int32_t c1[BR * BC];
  float t[BR * BC];
  int32_t* c(int i) { return i ? c1 : c0; }
};
thread_local Scratch tls;

// one block: rows [m, m + mr) (mr <= 32: 1 or 2 row tiles), column groups g0, g0 + 1 (ng 1 or 2)
struct Blk {
  int m, mr, g0, ng;
  bool last_of_chunk;  // the fused quantisation runs after this block's epilogue (qo)
  int q0, q1;          // rows of the chunk to quantise then
};

inline const int8_t* group_ptr(const GemmI8Args& p, int g) {
  return static_cast<const int8_t*>(p.w) + static_cast<size_t>(g / 3) * p.Kp * PW + (g % 3) * GW * 4;
}

// A rows of row tile starting at m (rows < 16 left: through the zero-padded copy)
inline const uint8_t* a_rows(const GemmI8Args& p, int m, size_t* lda) {
  const uint8_t* a = static_cast<const uint8_t*>(p.a) + static_cast<size_t>(m) * p.lda;
  *lda = static_cast<size_t>(p.lda);
  const int mr = p.M - m;
  if (mr >= TR) return a;
  Scratch& s = tls;
  if (s.apad_src != p.a || s.apad_m != m) {
    const size_t need = static_cast<size_t>(TR) * p.Kp;
    if (s.apad.size() < need) s.apad.resize(need);
    std::memset(s.apad.data(), 0, need);
    for (int r = 0; r < mr; ++r) std::memcpy(s.apad.data() + static_cast<size_t>(r) * p.Kp, a + r * *lda, p.Kp);
    s.apad_src = p.a;
    s.apad_m = m;
    mem_barrier();
  }
  *lda = static_cast<size_t>(p.Kp);
  return s.apad.data();
}

// ---- epilogue of rows [r0, r1) (block-local) of block b (NG column groups) from its s32 sums
// c[rows][BC]: float(sum - zp' colsum) * (a_scale * w_scale) + bias, act, + res, as gemm_int8.cc
template <int NG>
void epi_rows_g(const GemmI8Args& p, const Blk& b, const int32_t* c, int r0, int r1, bool stream) {
  const int n0 = b.g0 * GW;
  const int nlast = p.N - (n0 + (NG - 1) * GW);  // columns of the last group (< 16: the N tail)
  auto ncols = [&](int j) { return j == NG - 1 && nlast < GW ? nlast : GW; };
  if (p.y_i32) {
    for (int r = r0; r < r1; ++r) {
      const __m512i zp = _mm512_set1_epi32(p.a_zp[b.m + r]);
#pragma GCC unroll 3
      for (int j = 0; j < NG; ++j) {
        const __m512i s = _mm512_sub_epi32(_mm512_load_si512(c + r * BC + j * GW),
                                           _mm512_mullo_epi32(zp, _mm512_loadu_si512(p.colsum + n0 + j * GW)));
        _mm512_mask_storeu_epi32(p.y_i32 + static_cast<size_t>(b.m + r) * p.ldy + n0 + j * GW, V16::mask(ncols(j)), s);
      }
    }
    return;
  }
  V::T ws[NG], bs[NG];
  __m512i cs[NG];
#pragma GCC unroll 3
  for (int j = 0; j < NG; ++j) {
    ws[j] = V::load(p.w_scale + n0 + j * GW);
    bs[j] = V::load(p.bias + n0 + j * GW);
    cs[j] = _mm512_loadu_si512(p.colsum + n0 + j * GW);
  }
  const bool full = nlast >= GW, st = stream && full;
  auto out = [&](int row, V::T (&f)[NG]) {  // + residual, store
    float* y = p.y + static_cast<size_t>(row) * p.ldy + n0;
    const float* res = p.res ? p.res + static_cast<size_t>(row) * p.ldr + n0 : nullptr;
    if (full) {
#pragma GCC unroll 3
      for (int j = 0; j < NG; ++j) {
        V::T v = res ? V::add(f[j], V::load(res + j * GW)) : f[j];
        if (st) _mm512_stream_ps(y + j * GW, v);
        else V::store(y + j * GW, v);
      }
    } else {
#pragma GCC unroll 3
      for (int j = 0; j < NG; ++j) {
        V::T v = res ? V::add(f[j], V::load_n(res + j * GW, ncols(j))) : f[j];
        V::store_n(y + j * GW, v, ncols(j));
      }
    }
  };
  if (p.act == ACT_NONE) {  // one pass, straight into y
    for (int r = r0; r < r1; ++r) {
      const int row = b.m + r;
      const V::T as = V::set(p.a_scale[row]);
      const __m512i zp = _mm512_set1_epi32(p.a_zp[row]);
      V::T f[NG];
#pragma GCC unroll 3
      for (int j = 0; j < NG; ++j) {
        const __m512i s = _mm512_sub_epi32(_mm512_load_si512(c + r * BC + j * GW), _mm512_mullo_epi32(zp, cs[j]));
        f[j] = V::add(V::mul(_mm512_cvtepi32_ps(s), V::mul(as, ws[j])), bs[j]);
      }
      out(row, f);
    }
    return;
  }
  // dequantise into the L1 float tile, the activation over it (4 vectors interleaved), then
  // residual and store
  float* t = tls.t;
  for (int r = r0; r < r1; ++r) {
    const int row = b.m + r;
    const V::T as = V::set(p.a_scale[row]);
    const __m512i zp = _mm512_set1_epi32(p.a_zp[row]);
#pragma GCC unroll 3
    for (int j = 0; j < NG; ++j) {
      const __m512i s = _mm512_sub_epi32(_mm512_load_si512(c + r * BC + j * GW), _mm512_mullo_epi32(zp, cs[j]));
      V::store(t + (r - r0) * (NG * GW) + j * GW, V::add(V::mul(_mm512_cvtepi32_ps(s), V::mul(as, ws[j])), bs[j]));
    }
  }
  vact_inplace(t, (r1 - r0) * NG * GW, p.act);
  for (int r = r0; r < r1; ++r) {
    V::T f[NG];
#pragma GCC unroll 3
    for (int j = 0; j < NG; ++j) f[j] = V::load(t + (r - r0) * (NG * GW) + j * GW);
    out(b.m + r, f);
  }
}

void epi_rows(const GemmI8Args& p, const Blk& b, const int32_t* c, int r0, int r1, bool stream) {
  if (r1 > b.mr) r1 = b.mr;
  if (r0 >= r1) return;
  if (b.ng == 3) epi_rows_g<3>(p, b, c, r0, r1, stream);
  else if (b.ng == 2) epi_rows_g<2>(p, b, c, r0, r1, stream);
  else epi_rows_g<1>(p, b, c, r0, r1, stream);
}

inline void finish(const GemmI8Args& p, const Blk& b) {  // after b's epilogue: the chunk's rows quantised
  if (p.qo.q && b.last_of_chunk)
    for (int m = b.q0; m < b.q1; ++m) quantize_into(p.y + static_cast<size_t>(m) * p.ldy, p.N, p.qo, m);
}

// K tail: the k-groups past the last full 64 k, by vpdpbusd on the stored sums
void k_tail(const GemmI8Args& p, const Blk& b, int32_t* c) {
  const int g0 = p.Kp / KB * (KB / 4), g1 = p.Kp / 4;
  if (g0 == g1) return;
  for (int i = 0; i * TR < b.mr; ++i) {
    size_t lda;
    const uint8_t* a = a_rows(p, b.m + i * TR, &lda);
    for (int j = 0; j < b.ng; ++j) {
      const int8_t* w = group_ptr(p, b.g0 + j);
      for (int r = 0; r < TR; ++r) {
        int32_t* cr = c + (i * TR + r) * BC + j * GW;
        __m512i acc = _mm512_load_si512(cr);
        for (int g = g0; g < g1; ++g) {
          int32_t v;
          std::memcpy(&v, a + r * lda + g * 4, 4);
          acc = _mm512_dpbusd_epi32(acc, _mm512_set1_epi32(v), _mm512_load_si512(w + static_cast<size_t>(g) * BSTRIDE));
        }
        _mm512_store_si512(cr, acc);
      }
    }
  }
}

// the K loop of block b (NR row tiles x NG groups: 1 x 1..3 or 2 x 1..2) with the epilogue of `prev`
// (sums in pc) interleaved between its k-steps, then b's sums stored to c. Tiles: C(i, j) = tile
// i * NG + j (NR = 1) / 2 i + j (NR = 2); A0 = 4; NR = 1: B = 5, 6, 7; NR = 2: A1 = 5, B = 6, 7.
template <int NR, int NG>
void block_kloop(const GemmI8Args& p, const Blk& b, int32_t* c, const Blk* prev, const int32_t* pc, bool stream) {
  static_assert(NR * NG <= 4 && NR + NG + NR * NG <= 8, "8 tiles");
  size_t lda0, lda1 = 0;
  const uint8_t* a0 = a_rows(p, b.m, &lda0);
  const uint8_t* a1 = NR == 2 ? a_rows(p, b.m + TR, &lda1) : nullptr;
  const int8_t* w0 = group_ptr(p, b.g0);
  const int8_t* w1 = NG >= 2 ? group_ptr(p, b.g0 + 1) : nullptr;
  const int8_t* w2 = NG >= 3 ? group_ptr(p, b.g0 + 2) : nullptr;
  const int nkb = p.Kp / KB;
  _tile_zero(0);
  if (NR * NG >= 2) _tile_zero(1);
  if (NR * NG >= 3) _tile_zero(2);
  if (NR * NG >= 4) _tile_zero(3);
  const int prow = prev ? prev->mr : 0;
  int done = 0;
  for (int kb = 0; kb < nkb; ++kb) {
    const size_t bo = static_cast<size_t>(kb) * (KB / 4) * BSTRIDE;
    if constexpr (NR == 1) {
      _tile_loadd(4, a0 + kb * KB, lda0);
      _tile_loadd(5, w0 + bo, BSTRIDE);
      if (NG >= 2) _tile_loadd(6, w1 + bo, BSTRIDE);
      if (NG >= 3) _tile_loadd(7, w2 + bo, BSTRIDE);
      _tile_dpbusd(0, 4, 5);
      if (NG >= 2) _tile_dpbusd(1, 4, 6);
      if (NG >= 3) _tile_dpbusd(2, 4, 7);
    } else {
      _tile_loadd(4, a0 + kb * KB, lda0);
      _tile_loadd(6, w0 + bo, BSTRIDE);
      if (NG >= 2) _tile_loadd(7, w1 + bo, BSTRIDE);
      _tile_loadd(5, a1 + kb * KB, lda1);
      _tile_dpbusd(0, 4, 6);
      if (NG >= 2) _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(2, 5, 6);
      if (NG >= 2) _tile_dpbusd(3, 5, 7);
    }
    if (kInterleave && prev) {  // the previous block's epilogue rows for this k-step
      const int upto = prow * (kb + 1) / nkb;
      epi_rows(p, *prev, pc, done, upto, stream);
      done = upto;
    }
  }
  if (prev && done < prow) epi_rows(p, *prev, pc, done, prow, stream);
  if (prev) finish(p, *prev);  // the fused quantisation too, before the stores wait for the tile unit
  if constexpr (NR == 1) {
    _tile_stored(0, c, BC * 4);
    if (NG >= 2) _tile_stored(1, c + GW, BC * 4);
    if (NG >= 3) _tile_stored(2, c + 2 * GW, BC * 4);
  } else {
    _tile_stored(0, c, BC * 4);
    if (NG >= 2) _tile_stored(1, c + GW, BC * 4);
    _tile_stored(2, c + TR * BC, BC * 4);
    if (NG >= 2) _tile_stored(3, c + TR * BC + GW, BC * 4);
  }
  k_tail(p, b, c);
}

void block_any(const GemmI8Args& p, const Blk& b, int32_t* c, const Blk* prev, const int32_t* pc, bool stream) {
  if (b.mr > TR) {
    if (b.ng >= 2) block_kloop<2, 2>(p, b, c, prev, pc, stream);
    else block_kloop<2, 1>(p, b, c, prev, pc, stream);
  } else if (b.ng == 3) {
    block_kloop<1, 3>(p, b, c, prev, pc, stream);
  } else if (b.ng == 2) {
    block_kloop<1, 2>(p, b, c, prev, pc, stream);
  } else {
    block_kloop<1, 1>(p, b, c, prev, pc, stream);
  }
}

// runs the blocks that next() yields through the pipeline: block i's K loop with block i-1's epilogue
template <class Next>
void pipeline(const GemmI8Args& p, Next next, bool stream) {
  Scratch& s = tls;
  Blk cur, prev;
  bool have = false;
  int slot = 0;
  while (next(&cur)) {
    block_any(p, cur, s.c(slot), have ? &prev : nullptr, s.c(slot ^ 1), stream);
    prev = cur;
    have = true;
    slot ^= 1;
  }
  if (have) {
    epi_rows(p, prev, s.c(slot ^ 1), 0, prev.mr, stream);
    finish(p, prev);
  }
}

void gemm(const GemmI8Args& p, int tid, int nt) {
  if (p.M <= 0 || p.N <= 0) return;
  if (p.M < amx_min_m()) {
    vnni::gemm_i8(p, tid, nt);
    return;
  }
  const int G = (p.N + GW - 1) / GW;  // column groups
  // block shape: 16 rows x 3 groups (a panel) up to K = kK2x2, else 32 rows x 2 groups (measured:
  // lab/cpu/README.md "AMX, second pass")
  const int rb = p.Kp > kK2x2 ? 2 * TR : TR, gb = p.Kp > kK2x2 ? 2 : 3;
  const int ngp = (G + gb - 1) / gb;  // blocks across N (the last may have fewer groups)
  long lo, hi;
  load_cfg();
  tls.apad_src = nullptr;  // the padded tail copy is per call
  if (p.qo.q) {  // split over row chunks; each chunk: every group pair, then its rows quantised
    const int nch = (p.M + MQ - 1) / MQ;
    split_range(nch, tid, nt, &lo, &hi);
    long ch = lo;
    int gp = 0, m = static_cast<int>(lo) * MQ;
    auto next = [&](Blk* b) {
      if (ch >= hi) return false;
      const int m0 = static_cast<int>(ch) * MQ, m1 = m0 + MQ < p.M ? m0 + MQ : p.M;
      b->m = m;
      b->mr = m1 - m < rb ? m1 - m : rb;
      b->g0 = gb * gp;
      b->ng = G - b->g0 < gb ? G - b->g0 : gb;
      b->q0 = m0;
      b->q1 = m1;
      m += rb;
      if (m >= m1) {  // rows of this chunk done for this group pair
        m = m0;
        if (++gp == ngp) { gp = 0; ++ch; m = m1; }
      }
      b->last_of_chunk = (gp == 0 && m == m1);
      return true;
    };
    pipeline(p, next, false);
  } else {
    const int nch = (p.M + MC - 1) / MC;
    const int mc = round_up((p.M + nch - 1) / nch, rb);  // equal chunks: balanced split over M
    // float outputs over kNtBytes (past what L2 + this core's share of L3 hold) are streamed;
    // needs 64-byte aligned rows (y, ldy)
    // (named `stream`, not `nt`: `nt` is the thread count; a bool `nt` here once shadowed it and
    // split_range divided by the bool, so every thread computed every panel; UBSan found it)
    const bool stream = nt_min_bytes() > 0 && !p.y_i32 &&
                        static_cast<size_t>(p.M) * p.N * 4 >= static_cast<size_t>(nt_min_bytes()) &&
                        (reinterpret_cast<uintptr_t>(p.y) & 63) == 0 && p.ldy % 16 == 0;
    split_range(static_cast<long>(nch) * ngp, tid, nt, &lo, &hi);
    long it = lo;
    int m = -1;
    auto next = [&](Blk* b) {
      if (it >= hi) return false;
      const int ch = static_cast<int>(it / ngp), gp = static_cast<int>(it % ngp);
      const int m0 = ch * mc, m1 = m0 + mc < p.M ? m0 + mc : p.M;
      if (m < 0) m = m0;
      b->m = m;
      b->mr = m1 - m < rb ? m1 - m : rb;
      b->g0 = gb * gp;
      b->ng = G - b->g0 < gb ? G - b->g0 : gb;
      b->last_of_chunk = false;
      b->q0 = b->q1 = 0;
      m += rb;
      if (m >= m1) { m = -1; ++it; }
      return true;
    };
    pipeline(p, next, stream);
    if (stream) _mm_sfence();
  }
  _tile_release();
}

// AMX roofline: 4 independent C tiles (the 2 x 2 block's), tdpbusd from tiles already loaded (no
// memory traffic)
double peak(long iters) {
  load_cfg();
  alignas(64) static uint8_t buf[TR * 64];
  std::memset(buf, 1, sizeof buf);
  _tile_loadd(4, buf, 64);
  _tile_loadd(5, buf, 64);
  _tile_loadd(6, buf, 64);
  _tile_loadd(7, buf, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long i = 0; i < iters; ++i) {
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
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
    return k;
  }();
  return t;
}

}  // namespace ZOI_NS
}  // namespace zoi
