// INT8 GEMM with fused epilogue, compiled once per ISA. Weights are s8 in [-127, 127] on every
// ISA (1 byte each), packed per panel of PW = NB * LANES columns as [K/4][panel col][4] so the
// micro-kernel streams them contiguously; A rows are 8-bit (qrow.h gives the format):
//   vnni:   u8 a x s8 w -> s32 with vpdpbusd (64 MACs / instruction)
//   avxvnni: the same with the VEX vpdpbusd on ymm (32 MACs / instruction), 4 x 3 ymm blocking
//   avx512, avx2: the sign trick on vpmaddubsw (u8 x s8 -> s16 pairs) + vpmaddwd with ones (s16
//           pairs -> s32): a is s8 (q, or q - 128 for asymmetric rows, with the colsum correction
//           of the zero point), the u8 operand is |a| <= 128 (stored next to a by the quantiser),
//           the s8 operand w * sign(a) in [-127, 127] (vpsignb; AVX-512: vpblendmb of w and -w), so every
//           s16 pair |a0| s0 + |a1| s1 is at most 2 * 128 * 127 = 32512 < 32767: never saturates,
//           exact. (Needs w != -128: pack() refuses it; |w| x sign(a, w) instead would break at
//           a = -128, whose negation wraps.) The s32 sums are exact for K < 2^31 / (128 * 127).
//           4 vector ops per 32 MACs, as many as the 16-bit vpmaddwd kernel, at half the bytes.
//   scalar: plain C++ over the same packed layout
//   aarch64 (A rows s8 as scalar's; s32 sums exact, the same as scalar's bit for bit):
//   neon:    smull / smlal (s8 x s8 -> s16, two products per lane: |a w| + |a w| <= 2 * 128 * 127
//            = 32512, never wraps) + sadalp (s16 pairs -> s32), 4 x 8 blocking
//   dotprod: sdot by element (4 columns x 4 k of a weight vector against one 4-byte group of a
//            16-byte A row load), 8 x 8 blocking
//   i8mm:    smmla (2 rows x 8 k by 2 columns x 8 k -> 2 x 2 s32, 32 MACs), weights packed in
//            groups of 8 k ([K/8][panel col][8]), 4 x 16 blocking
// Register blocking MR rows x NB vectors; M is cut into chunks of <= MC rows so that a chunk of A
// and one weight panel (K * PW bytes: K = 3072 and PW = 48, 144 KiB) stay in L2 while the panel
// is reused.
#include "kernels.h"
#include "qrow.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {
namespace {

using WE = int8_t;
constexpr int KG = 4;  // k per 32-bit group (4 bytes of A broadcast at once)

#if defined(ZOI_ISA_VNNI)
using IV = __m512i;
constexpr int LANES = 16, MR = 8, NB = 3;
struct ARow { IV a; };  // broadcast of 4 u8 of one A row
inline ARow arow(const uint8_t* p, int) { int32_t v; std::memcpy(&v, p, 4); return {_mm512_set1_epi32(v)}; }
inline IV izero() { return _mm512_setzero_si512(); }
inline IV loadw(const WE* p) { return _mm512_load_si512(p); }
inline IV dot(IV acc, const ARow& a, IV w) { return _mm512_dpbusd_epi32(acc, a.a, w); }
inline IV isub_zp(IV a, int zp, const int32_t* p) { return _mm512_sub_epi32(a, _mm512_mullo_epi32(_mm512_set1_epi32(zp), _mm512_loadu_si512(p))); }
inline V::T tof(IV a) { return _mm512_cvtepi32_ps(a); }
inline void istore(int32_t* p, IV a) { _mm512_store_si512(p, a); }
inline IV iload(const int32_t* p) { return _mm512_load_si512(p); }
#elif defined(ZOI_ISA_AVX512)
using IV = __m512i;
constexpr int LANES = 16, MR = 8, NB = 3;
struct ARow { IV abs; __mmask64 neg; };  // |a| (u8) and the lanes where a < 0
inline ARow arow(const uint8_t* p, int ldq) {
  int32_t v, u;
  std::memcpy(&v, p, 4);
  std::memcpy(&u, p + ldq, 4);
  return {_mm512_set1_epi32(u), _mm512_movepi8_mask(_mm512_set1_epi32(v))};
}
inline IV izero() { return _mm512_setzero_si512(); }
struct WV { IV w, nw; };  // a weight vector and its negation (once per k-group, for all rows)
inline WV loadw(const WE* p) {
  const IV w = _mm512_load_si512(p);
  IV nw = _mm512_sub_epi8(_mm512_setzero_si512(), w);
  __asm__("" : "+v"(nw));  // opaque: else GCC turns the blend below back into a copy + masked sub
  return {w, nw};
}
inline IV dot(IV acc, const ARow& a, const WV& w) {
  const IV sw = _mm512_mask_blend_epi8(a.neg, w.w, w.nw);  // w * sign(a) (a = 0: |a| = 0)
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(a.abs, sw), _mm512_set1_epi16(1)));
}
inline IV isub_zp(IV a, int zp, const int32_t* p) { return _mm512_sub_epi32(a, _mm512_mullo_epi32(_mm512_set1_epi32(zp), _mm512_loadu_si512(p))); }
inline V::T tof(IV a) { return _mm512_cvtepi32_ps(a); }
inline void istore(int32_t* p, IV a) { _mm512_store_si512(p, a); }
inline IV iload(const int32_t* p) { return _mm512_load_si512(p); }
// 7-bit weights (GemmI8Args::w_bits = 7, |w| <= 63): see the AVX2 block below
#define ZOI_I8_W7 1
inline IV arow7(const uint8_t* p) { int32_t v; std::memcpy(&v, p, 4); return _mm512_xor_si512(_mm512_set1_epi32(v), _mm512_set1_epi8(char(0x80))); }
inline IV loadw7(const WE* p) { return _mm512_load_si512(p); }
inline IV dot7(IV acc, IV u, IV w) { return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, w), _mm512_set1_epi16(1))); }
inline IV w7_init(const int32_t* cs) { return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(_mm512_loadu_si512(cs), 7)); }
#elif defined(ZOI_ISA_AVXVNNI)
using IV = __m256i;
// VEX vpdpbusd ymm (u8 a x s8 w -> s32, 32 MACs, 1 instruction): 4 x 3 accumulators + 3 weight
// vectors + the broadcast = all 16 ymm registers. 7 loads per 12 vpdpbusd (6 x 2: 8), 4 A-row
// streams (6), and M = 16 / 128 and N = 384 / 1152 / 1536 split into whole tiles (PW = 24).
// Against 6 x 2, interleaved in one process (lab/cpu/avxvnni_blocking.cc, K loop + s32 store,
// one thread CPU time, load ~20): 4-5% faster at K = 384 with M <= 128, 16-19% at K = 1536 or
// M = 512.
constexpr int LANES = 8, MR = 4, NB = 3;
struct ARow { IV a; };  // broadcast of 4 u8 of one A row
inline ARow arow(const uint8_t* p, int) { int32_t v; std::memcpy(&v, p, 4); return {_mm256_set1_epi32(v)}; }
inline IV izero() { return _mm256_setzero_si256(); }
inline IV loadw(const WE* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
inline IV dot(IV acc, const ARow& a, IV w) { return _mm256_dpbusd_avx_epi32(acc, a.a, w); }
inline IV isub_zp(IV a, int zp, const int32_t* p) { return _mm256_sub_epi32(a, _mm256_mullo_epi32(_mm256_set1_epi32(zp), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))); }
inline V::T tof(IV a) { return _mm256_cvtepi32_ps(a); }
inline void istore(int32_t* p, IV a) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), a); }
inline IV iload(const int32_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
#elif defined(ZOI_ISA_AVX2)
using IV = __m256i;
// 5 x 2 ymm accumulators + 2 weight vectors + a, |a|, a temporary and the ones: all 16 ymm
// registers (6 x 2 spills two accumulators to the stack every k-group: 4% slower at M = 4096,
// equal at M <= 128, interleaved runs on the EPYC dev VM)
constexpr int LANES = 8, MR = 5, NB = 2;
struct ARow { IV a, abs; };  // broadcasts of 4 s8 of one A row and of their |a|
inline ARow arow(const uint8_t* p, int ldq) {
  int32_t v, u;
  std::memcpy(&v, p, 4);
  std::memcpy(&u, p + ldq, 4);
  return {_mm256_set1_epi32(v), _mm256_set1_epi32(u)};
}
inline IV izero() { return _mm256_setzero_si256(); }
inline IV loadw(const WE* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
inline IV dot(IV acc, const ARow& a, IV w) {
  const IV sw = _mm256_sign_epi8(w, a.a);  // w * sign(a), in [-127, 127]
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a.abs, sw), _mm256_set1_epi16(1)));
}
inline IV isub_zp(IV a, int zp, const int32_t* p) { return _mm256_sub_epi32(a, _mm256_mullo_epi32(_mm256_set1_epi32(zp), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))); }
inline V::T tof(IV a) { return _mm256_cvtepi32_ps(a); }
inline void istore(int32_t* p, IV a) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), a); }
inline IV iload(const int32_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
// 7-bit weights (GemmI8Args::w_bits = 7, |w| <= 63): u = a ^ 0x80 = a + 128 in [0, 255] (u8) x w
// (s8) in vpmaddubsw: every s16 pair is at most 2 * 255 * 63 = 32130 < 32767, never saturates, so
// no sign trick: vpmaddubsw, vpmaddwd, vpaddd per 32 MACs and one vpxor per row and k-group (3.2
// ops at 5 x 2 against 4). The + 128 sum(w) it adds is taken off up front: the accumulators start
// at -128 colsum, so the s32 sums equal the 8-bit path's bit for bit. Same panels, same |a| rows
// (unread). (Two k-groups' sign-trick pairs summed in s16 before one vpmaddwd, 3.5 ops, needs 4
// weight and 4 A vectors live and measured slower: lab/cpu/avx2_w7_formulations.cc.)
#define ZOI_I8_W7 1
inline IV arow7(const uint8_t* p) { int32_t v; std::memcpy(&v, p, 4); return _mm256_xor_si256(_mm256_set1_epi32(v), _mm256_set1_epi8(char(0x80))); }
inline IV loadw7(const WE* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
inline IV dot7(IV acc, IV u, IV w) { return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, w), _mm256_set1_epi16(1))); }
inline IV w7_init(const int32_t* cs) { return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(cs)), 7)); }
#elif defined(ZOI_ISA_NEON)
using IV = int32x4_t;
// 4 s32 lanes = 4 columns per vector (LANES = V::N, the epilogue's float width); the K loops
// are the micro-kernels below (micro_arm), not the generic one
#if defined(ZOI_ISA_I8MM)
// 2 row pairs x 8 column pairs: 16 smmla per 8 k on 2 A pair loads (ldr d + ld1 {.d}[1]) and 8
// weight vectors, 16 + 2 + 8 registers. llvm-mca (Neoverse V1): 87% of the smmla peak; 8 x 8
// (16 smmla, 4 A pairs) 79%, and 8 x 8 from 16-byte A loads split by zip1 / zip2 spills (65%)
constexpr int LANES = 4, MR = 4, NB = 4;
#elif defined(ZOI_ISA_DOTPROD)
constexpr int LANES = 4, MR = 8, NB = 2;
#else
constexpr int LANES = 4, MR = 4, NB = 2;
#endif
inline IV izero() { return vdupq_n_s32(0); }
inline IV isub_zp(IV a, int zp, const int32_t* p) { return vsubq_s32(a, vmulq_s32(vdupq_n_s32(zp), vld1q_s32(p))); }
inline V::T tof(IV a) { return vcvtq_f32_s32(a); }
inline void istore(int32_t* p, IV a) { vst1q_s32(p, a); }
inline IV iload(const int32_t* p) { return vld1q_s32(p); }
#else
using IV = int32_t;
constexpr int LANES = 1, MR = 4, NB = 4;
struct ARow { const int8_t* p; };
inline ARow arow(const uint8_t* p, int) { return {reinterpret_cast<const int8_t*>(p)}; }
inline IV izero() { return 0; }
inline const WE* loadw(const WE* p) { return p; }
inline IV dot(IV acc, const ARow& a, const WE* w) {
  return acc + int32_t(a.p[0]) * w[0] + int32_t(a.p[1]) * w[1] + int32_t(a.p[2]) * w[2] + int32_t(a.p[3]) * w[3];
}
inline IV isub_zp(IV a, int zp, const int32_t* p) { return a - zp * *p; }
inline V::T tof(IV a) { return static_cast<float>(a); }
inline void istore(int32_t* p, IV a) { *p = a; }
inline IV iload(const int32_t* p) { return *p; }
#endif

