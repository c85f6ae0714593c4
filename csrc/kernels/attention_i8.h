// INT8 attention of one (sequence, head) item (opt-in: AttnArgs::prec), AVX-512 VNNI.
// Included by attention.cc inside its namespace (it uses softmax_row, pv_block, prefetch_rows).
//   prec = 1: s = (q8 . k8) sq sk scale with q, k quantised per token and head (symmetric, amax /
//           127; q stored as u8 = q8 + 128 for vpdpbusd, the 128 sum k8 subtracted by starting
//           the s32 accumulators at -128 sum_c k8), softmax and p.v in FP32 (attention.cc's).
//   prec = 2: also p.v in INT8: e = exp(s - max) in (0, 1] quantised to u8 round(255 e), v per
//           channel of the head (amax over the sequence / 127), s32 sums of u8 x s8 (exact: no
//           saturation in vpdpbusd), ctx = sum_j p8_j v8_j sv / sum_j p8_j.
// NaN: a NaN / inf in a q, k or v row makes its scale NaN (scale + 0 * sum of x), which reaches the
// same outputs as in the FP32 kernel (q: its row; k: the head; v: its channel of the head).
// Scratch (bytes, within attn_scratch_floats(L, d) floats for d % 4 == 0, d <= 256):
//   s [NQ][lp] f32 | sk [lp] f32 | kc [lp] s32 | sq [lp] f32 | kt8 [d/4][lp][4] s8 | q8 [L][d] u8 |
//   prec = 1: vc [L][d] f32;  prec = 2: sv [dv] f32 | v8 [lp/4][dv][4] s8 | p8 [NQ][lp] u8  (dv = d
//   rounded up to 16)
#if defined(ZOI_ISA_VNNI)
constexpr bool kAttnI8 = true;
constexpr int kI8Q = 4;  // query rows per block (the last block repeats the last row)

// acc += u8 a x s8 b (4 products per lane). As asm: through _mm512_dpbusd_epi32 GCC 12 copied
// every accumulator to a second register set each iteration and spilled one (32 moves per 16
// vpdpbusd: this kernel ran 1.4-1.8x slower than the FP32 one)
ZOI_INLINE __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// codes of x[0:d) (d % 4 == 0) into q (d bytes, + off: 128 for u8 operands, 0 for s8); returns the
// scale (amax / 127, NaN when x has a NaN or inf); *sum = sum of the signed codes
inline float quant_row_i8(const float* x, int d, uint8_t* q, int off, int32_t* sum) {
  __m512 am = _mm512_setzero_ps(), bad = _mm512_setzero_ps();
  for (int c = 0; c < d; c += 16) {
    const __m512 v = V::load_n(x + c, d - c);
    am = _mm512_max_ps(am, V::abs(v));
    bad = _mm512_add_ps(bad, _mm512_mul_ps(v, _mm512_setzero_ps()));
  }
  const float amax = _mm512_reduce_max_ps(am);
  const float bads = _mm512_reduce_add_ps(bad);  // 0 unless x has a NaN or inf
  if (!(bads == 0.f)) {  // codes of a NaN row are meaningless (and summing INT_MIN lanes overflows: UBSan)
    std::memset(q, off, static_cast<size_t>(d));
    *sum = 0;
    return amax / 127.f + bads;  // NaN
  }
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  __m512i isum = _mm512_setzero_si512();
  const __m512 vi = _mm512_set1_ps(inv);
  const __m512i vo = _mm512_set1_epi32(off);
  for (int c = 0; c < d; c += 16) {
    const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(V::load_n(x + c, d - c), vi));  // to nearest even
    isum = _mm512_add_epi32(isum, v);
    _mm_mask_storeu_epi8(q + c, V::mask(d - c), _mm512_cvtepi32_epi8(_mm512_add_epi32(v, vo)));
  }
  *sum = _mm512_reduce_add_epi32(isum);
  return amax / 127.f;
}

