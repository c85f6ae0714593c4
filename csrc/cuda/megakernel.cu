// The persistent encoder kernel: one launch runs a whole BERT forward of one token bucket.
//
// One block per SM (launched with at most as many blocks as SMs, 256 threads each). Block b
// executes the instructions queue[qoff[b] .. qoff[b+1]) in order. An instruction names its
// tile, its operands (16-byte units into the weight buffer, the scratch arena, the call input
// and the pooled output; the opcode fixes which base each operand uses), the counter it waits
// on (and how many bumps that counter receives per call) and the counter it bumps when done.
// docs/MEGAKERNEL.md describes the format and the reasons; src/zoi/backends/cuda/megakernel.py
// builds the lists and mirrors every constant below.
//
// Counters are never reset between calls: every call bumps counter c exactly per_call[c]
// times, so in call g (0-based, read from state[STATE_GEN]) an instruction waiting for n bumps
// waits until counter >= g * per_call + n. The last block to finish advances the generation.
// A wait gives up after poll_limit polls: it sets state[STATE_ERR] and the block stops; the
// host sees the flag, zeroes the whole state (generation, counters) and raises, so the next
// call starts from a clean state.
//
// Memory ordering: a producer's threads store, bar.sync, then thread 0 does a release add at
// gpu scope; a consumer's thread 0 polls with ld.acquire.gpu, then bar.sync. Activations are
// read through L2 only (ld.global.cg / cp.async.cg), never a possibly stale L1 line.

#include <cuda_fp16.h>
#include <stddef.h>
#include <stdint.h>

