// A persistent decode step for Llama-3.2-1B shapes with INT8 weights (lab: the decode half of
// the persistent kernel, measured before it is built into the product).
//
// What it tests: whether one launch per token that streams every weight through a per-SM
// shared-memory ring (cp.async.bulk + mbarrier, up to NSLOT tiles ahead, whatever the
// dependencies) and orders its phases with counters in global memory reaches the weight-read
// floor, where the per-op graph of Triton kernels (one launch per linear, PDL, L2 prefetch)
// stops at ~1.9x of it (0.77 ms/token on an H100 against ~0.41).
//
// The step (batch 1, one token at position `pos`, weights INT8 with one fp32 scale per output
// row, activations fp32, KV cache fp16, RMSNorm gains folded into the weights as the product does):
//   per layer: qkv = rms(h) Wqkv^T; RoPE on q, k; k, v into the cache at pos; one query's
//   attention per q head (GQA 32 / 8, D 64); h += attn Wo^T; act = silu(rms(h) Wg^T) *
//   (rms(h) Wu^T); h += act Wd^T. Then logits = rms(h) Wlm^T. (Sampling is left out.)
// Layer 0 reads the embedding `emb` in place of h, and its o tiles write h = emb + attn Wo^T, so a
// step needs no copy before it.
//
// Instructions: one per weight tile of 32 KB (16 rows x 2048: qkv / o / lm_head; 8 gate + 8 up
// rows: gu; 4 rows x 8192: down) and one per q head (attention). Each SM runs its own queue in
// the global phase order, round-robin over the SMs phase after phase. At the first instruction
// of a phase, thread 0 polls until the phase before has counted all its instructions (relaxed
// loads, then one acquire; bounded by a time limit that sets an error flag), and the phase's
// input row is loaded. When an SM finishes its last instruction of a phase, it adds its count
// of them to the phase's counter (red.release.gpu, from the signal warp). Counters only grow:
// a step's targets are (epoch + 1) x count, so no memset is needed between launches.
// Timing modes and a phase timeline (`case: timeline`) split a step's time; docs/MEGAKERNEL.md.
//
// Checked against plain reference kernels (one warp per output row, one thread per head's
// attention) on the logits of several consecutive steps, then timed for a few context lengths
// beside a pure weight-read kernel over the same bytes and cudaMemcpy's copy bandwidth.
// Build / run (scripts/gpu_check.sh decmega):
//   nvcc -O3 -std=c++17 -arch=sm_90a -o decode_mega lab/gpu/decode_mega.cu && ./decode_mega
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int H = 2048, NQ = 32, NKV = 8, HD = 64, FF = 8192, NL = 16, VOC = 128256;
constexpr int QKV = H + 2 * NKV * HD;  // 3072
constexpr int MAXCTX = 2048;
constexpr int THREADS = 256;  // the compute warps
// PRODUCER 1: a ninth warp issues the weight copies (waiting on per-slot "empty" mbarriers), so
// no compute thread ever waits on the copy engine's queue; 0: thread 0 issues between tiles
#ifndef PRODUCER
#define PRODUCER 1
#endif
// with the producer warp, a second extra warp bumps the phase counters (a release waits for the
// block's stores to drain: ~1 us a phase that the compute warps no longer wait out)
constexpr int BLOCK = THREADS + (PRODUCER ? 64 : 0);
constexpr int SLOT = 32768;
// ring depth in 32 KB slots: 6 fills the SM's shared memory beside x; 7 (x straight from L2
// into registers, attention scratch in its own slot) measured no faster
#ifndef NSLOT
#define NSLOT 6
#endif
constexpr float EPS = 1e-5f;
constexpr float THETA = 500000.f;

enum Op { QKV_T = 0, ATTN = 1, O_T = 2, GU_T = 3, DOWN_T = 4, LM_T = 5 };
constexpr int NPH = 5;  // counted phases per layer: qkv, attn, o, gu, down
constexpr int TILES[6] = {QKV / 16, NQ, H / 16, FF / 8, H / 4, VOC / 16};

struct Ins {
  int op, layer, n0, wait_idx, wait_cnt, sig_idx, sig_add, pad;
};

struct Weights {  // device pointers; per layer arrays are [NL][rows][K] contiguous
  const int8_t *qkv, *o, *g, *u, *d, *lm;
  const float *s_qkv, *s_o, *s_g, *s_u, *s_d, *s_lm;
};

struct State {
  const float* emb;  // [H]
  float* h;          // [H] residual stream
  float* qkv;        // [QKV]
  float* attn;       // [H]
  float* act;        // [FF]
  float* logits;     // [VOC]
  half *kc, *vc;     // [NL][NKV][MAXCTX][HD]
};

