// Kernel interface shared by every ISA build. Each csrc/kernels/<op>.cc is compiled once per
// ISA (vnni, avx512, avx2, scalar; on aarch64 neon, dotprod, i8mm, scalar) into its own namespace zoi::<isa>; table.cc gathers the
// entry points into a KernelTable and the runtime picks one table at construction.
//
// Every kernel takes (args, tid, nthreads) and computes the share of the work that belongs
// to thread `tid`; calling it for tid = 0..nthreads-1 (in any order, on any threads)
// computes the whole op. Kernels never allocate.
#pragma once
#include <cstddef>
#include <cstdint>

#include "isa.h"

namespace zoi {

enum Act : int { ACT_NONE = 0, ACT_GELU = 1, ACT_GELU_TANH = 2, ACT_RELU = 3, ACT_SIGMOID = 4, ACT_TANH = 5, ACT_SILU = 6 };

// Quantisation of float rows for the next INT8 GEMM (standalone, or fused into the kernel
// that produces the rows): x' = (x - shift) * mul per channel (each optional, two roundings),
// then symmetric (per-token amax or the static amax) or asymmetric per-token UINT8.
struct QuantOut {
  void* q = nullptr;            // [M, ldq * i8_a_bytes] in the ISA's A format; nullptr = off
  int ldq = 0;                  // = Kp of the consumer (elements per row)
  float* scale = nullptr;       // [M] a_scale
  int32_t* zp = nullptr;        // [M] zero point of the stored integers (see the GEMM above)
  float static_amax = -1.f;     // < 0: dynamic per-token amax; >= 0: calibrated per-tensor amax
  int asym = 0;                 // 1: dynamic_asym (per-token UINT8 with zero point)
  const float* shift = nullptr; // [K] or nullptr
  const float* mul = nullptr;   // [K] or nullptr
  // optional (appended; docs/QUANT.md "The first row of each sequence quantised twice"): the first
  // row of each sequence (row cu[b]) also gets its residual x' - deq(q) quantised, symmetric with
  // the fixed step scale2 = scale * 2^-8 (any mode of the row itself; qrow.h), into row b of q2 /
  // scale2 / zp2 (the same A format and ldq). first_row: the build's flag (the engine sets the
  // pointers and cu / B per run)
  int first_row = 0;
  void* q2 = nullptr;           // [B, ldq * i8_a_bytes]; nullptr = off
  float* scale2 = nullptr;      // [B]
  int32_t* zp2 = nullptr;       // [B] stored zero point (the symmetric offset of the ISA)
  const int32_t* cu = nullptr;  // [B + 1] sequence starts in rows of x
  int B = 0;
};

// ---- INT8 GEMM:
//   y[m,n] = act(float(sum_k a[m,k] w[n,k] - zp[m] * colsum[n]) * (a_scale[m] * w_scale[n]) + bias[n]) (+ res)
// Activations arrive quantised by quantize_rows / a fused LayerNorm / embedding, as stored
// integers a = q + off with a stored per-row zero point zp' = zp + off (zoi.numerics.primitives
// numerics; symmetric q in [-127, 127] with zp = 0, asymmetric q in [0, 255] with the token's zp):
//   vnni, avxvnni: u8,  off = 128 (symmetric) / 0 (asymmetric)
//   avx512, avx2:  s8,  off = 0 / -128, each row followed by |a| (u8): rows of 2 * Kp bytes
//   scalar:        s8,  off = 0 / -128
//   neon, dotprod, i8mm (aarch64): s8, off = 0 / -128 (scalar's: smull / sdot / smmla are s8 x s8)
// (csrc/kernels/qrow.h; i8_a_get / i8_a_set read and write it). Kp = round_up(K, 4); padding: any
// value (its weight is 0). Weights: s8 in [-127, 127] on every ISA, packed by pack_i8 into panels
// of `i8_panel` columns: [panel][Kp/4][panel col][4]; colsum[n] = sum_k w[n,k].
struct GemmI8Args {
  const void* a = nullptr;        // [M, lda * i8_a_bytes] quantised activations (format above)
  int lda = 0;                    // elements per row of a (= Kp)
  const float* a_scale = nullptr; // [M] per-token activation scale
  const void* w = nullptr;        // packed weights
  const int32_t* colsum = nullptr;  // [Npad]
  const int32_t* a_zp = nullptr;    // [M] per-row zero point of a
  const float* w_scale = nullptr; // [Npad] per-channel weight scale (0 in the padding)
  const float* bias = nullptr;    // [Npad] (0 in the padding)
  int M = 0, N = 0, Kp = 0;
  float* y = nullptr;             // [M, ldy]
  int ldy = 0;
  const float* res = nullptr;     // optional residual [M, ldr], added after the activation
  int ldr = 0;
  int act = 0;                    // Act
  int32_t* y_i32 = nullptr;       // tests: when set, raw integer sums [M, ldy] instead of y
  // optional: also quantise each finished row of y (N = K of the next INT8 GEMM) into qo, while
  // it is L2-hot; the work is then split over rows (chunks of all N columns). qo.q must not be a.
  // The engine sets it only for M >= the plan's q_min_m (zoi.graph.fusion, measured: kI8FuseQuantMinM;
  // below, the N split reads each weight once)
  QuantOut qo;
  // optional, with qo.q: the pool thread's scratch of i8_qchunk_floats(N) floats (64-byte aligned)
  // for the float rows of one row chunk; then y is NOT written (the rows are quantised from the
  // scratch). The engine sets it only where nothing reads y after the quantisation (Engine::finalize).
  float* y_scratch = nullptr;
  // 7: every weight of w is in [-63, 63] (the engine checks it at load: check_i8_weight_bits), so
  // avx2 / avx512 run a cheaper exact K loop (gemm_int8.cc); the integer sums are the same, and
  // the other ISAs ignore it. 8: any weight in [-127, 127].
  int w_bits = 8;
  // optional (appended): the second quantisation of the first row of each sequence (QuantOut's
  // q2): row m0 + m = cu[b] adds float(sum_k a2[b,k] w[n,k] - a2_zp[b] colsum[n]) * (a2_scale[b] *
  // w_scale[n]) after its bias, before the activation; y_i32 leaves it out. row0: the row of cu's
  // numbering that row 0 of a is (a row chunk run as a GEMM of its own)
  const void* a2 = nullptr;         // [B, lda * i8_a_bytes]; nullptr = off
  const float* a2_scale = nullptr;  // [B]
  const int32_t* a2_zp = nullptr;   // [B]
  const int32_t* cu = nullptr;      // [B + 1]
  int B = 0;
  int row0 = 0;
};
constexpr int kI8FuseQuantMinM = 256;
constexpr int kI8QChunkRows = 64;  // the most rows of a fused-quant chunk (gemm_int8.cc / gemm_amx.cc MQ)
inline size_t i8_qchunk_floats(int N) { return static_cast<size_t>(kI8QChunkRows) * ((N + 15) / 16 * 16); }
// the rows [m0, m0 + mr) of p as a GEMM of their own (row 0 = row m0) writing y_scratch (ldy: N
// rounded up to 16); a_row_bytes: bytes per row of a
inline GemmI8Args i8_chunk_to_scratch(const GemmI8Args& p, int m0, int mr, size_t a_row_bytes) {
  GemmI8Args c = p;
  c.a = static_cast<const char*>(p.a) + static_cast<size_t>(m0) * a_row_bytes;
  c.a_scale = p.a_scale + m0;
  c.a_zp = p.a_zp + m0;
  c.row0 = p.row0 + m0;
  if (p.res) c.res = p.res + static_cast<size_t>(m0) * p.ldr;
  c.M = mr;
  c.y = p.y_scratch;
  c.ldy = (p.N + 15) / 16 * 16;
  c.qo.q = nullptr;
  c.y_scratch = nullptr;
  return c;
}

// ---- FP32 GEMM: y = act(a @ w^T + bias) (+ res); w packed by pack_f32: [panel][K][panel col]
struct GemmF32Args {
  const float* a = nullptr;  // [M, lda]
  int lda = 0;
  const float* w = nullptr;  // packed
  const float* bias = nullptr;  // [Npad]
  int M = 0, N = 0, K = 0;
  float* y = nullptr;
  int ldy = 0;
  const float* res = nullptr;
  int ldr = 0;
  int act = 0;
};

// ---- y = LN(x (+ r)) * w + b, per row of H
struct LnArgs {
  const float* x = nullptr; int ldx = 0;
  const float* r = nullptr; int ldr = 0;  // optional residual
  const float* w = nullptr; const float* b = nullptr;
  float eps = 1e-12f;
  // rms: RMSNorm, y = s / sqrt(mean(s^2) + eps) * w + b (decoder architectures); post: the
  // residual is added after the norm, y = norm(x) * w + b + r (Gemma3's sandwich norms)
  bool rms = false, post = false;
  int M = 0, H = 0;
  float* y = nullptr; int ldy = 0;
  QuantOut qo;
};

// ---- x = LN(word[ids] + pos[positions] (+ type0)) * w + b
struct EmbedArgs {
  const int32_t* ids = nullptr; const int32_t* positions = nullptr;
  int T = 0, H = 0;
  const float* word = nullptr;                                     // [V, H] or
  const int8_t* word_q = nullptr; const float* word_scale = nullptr; // [V, H] int8 + [V]
  const float* pos = nullptr;    // [P, H]
  const float* type0 = nullptr;  // [H] or nullptr
  const float* type = nullptr;   // [TV, H] with types (pairs, heads): type[types[t]] instead of type0
  const int32_t* types = nullptr;  // [T] or nullptr
  const float* ln_w = nullptr; const float* ln_b = nullptr;
  float eps = 1e-12f;
  float* y = nullptr; int ldy = 0;
  QuantOut qo;
  // task adapters (LoRA): a token of task t = tok_task[t] >= 0 adds A_t[id] @ B_t to its word row
  // (lora_a [n][V][r], lora_b [n][r][H], s folded in) and lora_type[t] [H] (or null) after the type
  // row; tok_task null or -1: nothing
  const int32_t* tok_task = nullptr;
  const float* lora_a = nullptr; const float* lora_b = nullptr; const float* lora_type = nullptr;
  int lora_r = 0, lora_V = 0;
};

// ---- the task adapters' term of a linear (LoRA), after its GEMM ran without activation or
// residual: for each row m of task t = tok_task[m] >= 0, y[m] += (x[m] A_t^T) B_t^T; then, on every
// row, y = act(y) (+ res). a [n][r][K] (A_t), bt [n][r][N] (s B_t transposed: rows over N).
// Row by row, in a fixed order: a row's result depends on its own task only, never on the batch.
constexpr int kMaxLoraRank = 256;
struct LoraArgs {
  const float* x = nullptr; int ldx = 0; int K = 0;
  float* y = nullptr; int ldy = 0; int N = 0;
  const float* a = nullptr; const float* bt = nullptr; int r = 0;
  const int32_t* tok_task = nullptr;  // [M] or null (no row has a task)
  int M = 0, act = 0;
  const float* res = nullptr; int ldr = 0;
};

// ---- varlen attention: ctx = softmax(q k^T * scale) v per sequence and head
constexpr int kMaxHeadDim = 512;  // q / k norm rows on the stack

struct AttnArgs {
  const float* qkv = nullptr; int ldqkv = 0;  // [T, 3H]
  const int32_t* cu = nullptr; int B = 0;     // cu_seqlens [B+1]
  int heads = 0, d = 0;
  float scale = 1.f;
  float* out = nullptr; int ldo = 0;          // [T, H]
  float* scratch = nullptr;                   // nthreads * attn_scratch_floats(maxlen, d)
  size_t scratch_stride = 0;                  // floats per thread
  // optional (docs/ARCHITECTURE.md): MPNet's relative position bias, scores[h][i][j] +=
  // bias[h * (2 * bias_span - 1) + j - i + bias_span - 1]; ModernBERT's local window (keys with
  // |i - j| <= window, 0 = all) and RoPE of q and k at the position in the sequence:
  // x * cos + rotate_half(x) * sin with cos / sin [rope_rows][d / 2]. Sequences must fit the
  // tables (L <= bias_span, L <= rope_rows).
  const float* bias = nullptr; int bias_span = 0;
  int window = 0;
  const float* rope_cos = nullptr; const float* rope_sin = nullptr; int rope_rows = 0;
  // decoder architectures: kv_heads grouped KV heads (0: heads; qkv rows are q [heads d], k and
  // v [kv_heads d] each, head h reads KV head h / (heads / kv_heads)); causal: keys j <= i only;
  // q_norm / k_norm [d]: RMSNorm (eps qk_eps) of each q / k head before RoPE (Qwen3, Gemma3)
  int kv_heads = 0;
  bool causal = false;
  const float* q_norm = nullptr; const float* k_norm = nullptr; float qk_eps = 1e-6f;
  // opt-in precision of q.k^T and p.v: 0 FP32; 1 q.k^T in INT8 (q, k rows quantised
  // per token and head, s32 sums), softmax and p.v in FP32; 2 also p.v in INT8 (p as u8 0..255 of
  // the row max, v per channel) (csrc/kernels/attention_i8.h, VNNI / AMX tables); 3 both in BF16
  // on AMX tiles (tdpbf16ps, attention_amx.h; the AMX table on CPUs with AMX-BF16, head dim 32 /
  // 64). Plain attention only (no bias, window or RoPE); where a mode does not apply (the table's
  // ISA, as picked or forced by ZOI_CPU_ISA, has no kernel for it, too) the FP32 kernel runs.
  int prec = 0;
};

// ---- attention over a paged KV cache (generation: the decoder layer of zoi.decoder). The cache
// of one layer is two pools [num_blocks][kv_heads][block][d] (K and V); a sequence's position p lives
// in block tables[row * ldt + p / block] at slot p % block.
constexpr int kPagedMaxBlock = 256;  // tokens per KV block at most (a score row per block on the stack)

// Per token t: q / k RMSNorm per head (optional), RoPE (rotate_half) at its absolute position pos[t]
// (cos / sin [rows >= pos + 1][d / 2]), then its K and V rows written to the cache. q and k are
// rotated in place in the qkv rows ([q heads | k heads | v heads] x d).
struct PagedQkvArgs {
  float* qkv = nullptr; int ldqkv = 0;
  int T = 0, heads = 0, kv_heads = 0, d = 0;
  const int32_t* pos = nullptr;  // [T]
  const int32_t* row = nullptr;  // [T]: the block-table row of the token's sequence
  const int32_t* tables = nullptr; int ldt = 0;
  const float* cos = nullptr; const float* sin = nullptr;
  const float* q_norm = nullptr; const float* k_norm = nullptr; float qk_eps = 1e-6f;
  float* kc = nullptr; float* vc = nullptr;  // this layer's pools
  int block = 16;
};

// Causal attention of token t over positions 0..pos[t] of its sequence in the cache. A work item is
// (t, kv head, split s) over positions [s * chunk, min((s + 1) * chunk, pos + 1)); with splits > 1
// each item writes partials (max, sum, acc [d]) that paged_merge combines (long contexts, few tokens).
struct PagedAttnArgs {
  const float* q = nullptr; int ldq = 0;  // rotated q rows (inside qkv)
  int T = 0, heads = 0, kv_heads = 0, d = 0;
  const int32_t* pos = nullptr;
  const int32_t* row = nullptr;
  const int32_t* tables = nullptr; int ldt = 0;
  const float* kc = nullptr; const float* vc = nullptr;
  int block = 16;
  float scale = 1.f;
  int splits = 1, chunk = 1 << 30;
  float* out = nullptr; int ldo = 0;  // [T, heads * d]
  float* part = nullptr;              // [T][kv_heads][splits][heads / kv_heads][d + 2] when splits > 1
};

struct PoolArgs {
  const float* x = nullptr; int ldx = 0;  // [T, H]
  const int32_t* cu = nullptr; int B = 0, H = 0;
  int mode = 0;                           // 0 mean, 1 cls, 2 max, 3 splade: log1p(relu(max)), 4 last
  float* out = nullptr; int ldo = 0;      // [B, H]
};

// ---- gated linear unit: y[m, k] = act(x[m, k]) * x[m, n + k], k < n (x [M, 2n])
struct GluArgs {
  const float* x = nullptr; int ldx = 0;
  int M = 0, n = 0, act = 0;
  float* y = nullptr; int ldy = 0;
  QuantOut qo;
};

struct KernelTable {
  Isa isa;
  int i8_kgroup;      // K granularity of the packed INT8 weights / A rows
  int i8_a_bytes;     // bytes of A buffer per element (1: a only; 2: a and |a|)
  int i8_a_off_sym;   // off of the A format: stored a = q + off, zp' = zp + off
  int i8_a_off_asym;
  int i8_panel;       // columns per packed INT8 panel
  int f32_panel;      // columns per packed FP32 panel
  size_t (*pack_i8_bytes)(int N, int K);
  void (*pack_i8)(const int8_t* w, int N, int K, void* dst, int32_t* colsum);  // colsum [Npad]
  size_t (*pack_f32_bytes)(int N, int K);
  void (*pack_f32)(const float* w, int N, int K, float* dst);
  void (*gemm_i8)(const GemmI8Args& a, int tid, int nt);
  void (*gemm_f32)(const GemmF32Args& a, int tid, int nt);
  void (*quantize_rows)(const float* x, int ldx, int M, int K, const QuantOut& qo, int tid, int nt);
  void (*layernorm)(const LnArgs& a, int tid, int nt);
  void (*embed)(const EmbedArgs& a, int tid, int nt);
  void (*attention)(const AttnArgs& a, int tid, int nt);
  void (*pool)(const PoolArgs& a, int tid, int nt);
  void (*normalize)(float* p, int ld, int B, int H, int tid, int nt);
  void (*activation)(float* x, size_t n, int act);  // tests
  double (*peak_i8)(long iters);  // roofline loop; returns integer ops done
  // stored A value at (m, k) of a buffer with rows of ldq elements (tests); set also writes |v|
  int (*i8_a_get)(const void* q, int ldq, int m, int k);
  void (*i8_a_set)(void* q, int ldq, int m, int k, int v);
  void (*glu)(const GluArgs& a, int tid, int nt);
  void (*lora)(const LoraArgs& a, int tid, int nt);
  // paged attention (generation); paged_attention's parts cut T * kv_heads * splits items,
  // paged_merge's T * kv_heads
  void (*paged_qkv)(const PagedQkvArgs& a, int tid, int nt);
  void (*paged_attention)(const PagedAttnArgs& a, int tid, int nt);
  void (*paged_merge)(const PagedAttnArgs& a, int tid, int nt);
};

const KernelTable& kernel_table(Isa isa);  // throws if isa is not supported by this CPU

constexpr int kMaxLnH = 8192;  // widest LayerNorm row (a stack row of scratch per call)

inline size_t attn_scratch_floats(int maxlen, int d) {
  size_t lp = (static_cast<size_t>(maxlen) + 31) / 32 * 32;  // 32: AMX-BF16 key blocks (attention_amx.h)
  // K^T, V copy, rotated Q (RoPE), <= 8 score rows; + 16 score rows and a [16][d] tile (AMX-BF16)
  return 3 * lp * static_cast<size_t>(d) + 24 * lp + 16 * static_cast<size_t>(d) + 64;
}

inline void split_range(long total, int tid, int nt, long* lo, long* hi) {
  long base = total / nt, rem = total % nt;
  *lo = tid * base + (tid < rem ? tid : rem);
  *hi = *lo + base + (tid < rem ? 1 : 0);
}

inline int round_up(int x, int m) { return (x + m - 1) / m * m; }

// Error paths of the per-ISA files, compiled once with the base flags (dispatch.cc): a std::string
// built inside an ISA file would instantiate weak std:: code with that ISA's flags, and the linker
// keeps one copy for every caller (csrc/check_isa_symbols.py fails the build on such symbols).
[[noreturn]] void throw_weight_out_of_range(size_t row, size_t col);

#define ZOI_DECLARE_TABLE(ns) namespace ns { const KernelTable& table(); }
ZOI_DECLARE_TABLE(vnni)
ZOI_DECLARE_TABLE(avx512)
ZOI_DECLARE_TABLE(avx2)
ZOI_DECLARE_TABLE(avxvnni)
ZOI_DECLARE_TABLE(scalar)
ZOI_DECLARE_TABLE(amx)  // gemm_amx.cc: vnni's table with the AMX-INT8 GEMM
ZOI_DECLARE_TABLE(neon)     // aarch64 (docs/ARM.md): Advanced SIMD, Armv8.0
ZOI_DECLARE_TABLE(dotprod)  // + sdot (FEAT_DotProd)
ZOI_DECLARE_TABLE(i8mm)     // + smmla (FEAT_I8MM)
#undef ZOI_DECLARE_TABLE

}  // namespace zoi