// The one u8 x s8 block of both products, NQ rows r, columns c .. c + 16 NV:
//   o_r[c + i] = float(init[c + i] + sum_{g < n4} a_r[4g .. 4g+3] . b[g][c + i][0 .. 3]) bs[c + i] rs_r
// a_r: u8 rows (4 consecutive bytes per group g); b: [n4][ldb] dwords of 4 s8 codes; init: s32
// column starts (null: 0); n: the columns of o_r from c that exist (from 16 NV on, all stored).
//   q.k^T: a = q8 (u8 = q8 + 128), b = kt [d4][lp], init = kc (-128 sum k8), bs = sk, rs = sq scale
//   p.v:   a = p8 (u8 0..255),    b = v8 [lp/4][dv], init = null,         bs = sv, rs = 1 / sum p8
template <int NQ, int NV>
inline void u8s8_block(const uint8_t* const* a, const int32_t* b, int ldb, int n4, int c, const int32_t* init,
                       const float* bs, const float* rs, float* const* o, int n) {
  __m512i acc[NQ][NV];
#pragma GCC unroll 4
  for (int u = 0; u < NV; ++u) {
    const __m512i c0 = init ? _mm512_loadu_si512(init + c + 16 * u) : _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int r = 0; r < NQ; ++r) acc[r][u] = c0;
  }
  for (int g = 0; g < n4; ++g) {
    const int32_t* br = b + static_cast<size_t>(g) * ldb + c;
    __m512i bv[NV];
#pragma GCC unroll 4
    for (int u = 0; u < NV; ++u) bv[u] = _mm512_loadu_si512(br + 16 * u);
#pragma GCC unroll 8
    for (int r = 0; r < NQ; ++r) {
      int32_t w;
      std::memcpy(&w, a[r] + 4 * g, 4);
      const __m512i ab = _mm512_set1_epi32(w);
#pragma GCC unroll 4
      for (int u = 0; u < NV; ++u) acc[r][u] = dpbusd(acc[r][u], ab, bv[u]);
    }
  }
#pragma GCC unroll 4
  for (int u = 0; u < NV; ++u) {
    const __m512 sc = _mm512_loadu_ps(bs + c + 16 * u);
#pragma GCC unroll 8
    for (int r = 0; r < NQ; ++r)
      V::store_n(o[r] + c + 16 * u,
                 _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][u]), sc), _mm512_set1_ps(rs[r])),
                 n - 16 * u);
  }
}

// p8[0:lp) = round(255 exp(s - max)) for j < L, 0 beyond; returns 1 / sum p8 (NaN if s has one)
inline float softmax_row_u8(const float* s, int L, int lp, uint8_t* p8) {
  constexpr float kLog2e = 1.44269504088896341f;
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int j = 0; j < L; j += 16) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), V::mask(L - j), s + j));
  const float m = _mm512_reduce_max_ps(mx);
  const __m512 vl = _mm512_set1_ps(kLog2e), vnm = _mm512_set1_ps(-m * kLog2e), v255 = _mm512_set1_ps(255.f);
  __m512 sum = _mm512_setzero_ps();
  for (int j = 0; j < lp; j += 16) {
    const __mmask16 k = V::mask(L - j);
    const __m512 e = vexp2<V>(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, s + j), vl, vnm));
    const __m512 r = _mm512_maskz_roundscale_ps(k, _mm512_mul_ps(e, v255), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    sum = _mm512_add_ps(sum, r);  // integers: exact below 2^24
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p8 + j), _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(r)));
  }
  return 1.f / _mm512_reduce_add_ps(sum);
}