__host__ __device__ inline size_t kv_off(int l, int g, int t) {
  return ((size_t(l) * NKV + g) * MAXCTX + t) * HD;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// RoPE (rotate-half) angle for dimension pair i of a head at position pos: the same function
// in the kernel and the reference, so both round alike
__device__ __forceinline__ void rope_cs(int pos, int i, float& c, float& s) {
  float inv = powf(THETA, -2.f * i / HD);
  sincosf(pos * inv, &s, &c);
}
__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

// ---------------------------------------------------------------- the reference (plain kernels)
// out[n] = (x . W[n]) * scale[n] * (rms ? rsqrt(mean(x^2) + eps) : 1) (+ base[n]); one warp a row
__global__ void ref_gemv(const int8_t* W, const float* sc, const float* x, int N, int K, int rms,
                         const float* base, float* out) {
  int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
  if (n >= N) return;
  float a = 0.f, ss = 0.f;
  for (int k = lane; k < K; k += 32) {
    a += x[k] * float(W[size_t(n) * K + k]);
    ss += x[k] * x[k];
  }
  a = warp_sum(a);
  ss = warp_sum(ss);
  if (lane == 0) {
    float r = rms ? rsqrtf(ss / K + EPS) : 1.f;
    out[n] = a * sc[n] * r + (base ? base[n] : 0.f);
  }
}
__global__ void ref_swiglu(const float* g, const float* u, float* act, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) act[i] = silu(g[i]) * u[i];
}
// one thread per q head: RoPE, the cache write (the group's first head), softmax attention
__global__ void ref_attn(float* qkv, half* kc, half* vc, float* attn, int l, int pos) {
  int h = threadIdx.x;
  if (h >= NQ) return;
  int g = h / (NQ / NKV);
  float q[HD], kn[HD], vn[HD];
  for (int i = 0; i < HD / 2; ++i) {
    float c, s;
    rope_cs(pos, i, c, s);
    const float* qq = qkv + h * HD;
    const float* kk = qkv + H + g * HD;
    q[i] = qq[i] * c - qq[i + 32] * s;
    q[i + 32] = qq[i + 32] * c + qq[i] * s;
    kn[i] = kk[i] * c - kk[i + 32] * s;
    kn[i + 32] = kk[i + 32] * c + kk[i] * s;
  }
  for (int d = 0; d < HD; ++d) {
    kn[d] = __half2float(__float2half(kn[d]));
    vn[d] = __half2float(__float2half(qkv[H + NKV * HD + g * HD + d]));
  }
  if (h % (NQ / NKV) == 0)
    for (int d = 0; d < HD; ++d) {
      kc[kv_off(l, g, pos) + d] = __float2half(kn[d]);
      vc[kv_off(l, g, pos) + d] = __float2half(vn[d]);
    }
  float m = -INFINITY, sum = 0.f, o[HD] = {};
  for (int t = 0; t <= pos; ++t) {
    float sc = 0.f;
    for (int d = 0; d < HD; ++d)
      sc += q[d] * (t == pos ? kn[d] : __half2float(kc[kv_off(l, g, t) + d]));
    sc *= 0.125f;
    float mn = fmaxf(m, sc), a = expf(m - mn), p = expf(sc - mn);
    sum = sum * a + p;
    for (int d = 0; d < HD; ++d)
      o[d] = o[d] * a + p * (t == pos ? vn[d] : __half2float(vc[kv_off(l, g, t) + d]));
    m = mn;
  }
  for (int d = 0; d < HD; ++d) attn[h * HD + d] = o[d] / sum;
}

// ---------------------------------------------------------------- the persistent kernel
// the compute warps' barrier (named barrier 1: the producer warp never joins it)
__device__ __forceinline__ void csync() { asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory"); }

constexpr int NTRACE = NL * NPH + 1;  // traced phases: every counted one and lm_head
__device__ __forceinline__ int phase_of(const Ins& in) { return in.sig_idx >= 0 ? in.sig_idx : NL * NPH; }

struct Prof {  // per block, SM clocks
  unsigned long long total, wait_dep, wait_w, attn, body;  // body: weights ready -> next issued
  unsigned long long dot, issue;  // of body: the tile loop to its barrier; thread 0's issue
};

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count));
}
__device__ __forceinline__ void mbar_expect(uint64_t* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ bool mbar_try(uint64_t* b, unsigned parity) {
  unsigned ok;
  asm volatile(
      "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
      : "=r"(ok)
      : "r"(smem_u32(b)), "r"(parity)
      : "memory");
  return ok;
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* b) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(b))
      : "memory");
}
__device__ __forceinline__ int ld_acquire(const int* a) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
  return v;
}
__device__ __forceinline__ int ld_relaxed(const int* a) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
  return v;
}
__device__ __forceinline__ void red_release(int* a, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(a), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned ld_acquire_cta(const unsigned* a) {
  unsigned v;
  asm volatile("ld.acquire.cta.shared::cta.u32 %0, [%1];" : "=r"(v) : "r"(smem_u32(a)) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_cta(unsigned* a, unsigned v) {
  asm volatile("st.release.cta.shared::cta.u32 [%0], %1;" ::"r"(smem_u32(a)), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

struct Slot {  // an instruction's weight tile and its rows' scales, one mbarrier transaction
  int8_t w[SLOT];
  float sc[16];
};
struct Smem {
  alignas(128) Slot ring[NSLOT];
  alignas(16) float x[FF];  // the phase's input row (or attention scores)
  float red[32];
  float stat[8];
  unsigned sig_seq;  // phase ends the compute warps have finished (the signal warp's cue)
  uint64_t full[NSLOT];
  uint64_t empty[NSLOT];
};

// the weight bytes of instruction `in` into ring slot s (thread 0 only)
// (the scales ride along: an epilogue that loaded them itself waited an HBM round trip per tile)
__device__ __forceinline__ void issue(const Weights& w, const Ins& in, Smem& sm, int s) {
  int8_t* dst = sm.ring[s].w;
  float* sc = sm.ring[s].sc;
  uint64_t* b = &sm.full[s];
  size_t l = in.layer;
  switch (in.op) {
    case QKV_T:
      mbar_expect(b, SLOT + 64);
      bulk_copy(dst, w.qkv + (l * QKV + in.n0) * H, SLOT, b);
      bulk_copy(sc, w.s_qkv + l * QKV + in.n0, 64, b);
      break;
    case O_T:
      mbar_expect(b, SLOT + 64);
      bulk_copy(dst, w.o + (l * H + in.n0) * H, SLOT, b);
      bulk_copy(sc, w.s_o + l * H + in.n0, 64, b);
      break;
    case GU_T:
      mbar_expect(b, SLOT + 64);
      bulk_copy(dst, w.g + (l * FF + in.n0) * H, SLOT / 2, b);
      bulk_copy(dst + SLOT / 2, w.u + (l * FF + in.n0) * H, SLOT / 2, b);
      bulk_copy(sc, w.s_g + l * FF + in.n0, 32, b);
      bulk_copy(sc + 8, w.s_u + l * FF + in.n0, 32, b);
      break;
    case DOWN_T:
      mbar_expect(b, SLOT + 16);
      bulk_copy(dst, w.d + (l * H + in.n0) * FF, SLOT, b);
      bulk_copy(sc, w.s_d + l * H + in.n0, 16, b);
      break;
    case LM_T:
      mbar_expect(b, SLOT + 64);
      bulk_copy(dst, w.lm + size_t(in.n0) * H, SLOT, b);
      bulk_copy(sc, w.s_lm + in.n0, 64, b);
      break;
    default:  // attention reads no weights: complete the slot's phase at once
      mbar_expect(&sm.full[s], 0);
  }
}

// four int8 weights (one word) times four x: the int8 -> fp32 conversion by exponent bits (the
// byte under 0x4B000000 is 2^23 + (q + 128), minus 2^23 + 128 is q, exactly): a PRMT and an FADD
__device__ __forceinline__ float dot4(unsigned w, float4 x, float acc) {
  unsigned u = w ^ 0x80808080u;
  const float off = 8388736.f;
  acc = fmaf(x.x, __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440)) - off, acc);
  acc = fmaf(x.y, __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441)) - off, acc);
  acc = fmaf(x.z, __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7442)) - off, acc);
  acc = fmaf(x.w, __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7443)) - off, acc);
  return acc;
}

