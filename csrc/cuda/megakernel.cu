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
  N_FIELDS = 24,
};
// F_FLAGS bits
constexpr int FL_ACT_MASK = 0xF;  // 0 none, 1 gelu (erf)
constexpr int FL_OUT_F32 = 1 << 4;
constexpr int FL_HAS_RES = 1 << 5;
constexpr int FL_HAS_TYPE = 1 << 6;
constexpr int FL_POOL_CLS = 1 << 7;
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

struct __align__(16) Smem {
  union {
    struct {
      half a[NSTAGE][MAX_BM][SROW];
      half w[NSTAGE][BN][SROW];
    } g;
    struct {
      half k[ATT_KC][MAX_D + 2];
      half v[ATT_KC][MAX_D + 2];
      float q[WARPS][MAX_BM / WARPS][MAX_D];  // a warp's query rows, scaled
    } at;
    float red[2 * WARPS];
  };
};
// dynamic shared memory of a block (the host sets the function's limit to this; megakernel.py)
constexpr int SMEM_BYTES = 82944;
static_assert(sizeof(Smem) == SMEM_BYTES, "update SMEM_BYTES here and in megakernel.py");

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

template <int NV>
__device__ __forceinline__ void ln_finish(float (&v)[NV], const float (&gv)[NV],
                                          const float (&bv)[NV], int H, float eps, half* out,
                                          const float* g, const float* b) {
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
    const int c = lane + 32 * i;
    const float gi = NV <= 16 ? gv[i] : g[col_of<NV>(i, H)];
    const float bi = NV <= 16 ? bv[i] : b[col_of<NV>(i, H)];
    if (c < H) out[c] = __float2half((v[i] - mean) * rstd * gi + bi);
  }
}

__device__ __forceinline__ void zero_row(half* out, int H) {
  for (int c = threadIdx.x & 31; c < H; c += 32) out[c] = __float2half(0.f);
}