// v rows [L][ld] of the head -> sv [dv] (per channel amax / 127, NaN for a channel with a NaN /
// inf) and v8 [lp/4][dv][4] (codes of keys 4 j4 .. 4 j4 + 3 of each channel, 0 past L and d)
inline void quant_v_i8(const float* vb, size_t ld, int L, int d, int lp, int dv, float* sv, int32_t* v8) {
  for (int c0 = 0; c0 < dv; c0 += 16) {
    __m512 am = _mm512_setzero_ps(), bad = _mm512_setzero_ps();
    for (int j = 0; j < L; ++j) {
      const __m512 x = V::load_n(vb + static_cast<size_t>(j) * ld + c0, d - c0);
      am = _mm512_max_ps(am, V::abs(x));
      bad = _mm512_add_ps(bad, _mm512_mul_ps(x, _mm512_setzero_ps()));
    }
    const __mmask16 pos = _mm512_cmp_ps_mask(am, _mm512_setzero_ps(), _CMP_GT_OQ);
    const __m512 vi = _mm512_maskz_div_ps(pos, _mm512_set1_ps(127.f), am);
    _mm512_storeu_ps(sv + c0, _mm512_add_ps(_mm512_div_ps(am, _mm512_set1_ps(127.f)), bad));
    const __m512i lo = _mm512_set1_epi32(0xFF);
    for (int j4 = 0; j4 < lp / 4; ++j4) {
      __m512i w = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const int j = 4 * j4 + k;
        if (j >= L) break;
        const __m512 x = V::load_n(vb + static_cast<size_t>(j) * ld + c0, d - c0);
        const __m512i q = _mm512_and_si512(_mm512_cvtps_epi32(_mm512_mul_ps(x, vi)), lo);
        w = _mm512_or_si512(w, _mm512_slli_epi32(q, 8 * k));
      }
      _mm512_storeu_si512(v8 + static_cast<size_t>(j4) * dv + c0, w);
    }
  }
}

inline bool attn_i8_ok(const AttnArgs& a) {
  return (a.prec == 1 || a.prec == 2) && !a.bias && a.window == 0 && !a.rope_cos && !a.causal && !a.q_norm &&
         (a.kv_heads == 0 || a.kv_heads == a.heads) && a.d % 4 == 0 && a.d <= 256;
}