// A 32 KB tile against x, x held in registers for the whole phase (re-reading it from shared
// memory made four of every five bytes the tile loop moved through the LSU):
//   [16 rows][2048] (qkv / o / gu / lm_head): warp w owns rows 2w, 2w + 1; lane's columns
//     c * 128 + lane * 4 (c < 16: xr[16]); red[r] = row r's sum.
//   [4 rows][8192] (down): warp w owns columns [w * 1024, (w + 1) * 1024) of every row; lane's
//     columns w * 1024 + c * 128 + lane * 4 (c < 8: xr[0..8)); red[4 w + r] = row r's part.
// Lane words are consecutive in shared memory (conflict-free LDS.32). Two FMA chains per row,
// every index compile-time (an index computed at run time put the accumulators in local memory).
__device__ __forceinline__ void load_xr(float4 (&xr)[16], const float* x, bool down) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (down) {
#pragma unroll
    for (int c = 0; c < 8; ++c) xr[c] = *reinterpret_cast<const float4*>(x + warp * 1024 + c * 128 + lane * 4);
  } else {
#pragma unroll
    for (int c = 0; c < 16; ++c) xr[c] = *reinterpret_cast<const float4*>(x + c * 128 + lane * 4);
  }
}
// R rows per warp, C word steps per row: warp w's words start at w * WARP_W, row r's at
// r * ROW_W; red[R * w + r] gets the warp's sum for row r
template <int R, int C, int WARP_W, int ROW_W>
__device__ __forceinline__ void tile_dot(const int8_t* tile, const float4 (&xr)[16], float* red) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const unsigned* w32 = reinterpret_cast<const unsigned*>(tile) + warp * WARP_W + lane;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float e = 0.f, o = 0.f;
#pragma unroll
    for (int c = 0; c < C; c += 2) {
      e = dot4(w32[r * ROW_W + c * 32], xr[c], e);
      o = dot4(w32[r * ROW_W + (c + 1) * 32], xr[c + 1], o);
    }
    const float v = warp_sum(e + o);
    if (lane == 0) red[R * warp + r] = v;
  }
}
__device__ __forceinline__ void tile_rows(const int8_t* tile, const float4 (&xr)[16], float* red) {
  tile_dot<2, 16, 1024, 512>(tile, xr, red);  // [16][2048]: rows 2w, 2w + 1
}
__device__ __forceinline__ void tile_down(const int8_t* tile, const float4 (&xr)[16], float* red) {
  tile_dot<4, 8, 256, 2048>(tile, xr, red);  // [4][8192]: columns [1024 w, 1024 (w + 1))
}

// the phase's input row into shared memory (through L2: other SMs wrote it), and its RMS
__device__ void load_x(Smem& sm, const float* src, int n, bool rms) {
  float ss = 0.f;
  for (int i = threadIdx.x * 4; i < n; i += THREADS * 4) {
    float4 v = __ldcg(reinterpret_cast<const float4*>(src + i));
    *reinterpret_cast<float4*>(sm.x + i) = v;
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  if (rms) {
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) sm.red[threadIdx.x / 32] = ss;
    csync();
    if (threadIdx.x == 0) {
      float t = 0.f;
      for (int i = 0; i < THREADS / 32; ++i) t += sm.red[i];
      sm.stat[0] = rsqrtf(t / n + EPS);
    }
  }
  csync();
}