namespace zoi_mk {

// ---- opcodes and instruction fields (mirrored in megakernel.py) ----
enum Op : int {
  OP_NOP = 0,
  OP_EMBED_LN = 1,  // rows [m0, m0+bm): LN(word[id] + pos[p] + type0) -> out fp16
  OP_GEMM = 2,      // out[m0:+bm, n0:+bn] = act(A[:, kb:ke] @ W[:, kb:ke]^T + bias) (+ res)
  OP_LN = 3,        // rows [m0, m0+bm): LN(sum of fp32 partials of a) -> out fp16
  OP_ATTN = 4,      // head n0, query rows [m0, m0+bm): varlen softmax(q k^T * scale) v
  OP_POOL = 5,      // sequences b = m0, m0 + bm, ... < B: mean / cls (+ L2 norm) -> out fp32
};
enum Field : int {
  F_OP = 0, F_WAIT = 1, F_WAIT_N = 2, F_WAIT_PER_CALL = 3, F_SIGNAL = 4,
  F_M0 = 5, F_BM = 6, F_N0 = 7, F_BN = 8, F_N = 9, F_K = 10,
  F_A = 11, F_W = 12, F_BIAS = 13, F_RES = 14, F_OUT = 15, F_X1 = 16, F_X2 = 17,
  F_FLAGS = 18, F_AUX = 19, F_FAUX = 20, F_FAUX2 = 21,
  F_SELF = 23,  // the instruction's own index (profile rows)
  // a GEMM's (or the pool's) prologue: the rows it makes itself instead of reading them
  F_PSRC = 24,     // LN: fp32 partials (scratch) or the word table (weights); attention: qkv
  F_LN_G = 25, F_LN_B = 26,  // LayerNorm gain / bias (weights, fp32)
  F_LN_OUT = 27,   // FL_LN_STORE: the normalised rows also go here (scratch fp16)
  F_LN_NP = 28, F_LN_PSTRIDE = 29,  // partial slices to sum, 16-byte units apart
  F_EPOS = 30, F_ETYPE = 31,        // embedding prologue: position table, token-type row
  N_FIELDS = 32,
};
// F_FLAGS bits
constexpr int FL_ACT_MASK = 0xF;  // 0 none, 1 gelu (erf)
constexpr int FL_OUT_F32 = 1 << 4;
constexpr int FL_HAS_RES = 1 << 5;
constexpr int FL_HAS_TYPE = 1 << 6;
constexpr int FL_POOL_CLS = 1 << 7;
constexpr int FL_A_LN = 1 << 8;      // A = LN(sum of fp32 partials) of the tile's rows
constexpr int FL_A_EMBED = 1 << 9;   // A = LN(word[id] + pos[p] + type) of the tile's rows
constexpr int FL_A_ATTN = 1 << 10;   // A = attention of the tile's rows over every head
constexpr int FL_LN_STORE = 1 << 11;  // the prologue's LN rows are stored too (a residual)
// state (int64 words; the host zeroes words 1.. after a timeout)
constexpr int STATE_ERR = 1, STATE_GEN = 2, STATE_DONE = 3, STATE_CTR = 4;
// error codes in state[STATE_ERR]
constexpr long long ERR_TIMEOUT = 1, ERR_BAD_OP = 2;

constexpr int THREADS = 256;
constexpr int WARPS = THREADS / 32;
constexpr int BK = 64;          // GEMM k step (halves)
constexpr int NSTAGE = 6;       // cp.async ring: a K = 384 tile has every k step in flight at once
constexpr int SROW = BK + 8;    // padded shared row (halves): ldmatrix rows on distinct banks
constexpr int MAX_BM = 32;
constexpr int BN = 64;          // GEMM n tile: 8 warps x n8
constexpr int MAX_H = 512;      // LayerNorm / pool row width (a lane's 16 columns in registers)
constexpr int ATT_KC = 64;      // keys per attention chunk
constexpr int MAX_D = 128;

struct Params {
  const int* instr;        // [n_instr][N_FIELDS]
  const int* qoff;         // [n_blocks + 1]
  const int* queue;        // instruction indices
  long long* state;        // [STATE_CTR + n_counters]
  const char* wbase;       // weight buffer
  char* sbase;             // scratch arena
  const int* in;           // call input: header [norm, B, T, 0] + cu_seqlens | ids | positions
  float* out;              // pooled [max_batch, H] fp32
  int hdr_ints;            // ints before the ids
  int tb;                  // the bucket's token count (ids at hdr_ints, positions after)
  int n_blocks;
  long long poll_limit;
  // null, or [n_instr][4] globaltimer ns per instruction: start, dependency met, done, SM
  unsigned long long* prof;
};
// megakernel.py packs this struct as "<8Q3i4xqQ"
static_assert(sizeof(Params) == 96 && offsetof(Params, hdr_ints) == 64 &&
                  offsetof(Params, poll_limit) == 80 && offsetof(Params, prof) == 88,
              "update the host's packing in megakernel.py");

// a prologue's full A row (halves), padded: ldmatrix rows on distinct banks
constexpr int AROW = MAX_H + 8;
// the fused attention's region: Q (16 rows), K and V (keys rounded up to 16) at a row stride
// of hidden + 8 halves; the builder fuses attention only where (16 + 2 keys) (H + 8) fits
constexpr int FA_HALVES = 144 * 392;

// The weight ring is never aliased: a GEMM tile requests its first weight stages before it
// waits for its inputs, so the ring is in flight while the prologue (LN rows, attention) runs.
struct __align__(16) Smem {
  half w[NSTAGE][BN][SROW];
  // A: the k stages of an A read from memory ([NSTAGE][MAX_BM][SROW] view), or the whole rows
  // a prologue made ([MAX_BM][AROW] view)
  half a[MAX_BM * AROW];
  union {
    half fa[FA_HALVES];  // fused attention: Q, K, V of every head
    struct {
      half k[ATT_KC][MAX_D + 2];
      half v[ATT_KC][MAX_D + 2];
      float q[WARPS][MAX_BM / WARPS][MAX_D];  // a warp's query rows, scaled
    } at;
    float pool[WARPS][MAX_H];  // the pool's per-warp column sums
    float red[2 * WARPS];
  };
};
static_assert(NSTAGE * MAX_BM * SROW <= MAX_BM * AROW, "the A stage view fits the A rows");
// dynamic shared memory of a block (the host sets the function's limit to this; megakernel.py)
constexpr int SMEM_BYTES = 201472;
static_assert(sizeof(Smem) == SMEM_BYTES, "update SMEM_BYTES here and in megakernel.py");

__device__ __forceinline__ half* a_stage(Smem& sm, int buf, int r, int c) {
  return sm.a + ((size_t)buf * MAX_BM + r) * SROW + c;
}

// the call's cu_seqlens (B + 1 <= MAX_TB + 1 ints), copied into shared memory when the block
// starts: every sequence lookup (attention, pool) is then a shared-memory read, not a chain
// of dependent L2 round trips
constexpr int MAX_TB = 1024;
__shared__ int s_cu[MAX_TB + 1];

__device__ __forceinline__ const void* wptr(const Params& p, int off16) {
  return p.wbase + (size_t)off16 * 16;
}
__device__ __forceinline__ void* sptr(const Params& p, int off16) {
  return p.sbase + (size_t)off16 * 16;
}

__device__ __forceinline__ long long ld_acquire(const long long* a) {
  long long v;
  asm volatile("ld.acquire.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(a) : "memory");
  return v;
}
__device__ __forceinline__ void red_release(long long* a, long long v) {
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(a), "l"(v) : "memory");
}
__device__ __forceinline__ float ldcg_h(const half* p) { return __half2float(__ldcg(p)); }

__device__ __forceinline__ void cp_async16(void* smem, const void* g, bool ok) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  int n = ok ? 16 : 0;  // 0: zero-fill (rows / columns outside the matrix)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(g), "r"(n)
               : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ float gelu_erf(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
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

// ---------------------------------------------------------------- waits
// Thread 0 polls; the block then meets in bar.sync. Returns false on timeout (flag set).
__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ unsigned long long* prof_row(const Params& p, const int* ins) {
  return p.prof + (size_t)ins[F_SELF] * 4;
}

__device__ bool wait_counter(const Params& p, const int* ins, long long gen, int* s_ok) {
  int c = ins[F_WAIT];
  if (c < 0) {
    if (p.prof && threadIdx.x == 0) prof_row(p, ins)[1] = now_ns();
    return true;
  }
  if (threadIdx.x == 0) {
    long long target = gen * (long long)ins[F_WAIT_PER_CALL] + ins[F_WAIT_N];
    const long long* a = p.state + STATE_CTR + c;
    long long n = 0;
    int ok = 1;
    while (ld_acquire(a) < target) {
      if (++n > p.poll_limit) {
        atomicExch((unsigned long long*)(p.state + STATE_ERR), (unsigned long long)ERR_TIMEOUT);
        ok = 0;
        break;
      }
      if ((n & 1023) == 0 && ld_acquire(p.state + STATE_ERR) != 0) {  // another block gave up
        ok = 0;
        break;
      }
    }
    *s_ok = ok;
    if (p.prof) prof_row(p, ins)[1] = now_ns();
  }
  __syncthreads();
  return *s_ok != 0;
}

__device__ __forceinline__ void signal_counter(const Params& p, const int* ins) {
  __syncthreads();  // every thread's stores of this instruction are done (CTA scope)
  if (p.prof && threadIdx.x == 0) {  // done: before the bump, so a consumer starts later
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    prof_row(p, ins)[2] = now_ns();
    prof_row(p, ins)[3] = smid;
  }
  int c = ins[F_SIGNAL];
  if (c >= 0 && threadIdx.x == 0)  // release (cumulative over the block's stores via bar.sync)
    red_release(p.state + STATE_CTR + c, 1);
}

// ---------------------------------------------------------------- LayerNorm of one row
// A warp normalises one row of H <= 32 NV values, lane owning columns lane + 32 i. Every load
// of a source is issued before the first use (one L2 round trip per source, not one per
// column): indices are clamped to the row instead of branched on.
template <int NV>
__device__ __forceinline__ int col_of(int i, int H) {
  return min((int)(threadIdx.x & 31) + 32 * i, H - 1);
}

// the gain and bias: in flight with the row's loads (NV <= 16); wider rows load them when
// writing (register budget)
template <int NV>
__device__ __forceinline__ void load_gb(float (&gv)[NV], float (&bv)[NV], const float* g,
                                        const float* b, int H) {
#pragma unroll
  for (int i = 0; i < NV; i++) {
    gv[i] = NV <= 16 ? g[col_of<NV>(i, H)] : 0.f;
    bv[i] = NV <= 16 ? b[col_of<NV>(i, H)] : 0.f;
  }
}

// v <- LN(v) of one row (a warp: lane owns columns lane + 32 i)
template <int NV>
__device__ __forceinline__ void ln_norm(float (&v)[NV], const float (&gv)[NV],
                                        const float (&bv)[NV], int H, float eps, const float* g,
                                        const float* b) {
  const int lane = threadIdx.x & 31;
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NV; i++) s += lane + 32 * i < H ? v[i] : 0.f;
  const float mean = warp_sum(s) / H;
  float q = 0.f;
#pragma unroll
  for (int i = 0; i < NV; i++) {
    float d = lane + 32 * i < H ? v[i] - mean : 0.f;
    q += d * d;
  }
  const float rstd = rsqrtf(warp_sum(q) / H + eps);
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const float gi = NV <= 16 ? gv[i] : g[col_of<NV>(i, H)];  // wider rows: loaded at use
    const float bi = NV <= 16 ? bv[i] : b[col_of<NV>(i, H)];
    v[i] = (v[i] - mean) * rstd * gi + bi;
  }
}