template <int NV>
__device__ void op_embed_ln(const Params& p, const int* ins, int T) {
  const int H = ins[F_N];
  const float eps = __int_as_float(ins[F_FAUX]);
  const half* word = (const half*)wptr(p, ins[F_A]);
  const half* pos = (const half*)wptr(p, ins[F_W]);
  const bool has_type = ins[F_FLAGS] & FL_HAS_TYPE;
  const float* g = (const float*)wptr(p, ins[F_X1]);
  const float* b = (const float*)wptr(p, ins[F_X2]);
  half* out = (half*)sptr(p, ins[F_OUT]);
  const int* ids = p.in + p.hdr_ints;
  const int* posn = ids + p.tb;
  const int warp = threadIdx.x >> 5;
  for (int r = ins[F_M0] + warp; r < ins[F_M0] + ins[F_BM]; r += WARPS) {
    if (r >= T) {  // padding rows: zeros (never read by a real row)
      zero_row(out + (size_t)r * H, H);
      continue;
    }
    float gv[NV], bv[NV], v[NV];
    load_gb<NV>(gv, bv, g, b, H);
    const half* wr = word + (size_t)ids[r] * H;
    const half* pr = pos + (size_t)posn[r] * H;
    // no token types: the position row read twice, counted once
    const half* tr = has_type ? (const half*)wptr(p, ins[F_RES]) : pr;
    const float tw = has_type ? 1.f : 0.f;
#pragma unroll
    for (int i = 0; i < NV; i++) {  // one basic block: the loads are hoisted together
      const int c = col_of<NV>(i, H);
      v[i] = __half2float(wr[c]) + __half2float(pr[c]) + tw * __half2float(tr[c]);
    }
    ln_finish<NV>(v, gv, bv, H, eps, out + (size_t)r * H, g, b);
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
  // the input is the sum of F_AUX fp32 partial slices (split-K), F_RES 16-byte units apart,
  // summed in a fixed order (repeated calls give identical bits)
  const int np = ins[F_AUX] > 1 ? ins[F_AUX] : 1;
  const size_t pst = (size_t)ins[F_RES] * 4;
  const int warp = threadIdx.x >> 5;
  for (int r = ins[F_M0] + warp; r < ins[F_M0] + ins[F_BM]; r += WARPS) {
    if (r >= T) {
      zero_row(out + (size_t)r * H, H);
      continue;
    }
    const float* ar = a + (size_t)r * H;
    float gv[NV], bv[NV], v[NV];
    load_gb<NV>(gv, bv, g, b, H);
#pragma unroll
    for (int i = 0; i < NV; i++) v[i] = __ldcg(ar + col_of<NV>(i, H));
    for (int q = 1; q < np; q++) {
      float t[NV];
#pragma unroll
      for (int i = 0; i < NV; i++) t[i] = __ldcg(ar + q * pst + col_of<NV>(i, H));
#pragma unroll
      for (int i = 0; i < NV; i++) v[i] += t[i];
    }
    ln_finish<NV>(v, gv, bv, H, eps, out + (size_t)r * H, g, b);
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
    cp_async16(&sm.g.w[buf][r][c], ok ? (const void*)(W + (size_t)n * K + k) : (const void*)W, ok);
  }
}
__device__ __forceinline__ void load_a_stage(Smem& sm, int buf, const half* A, int m0, int bm,
                                             int M, int K, int ke, int k0) {
  for (int i = threadIdx.x; i < bm * (BK / 8); i += THREADS) {
    int r = i >> 3, c = (i & 7) * 8;
    int m = m0 + r, k = k0 + c;
    bool ok = m < M && k < ke;
    cp_async16(&sm.g.a[buf][r][c], ok ? (const void*)(A + (size_t)m * K + k) : (const void*)A, ok);
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

template <int MI>  // bm = 16 * MI rows
__device__ void gemm_tile(const Params& p, Smem& sm, const int* ins, int T, long long gen,
                          int* s_ok, bool* ok) {
  // k range [kb, ke) of the K-long rows (split-K: each split writes its own fp32 partial;
  // split 0, the one with kb == 0, adds the bias and the residual)
  const int m0 = ins[F_M0], n0 = ins[F_N0], N = ins[F_N], K = ins[F_K];
  const int kb = ins[F_X1], ke = ins[F_X2];
  const int bm = 16 * MI;
  const half* A = (const half*)sptr(p, ins[F_A]);
  const half* W = (const half*)wptr(p, ins[F_W]);
  const int M = p.tb;
  const int nk = (ke - kb + BK - 1) / BK;
  // the weights depend on nothing: the first NSTAGE - 1 stages are in flight while we wait
  // (one cp.async group); the A stages follow, one group each
  for (int s = 0; s < NSTAGE - 1 && s < nk; s++) load_w_stage(p, sm, s, W, n0, N, K, ke, kb + s * BK);
  cp_commit();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int col = n0 + warp * 8 + (lane & 3) * 2;  // the thread's two output columns
  const int flags = ins[F_FLAGS];
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
  for (int s = 0; s < NSTAGE - 1; s++) {
    if (s < nk) load_a_stage(sm, s, A, m0, bm, M, K, ke, kb + s * BK);
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
      load_a_stage(sm, nx % NSTAGE, A, m0, bm, M, K, ke, kb + nx * BK);
    }
    cp_commit();
    cp_wait<NSTAGE - 1>();  // every group but the newest NSTAGE - 1: stage kt has landed
    __syncthreads();
    const int buf = kt % NSTAGE;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      unsigned b[2];
      // x2: matrices (n 0-7, k kk..kk+7) and (n 0-7, k kk+8..kk+15); lanes 0-15 give rows
      ldmatrix_x2(b, &sm.g.w[buf][warp * 8 + (lane & 7)][kk + ((lane >> 3) & 1) * 8]);
#pragma unroll
      for (int i = 0; i < MI; i++) {
        unsigned a[4];
        ldmatrix_x4(a, &sm.g.a[buf][i * 16 + (lane & 15)][kk + (lane >> 4) * 8]);
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
  const int* cu = p.in + 4;
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
__device__ void op_pool(const Params& p, Smem& sm, const int* ins, int B, int norm) {
  const int H = ins[F_N];
  const half* x = (const half*)sptr(p, ins[F_A]);
  const int* cu = p.in + 4;
  const bool cls = ins[F_FLAGS] & FL_POOL_CLS;
  for (int b = ins[F_M0]; b < B; b += ins[F_BM]) {
    const int s = cu[b], e = cls ? min(cu[b + 1], cu[b] + 1) : cu[b + 1];
    float part = 0.f;
    float vals[MAX_H / THREADS];
#pragma unroll
    for (int i = 0; i < MAX_H / THREADS; i++) {
      int c = threadIdx.x + i * THREADS;
      float acc = 0.f;
      if (c < H)
        for (int r = s; r < e; r++) acc += ldcg_h(x + (size_t)r * H + c);
      vals[i] = e > s ? acc / (float)(e - s) : 0.f;
      part += c < H ? vals[i] * vals[i] : 0.f;
    }
    float div = 1.f;
    if (norm) {
      part = warp_sum(part);
      __syncthreads();
      if ((threadIdx.x & 31) == 0) sm.red[threadIdx.x >> 5] = part;
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
  bool alive = true;
  for (int q = q0; q < q1 && alive; q++) {
    const int* ins = q - q0 < QCACHE ? s_ins[q - q0] : p.instr + (size_t)p.queue[q] * N_FIELDS;
    const int op = ins[F_OP];
    if (p.prof && threadIdx.x == 0) prof_row(p, ins)[0] = now_ns();
    if (op == OP_GEMM) {
      bool ok;
      if (ins[F_BM] == 32)
        gemm_tile<2>(p, sm, ins, T, gen, &s_ok, &ok);
      else
        gemm_tile<1>(p, sm, ins, T, gen, &s_ok, &ok);
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
        case OP_POOL: op_pool(p, sm, ins, B, norm); break;
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