// nt0 / nL / nh: the next item of this thread (nL = 0: none), prefetched as one_head does
void one_head_i8(const AttnArgs& a, int t0, int L, int h, float* scratch, int nt0, int nL, int nh) {
  constexpr int NQ = kI8Q;
  const int H = a.heads * a.d, d = a.d, ld = a.ldqkv, d4 = d / 4;
  const int lp = (L + 15) / 16 * 16, dv = (d + 15) / 16 * 16;
  float* s = scratch;                                           // [NQ][lp]
  float* sk = s + static_cast<size_t>(NQ) * lp;                 // [lp]
  int32_t* kc = reinterpret_cast<int32_t*>(sk + lp);            // [lp]
  float* sq = reinterpret_cast<float*>(kc + lp);                // [lp]
  int32_t* kt = reinterpret_cast<int32_t*>(sq + lp);            // [d4][lp]
  uint8_t* q8 = reinterpret_cast<uint8_t*>(kt + static_cast<size_t>(d4) * lp);  // [L][d]
  float* tail = reinterpret_cast<float*>(q8 + static_cast<size_t>(lp) * d);    // 4-byte aligned: lp d % 64 == 0
  const float* qb = a.qkv + static_cast<size_t>(t0) * ld + h * d;
  const float* kb = qb + H;
  const float* vb = qb + 2 * H;
  uint8_t row[256];
  for (int j = 0; j < lp; ++j) {
    if (j + 8 < L) {  // this item's rows (3H floats apart) ahead of the quantiser's dependent chain
      for (int c = 0; c < d; c += 16) {
        __builtin_prefetch(kb + static_cast<size_t>(j + 8) * ld + c, 0, 3);
        __builtin_prefetch(qb + static_cast<size_t>(j + 8) * ld + c, 0, 3);
      }
    }
    if (j < L) {
      int32_t sum;
      sk[j] = quant_row_i8(kb + static_cast<size_t>(j) * ld, d, row, 0, &sum);
      kc[j] = -128 * sum;
      for (int c4 = 0; c4 < d4; ++c4) std::memcpy(kt + static_cast<size_t>(c4) * lp + j, row + 4 * c4, 4);
      int32_t unused;
      sq[j] = quant_row_i8(qb + static_cast<size_t>(j) * ld, d, q8 + static_cast<size_t>(j) * d, 128, &unused) * a.scale;
    } else {
      sk[j] = 0.f;
      kc[j] = 0;
      for (int c4 = 0; c4 < d4; ++c4) kt[static_cast<size_t>(c4) * lp + j] = 0;
    }
  }
  float* vc = tail;  // prec = 1: [L][d]
  float* sv = tail;  // prec = 2: [dv], then v8, p8
  int32_t* v8 = reinterpret_cast<int32_t*>(sv + dv);
  uint8_t* p8 = reinterpret_cast<uint8_t*>(v8 + static_cast<size_t>(lp / 4) * dv);
  if (a.prec == 1) {
    for (int j = 0; j < L; ++j) {
      const float* src = vb + static_cast<size_t>(j) * ld;
      float* dst = vc + static_cast<size_t>(j) * d;
      for (int c = 0; c < d; c += V::N) V::store_n(dst + c, V::load_n(src + c, d - c), d - c);
    }
  } else {
    quant_v_i8(vb, ld, L, d, lp, dv, sv, v8);
  }
  int pf = 0;
  for (int i = 0; i < L; i += NQ) {
    const int pe = static_cast<int>((static_cast<long>(i + NQ < L ? i + NQ : L) * nL + L - 1) / L);
    prefetch_rows(a, nt0, nh, pf, pe);
    pf = pe;
    const uint8_t* qr[NQ];
    float* sr[NQ];
    float* o[NQ];
    uint8_t* pr[NQ];
    float sqs[NQ], inv[NQ];
    for (int r = 0; r < NQ; ++r) {
      const int ri = i + r < L ? i + r : L - 1;  // the last block repeats the last row (same values)
      qr[r] = q8 + static_cast<size_t>(ri) * d;
      sr[r] = s + static_cast<size_t>(r) * lp;
      pr[r] = p8 + static_cast<size_t>(r) * lp;
      o[r] = a.out + static_cast<size_t>(t0 + ri) * a.ldo + h * d;
      sqs[r] = sq[ri];
    }
    int j = 0;
    // s_r[j : j + 16 NV) = float(q8_r . k8_j) sk_j sqs_r (lp columns, kt: [d4][lp])
    for (; j + 64 <= lp; j += 64) u8s8_block<NQ, 4>(qr, kt, lp, d4, j, kc, sk, sqs, sr, 64);
    for (; j < lp; j += 16) u8s8_block<NQ, 1>(qr, kt, lp, d4, j, kc, sk, sqs, sr, 16);
    if (a.prec == 1) {
      for (int r = 0; r < NQ; ++r) inv[r] = softmax_row(sr[r], L);
      int c = 0;
      for (; c + 2 * V::N <= d; c += 2 * V::N) pv_block<NQ, 2, true>(sr, vc, d, 0, L, c, d, o, inv);
      for (; c + V::N <= d; c += V::N) pv_block<NQ, 1, true>(sr, vc, d, 0, L, c, d, o, inv);
      if (c < d) pv_block<NQ, 1, false>(sr, vc, d, 0, L, c, d, o, inv);
    } else {
      for (int r = 0; r < NQ; ++r) inv[r] = softmax_row_u8(sr[r], L, lp, pr[r]);
      int c = 0;
      // o_r[c : c + 16 NV) = float(sum_j p8_r[j] v8_j) sv inv_r (d columns, v8: [lp/4][dv])
      for (; c + 32 <= dv; c += 32) u8s8_block<NQ, 2>(pr, v8, dv, lp / 4, c, nullptr, sv, inv, o, d - c);
      if (c < dv) u8s8_block<NQ, 1>(pr, v8, dv, lp / 4, c, nullptr, sv, inv, o, d - c);
    }
  }
  prefetch_rows(a, nt0, nh, pf, nL);
}
#else
constexpr bool kAttnI8 = false;
inline bool attn_i8_ok(const AttnArgs&) { return false; }
inline void one_head_i8(const AttnArgs&, int, int, int, float*, int, int, int) {}
#endif