// a row's values as fp16 into out (and out2 when given)
template <int NV>
__device__ __forceinline__ void store_row(const float (&v)[NV], int H, half* out, half* out2) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const int c = lane + 32 * i;
    if (c < H) {
      const half y = __float2half(v[i]);
      out[c] = y;
      if (out2) out2[c] = y;
    }
  }
}

__device__ __forceinline__ void zero_row(half* out, int H) {
  for (int c = threadIdx.x & 31; c < H; c += 32) out[c] = __float2half(0.f);
}

// The source row r of an embedding LN: word[id] + pos[p] (+ the token-type row). Loads are
// predicated on the column (one base register per source, immediate offsets: all in flight
// at once, few registers), not branched.
template <int NV>
__device__ __forceinline__ void embed_row(float (&v)[NV], const Params& p, const half* word,
                                          const half* pos, const half* type, int r, int H) {
  const int* ids = p.in + p.hdr_ints;
  const int* posn = ids + p.tb;
  const int lane = threadIdx.x & 31;
  const half* wr = word + (size_t)ids[r] * H + lane;
  const half* pr = pos + (size_t)posn[r] * H + lane;
  const half* tr = type ? type + lane : nullptr;
#pragma unroll
  for (int i = 0; i < NV; i++) {
    const bool ok = lane + 32 * i < H;
    v[i] = ok ? __half2float(wr[32 * i]) + __half2float(pr[32 * i]) : 0.f;
  }
  if (tr) {
#pragma unroll
    for (int i = 0; i < NV; i++) v[i] += lane + 32 * i < H ? __half2float(tr[32 * i]) : 0.f;
  }
}

// The source row r of a partial-sum LN: the sum of np fp32 slices pst floats apart, in a
// fixed order (repeated calls give identical bits); predicated loads as above
template <int NV>
__device__ __forceinline__ void partial_row(float (&v)[NV], const float* a, size_t pst, int np,
                                            int r, int H) {
  const int lane = threadIdx.x & 31;
  const float* ar = a + (size_t)r * H + lane;
#pragma unroll
  for (int i = 0; i < NV; i++) v[i] = lane + 32 * i < H ? __ldcg(ar + 32 * i) : 0.f;
  for (int q = 1; q < np; q++) {
    const float* aq = ar + q * pst;
    float t[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) t[i] = lane + 32 * i < H ? __ldcg(aq + 32 * i) : 0.f;
#pragma unroll
    for (int i = 0; i < NV; i++) v[i] += t[i];
  }
}

template <int NV>
__device__ void op_embed_ln(const Params& p, const int* ins, int T) {
  const int H = ins[F_N];
  const float eps = __int_as_float(ins[F_FAUX]);
  const half* word = (const half*)wptr(p, ins[F_A]);
  const half* pos = (const half*)wptr(p, ins[F_W]);
  const half* type = ins[F_FLAGS] & FL_HAS_TYPE ? (const half*)wptr(p, ins[F_RES]) : nullptr;
  const float* g = (const float*)wptr(p, ins[F_X1]);
  const float* b = (const float*)wptr(p, ins[F_X2]);
  half* out = (half*)sptr(p, ins[F_OUT]);
  const int warp = threadIdx.x >> 5;
  for (int r = ins[F_M0] + warp; r < ins[F_M0] + ins[F_BM]; r += WARPS) {
    if (r >= T) {  // padding rows: zeros (never read by a real row)
      zero_row(out + (size_t)r * H, H);
      continue;
    }
    float gv[NV], bv[NV], v[NV];
    load_gb<NV>(gv, bv, g, b, H);
    embed_row<NV>(v, p, word, pos, type, r, H);
    ln_norm<NV>(v, gv, bv, H, eps, g, b);
    store_row<NV>(v, H, out + (size_t)r * H, nullptr);
  }
}

template <int NV>
__device__ void op_ln(const Params& p, const int* ins, int T) {
  const int H = ins[F_N];
  const float eps = __int_as_float(ins[F_FAUX]);
  const float* a = (const float*)sptr(p, ins[F_A]);
  const float* g = (const float*)wptr(p, ins[F_W]);
  const float* b = (const float*)wptr(p, ins[F_BIAS]);
  half* out = (half*)sptr(p, ins[F_OUT]);
  // the input is the sum of F_AUX fp32 partial slices (split-K), F_RES 16-byte units apart
  const int np = ins[F_AUX] > 1 ? ins[F_AUX] : 1;
  const size_t pst = (size_t)ins[F_RES] * 4;
  const int warp = threadIdx.x >> 5;
  for (int r = ins[F_M0] + warp; r < ins[F_M0] + ins[F_BM]; r += WARPS) {
    if (r >= T) {
      zero_row(out + (size_t)r * H, H);
      continue;
    }
    float gv[NV], bv[NV], v[NV];
    load_gb<NV>(gv, bv, g, b, H);
    partial_row<NV>(v, a, pst, np, r, H);
    ln_norm<NV>(v, gv, bv, H, eps, g, b);
    store_row<NV>(v, H, out + (size_t)r * H, nullptr);
  }
}