constexpr int PW = LANES * NB;  // columns per panel
// k per packed weight group: KG, but 8 on i8mm (smmla's 8 k per column); A rows keep KG (Kp =
// round_up(K, 4) on every ISA), the packed panel has round_up(Kp, KP) rows of k (zero padded)
#if defined(ZOI_ISA_I8MM)
constexpr int KP = 8;
#else
constexpr int KP = KG;
#endif
inline size_t panel_elems_of(int Kp) {
  if constexpr (KP == KG) return static_cast<size_t>(Kp) * PW;
  else return static_cast<size_t>(round_up(Kp, KP)) * PW;
}
constexpr int MC = 192 / MR * MR;  // rows per M chunk (multiple of MR): one chunk up to M ~ 192, so
                                // small batches split over N (each weight byte read once)
static_assert(MC % MR == 0, "MC must be a multiple of MR");

// acc[r][j] = sum over kgroups of A row r x vector j of the panel. The accumulators stay in registers
// (only constant indices after full unrolling).
// PF: software-prefetch the panel PF_DIST bytes ahead (the first row block of a panel streams
// it from L3; later row blocks find it in L1/L2)
constexpr int PF_DIST = 2048;
#if !defined(ZOI_ISA_NEON)
// W7: the 7-bit-weight loop (ISAs with ZOI_I8_W7); colsum: the panel's, for its start value
template <int R, bool PF, bool W7 = false>
ZOI_INLINE void micro(const uint8_t* a, int lda, const WE* w, int kgroups, IV (&acc)[R][NB],
                      [[maybe_unused]] const int32_t* colsum = nullptr) {
#if defined(ZOI_I8_W7)
  if constexpr (W7) {
    IV c0[NB];
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) c0[j] = w7_init(colsum + j * LANES);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) acc[r][j] = c0[j];
    for (int g = 0; g < kgroups; ++g) {
      const WE* wg = w + static_cast<size_t>(g) * PW * KG;
      if (PF) {
        constexpr int kBytes = PW * KG * static_cast<int>(sizeof(WE));
#pragma GCC unroll 8
        for (int o = 0; o < kBytes; o += 64)
          __builtin_prefetch(reinterpret_cast<const char*>(wg) + PF_DIST + o, 0, 3);
      }
      IV b[NB];
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) b[j] = loadw7(wg + j * LANES * KG);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const IV u = arow7(a + static_cast<size_t>(r) * lda * kABytes + g * KG);
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) acc[r][j] = dot7(acc[r][j], u, b[j]);
      }
    }
    return;
  }