// one q head's attention (RoPE, the cache write by the group's first head, softmax over pos + 1
// keys); scores in sm.x
__device__ void attention(const State& st, Smem& sm, int l, int h, int pos) {
  int g = h / (NQ / NKV), tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
  float* qs = sm.x;          // [64] rotated q
  float* kn = sm.x + 64;     // [64] rotated new k (fp16-rounded)
  float* vn = sm.x + 128;    // [64] new v (fp16-rounded)
  float* part = sm.x + 192;  // [8][64] partial outputs
  float* sc = sm.x + 1024;   // [pos + 1] scores
  if (tid < 32) {
    float c, s;
    rope_cs(pos, tid, c, s);
    const float* qq = st.qkv + h * HD;
    const float* kk = st.qkv + H + g * HD;
    float q0 = __ldcg(qq + tid), q1 = __ldcg(qq + tid + 32);
    float k0 = __ldcg(kk + tid), k1 = __ldcg(kk + tid + 32);
    qs[tid] = q0 * c - q1 * s;
    qs[tid + 32] = q1 * c + q0 * s;
    kn[tid] = __half2float(__float2half(k0 * c - k1 * s));
    kn[tid + 32] = __half2float(__float2half(k1 * c + k0 * s));
  } else if (tid < 96) {
    int d = tid - 32;
    vn[d] = __half2float(__float2half(__ldcg(st.qkv + H + NKV * HD + g * HD + d)));
  }
  csync();
  if (h % (NQ / NKV) == 0 && tid < HD) {
    st.kc[kv_off(l, g, pos) + tid] = __float2half(kn[tid]);
    st.vc[kv_off(l, g, pos) + tid] = __float2half(vn[tid]);
  }
  // scores: a thread per key, its 64 dimensions as eight independent 16-byte loads (a warp
  // per key with a shuffle tree made every key a dependent round trip)
  const half* kb = st.kc + kv_off(l, g, 0);
  for (int t = tid; t <= pos; t += THREADS) {
    float a = 0.f;
    if (t == pos) {
      for (int d = 0; d < HD; ++d) a += qs[d] * kn[d];
    } else {
      uint4 kv[8];
      const uint4* kp = reinterpret_cast<const uint4*>(kb + size_t(t) * HD);
#pragma unroll
      for (int c = 0; c < 8; ++c) kv[c] = kp[c];
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const half2* h2 = reinterpret_cast<const half2*>(&kv[c]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float2 f = __half22float2(h2[i]);
          a += qs[c * 8 + 2 * i] * f.x + qs[c * 8 + 2 * i + 1] * f.y;
        }
      }
    }
    sc[t] = a * 0.125f;
  }
  csync();
  float m = -INFINITY;
  for (int t = tid; t <= pos; t += THREADS) m = fmaxf(m, sc[t]);
  m = warp_max(m);
  if (lane == 0) sm.red[warp] = m;
  csync();
  m = sm.red[0];
  for (int i = 1; i < THREADS / 32; ++i) m = fmaxf(m, sm.red[i]);
  csync();
  float sum = 0.f;
  for (int t = tid; t <= pos; t += THREADS) {
    float p = expf(sc[t] - m);
    sc[t] = p;
    sum += p;
  }
  sum = warp_sum(sum);
  if (lane == 0) sm.red[warp] = sum;
  csync();
  sum = 0.f;
  for (int i = 0; i < THREADS / 32; ++i) sum += sm.red[i];
  // out = sum_t p[t] v[t]: a warp per key (t = warp, warp + 8, ...), a lane per two dimensions
  // (128 coalesced bytes per key); the new key last, by the warp whose turn it is
  const half* vb = st.vc + kv_off(l, g, 0);
  float ox = 0.f, oy = 0.f;
#pragma unroll 4
  for (int t = warp; t < pos; t += THREADS / 32) {
    const float p = sc[t];
    const float2 v = __half22float2(*reinterpret_cast<const half2*>(vb + size_t(t) * HD + 2 * lane));
    ox += p * v.x;
    oy += p * v.y;
  }
  if (warp == pos % (THREADS / 32)) {
    ox += sc[pos] * vn[2 * lane];
    oy += sc[pos] * vn[2 * lane + 1];
  }
  part[warp * HD + 2 * lane] = ox;
  part[warp * HD + 2 * lane + 1] = oy;
  csync();
  if (tid < HD) {
    float o = 0.f;
    for (int i = 0; i < THREADS / 32; ++i) o += part[i * HD + tid];
    st.attn[h * HD + tid] = o / sum;
  }
}

__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}