// A GEMM tile's LN prologue: rows [m0, m0 + bm) of LN(embedding) (FL_A_EMBED) or LN(sum of
// partials) (FL_A_LN) as fp16 into the A rows in shared memory (row stride AROW), padding
// rows (>= T) zero; with FL_LN_STORE also into F_LN_OUT (the residual a later tile adds).
// Every tile of the row block computes the same rows (a few KB from L2): one dependent phase
// fewer than an LN instruction between producer and consumer, if the prologue itself costs
// about one round trip: a half-warp owns a row (16 rows at once), every source load of a row
// (all the partial slices) is in flight together, and the gain / bias were brought into
// shared memory (lng, lnb) before the tile's wait.
template <int NJ>  // columns per lane: H <= 16 NJ
__device__ void ln_prologue(const Params& p, Smem& sm, const int* ins, int T, const float* lng,
                            const float* lnb) {
  const int H = ins[F_K], m0 = ins[F_M0], bm = ins[F_BM], flags = ins[F_FLAGS];
  const float eps = __int_as_float(ins[F_FAUX]);
  half* st = flags & FL_LN_STORE ? (half*)sptr(p, ins[F_LN_OUT]) : nullptr;
  const bool emb = flags & FL_A_EMBED;
  const int l16 = threadIdx.x & 15;
  const unsigned hmask = (threadIdx.x & 16) ? 0xffff0000u : 0x0000ffffu;
  for (int i = threadIdx.x >> 4; i < bm; i += THREADS / 16) {
    const int r = m0 + i;
    half* srow = sm.a + (size_t)i * AROW;
    float v[NJ];
    const bool real = r < T;
    if (emb) {
      const int* ids = p.in + p.hdr_ints;
      const int rr = real ? r : 0;
      const half* wr = (const half*)wptr(p, ins[F_PSRC]) + (size_t)ids[rr] * H + l16;
      const half* pr = (const half*)wptr(p, ins[F_EPOS]) + (size_t)ids[p.tb + rr] * H + l16;
      const half* tr = flags & FL_HAS_TYPE ? (const half*)wptr(p, ins[F_ETYPE]) + l16 : pr;
      const float tw = flags & FL_HAS_TYPE ? 1.f : 0.f;
#pragma unroll
      for (int j = 0; j < NJ; j++) {
        const bool ok = l16 + 16 * j < H;
        v[j] = ok ? __half2float(wr[16 * j]) + __half2float(pr[16 * j]) +
                        tw * __half2float(tr[16 * j])
                  : 0.f;
      }
    } else {
      const float* ar = (const float*)sptr(p, ins[F_PSRC]) + (size_t)(real ? r : 0) * H + l16;
      const size_t pst = (size_t)ins[F_LN_PSTRIDE] * 4;
      const int np = ins[F_LN_NP];
      float t[4][NJ];  // every slice's loads in flight together
#pragma unroll
      for (int q = 0; q < 4; q++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
          t[q][j] = q < np && l16 + 16 * j < H ? __ldcg(ar + q * pst + 16 * j) : 0.f;
#pragma unroll
      for (int j = 0; j < NJ; j++) v[j] = ((t[0][j] + t[1][j]) + t[2][j]) + t[3][j];
    }
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; j++) s += v[j];
#pragma unroll
    for (int o = 8; o; o >>= 1) s += __shfl_xor_sync(hmask, s, o);
    const float mean = s / H;
    float q2 = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const float d = l16 + 16 * j < H ? v[j] - mean : 0.f;
      q2 += d * d;
    }
#pragma unroll
    for (int o = 8; o; o >>= 1) q2 += __shfl_xor_sync(hmask, q2, o);
    const float rstd = rsqrtf(q2 / H + eps);
    half* so = st && r < p.tb ? st + (size_t)r * H : nullptr;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const int c = l16 + 16 * j;
      if (c < H) {  // padding rows: zeros (their outputs are never read by a real row)
        const half y = __float2half(real ? (v[j] - mean) * rstd * lng[c] + lnb[c] : 0.f);
        srow[c] = y;
        if (so) so[c] = y;
      }
    }
  }
}

// ---------------------------------------------------------------- GEMM tile (mma.sync)
// W [N, K] fp16 row-major (nn.Linear) is the col-major B of mma .row.col; K % 8 == 0 and
// 16-byte aligned rows (the builder checks). Stage s of the k loop: A [bm, 64] and W [64, 64]
// by cp.async.cg into shared memory (zero-filled outside the matrix), double-buffered.
__device__ __forceinline__ void load_w_stage(const Params& p, Smem& sm, int buf, const half* W,
                                             int n0, int N, int K, int ke, int k0) {
  // W rows are K long; columns from ke on are zero-filled (the end of the k range)
  for (int i = threadIdx.x; i < BN * (BK / 8); i += THREADS) {
    int r = i >> 3, c = (i & 7) * 8;
    int n = n0 + r, k = k0 + c;
    bool ok = n < N && k < ke;
    cp_async16(&sm.w[buf][r][c], ok ? (const void*)(W + (size_t)n * K + k) : (const void*)W, ok);
  }
}
__device__ __forceinline__ void load_a_stage(Smem& sm, int buf, const half* A, int m0, int bm,
                                             int M, int K, int ke, int k0) {
  for (int i = threadIdx.x; i < bm * (BK / 8); i += THREADS) {
    int r = i >> 3, c = (i & 7) * 8;
    int m = m0 + r, k = k0 + c;
    bool ok = m < M && k < ke;
    cp_async16(a_stage(sm, buf, r, c), ok ? (const void*)(A + (size_t)m * K + k) : (const void*)A,
               ok);
  }
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const half* s) {
  unsigned a = (unsigned)__cvta_generic_to_shared(s);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x2(unsigned (&r)[2], const half* s) {
  unsigned a = (unsigned)__cvta_generic_to_shared(s);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(a));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4],
                                         const unsigned (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void ldmatrix_x2_trans(unsigned (&r)[2], const half* s) {
  unsigned a = (unsigned)__cvta_generic_to_shared(s);
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(a));
}
__device__ __forceinline__ unsigned pack_h2(float x, float y) {
  half2 h = __floats2half2_rn(x, y);
  return *(unsigned*)&h;
}

// the sequence of token row r: the number of sequence ends <= r
__device__ __forceinline__ int seq_of(const int* cu, int B, int r) {
  int s = 0;
  for (int b = 0; b < B; b++) s += (cu[b + 1] <= r);
  return s;
}