#endif
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[r][j] = izero();
  for (int g = 0; g < kgroups; ++g) {
    const WE* wg = w + static_cast<size_t>(g) * PW * KG;
    if (PF) {
      constexpr int kBytes = PW * KG * static_cast<int>(sizeof(WE));
#pragma GCC unroll 8
      for (int o = 0; o < kBytes; o += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(wg) + PF_DIST + o, 0, 3);
    }
    decltype(loadw(wg)) b[NB];
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) b[j] = loadw(wg + j * LANES * KG);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const ARow av = arow(a + static_cast<size_t>(r) * lda * kABytes + g * KG, lda);
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) acc[r][j] = dot(acc[r][j], av, b[j]);
    }
  }
}
#else
template <bool PF>
ZOI_INLINE void prefetch_group(const WE* wg) {
  if (PF) {
    constexpr int kBytes = PW * KP * static_cast<int>(sizeof(WE));
#pragma GCC unroll 8
    for (int o = 0; o < kBytes; o += 64) __builtin_prefetch(reinterpret_cast<const char*>(wg) + PF_DIST + o, 0, 3);
  }
}

#if defined(ZOI_ISA_I8MM)
// rows (2p, 2p + 1) x columns (2q, 2q + 1) accumulate in c[p][q] = [r0c0 r0c1 r1c0 r1c1]; an odd
// R reads its last row twice (the copy's sums are dropped). A pair operand = 8 k of each row.
ZOI_INLINE int8x16_t pair8(const int8_t* const* rows, int p, int k) {
  return vcombine_s8(vld1_s8(rows[2 * p] + k), vld1_s8(rows[2 * p + 1] + k));
}
template <int R, bool PF>
ZOI_INLINE void micro(const uint8_t* a, int lda, const WE* w, int kgroups, IV (&acc)[R][NB]) {
  constexpr int RP = (R + 1) / 2, CP = 2 * NB;
  const int8_t* rows[2 * RP];
#pragma GCC unroll 8
  for (int i = 0; i < 2 * RP; ++i) rows[i] = reinterpret_cast<const int8_t*>(a) + static_cast<size_t>(i < R ? i : R - 1) * lda;
  IV c[RP][CP];
#pragma GCC unroll 8
  for (int p = 0; p < RP; ++p)
#pragma GCC unroll 8
    for (int q = 0; q < CP; ++q) c[p][q] = izero();
  const int steps = kgroups / 2;  // whole groups of 8 k; an odd kgroups leaves 4 k
  auto step = [&](const WE* wg, const int8x16_t (&ap)[RP]) __attribute__((always_inline)) {
#pragma GCC unroll 8
    for (int q = 0; q < CP; ++q) {
      const int8x16_t b = vld1q_s8(wg + q * 16);
#pragma GCC unroll 8
      for (int p = 0; p < RP; ++p) c[p][q] = vmmlaq_s32(c[p][q], ap[p], b);
    }
  };
  int s = 0;
  for (; s < steps; ++s) {  // steps of 8 k
    const WE* wg = w + static_cast<size_t>(s) * PW * KP;
    prefetch_group<PF>(wg);
    int8x16_t a0[RP];
#pragma GCC unroll 8
    for (int p = 0; p < RP; ++p) a0[p] = pair8(rows, p, s * 8);
    step(wg, a0);
  }
  if (kgroups & 1) {  // the last 4 k of the rows (Kp % 8 == 4), the upper 4 zero (as the packed weights)
    int8x16_t a0[RP];
#pragma GCC unroll 8
    for (int p = 0; p < RP; ++p) {
      uint32_t u0, u1;
      std::memcpy(&u0, rows[2 * p] + s * 8, 4);
      std::memcpy(&u1, rows[2 * p + 1] + s * 8, 4);
      a0[p] = vreinterpretq_s8_u64(vcombine_u64(vcreate_u64(u0), vcreate_u64(u1)));
    }
    step(w + static_cast<size_t>(s) * PW * KP, a0);
  }
  // 2 x 2 blocks -> rows of 4 columns: row 2p = the low halves of c[p][2j], c[p][2j + 1], row 2p + 1 the high ones
#pragma GCC unroll 8
  for (int p = 0; p < RP; ++p)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const int64x2_t x = vreinterpretq_s64_s32(c[p][2 * j]), y = vreinterpretq_s64_s32(c[p][2 * j + 1]);
      acc[2 * p][j] = vreinterpretq_s32_s64(vzip1q_s64(x, y));
      if (2 * p + 1 < R) acc[2 * p + 1][j] = vreinterpretq_s32_s64(vzip2q_s64(x, y));
    }
}
#elif defined(ZOI_ISA_DOTPROD)
// one 4-k group G of 16-byte A row loads (a[r] holds groups g .. g + 3) against the group's weight
// vectors: sdot by element (the lane is an immediate, hence the template)
template <int G, int R>
ZOI_INLINE void dot_group(const WE* wg, const int8x16_t (&a)[R], IV (&acc)[R][NB]) {
  int8x16_t b[NB];
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) b[j] = vld1q_s8(wg + j * LANES * KG);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[r][j] = vdotq_laneq_s32(acc[r][j], b[j], a[r], G);
}
template <int R, bool PF>
ZOI_INLINE void micro(const uint8_t* a, int lda, const WE* w, int kgroups, IV (&acc)[R][NB]) {
  const int8_t* a8 = reinterpret_cast<const int8_t*>(a);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[r][j] = izero();
  int g = 0;
  for (; g + 4 <= kgroups; g += 4) {
    const WE* wg = w + static_cast<size_t>(g) * PW * KG;
    prefetch_group<PF>(wg);
    prefetch_group<PF>(wg + 2 * PW * KG);
    int8x16_t av[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) av[r] = vld1q_s8(a8 + static_cast<size_t>(r) * lda + g * KG);
    dot_group<0>(wg, av, acc);
    dot_group<1>(wg + PW * KG, av, acc);
    dot_group<2>(wg + 2 * PW * KG, av, acc);
    dot_group<3>(wg + 3 * PW * KG, av, acc);
  }
  for (; g < kgroups; ++g) {  // 1-3 groups left: each row's 4 bytes broadcast
    const WE* wg = w + static_cast<size_t>(g) * PW * KG;
    int8x16_t b[NB];
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) b[j] = vld1q_s8(wg + j * LANES * KG);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t v;
      std::memcpy(&v, a8 + static_cast<size_t>(r) * lda + g * KG, 4);
      const int8x16_t av = vreinterpretq_s8_s32(vdupq_n_s32(v));
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) acc[r][j] = vdotq_s32(acc[r][j], b[j], av);
    }
  }
}
#else
// Armv8.0: per weight vector (4 columns x 4 k) and A group broadcast [a0 a1 a2 a3] x 4, smull
// gives columns 0-1's 8 products (s16), smull2 columns 2-3's; two groups share one s16 vector
// (smlal), sadalp adds its pairs into s32: lo = [c0 c0 c1 c1], hi = [c2 c2 c3 c3] partial sums,
// combined at the end by one addp into [c0 c1 c2 c3]
template <int R, bool PF>
ZOI_INLINE void micro(const uint8_t* a, int lda, const WE* w, int kgroups, IV (&acc)[R][NB]) {
  const int8_t* a8 = reinterpret_cast<const int8_t*>(a);
  IV lo[R][NB], hi[R][NB];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) lo[r][j] = hi[r][j] = izero();
  int g = 0;
  for (; g + 2 <= kgroups; g += 2) {
    const WE* wg = w + static_cast<size_t>(g) * PW * KG;
    prefetch_group<PF>(wg);
    int8x16_t b0[NB], b1[NB];
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      b0[j] = vld1q_s8(wg + j * LANES * KG);
      b1[j] = vld1q_s8(wg + PW * KG + j * LANES * KG);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int32x2_t a2 = vreinterpret_s32_s8(vld1_s8(a8 + static_cast<size_t>(r) * lda + g * KG));
      const int8x16_t a0 = vreinterpretq_s8_s32(vdupq_lane_s32(a2, 0)), a1 = vreinterpretq_s8_s32(vdupq_lane_s32(a2, 1));
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) {
        const int16x8_t pl = vmlal_s8(vmull_s8(vget_low_s8(a0), vget_low_s8(b0[j])), vget_low_s8(a1), vget_low_s8(b1[j]));
        const int16x8_t ph = vmlal_high_s8(vmull_high_s8(a0, b0[j]), a1, b1[j]);
        lo[r][j] = vpadalq_s16(lo[r][j], pl);
        hi[r][j] = vpadalq_s16(hi[r][j], ph);
      }
    }
  }
  if (g < kgroups) {  // an odd group
    const WE* wg = w + static_cast<size_t>(g) * PW * KG;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t v;
      std::memcpy(&v, a8 + static_cast<size_t>(r) * lda + g * KG, 4);
      const int8x16_t a0 = vreinterpretq_s8_s32(vdupq_n_s32(v));
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) {
        const int8x16_t b = vld1q_s8(wg + j * LANES * KG);
        lo[r][j] = vpadalq_s16(lo[r][j], vmull_s8(vget_low_s8(a0), vget_low_s8(b)));
        hi[r][j] = vpadalq_s16(hi[r][j], vmull_high_s8(a0, b));
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[r][j] = vpaddq_s32(lo[r][j], hi[r][j]);
}
#endif
#endif

