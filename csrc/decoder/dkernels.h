// Decoder kernels, compiled once per ISA (zoi::<isa>) like csrc/kernels. Every kernel
// takes (args, part, parts) and computes its share; parts are handed out dynamically by the model's
// step job. Nothing here allocates.
//
// Linear weights, FP32 or INT8 (per output channel scale), are packed alike on every ISA: panels of
// kDecPanel output channels, [panel][K][kDecPanel] (N padded with zeros) — numpy packs them
// (zoi/decoder/cpu.py), so the layout is one for all ISAs.
#pragma once
#include <cstddef>
#include <cstdint>

#include "../isa.h"

namespace zoi {

constexpr int kDecPanel = 32;
constexpr int kDecMaxD = 512;        // widest head
constexpr int kDecMaxBlock = 256;    // tokens per KV block at most

// y[M, N] = (x[M, K] . W^T) * scale[n] + bias[n] (+ res), W packed (above), wtype 0 f32 / 1 s8
struct DecLinear {
  const float* x = nullptr; int ldx = 0;
  const void* w = nullptr; int wtype = 0;
  const float* scale = nullptr;  // [Npad] (s8); nullptr for f32
  const float* bias = nullptr;   // [N] or nullptr
  int M = 0, N = 0, K = 0;
  float* y = nullptr; int ldy = 0;
  const float* res = nullptr; int ldr = 0;  // may not alias y
};

// y = x / sqrt(mean(x^2) + eps) * w per row of H
struct DecNorm {
  const float* x = nullptr; int ldx = 0;
  const float* w = nullptr; float eps = 1e-6f;
  int M = 0, H = 0;
  float* y = nullptr; int ldy = 0;
  const int32_t* rows = nullptr;  // optional: row m of y is row rows[m] of x (the last-token gather)
};

// Per token: q/k RMSNorm per head (Qwen3), RoPE (rotate_half), K/V written to the paged cache.
// qkv rows: [q heads | k heads | v heads] x D; q and k are rotated in place.
struct DecQkvPost {
  float* qkv = nullptr; int ldqkv = 0;
  int T = 0, nh = 0, nkv = 0, D = 0;
  const int32_t* pos = nullptr;    // [T] position of each token
  const int32_t* row = nullptr;    // [T] block-table row of the token's sequence
  const int32_t* tables = nullptr; int ldt = 0;  // block tables [rows, ldt]
  const float* cos = nullptr; const float* sin = nullptr;  // [max_pos, D/2]
  const float* qn = nullptr; const float* kn = nullptr; float eps = 1e-6f;  // qk norm or nullptr
  float* kc = nullptr; float* vc = nullptr;  // this layer's cache [num_blocks, nkv, BS, D]
  int bs = 16;
};

// Paged causal attention: token t attends to positions 0..pos[t] of its sequence in the cache;
// work item (t, kv head, split s) covers positions [s * chunk, min((s + 1) * chunk, pos + 1)).
// Splits > 1 write partials (max, sum, acc) merged by dec_attn_merge.
struct DecAttn {
  const float* q = nullptr; int ldq = 0;  // rotated q [T, nh * D] (inside qkv)
  int T = 0, nh = 0, nkv = 0, D = 0;
  const int32_t* pos = nullptr;
  const int32_t* row = nullptr;
  const int32_t* tables = nullptr; int ldt = 0;
  const float* kc = nullptr; const float* vc = nullptr;
  int bs = 16;
  float scale = 1.f;
  int splits = 1, chunk = 1 << 30;  // positions per split
  float* out = nullptr; int ldo = 0;  // [T, nh * D]
  float* part = nullptr;  // [T, nkv, splits, G, D + 2] when splits > 1
};

struct DecKernels {
  Isa isa;
  void (*linear)(const DecLinear& a, int part, int parts);
  int (*linear_parts)(int M, int N);
  void (*rmsnorm)(const DecNorm& a, int part, int parts);
  void (*qkv_post)(const DecQkvPost& a, int part, int parts);
  void (*attention)(const DecAttn& a, int part, int parts);  // parts = T * nkv * splits
  void (*attn_merge)(const DecAttn& a, int part, int parts);  // parts = T * nkv
  void (*silu_mul)(const float* gu, int ldgu, int M, int I, float* y, int ldy, int part, int parts);
};

const DecKernels& dec_kernels(Isa isa);  // throws if the CPU does not run isa

#define ZOI_DECLARE_DTABLE(ns) namespace ns { const DecKernels& dec_table(); }
ZOI_DECLARE_DTABLE(vnni)
ZOI_DECLARE_DTABLE(avx512)
ZOI_DECLARE_DTABLE(avx2)
ZOI_DECLARE_DTABLE(scalar)
ZOI_DECLARE_DTABLE(neon)  // aarch64: also the dotprod and i8mm tables' (the decoder's own kernels are FP32)
#undef ZOI_DECLARE_DTABLE

}  // namespace zoi