// The o tile's attention prologue (FL_A_ATTN): the 16 query rows [m0, m0 + 16) attend, every
// head, over the keys of their own sequences, on tensor cores, into the A rows (fp16, stride
// AROW). Q, K and V of every head come in at once (one round trip, not one per head); a warp
// owns a head at a time: S = Q K^T (m16n8k16, fp32), the rows' softmax in registers (a row's
// scores sit in a lane quad), P in fp16 straight from the S fragments as the A operand of
// O = P V (V through ldmatrix.trans). Builder rules: bm 16, head_dim D (the template) 16 / 32
// / 64, (16 + 2 x keys rounded up to 16) x (H + 8) halves within FA_HALVES.
template <int D>
__device__ void attn_prologue(const Params& p, Smem& sm, const int* ins, int T, int B) {
  const int H = ins[F_K], m0 = ins[F_M0];
  const int NH = H / D, FR = H + 8, H3 = 3 * H;
  const float scale = __int_as_float(ins[F_FAUX]);  // times log2(e)
  const half* qkv = (const half*)sptr(p, ins[F_PSRC]);
  const int* cu = s_cu;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int m1 = min(m0 + 16, T);
  const int kstart = cu[seq_of(cu, B, m0)];
  const int kend = cu[seq_of(cu, B, m1 - 1) + 1];
  const int nk = kend - kstart, nkp = (nk + 15) & ~15;
  half* qs = sm.fa;
  half* ks = qs + 16 * FR;
  half* vs = ks + nkp * FR;
  {  // Q rows, then K and V rows, 16 bytes a thread at a time; zero outside the ranges
    const int cpr = H / 8;  // 16-byte pieces of a row
    const int nrows = 16 + 2 * nkp;
    for (int i = threadIdx.x; i < nrows * cpr; i += THREADS) {
      const int rr = i / cpr, c = (i % cpr) * 8;
      const half* src;
      half* dst;
      bool ok;
      if (rr < 16) {
        ok = m0 + rr < m1;
        src = qkv + (size_t)(m0 + rr) * H3 + c;
        dst = qs + rr * FR + c;
      } else {
        const int j = (rr - 16) % nkp, isv = (rr - 16) / nkp;
        ok = j < nk;
        src = qkv + (size_t)(kstart + j) * H3 + H * (1 + isv) + c;
        dst = (isv ? vs : ks) + j * FR + c;
      }
      cp_async16(dst, ok ? (const void*)src : (const void*)qkv, ok);
    }
    cp_commit();
    cp_wait<0>();
    __syncthreads();
  }
  // the lane's two rows (lane / 4 and + 8) and their key ranges
  const int g = lane >> 2, tig = lane & 3;
  int rs[2], re[2];
#pragma unroll
  for (int h2 = 0; h2 < 2; h2++) {
    const int r = m0 + g + 8 * h2;
    rs[h2] = 0;
    re[h2] = 0;  // padding rows: no keys (their output is zero)
    if (r < m1) {
      const int sq = seq_of(cu, B, r);
      rs[h2] = cu[sq];
      re[h2] = cu[sq + 1];
    }
  }
  constexpr int NT = 8;  // up to 64 keys: 8 n8 tiles of scores
  for (int h = warp; h < NH; h += WARPS) {
    float sc[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++) sc[t][0] = sc[t][1] = sc[t][2] = sc[t][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D; kk += 16) {
      unsigned a[4];
      ldmatrix_x4(a, qs + (lane & 15) * FR + h * D + kk + (lane >> 4) * 8);
#pragma unroll
      for (int t = 0; t < NT; t++) {
        if (t * 8 < nkp) {
          unsigned bb[2];
          ldmatrix_x2(bb, ks + (t * 8 + (lane & 7)) * FR + h * D + kk + ((lane >> 3) & 1) * 8);
          mma16816(sc[t], a, bb);
        }
      }
    }
    // mask, scale, row max / sum over the quad (the 4 lanes of a row)
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int t = 0; t < NT; t++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int h2 = e >> 1, key = kstart + t * 8 + tig * 2 + (e & 1);
        const bool ok = t * 8 < nkp && key >= rs[h2] && key < re[h2];
        sc[t][e] = ok ? sc[t][e] * scale : -INFINITY;
        mx[h2] = fmaxf(mx[h2], sc[t][e]);
      }
    }
    float l[2];
#pragma unroll
    for (int h2 = 0; h2 < 2; h2++) {
      mx[h2] = fmaxf(mx[h2], __shfl_xor_sync(0xffffffffu, mx[h2], 1));
      mx[h2] = fmaxf(mx[h2], __shfl_xor_sync(0xffffffffu, mx[h2], 2));
      if (mx[h2] == -INFINITY) mx[h2] = 0.f;  // a row without keys: every p is 0
      l[h2] = 0.f;
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        sc[t][e] = exp2f(sc[t][e] - mx[e >> 1]);  // exp2(-inf) = 0: masked keys
        l[e >> 1] += sc[t][e];
      }
#pragma unroll
    for (int h2 = 0; h2 < 2; h2++) {
      l[h2] += __shfl_xor_sync(0xffffffffu, l[h2], 1);
      l[h2] += __shfl_xor_sync(0xffffffffu, l[h2], 2);
    }
    // O = P V: the S fragments of key tiles 2 kt, 2 kt + 1 are the A fragment of k step kt
    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
#pragma unroll
    for (int kt = 0; kt < NT / 2; kt++) {
      if (kt * 16 < nkp) {
        unsigned a[4] = {pack_h2(sc[2 * kt][0], sc[2 * kt][1]),
                         pack_h2(sc[2 * kt][2], sc[2 * kt][3]),
                         pack_h2(sc[2 * kt + 1][0], sc[2 * kt + 1][1]),
                         pack_h2(sc[2 * kt + 1][2], sc[2 * kt + 1][3])};
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
          unsigned bb[2];
          ldmatrix_x2_trans(bb, vs + (kt * 16 + (lane & 15)) * FR + h * D + n * 8);
          mma16816(o[n], a, bb);
        }
      }
    }
    const float inv[2] = {l[0] > 0.f ? 1.f / l[0] : 0.f, l[1] > 0.f ? 1.f / l[1] : 0.f};
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
      for (int h2 = 0; h2 < 2; h2++)
        *(half2*)(sm.a + (size_t)(g + 8 * h2) * AROW + h * D + n * 8 + tig * 2) =
            __floats2half2_rn(o[n][2 * h2] * inv[h2], o[n][2 * h2 + 1] * inv[h2]);
  }
}