template <int R, bool PF, bool W7 = false>
__attribute__((noinline)) void micro_st(const uint8_t* a, int lda, const WE* w, int kgroups, int32_t* out,
                                        const int32_t* colsum = nullptr) {
  IV acc[R][NB];
  micro<R, PF, W7>(a, lda, w, kgroups, acc, colsum);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) istore(out + r * PW + j * LANES, acc[r][j]);
}

// the epilogue of a full tile without activation, straight from the accumulator registers
// (no spill to the tile and reload): float(sum - zp * colsum) * (a_scale * w_scale) + bias (+ res)
template <int R>
ZOI_INLINE void epi_regs(const GemmI8Args& p, int m, int n0, IV (&acc)[R][NB]) {
  V::T ws[NB], bs[NB];
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) {
    ws[j] = V::load(p.w_scale + n0 + j * LANES);
    bs[j] = V::load(p.bias + n0 + j * LANES);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const int row = m + r;
    const V::T as = V::set(p.a_scale[row]);
    const int zp = p.a_zp[row];
    float* y = p.y + static_cast<size_t>(row) * p.ldy + n0;
    const float* res = p.res ? p.res + static_cast<size_t>(row) * p.ldr + n0 : nullptr;
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      V::T f = V::add(V::mul(tof(isub_zp(acc[r][j], zp, p.colsum + n0 + j * LANES)), V::mul(as, ws[j])), bs[j]);
      if (res) f = V::add(f, V::load(res + j * LANES));
      V::store(y + j * LANES, f);
    }
  }
}