__global__ void __launch_bounds__(BLOCK, 1)
    decode_step(Weights w, State st, const Ins* __restrict__ ins, const int* __restrict__ qoff,
                int* cnt, int epoch, int pos, int* err, Prof* prof, long long limit_ns, int mode,
                unsigned long long* trace) {
  // mode (timing only, results meaningless): bit 0 no waits (the stream and the tiles alone),
  // bit 1 no tile arithmetic (the stream and the dependency chain alone)
  const bool nodep = mode & 1, nodot = mode & 2;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int tid = threadIdx.x;
  const int q0 = qoff[blockIdx.x], q1 = qoff[blockIdx.x + 1], nq = q1 - q0;
  unsigned long long t_start = clock64(), t_dep = 0, t_w = 0, t_attn = 0, t_body = 0, t_dot = 0,
                     t_iss = 0;
  unsigned n_sig = 0;
  if (tid == 0) {
    for (int s = 0; s < NSLOT; ++s) {
      mbar_init(&sm.full[s], 1);
      mbar_init(&sm.empty[s], 1);
    }
    sm.sig_seq = 0;
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (PRODUCER && tid >= THREADS) {  // the producer warp: one lane walks the queue
    if (tid == THREADS) {
      Ins nx = nq ? ins[q0] : Ins{};
      for (int j = 0; j < nq; ++j) {
        const Ins in = nx;
        if (j + 1 < nq) nx = ins[q0 + j + 1];
        const int s = j % NSLOT;
        if (j >= NSLOT)
          while (!mbar_try(&sm.empty[s], ((j / NSLOT) - 1) & 1)) {
          }
        issue(w, in, sm, s);
      }
    }
    if (tid >= THREADS + 32) {  // the signal warp: each phase end's count, in queue order
      const int lane = tid & 31;  // (32 instructions read at once: one L2 / HBM trip per 32)
      unsigned k = 0;
      for (int j0 = 0; j0 < nq; j0 += 32) {
        int si = -1, sa = 0;
        if (j0 + lane < nq) {
          const Ins in = ins[q0 + j0 + lane];
          si = in.sig_idx;
          sa = in.sig_add;
        }
        unsigned m = __ballot_sync(0xffffffffu, si >= 0 && sa > 0);
        while (m) {
          const int b = __ffs(m) - 1;
          m &= m - 1;
          const int c = __shfl_sync(0xffffffffu, si, b), add = __shfl_sync(0xffffffffu, sa, b);
          ++k;
          if (lane == 0) {
            while (ld_acquire_cta(&sm.sig_seq) < k) {
            }
            red_release(cnt + c, add);  // cumulative: the compute warps' bar.sync, release.cta
          }
          __syncwarp();
        }
      }
    }
    return;
  }
  if (!PRODUCER && tid == 0)
    for (int j = 0; j < NSLOT && j < nq; ++j) issue(w, ins[q0 + j], sm, j);
  int have = -2;  // the wait index whose input row sm.x (and xr) holds
  float4 xr[16];
  // instructions are read one iteration ahead (and the one to issue NSLOT ahead): the weight
  // stream evicts them from L2, and a fetch at the point of use put an HBM round trip on every
  // instruction's critical path
  Ins nxt = ins[q0];
  for (int j = 0; j < nq; ++j) {
    const Ins in = nxt;
    if (j + 1 < nq) nxt = ins[q0 + j + 1];
    Ins ahead = in;
    if (!PRODUCER && tid == 0 && j + NSLOT < nq) ahead = ins[q0 + j + NSLOT];
    const int s = j % NSLOT;
    if (in.wait_idx != have) {  // first instruction of a phase on this SM: wait, load its input
      unsigned long long t0 = clock64();
      if (in.wait_idx >= 0 && tid == 0 && !nodep) {  // nodep: timing only (no ordering)
        const int target = (epoch + 1) * in.wait_cnt;
        long long t_lim = gtime() + limit_ns;
        // relaxed polls (an acquire load also invalidates L1 each time), one acquire at the end
        while (ld_relaxed(cnt + in.wait_idx) < target) {
          if ((long long)gtime() > t_lim || *(volatile int*)err) {  // stuck, or another SM was
            atomicCAS(err, 0, 1 + in.wait_idx);
            break;
          }
        }
        (void)ld_acquire(cnt + in.wait_idx);
      }
      csync();
      const float* hsrc = in.layer == 0 && in.op == QKV_T ? st.emb : st.h;
      switch (in.op) {
        case QKV_T:
        case GU_T:
        case LM_T: load_x(sm, hsrc, H, true); break;
        case O_T: load_x(sm, st.attn, H, false); break;
        case DOWN_T: load_x(sm, st.act, FF, false); break;
        default: break;
      }
      if (in.op != ATTN) load_xr(xr, sm.x, in.op == DOWN_T);
      have = in.op == ATTN ? -3 : in.wait_idx;  // attention overwrites sm.x
      t_dep += clock64() - t0;
      // trace: when this SM starts a phase (its wait over, its input loaded) and, below, when it
      // has finished the phase (ns, globaltimer); phase = the counter it bumps, NL * NPH for lm_head
      if (trace && tid == 0) trace[(size_t(blockIdx.x) * NTRACE + phase_of(in)) * 2] = gtime();
    }
    {  // this instruction's weights
      unsigned long long t0 = clock64();
      const unsigned parity = (j / NSLOT) & 1;
      while (!mbar_try(&sm.full[s], parity)) {
      }
      t_w += clock64() - t0;
    }
    const unsigned long long t_b0 = clock64();
    const int l = in.layer;
    // the residual rows are read before the dot, so their L2 round trip hides behind it
    float base = 0.f;
    if (in.op == O_T && tid < 16) base = __ldcg((l == 0 ? st.emb : st.h) + in.n0 + tid);
    if (in.op == DOWN_T && tid < 4) base = __ldcg(st.h + in.n0 + tid);
    const float* sc = sm.ring[s].sc;
    if (in.op == ATTN) {
      unsigned long long t0 = clock64();
      if (!nodot) attention(st, sm, l, in.n0, pos);
      t_attn += clock64() - t0;
    } else if (in.op == DOWN_T) {
      if (!nodot) tile_down(sm.ring[s].w, xr, sm.red);
      csync();
      t_dot += clock64() - t_b0;
      if (tid < 4) {
        float a = 0.f;
        for (int i = 0; i < THREADS / 32; ++i) a += sm.red[4 * i + tid];
        st.h[in.n0 + tid] = base + a * sc[tid];
      }
    } else {
      if (!nodot) tile_rows(sm.ring[s].w, xr, sm.red);
      csync();
      t_dot += clock64() - t_b0;
      const float r = sm.stat[0];
      if (tid < 16) {
        const float a = sm.red[tid] * sc[tid];
        const int n = in.n0 + tid;
        switch (in.op) {
          case QKV_T: st.qkv[n] = a * r; break;
          case O_T: st.h[n] = base + a; break;
          case LM_T: st.logits[n] = a * r; break;
          default: break;
        }
      }
      if (in.op == GU_T && tid < 8) st.act[in.n0 + tid] = silu(sm.red[tid] * sc[tid] * r) * (sm.red[8 + tid] * sc[8 + tid] * r);
    }
    csync();  // the slot is free and every output of the instruction is written
    if (tid == 0) {
      const unsigned long long t_i0 = clock64();
      // the SM's last instruction of a phase counts all of the SM's instructions in it
      // (release: cumulative over the block's stores through bar.sync)
      const bool sig = in.sig_idx >= 0 && in.sig_add > 0;
      if (PRODUCER) {
        mbar_arrive(&sm.empty[s]);  // the slot is the producer's again
        if (sig) st_release_cta(&sm.sig_seq, ++n_sig);
        if (trace && (sig || j + 1 == nq)) trace[(size_t(blockIdx.x) * NTRACE + phase_of(in)) * 2 + 1] = gtime();
      } else {
        if (j + NSLOT < nq) {  // the next load first: the release below waits for the stores
          asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
          issue(w, ahead, sm, s);
        }
        if (sig) red_release(cnt + in.sig_idx, in.sig_add);
      }
      t_iss += clock64() - t_i0;
    }
    t_body += clock64() - t_b0;
  }
  if (tid == 0 && prof) prof[blockIdx.x] = Prof{clock64() - t_start, t_dep, t_w, t_attn, t_body, t_dot, t_iss};
}

// ---------------------------------------------------------------- host
static bool ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    printf("{\"case\": \"%s\", \"error\": \"%s\"}\n", what, cudaGetErrorString(e));
    fflush(stdout);
    return false;
  }
  return true;
}
#define CK(x)                   \
  do {                          \
    if (!ok((x), #x)) exit(1);  \
  } while (0)

__global__ void fill_i8(int8_t* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned x = unsigned(i) * 2654435761u ^ seed ^ unsigned(i >> 32) * 40503u;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    p[i] = int8_t(int(x % 255u) - 127);
  }
}
__global__ void fill_f32(float* p, size_t n, unsigned seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned x = unsigned(i) * 747796405u + seed;
    x ^= x >> 16;
    x *= 2246822519u;
    x ^= x >> 13;
    p[i] = lo + (hi - lo) * (x & 0xFFFFFF) / float(0x1000000);
  }
}
__global__ void fill_h(half* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned x = unsigned(i) * 747796405u + seed;
    x ^= x >> 16;
    x *= 2246822519u;
    x ^= x >> 13;
    p[i] = __float2half(((x & 0xFFFF) / 32768.f) - 1.f);
  }
}
// every weight byte read once (16-byte loads, grid-stride): the floor's kernel
__global__ void read_all(const int4* p, size_t n, int* sink) {
  int acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    int4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678) sink[0] = acc;
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? atoi(argv[1]) : 200;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int nsm = prop.multiProcessorCount;
  printf("{\"gpu\": \"%s\", \"sms\": %d, \"smem_bytes\": %zu, \"iters\": %d, \"producer_warp\": %d, \"nslot\": %d}\n",
         prop.name, nsm, sizeof(Smem), iters, PRODUCER, NSLOT);

  // weights: one buffer, the layout the instructions read
  const size_t n_qkv = size_t(NL) * QKV * H, n_o = size_t(NL) * H * H, n_g = size_t(NL) * FF * H,
               n_d = size_t(NL) * H * FF, n_lm = size_t(VOC) * H;
  const size_t wbytes = n_qkv + n_o + 2 * n_g + n_d + n_lm;
  int8_t* wb;
  CK(cudaMalloc(&wb, wbytes));
  fill_i8<<<4096, 256>>>(wb, wbytes, 12345u);
  Weights w;
  w.qkv = wb;
  w.o = w.qkv + n_qkv;
  w.g = w.o + n_o;
  w.u = w.g + n_g;
  w.d = w.u + n_g;
  w.lm = w.d + n_d;
  // scales: ~1 / (64 sqrt(K)) keeps every activation near unit size (weights uniform in +-127)
  const size_t ns = size_t(NL) * (QKV + H + 2 * FF + H) + VOC;
  float* sb;
  CK(cudaMalloc(&sb, ns * sizeof(float)));
  float* sp = sb;
  auto scales = [&](size_t n, int K, float gain, const float** dst) {
    float lo = 0.5f * gain / (73.f * sqrtf(float(K))), hi = 1.5f * gain / (73.f * sqrtf(float(K)));
    fill_f32<<<256, 256>>>(sp, n, unsigned(n * 7 + K), lo, hi);
    *dst = sp;
    sp += n;
  };
  scales(size_t(NL) * QKV, H, 1.f, &w.s_qkv);
  scales(size_t(NL) * H, H, 0.5f, &w.s_o);
  scales(size_t(NL) * FF, H, 1.f, &w.s_g);
  scales(size_t(NL) * FF, H, 1.f, &w.s_u);
  scales(size_t(NL) * H, FF, 0.5f, &w.s_d);
  scales(VOC, H, 1.f, &w.s_lm);

  auto state = [&](State& s) {
    float* f;
    CK(cudaMalloc(&f, (H + H + QKV + H + FF + VOC) * sizeof(float)));
    s.emb = nullptr;
    s.h = f;
    s.qkv = f + H;
    s.attn = s.qkv + QKV;
    s.act = s.attn + H;
    s.logits = s.act + FF;
    half* kv;
    size_t nkv = size_t(NL) * NKV * MAXCTX * HD;
    CK(cudaMalloc(&kv, 2 * nkv * sizeof(half)));
    fill_h<<<1024, 256>>>(kv, 2 * nkv, 99u);  // both copies start from the same "past" keys
    s.kc = kv;
    s.vc = kv + nkv;
  };
  float* emb;
  CK(cudaMalloc(&emb, 64 * H * sizeof(float)));
  fill_f32<<<64, 256>>>(emb, 64 * H, 7u, -1.f, 1.f);
  State mg, rf;
  state(mg);
  state(rf);

  // the program: phases in order, instructions round-robin over the SMs from where the last
  // phase stopped (each SM's queue keeps the global order; weight bytes balanced to a tile)
  std::vector<std::vector<Ins>> q(nsm);
  int rr = 0;
  auto phase = [&](int op, int l, int rows, int wait_idx, int wait_cnt, int sig_idx) {
    for (int t = 0; t < TILES[op]; ++t) {
      q[rr].push_back(Ins{op, l, op == ATTN ? t : t * rows, wait_idx, wait_cnt, sig_idx, 0, 0});
      rr = (rr + 1) % nsm;
    }
  };
  for (int l = 0; l < NL; ++l) {
    int c = l * NPH;
    phase(QKV_T, l, 16, l ? c - 1 : -1, TILES[DOWN_T], c + 0);
    phase(ATTN, l, 0, c + 0, TILES[QKV_T], c + 1);
    phase(O_T, l, 16, c + 1, TILES[ATTN], c + 2);
    phase(GU_T, l, 8, c + 2, TILES[O_T], c + 3);
    phase(DOWN_T, l, 4, c + 3, TILES[GU_T], c + 4);
  }
  phase(LM_T, NL - 1, 16, NL * NPH - 1, TILES[DOWN_T], -1);
  for (auto& qs : q) {  // sig_add: on the SM's last instruction of each phase, its count there
    int run = 0;
    for (size_t i = 0; i < qs.size(); ++i) {
      ++run;
      if (i + 1 == qs.size() || qs[i + 1].sig_idx != qs[i].sig_idx) {
        qs[i].sig_add = run;
        run = 0;
      }
    }
  }
  std::vector<Ins> flat;
  std::vector<int> off(nsm + 1, 0);
  for (int s = 0; s < nsm; ++s) {
    off[s] = int(flat.size());
    flat.insert(flat.end(), q[s].begin(), q[s].end());
  }
  off[nsm] = int(flat.size());
  Ins* d_ins;
  int *d_off, *cnt, *err, *sink;
  Prof* prof;
  CK(cudaMalloc(&d_ins, flat.size() * sizeof(Ins)));
  CK(cudaMalloc(&d_off, off.size() * sizeof(int)));
  CK(cudaMalloc(&cnt, NL * NPH * sizeof(int)));
  CK(cudaMalloc(&err, sizeof(int)));
  CK(cudaMalloc(&sink, sizeof(int)));
  CK(cudaMalloc(&prof, nsm * sizeof(Prof)));
  CK(cudaMemcpy(d_ins, flat.data(), flat.size() * sizeof(Ins), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_off, off.data(), off.size() * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMemset(cnt, 0, NL * NPH * sizeof(int)));
  CK(cudaMemset(err, 0, sizeof(int)));
  printf("{\"instructions\": %zu, \"per_sm_max\": %zu, \"weight_bytes\": %zu}\n", flat.size(),
         q[0].size(), wbytes);

  const size_t smem = sizeof(Smem);
  CK(cudaFuncSetAttribute(decode_step, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_step, BLOCK, smem));
  if (per_sm < 1) {
    printf("{\"error\": \"decode_step does not fit an SM\"}\n");
    return 1;
  }
  int epoch = 0;
  const long long limit_ns = 200000000LL;  // a stuck step errs after 0.2 s instead of hanging
  auto mega = [&](int pos, const float* e, Prof* pr, int mode = 0, unsigned long long* tr = nullptr) {
    mg.emb = e;
    decode_step<<<nsm, BLOCK, smem>>>(w, mg, d_ins, d_off, cnt, epoch++, pos, err, pr, limit_ns, mode, tr);
  };
  auto reference = [&](int pos, const float* e) {
    rf.emb = e;
    const int wpb = 8, tpb = 32 * wpb;
    float *g = rf.act, *u;  // gate into act, up into logits' head (free until lm_head)
    u = rf.logits;
    for (int l = 0; l < NL; ++l) {
      const float* hin = l == 0 ? e : rf.h;
      ref_gemv<<<(QKV + wpb - 1) / wpb, tpb>>>(w.qkv + size_t(l) * QKV * H, w.s_qkv + size_t(l) * QKV, hin,
                                                QKV, H, 1, nullptr, rf.qkv);
      ref_attn<<<1, 32>>>(rf.qkv, rf.kc, rf.vc, rf.attn, l, pos);
      ref_gemv<<<H / wpb, tpb>>>(w.o + size_t(l) * H * H, w.s_o + size_t(l) * H, rf.attn, H, H, 0, hin,
                                 rf.h);
      ref_gemv<<<FF / wpb, tpb>>>(w.g + size_t(l) * FF * H, w.s_g + size_t(l) * FF, rf.h, FF, H, 1,
                                  nullptr, g);
      ref_gemv<<<FF / wpb, tpb>>>(w.u + size_t(l) * FF * H, w.s_u + size_t(l) * FF, rf.h, FF, H, 1,
                                  nullptr, u);
      ref_swiglu<<<FF / 256, 256>>>(g, u, rf.act, FF);
      ref_gemv<<<H / wpb, tpb>>>(w.d + size_t(l) * H * FF, w.s_d + size_t(l) * H, rf.act, H, FF, 0, rf.h,
                                 rf.h);
    }
    ref_gemv<<<VOC / wpb, tpb>>>(w.lm, w.s_lm, rf.h, VOC, H, 1, nullptr, rf.logits);
  };

  // correctness: consecutive steps (each writes its key / value at pos, the next reads them)
  int pass = 1;
  std::vector<float> a(VOC), b(VOC);
  for (int step = 0; step < 4; ++step) {
    const int pos = 37 + step;
    const float* e = emb + step * H;
    CK(cudaMemset(mg.logits, 0xFF, VOC * sizeof(float)));  // NaN: every logit must be written
    mega(pos, e, nullptr);
    reference(pos, e);
    CK(cudaDeviceSynchronize());
    int h_err = 0;
    CK(cudaMemcpy(&h_err, err, sizeof(int), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(a.data(), mg.logits, VOC * sizeof(float), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), rf.logits, VOC * sizeof(float), cudaMemcpyDeviceToHost));
    double num = 0, den = 0, mx = 0;
    int nan = 0, am = 0, bm = 0;
    for (int i = 0; i < VOC; ++i) {
      if (!std::isfinite(a[i])) ++nan;
      num += double(a[i] - b[i]) * (a[i] - b[i]);
      den += double(b[i]) * b[i];
      mx = fmax(mx, fabs(a[i] - b[i]));
      if (a[i] > a[am]) am = i;
      if (b[i] > b[bm]) bm = i;
    }
    const double rel = sqrt(num / fmax(den, 1e-30));
    const bool good = !h_err && !nan && rel < 2e-3 && am == bm;
    pass &= good;
    printf("{\"case\": \"check\", \"pos\": %d, \"rel_l2\": %.3e, \"max_abs\": %.3e, \"ref_rms\": %.3f, "
           "\"nonfinite\": %d, \"argmax\": [%d, %d], \"err_flag\": %d, \"ok\": %s}\n",
           pos, rel, mx, sqrt(den / VOC), nan, am, bm, h_err, good ? "true" : "false");
    fflush(stdout);
    if (h_err) return 2;
  }

  // repeatability: the same step twice gives the same bits (no atomics on values)
  {
    std::vector<float> c(VOC);
    mega(40, emb + 3 * H, nullptr);
    CK(cudaMemcpy(c.data(), mg.logits, VOC * sizeof(float), cudaMemcpyDeviceToHost));
    int diff = 0;
    for (int i = 0; i < VOC; ++i) diff += memcmp(&c[i], &a[i], 4) != 0;
    pass &= diff == 0;
    printf("{\"case\": \"repeat\", \"differing_logits\": %d}\n", diff);
  }

  // floors: the same weight bytes read once by a streaming kernel, and cudaMemcpy's copy rate
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float ms = 0;
  auto timed = [&](auto&& f, int n) {
    f();
    CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(e0));
    for (int i = 0; i < n; ++i) f();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return 1000.0 * ms / n;
  };
  const double us_read = timed([&] { read_all<<<nsm * 8, 512>>>((const int4*)wb, wbytes / 16, sink); }, 50);
  int8_t* cp;
  const size_t cpn = size_t(1) << 30;
  CK(cudaMalloc(&cp, cpn));
  const double us_copy = timed([&] { CK(cudaMemcpyAsync(cp, wb, cpn, cudaMemcpyDeviceToDevice)); }, 20);
  const double copy_bw = 2.0 * cpn / us_copy / 1e6;  // TB/s, read + write
  CK(cudaFree(cp));
  printf("{\"case\": \"floor\", \"weight_bytes\": %zu, \"read_kernel_us\": %.1f, \"read_tb_s\": %.3f, "
         "\"copy_tb_s\": %.3f, \"copy_floor_us\": %.1f}\n",
         wbytes, us_read, wbytes / us_read / 1e6, copy_bw, wbytes / copy_bw / 1e6);
  fflush(stdout);

  std::vector<Prof> hp(nsm);
  const char* names[4] = {"mega", "mega_nodep", "mega_nodot", "mega_stream_only"};
  const int cases[][2] = {{128, 3}, {128, 2}, {128, 1}, {128, 0}, {512, 0}, {2047, 0}};  // ctx, mode
  for (const auto& cm : cases) {
    const int ctx = cm[0], mode = cm[1];
    const double us = timed([&] { mega(ctx, emb, nullptr, mode); }, iters);
    int h_err = 0;
    CK(cudaMemcpy(&h_err, err, sizeof(int), cudaMemcpyDeviceToHost));
    mega(ctx, emb, prof, mode);
    CK(cudaMemcpy(hp.data(), prof, nsm * sizeof(Prof), cudaMemcpyDeviceToHost));
    double tot = 0, dep = 0, wt = 0, at = 0, tmax = 0, bd = 0, dt = 0, is = 0;
    for (auto& p : hp) {
      tot += p.total;
      dep += p.wait_dep;
      wt += p.wait_w;
      at += p.attn;
      bd += p.body;
      dt += p.dot;
      is += p.issue;
      tmax = fmax(tmax, double(p.total));
    }
    const double clk_ghz = tmax / us / 1e3;  // the slowest block spans the step (launch aside)
    printf("{\"case\": \"%s\", \"ctx\": %d, \"us_per_step\": %.1f, \"weight_tb_s\": %.3f, "
           "\"x_read_floor\": %.2f, \"x_copy_floor\": %.2f, \"share_wait_dep\": %.3f, "
           "\"share_wait_weights\": %.3f, \"share_attention\": %.3f, \"share_body\": %.3f, \"share_dot\": %.3f, \"share_issue\": %.3f, \"clock_ghz_est\": %.2f, "
           "\"err_flag\": %d}\n",
           names[mode], ctx, us, wbytes / us / 1e6, us / us_read, us / (wbytes / copy_bw / 1e6), dep / tot, wt / tot,
           at / tot, bd / tot, dt / tot, is / tot, clk_ghz, h_err);
    fflush(stdout);
    pass &= h_err == 0;
  }
  // the phase timeline of one step (ctx 128): per phase, from the first SM's start to the last
  // SM's finish (span) and from that finish to the next phase's first start (hop), by kind
  if (PRODUCER) {
    const size_t nt = size_t(nsm) * NTRACE * 2;
    unsigned long long* d_tr;
    CK(cudaMalloc(&d_tr, nt * 8));
    CK(cudaMemset(d_tr, 0, nt * 8));
    mega(128, emb, nullptr, 0, d_tr);
    std::vector<unsigned long long> tr(nt);
    CK(cudaMemcpy(tr.data(), d_tr, nt * 8, cudaMemcpyDeviceToHost));
    std::vector<double> S(NTRACE, 1e30), E(NTRACE, 0), Smax(NTRACE, 0);
    for (int b = 0; b < nsm; ++b)
      for (int p = 0; p < NTRACE; ++p) {
        const double a = double(tr[(size_t(b) * NTRACE + p) * 2]), z = double(tr[(size_t(b) * NTRACE + p) * 2 + 1]);
        if (a == 0 || z == 0) continue;
        S[p] = fmin(S[p], a);
        Smax[p] = fmax(Smax[p], a);
        E[p] = fmax(E[p], z);
      }
    const char* kind[6] = {"qkv", "attn", "o", "gu", "down", "lm_head"};
    double span[6] = {}, hop[6] = {}, skew[6] = {};
    int n[6] = {};
    for (int p = 0; p < NTRACE; ++p) {
      const int k = p == NL * NPH ? 5 : p % NPH;
      span[k] += (E[p] - S[p]) / 1e3;
      skew[k] += (Smax[p] - S[p]) / 1e3;
      if (p + 1 < NTRACE) hop[k] += (S[p + 1] - E[p]) / 1e3;
      ++n[k];
    }
    printf("{\"case\": \"timeline\", \"ctx\": 128, \"step_us\": %.1f", (E[NTRACE - 1] - S[0]) / 1e3);
    for (int k = 0; k < 6; ++k)
      printf(", \"%s\": {\"count\": %d, \"span_us\": %.2f, \"start_skew_us\": %.2f, \"hop_after_us\": %.2f}", kind[k],
             n[k], span[k] / n[k], skew[k] / n[k], hop[k] / n[k]);
    printf("}\n");
    CK(cudaFree(d_tr));
  }
  printf("{\"pass\": %s}\n", pass ? "true" : "false");
  return pass ? 0 : 3;
}