template <int MI>  // bm = 16 * MI rows
__device__ void gemm_tile(const Params& p, Smem& sm, const int* ins, int T, int B,
                          long long gen, int* s_ok, bool* ok) {
  // k range [kb, ke) of the K-long rows (split-K: each split writes its own fp32 partial;
  // split 0, the one with kb == 0, adds the bias and the residual)
  const int m0 = ins[F_M0], n0 = ins[F_N0], N = ins[F_N], K = ins[F_K];
  const int kb = ins[F_X1], ke = ins[F_X2];
  const int bm = 16 * MI;
  const int flags = ins[F_FLAGS];
  // A rows made by a prologue (whole rows in shared memory, k from 0) or read in k stages
  const bool full = flags & (FL_A_LN | FL_A_EMBED | FL_A_ATTN);
  const half* A = full ? nullptr : (const half*)sptr(p, ins[F_A]);
  const half* W = (const half*)wptr(p, ins[F_W]);
  const int M = p.tb;
  const int nk = (ke - kb + BK - 1) / BK;
  // the weights depend on nothing: the first NSTAGE - 1 stages are in flight while we wait
  // (one cp.async group); the A stages follow, one group each
  for (int s = 0; s < NSTAGE - 1 && s < nk; s++)
    load_w_stage(p, sm, s, W, n0, N, K, ke, kb + s * BK);
  // an LN prologue's gain and bias (weights: in flight with the W stages, before the wait)
  const bool lnp = flags & (FL_A_LN | FL_A_EMBED);
  float* lng = (float*)sm.fa;
  float* lnb = lng + MAX_H;
  if (lnp) {
    const float* g = (const float*)wptr(p, ins[F_LN_G]);
    const float* b = (const float*)wptr(p, ins[F_LN_B]);
    for (int i = threadIdx.x; i < 2 * (K / 4); i += THREADS) {
      const int k4 = (i % (K / 4)) * 4;
      cp_async16(i < K / 4 ? lng + k4 : lnb + k4, i < K / 4 ? g + k4 : b + k4, true);
    }
  }
  cp_commit();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int col = n0 + warp * 8 + (lane & 3) * 2;  // the thread's two output columns
  const bool first = kb == 0;  // bias and residual: the first split only
  float bj[2];
  {
    const float* bias = (const float*)wptr(p, ins[F_BIAS]);
    bj[0] = first ? bias[min(col, N - 1)] : 0.f;  // weights: requested before the wait
    bj[1] = first ? bias[min(col + 1, N - 1)] : 0.f;
  }
  *ok = wait_counter(p, ins, gen, s_ok);
  if (!*ok || m0 >= T) {  // timed out, or every row of the tile is padding
    cp_wait<0>();
    __syncthreads();
    return;
  }
  if (full) {  // the A columns past K up to the last k step: zeros (the W columns are too)
    const int kw = (K + BK - 1) / BK * BK;
    for (int i = threadIdx.x; i < bm * (kw - K); i += THREADS)
      sm.a[(size_t)(i / (kw - K)) * AROW + K + i % (kw - K)] = __float2half(0.f);
  }
  if (flags & FL_A_ATTN) {
    const int D = ins[F_AUX];
    if (D == 16)
      attn_prologue<16>(p, sm, ins, T, B);
    else if (D == 32)
      attn_prologue<32>(p, sm, ins, T, B);
    else
      attn_prologue<64>(p, sm, ins, T, B);
  } else if (lnp) {
    cp_wait<0>();  // the gain / bias (and the W stages, requested earlier)
    __syncthreads();
    if (K <= 128)
      ln_prologue<8>(p, sm, ins, T, lng, lnb);
    else if (K <= 256)
      ln_prologue<16>(p, sm, ins, T, lng, lnb);
    else  // K <= 384 (megakernel_program.LN_PRO_MAX_H: a lane's slices of wider rows spill)
      ln_prologue<24>(p, sm, ins, T, lng, lnb);
  }
  for (int s = 0; s < NSTAGE - 1; s++) {
    if (s < nk && !full) load_a_stage(sm, s, A, m0, bm, M, K, ke, kb + s * BK);
    cp_commit();  // possibly empty: the group count stays uniform
  }
  // the residual (written by an earlier instruction: through L2), in flight during the k loop
  float rv[MI][2][2];
  const half* res = (flags & FL_HAS_RES) && first ? (const half*)sptr(p, ins[F_RES]) : nullptr;
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
      for (int j = 0; j < 2; j++) {
        const int row = min(m0 + i * 16 + (lane >> 2) + h * 8, M - 1);
        rv[i][h][j] = res ? ldcg_h(res + (size_t)row * N + min(col + j, N - 1)) : 0.f;
      }
  float acc[MI][4];
#pragma unroll
  for (int i = 0; i < MI; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  for (int kt = 0; kt < nk; kt++) {
    // stage kt + NSTAGE - 1 goes into the slot consumed at kt - 1 (the barrier ending that
    // step made it free)
    const int nx = kt + NSTAGE - 1;
    if (nx < nk) {
      load_w_stage(p, sm, nx % NSTAGE, W, n0, N, K, ke, kb + nx * BK);
      if (!full) load_a_stage(sm, nx % NSTAGE, A, m0, bm, M, K, ke, kb + nx * BK);
    }
    cp_commit();
    cp_wait<NSTAGE - 1>();  // every group but the newest NSTAGE - 1: stage kt has landed
    __syncthreads();  // (and, on the first step, the prologue's A rows are written)
    const int buf = kt % NSTAGE;
    // this step's A: the prologue's rows from column kt * BK, or stage buf of the ring
    const half* ab = full ? sm.a + kt * BK + (lane & 15) * AROW
                          : sm.a + (size_t)buf * MAX_BM * SROW + (lane & 15) * SROW;
    const int ars = full ? 16 * AROW : 16 * SROW;  // the next 16 rows
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned b[2];
      // x2: matrices (n 0-7, k kk..kk+7) and (n 0-7, k kk+8..kk+15); lanes 0-15 give rows
      ldmatrix_x2(b, &sm.w[buf][warp * 8 + (lane & 7)][kk + ((lane >> 3) & 1) * 8]);
#pragma unroll
      for (int i = 0; i < MI; i++) {
        unsigned a[4];
        ldmatrix_x4(a, ab + i * ars + kk + (lane >> 4) * 8);
        mma16816(acc[i], a, b);
      }
    }
    __syncthreads();  // the slot is refilled by a later step
  }
  cp_wait<0>();
  // epilogue: fragment rows lane/4 (+8), columns (lane%4)*2 (+1)
  const int act = flags & FL_ACT_MASK;
#pragma unroll
  for (int i = 0; i < MI; i++) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int row = m0 + i * 16 + (lane >> 2) + h * 8;
      if (row >= M) continue;
#pragma unroll
      for (int j = 0; j < 2; j++) {
        const int c = col + j;
        if (c >= N) continue;
        float y = acc[i][h * 2 + j] + bj[j];
        if (act == 1) y = gelu_erf(y);  // never on a split (the builder's rule)
        y += rv[i][h][j];
        if (flags & FL_OUT_F32)
          ((float*)sptr(p, ins[F_OUT]))[(size_t)row * N + c] = y;
        else
          ((half*)sptr(p, ins[F_OUT]))[(size_t)row * N + c] = __float2half(y);
      }
    }
  }
}