// float(sum - zp * colsum) * (a_scale * w_scale) + bias of a tile into t[R][PW], in this order
// (the emulation's rounding)
template <int R>
ZOI_INLINE void dequant_regs(const GemmI8Args& p, int m, int n0, IV (&acc)[R][NB], float* t) {
  V::T ws[NB], bs[NB];
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) {
    ws[j] = V::load(p.w_scale + n0 + j * LANES);
    bs[j] = V::load(p.bias + n0 + j * LANES);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const V::T as = V::set(p.a_scale[m + r]);
    const int zp = p.a_zp[m + r];
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j)
      V::store(t + r * PW + j * LANES,
               V::add(V::mul(tof(isub_zp(acc[r][j], zp, p.colsum + n0 + j * LANES)), V::mul(as, ws[j])), bs[j]));
  }
}

// the second quantisation of the first rows of sequences among rows [m, m + R) (GemmI8Args::a2):
// each such row of the dequantised tile t (bias added) gets float(sum2 - zp2 * colsum) * (s2 *
// w_scale), its integer sum from the same (L1-hot) weight panel (the 8-bit K loop: the same
// sums as the 7-bit one). has_first_rows: whether the tile holds such a row (then it takes the
// general epilogue, not epi_regs).
template <int R>
ZOI_INLINE bool has_first_rows(const GemmI8Args& p, int m) {
  int seq[R];
  return p.a2 && first_rows_in(p.cu, p.B, p.row0 + m, R, seq) > 0;
}
template <int R>
__attribute__((noinline)) void add_first_rows(const GemmI8Args& p, int m, int n0, const WE* wpanel, float* t) {
  int seq[R];
  if (first_rows_in(p.cu, p.B, p.row0 + m, R, seq) == 0) return;
  for (int r = 0; r < R; ++r) {
    const int b = seq[r];
    if (b < 0) continue;
    const uint8_t* a2 = static_cast<const uint8_t*>(p.a2) + static_cast<size_t>(b) * p.lda * kABytes;
    IV sacc[1][NB];
#if defined(ZOI_ISA_AVX2) && !defined(ZOI_ISA_AVXVNNI)
    alignas(32) int32_t st[PW];
    micro_st<1, false>(a2, p.lda, wpanel, p.Kp / KG, st);
    for (int j = 0; j < NB; ++j) sacc[0][j] = iload(st + j * LANES);
#else
    micro<1, false>(a2, p.lda, wpanel, p.Kp / KG, sacc);
#endif
    const V::T s2 = V::set(p.a2_scale[b]);
    const int zp2 = p.a2_zp[b];
    for (int j = 0; j < NB; ++j) {
      const V::T ws = V::load(p.w_scale + n0 + j * LANES);
      const V::T d = V::mul(tof(isub_zp(sacc[0][j], zp2, p.colsum + n0 + j * LANES)), V::mul(s2, ws));
      V::store(t + r * PW + j * LANES, V::add(V::load(t + r * PW + j * LANES), d));
    }
  }
}

template <int R>
inline void tile(const GemmI8Args& p, int m, int n0, const WE* wpanel, bool first) {
  IV racc[R][NB];
  const uint8_t* a = static_cast<const uint8_t*>(p.a) + static_cast<size_t>(m) * p.lda * kABytes;
#if defined(ZOI_ISA_AVX2) && !defined(ZOI_ISA_AVXVNNI)
  // the sign-trick K loop needs all 16 ymm registers: compiled apart (no epilogue value live
  // across it), its sums through the L1-hot tile (in registers: 10% slower, spills)
  alignas(32) int32_t st[R * PW];
  if (p.w_bits == 7) {  // the 7-bit-weight loop (above): the same sums
    if (first) micro_st<R, true, true>(a, p.lda, wpanel, p.Kp / KG, st, p.colsum + n0);
    else micro_st<R, false, true>(a, p.lda, wpanel, p.Kp / KG, st, p.colsum + n0);
  } else if (first) micro_st<R, true>(a, p.lda, wpanel, p.Kp / KG, st);
  else micro_st<R, false>(a, p.lda, wpanel, p.Kp / KG, st);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) racc[r][j] = iload(st + r * PW + j * LANES);
#else
#if defined(ZOI_I8_W7)
  if (p.w_bits == 7) {
    if (first) micro<R, true, true>(a, p.lda, wpanel, p.Kp / KG, racc, p.colsum + n0);
    else micro<R, false, true>(a, p.lda, wpanel, p.Kp / KG, racc, p.colsum + n0);
  } else