// ---------------------------------------------------------------- attention
// One head (n0), query rows [m0, m0 + bm). Row r attends over keys [start, end) of its own
// sequence (cu_seqlens). Keys / values of the block's key range come in chunks of 64 through
// shared memory; a warp owns a query row at a time (online softmax in fp32; lanes own keys for
// the scores and head dimensions for the output).
template <int DMAX>  // head_dim <= DMAX: a lane's output dims and the chunk loads unrolled
__device__ void op_attention(const Params& p, Smem& sm, const int* ins, int T, int B) {
  const int h = ins[F_N0], D = ins[F_BN], H3 = ins[F_K], H = ins[F_N];
  const float scale = __int_as_float(ins[F_FAUX]);  // already times log2(e)
  const half* qkv = (const half*)sptr(p, ins[F_A]);
  half* out = (half*)sptr(p, ins[F_OUT]);
  const int* cu = s_cu;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int m0 = ins[F_M0];
  const int m1 = min(m0 + ins[F_BM], T);
  if (m0 >= m1) return;
  // the sequence of a row: the number of sequence ends <= row
  auto seq_of = [&](int r) {
    int s = 0;
    for (int b = 0; b < B; b++) s += (cu[b + 1] <= r);
    return s;
  };
  const int kstart = cu[seq_of(m0)];
  const int kend = cu[seq_of(m1 - 1) + 1];
  constexpr int RPW = MAX_BM / WARPS;  // rows per warp (bm <= 32)
  float o[RPW][DMAX / 32];
  float mx[RPW], l[RPW];
  int rs[RPW], re[RPW];
#pragma unroll
  for (int i = 0; i < RPW; i++) {
    int r = m0 + warp + i * WARPS;
    mx[i] = -INFINITY;
    l[i] = 0.f;
    rs[i] = 0;
    re[i] = 0;
    if (r < m1) {
      int s = seq_of(r);
      rs[i] = cu[s];
      re[i] = cu[s + 1];
    }
#pragma unroll
    for (int d = 0; d < DMAX / 32; d++) o[i][d] = 0.f;
    if (r < m1)  // every query row loaded once, before the key loop (one latency, not one a chunk)
      for (int d = lane; d < D; d += 32)
        sm.at.q[warp][i][d] = ldcg_h(qkv + (size_t)r * H3 + h * D + d) * scale;
  }
  __syncwarp();
  for (int k0 = kstart; k0 < kend; k0 += ATT_KC) {
    __syncthreads();  // the previous chunk is consumed
    // every load of the chunk issued before the first store (clamped, branch-free)
    constexpr int ITEMS = ATT_KC * DMAX / 2 / THREADS;
    const int n2 = ATT_KC * D / 2;
    half2 kr[ITEMS], vr[ITEMS];
#pragma unroll
    for (int it = 0; it < ITEMS; it++) {
      const int i = min((int)threadIdx.x + it * THREADS, n2 - 1);
      const int j = i / (D / 2), d = (i % (D / 2)) * 2;
      const half* row = qkv + (size_t)min(k0 + j, kend - 1) * H3 + h * D + d;
      kr[it] = __ldcg((const half2*)(row + H));
      vr[it] = __ldcg((const half2*)(row + 2 * H));
    }
#pragma unroll
    for (int it = 0; it < ITEMS; it++) {
      const int i = threadIdx.x + it * THREADS;
      if (i < n2) {
        const int j = i / (D / 2), d = (i % (D / 2)) * 2;
        const bool ok = k0 + j < kend;  // keys past the range: zeros (masked anyway)
        *(half2*)&sm.at.k[j][d] = ok ? kr[it] : __float2half2_rn(0.f);
        *(half2*)&sm.at.v[j][d] = ok ? vr[it] : __float2half2_rn(0.f);
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < RPW; i++) {
      int r = m0 + warp + i * WARPS;
      if (r >= m1) continue;  // warp-uniform
      const float* qr = sm.at.q[warp][i];
      float s[2];
#pragma unroll
      for (int t = 0; t < 2; t++) {
        int j = lane + 32 * t, key = k0 + j;
        float acc = 0.f;
        for (int d = 0; d < D; d += 2) {
          float2 kf = __half22float2(*(const half2*)&sm.at.k[j][d]);
          acc += qr[d] * kf.x + qr[d + 1] * kf.y;
        }
        s[t] = (key >= rs[i] && key < re[i]) ? acc : -INFINITY;
      }
      float cm = warp_max(fmaxf(s[0], s[1]));
      float nm = fmaxf(mx[i], cm);
      if (nm == -INFINITY) {  // no key of this chunk belongs to the row's sequence
        __syncwarp();
        continue;
      }
      float corr = exp2f(mx[i] - nm);  // exp2(-inf) = 0 on the first chunk
      float e0 = exp2f(s[0] - nm), e1 = exp2f(s[1] - nm);
      l[i] = l[i] * corr + warp_sum(e0 + e1);
      mx[i] = nm;
#pragma unroll
      for (int dd = 0; dd < DMAX / 32; dd++) o[i][dd] *= corr;
      for (int j = 0; j < ATT_KC; j++) {
        float pj = __shfl_sync(0xffffffffu, j < 32 ? e0 : e1, j & 31);
        if (pj == 0.f) continue;  // warp-uniform
#pragma unroll
        for (int dd = 0; dd < DMAX / 32; dd++) {
          int d = lane + 32 * dd;
          if (d < D) o[i][dd] += pj * __half2float(sm.at.v[j][d]);
        }
      }
      __syncwarp();
    }
  }
#pragma unroll
  for (int i = 0; i < RPW; i++) {
    int r = m0 + warp + i * WARPS;
    if (r >= m1) continue;
    float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
#pragma unroll
    for (int dd = 0; dd < DMAX / 32; dd++) {
      int d = lane + 32 * dd;
      if (d < D) out[(size_t)r * H + h * D + d] = __float2half(o[i][dd] * inv);
    }
  }
}

// ---------------------------------------------------------------- pool
// Sequences b = m0, m0 + bm, ... < B: mean (or the CLS row) of the rows, optionally L2
// normalised. The rows are the fp16 x (F_A), or, with FL_A_LN, made here: LN(sum of the last
// layer's partials) rounded to fp16 as the stored rows would be (no LayerNorm phase before the
// pool). Warps take rows in turn; their column sums meet in shared memory in warp order.
template <int NV>
__device__ void op_pool(const Params& p, Smem& sm, const int* ins, int B, int norm) {
  const int H = ins[F_N], flags = ins[F_FLAGS];
  const half* x = (const half*)sptr(p, ins[F_A]);
  const int* cu = s_cu;
  const bool cls = flags & FL_POOL_CLS;
  const bool lnp = flags & FL_A_LN;
  const float eps = __int_as_float(ins[F_FAUX]);
  const float* g = (const float*)wptr(p, ins[F_LN_G]);
  const float* gb = (const float*)wptr(p, ins[F_LN_B]);
  const float* a = (const float*)sptr(p, ins[F_PSRC]);
  const int np = max(ins[F_LN_NP], 1);
  const size_t pst = (size_t)ins[F_LN_PSTRIDE] * 4;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int b = ins[F_M0]; b < B; b += ins[F_BM]) {
    const int s = cu[b], e = cls ? min(cu[b + 1], cu[b] + 1) : cu[b + 1];
    float acc[NV];
#pragma unroll
    for (int i = 0; i < NV; i++) acc[i] = 0.f;
    for (int r = s + warp; r < e; r += WARPS) {
      float v[NV];
      if (lnp) {
        float gv[NV], bv[NV];
        load_gb<NV>(gv, bv, g, gb, H);
        partial_row<NV>(v, a, pst, np, r, H);
        ln_norm<NV>(v, gv, bv, H, eps, g, gb);
      } else {
#pragma unroll
        for (int i = 0; i < NV; i++) v[i] = ldcg_h(x + (size_t)r * H + col_of<NV>(i, H));
      }
#pragma unroll
      for (int i = 0; i < NV; i++) acc[i] += __half2float(__float2half(v[i]));
    }
    __syncthreads();  // the previous sequence's sums are read
#pragma unroll
    for (int i = 0; i < NV; i++)
      if (lane + 32 * i < H) sm.pool[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    float vals[MAX_H / THREADS];
    float part = 0.f;
#pragma unroll
    for (int i = 0; i < MAX_H / THREADS; i++) {
      const int c = threadIdx.x + i * THREADS;
      float t = 0.f;
      if (c < H)
        for (int w = 0; w < WARPS; w++) t += sm.pool[w][c];
      vals[i] = e > s ? t / (float)(e - s) : 0.f;
      part += c < H ? vals[i] * vals[i] : 0.f;
    }
    float div = 1.f;
    if (norm) {
      part = warp_sum(part);
      __syncthreads();
      if (lane == 0) sm.red[warp] = part;
      __syncthreads();
      float tot = 0.f;
      for (int w = 0; w < WARPS; w++) tot += sm.red[w];
      div = fmaxf(sqrtf(tot), 1e-12f);
    }
#pragma unroll
    for (int i = 0; i < MAX_H / THREADS; i++) {
      int c = threadIdx.x + i * THREADS;
      if (c < H) p.out[(size_t)b * H + c] = vals[i] / div;
    }
  }
}

}  // namespace zoi_mk