#endif
  if (first) micro<R, true>(a, p.lda, wpanel, p.Kp / KG, racc);
  else micro<R, false>(a, p.lda, wpanel, p.Kp / KG, racc);
#endif
  const int ncols = p.N - n0 < PW ? p.N - n0 : PW;
  if (p.y_i32) {
    alignas(64) int32_t acc[R * PW];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) istore(acc + r * PW + j * LANES, racc[r][j]);
    for (int r = 0; r < R; ++r) {
      const int zp = p.a_zp[m + r];
      int32_t* dst = p.y_i32 + static_cast<size_t>(m + r) * p.ldy + n0;
      for (int e = 0; e < ncols; ++e) dst[e] = acc[r * PW + e] - zp * p.colsum[n0 + e];
    }
    return;
  }
  if (p.act == ACT_NONE && ncols == PW && !has_first_rows<R>(p, m)) {  // one pass from the registers straight into y
    epi_regs<R>(p, m, n0, racc);
    return;
  }
  // 1. dequantise from the registers into the (L1-hot) float tile (the padding columns have
  //    w_scale = bias = 0 and colsum = 0)
  alignas(64) float t[R * PW];
  dequant_regs<R>(p, m, n0, racc, t);
  if (p.a2) add_first_rows<R>(p, m, n0, wpanel, t);
  // 2. activation over the whole tile (independent vectors interleaved)
  if (p.act != ACT_NONE) vact_inplace(t, R * PW, p.act);
  // 3. residual, store
  for (int r = 0; r < R; ++r) {
    const int row = m + r;
    float* y = p.y + static_cast<size_t>(row) * p.ldy + n0;
    const float* res = p.res ? p.res + static_cast<size_t>(row) * p.ldr + n0 : nullptr;
    for (int c = 0; c < ncols; c += LANES) {
      V::T f = V::load(t + r * PW + c);
      if (res) f = V::add(f, V::load_n(res + c, ncols - c));
      V::store_n(y + c, f, ncols - c);
    }
  }
}

template <int R>
inline void tile_rows(int mr, const GemmI8Args& p, int m, int n0, const WE* wpanel, bool first) {
  if (mr == R) tile<R>(p, m, n0, wpanel, first);
  else if constexpr (R > 1) tile_rows<R - 1>(mr, p, m, n0, wpanel, first);
}

size_t pack_bytes(int N, int K) {
  return static_cast<size_t>(round_up(N, PW)) * round_up(K, KP) * sizeof(WE);
}

void pack(const int8_t* w, int N, int K, void* dst, int32_t* colsum) {
  const int Kp = round_up(K, KP), Np = round_up(N, PW);
  for (size_t i = 0; i < static_cast<size_t>(N) * K; ++i)  // the sign trick's bound (and the contract)
    if (w[i] == -128)
      throw_weight_out_of_range(i / K, i % K);
  WE* d = static_cast<WE*>(dst);
  for (int p = 0; p < Np / PW; ++p)
    for (int g = 0; g < Kp / KP; ++g)
      for (int c = 0; c < PW; ++c)
        for (int e = 0; e < KP; ++e) {
          const int n = p * PW + c, k = g * KP + e;
          *d++ = (n < N && k < K) ? static_cast<WE>(w[static_cast<size_t>(n) * K + k]) : WE(0);
        }
  for (int n = 0; n < Np; ++n) {
    int32_t s = 0;
    if (n < N)
      for (int k = 0; k < K; ++k) s += w[static_cast<size_t>(n) * K + k];
    colsum[n] = s;
  }
}

// rows per chunk when the GEMM also quantises its output rows: the chunk's float rows
// (MQ x N x 4 bytes: 384 KiB at N = 1536) stay in L2 until they are quantised
constexpr int MQ = 64 / MR * MR;
static_assert(MQ <= kI8QChunkRows, "y_scratch holds kI8QChunkRows rows");

void gemm(const GemmI8Args& p, int tid, int nt) {
  if (p.M <= 0 || p.N <= 0) return;
  if (p.qo.q) {  // split over row chunks; each chunk: every panel, then its rows quantised
    const int npanels = round_up(p.N, PW) / PW;
    const size_t panel_elems = panel_elems_of(p.Kp);
    const int nch = (p.M + MQ - 1) / MQ;
    long lo, hi;
    split_range(nch, tid, nt, &lo, &hi);
    const bool to_scratch = p.y_scratch && !p.y_i32;  // y has no reader: the chunk's rows stay in scratch
    for (long ch = lo; ch < hi; ++ch) {
      const int m0 = static_cast<int>(ch) * MQ, m1 = m0 + MQ < p.M ? m0 + MQ : p.M;
      // the chunk as a GEMM of its own: into the per-thread scratch (row 0 = m0), or into y
      const GemmI8Args c = to_scratch ? i8_chunk_to_scratch(p, m0, m1 - m0, static_cast<size_t>(p.lda) * kABytes) : p;
      const int c0 = to_scratch ? 0 : m0, c1 = to_scratch ? m1 - m0 : m1;
      for (int pn = 0; pn < npanels; ++pn) {
        const WE* wpanel = static_cast<const WE*>(p.w) + pn * panel_elems;
        for (int m = c0; m < c1; m += MR) tile_rows<MR>(c1 - m < MR ? c1 - m : MR, c, m, pn * PW, wpanel, m == c0);
      }
      for (int m = c0; m < c1; ++m) quantize_into(c.y + static_cast<size_t>(m) * c.ldy, p.N, p.qo, m - c0 + m0);
    }
    return;
  }
  const int npanels = round_up(p.N, PW) / PW;
  const int nch = (p.M + MC - 1) / MC;
  const int mc = round_up((p.M + nch - 1) / nch, MR);  // equal chunks: balanced split over M
  long lo, hi;
  split_range(static_cast<long>(nch) * npanels, tid, nt, &lo, &hi);
  const size_t panel_elems = panel_elems_of(p.Kp);
  for (long it = lo; it < hi; ++it) {
    const int ch = static_cast<int>(it / npanels), pn = static_cast<int>(it % npanels);
    const int m0 = ch * mc, m1 = m0 + mc < p.M ? m0 + mc : p.M;
    const WE* wpanel = static_cast<const WE*>(p.w) + pn * panel_elems;
    for (int m = m0; m < m1; m += MR) {
      const int mr = m1 - m < MR ? m1 - m : MR;
      tile_rows<MR>(mr, p, m, pn * PW, wpanel, m == m0);
    }
  }
}

}  // namespace

size_t pack_i8_bytes(int N, int K) { return pack_bytes(N, K); }
void pack_i8(const int8_t* w, int N, int K, void* dst, int32_t* colsum) { pack(w, N, K, dst, colsum); }
void gemm_i8(const GemmI8Args& a, int tid, int nt) { gemm(a, tid, nt); }
int i8_kgroup() { return KG; }
int i8_a_bytes() { return kABytes; }
int i8_a_off_sym() { return kAOffSym; }
int i8_a_off_asym() { return kAOffAsym; }
int i8_a_get(const void* q, int ldq, int m, int k) { return a_get(q, ldq, m, k); }
void i8_a_set(void* q, int ldq, int m, int k, int v) { a_set(q, ldq, m, k, v); }
int i8_panel() { return PW; }

}  // namespace ZOI_NS
}  // namespace zoi