using namespace zoi_mk;

extern "C" __global__ void __launch_bounds__(THREADS, 1) zoi_megakernel(Params p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  __shared__ int s_ok;
  // the block's first QCACHE instruction rows, fetched at once (not two dependent L2 round
  // trips, queue entry then row, at every instruction)
  constexpr int QCACHE = 64;
  __shared__ int s_ins[QCACHE][N_FIELDS];
  if (blockIdx.x >= p.n_blocks) return;
  const int q0 = p.qoff[blockIdx.x], q1 = p.qoff[blockIdx.x + 1];
  const int nq = min(q1 - q0, QCACHE);
  for (int t = threadIdx.x; t < nq * N_FIELDS; t += THREADS) {
    const int k = t / N_FIELDS, f = t % N_FIELDS;
    s_ins[k][f] = p.instr[(size_t)p.queue[q0 + k] * N_FIELDS + f];
  }
  __syncthreads();
  // the generation was advanced by the previous launch (stream order): every block reads it
  // before it arrives at the done counter, so the last arriver may advance it
  const long long gen = *(volatile long long*)(p.state + STATE_GEN);
  const int norm = p.in[0], B = p.in[1], T = p.in[2];
  for (int t = threadIdx.x; t <= B && t <= MAX_TB; t += THREADS) s_cu[t] = p.in[4 + t];
  __syncthreads();
  bool alive = true;
  for (int q = q0; q < q1 && alive; q++) {
    const int* ins = q - q0 < QCACHE ? s_ins[q - q0] : p.instr + (size_t)p.queue[q] * N_FIELDS;
    const int op = ins[F_OP];
    if (p.prof && threadIdx.x == 0) prof_row(p, ins)[0] = now_ns();
    if (op == OP_GEMM) {
      bool ok;
      if (ins[F_BM] == 32)
        gemm_tile<2>(p, sm, ins, T, B, gen, &s_ok, &ok);
      else
        gemm_tile<1>(p, sm, ins, T, B, gen, &s_ok, &ok);
      if (!ok) {
        alive = false;
        break;
      }
    } else {
      if (!wait_counter(p, ins, gen, &s_ok)) {
        alive = false;
        break;
      }
      switch (op) {
        case OP_NOP: break;
        case OP_EMBED_LN: op_embed_ln<MAX_H / 32>(p, ins, T); break;
        case OP_LN: op_ln<MAX_H / 32>(p, ins, T); break;
        case OP_ATTN:
          if (ins[F_BN] <= 32)
            op_attention<32>(p, sm, ins, T, B);
          else if (ins[F_BN] <= 64)
            op_attention<64>(p, sm, ins, T, B);
          else
            op_attention<MAX_D>(p, sm, ins, T, B);
          break;
        case OP_POOL: op_pool<MAX_H / 32>(p, sm, ins, B, norm); break;
        default:
          if (threadIdx.x == 0)
            atomicExch((unsigned long long*)(p.state + STATE_ERR), (unsigned long long)ERR_BAD_OP);
          alive = false;
      }
      if (!alive) break;
    }
    signal_counter(p, ins);
  }
  if (!alive) return;  // the host resets the state after an error
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    unsigned long long a =
        atomicAdd((unsigned long long*)(p.state + STATE_DONE), 1ull);
    if ((long long)a + 1 == (gen + 1) * (long long)p.n_blocks)
      atomicExch((unsigned long long*)(p.state + STATE_GEN), (unsigned long long)(gen + 1));
  }
}
