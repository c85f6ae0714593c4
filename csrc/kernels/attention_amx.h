// AMX-BF16 attention of one (sequence, head) item (opt-in: AttnArgs::prec = 3).
// Included by attention.cc (vnni build, which the amx table shares) inside its namespace. The
// vnni build's flags have no AMX / BF16, so these functions carry target attributes, and they
// run only from the amx table's entry (attention_amx: the ISA picked or forced is amx, as for
// the AMX-INT8 GEMM; ZOI_CPU_ISA=vnni runs the FP32 kernel for prec 3) where the CPU has
// AMX-BF16 and AVX512-BF16 and Linux granted the tile data (amx_bf16_ok(); otherwise the FP32
// kernel runs). Head dim 32 or 64, scale > 0.
//   q, k, v rounded to BF16 (round to nearest even, `vcvtneps2bf16`); s = q.k^T by `tdpbf16ps`
//   (16 query rows x 16 keys per tile, FP32 accumulation); e = exp(scale (s - max)) in FP32 (vexp2,
//   as the FP32 kernel) rounded to BF16 for p.v (`tdpbf16ps`, 16 rows x 16 channels per tile,
//   32 keys per step); ctx = (e.v) / sum e with the sum of the FP32 e.
// Scratch (bytes, lp = L rounded up to 32; within attn_scratch_floats(L, d)):
//   s [16][lp] f32 | p [16][lp] bf16 | ctx [16][d] f32 | q [lp][d] bf16 | kt [d/2][lp] dword pairs |
//   vt [lp/2][d] dword pairs (keys 2r, 2r + 1 of channel c; first the bf16 K rows before K^T)
// NaN: BF16 keeps NaN, so a NaN / inf in q, k or v reaches the outputs the FP32 kernel's does.
#if defined(ZOI_ISA_VNNI)
#define ZOI_AMXBF16 __attribute__((target("amx-tile,amx-bf16,avx512bf16")))
// GCC's tile load / store intrinsics are asm without a memory clobber: order them against the
// plain loads and stores of the same scratch explicitly
#define ZOI_TILE_FENCE() __asm__ __volatile__("" ::: "memory")

inline bool amx_bf16_ok() {
  static const bool ok = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx_bf16 = (d >> 22) & 1u;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
    const bool avx512_bf16 = (a >> 5) & 1u;
    return amx_bf16 && avx512_bf16 && zoi::cpu_features().amx_tile && zoi::amx_permission();
  }();
  return ok;
}

inline bool attn_amx_ok(const AttnArgs& a) {
  return a.prec == 3 && !a.bias && a.window == 0 && !a.rope_cos && !a.causal && !a.q_norm &&
         (a.kv_heads == 0 || a.kv_heads == a.heads) && (a.d == 32 || a.d == 64) && a.scale > 0.f &&
         amx_bf16_ok();
}

struct alignas(64) AttnTileCfg {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

ZOI_AMXBF16 inline __m256i bf16x16(__m512 x) {
  const __m256bh h = _mm512_cvtneps_pbh(x);
  __m256i r;
  std::memcpy(&r, &h, sizeof(r));
  return r;
}

// p[0:lp) = bf16(exp(scale (s - max))) for j < L, 0 beyond; returns 1 / sum of the FP32 exps
ZOI_AMXBF16 inline float softmax_row_bf16(const float* s, int L, int lp, float scale, uint16_t* p) {
  const float c = scale * 1.44269504088896341f;
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int j = 0; j < L; j += 16)
    mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), V::mask(L - j), s + j));
  const float m = _mm512_reduce_max_ps(mx);
  const __m512 vc = _mm512_set1_ps(c), vnm = _mm512_set1_ps(-m * c);
  __m512 sum = _mm512_setzero_ps();
  for (int j = 0; j < lp; j += 16) {
    const __mmask16 k = V::mask(L - j);
    const __m512 e = _mm512_maskz_mov_ps(k, vexp2<V>(_mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, s + j), vc, vnm)));
    sum = _mm512_add_ps(sum, e);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j), bf16x16(e));
  }
  return 1.f / _mm512_reduce_add_ps(sum);
}

template <int NB>  // NB = d / 16 channel tiles (2 or 4)
ZOI_AMXBF16 __attribute__((noinline)) void one_head_amx(const AttnArgs& a, int t0, int L, int h, float* scratch,
                                                        int nt0, int nL, int nh) {
  constexpr int d = NB * 16, KC = d / 32;  // q.k^T steps of 32 channels
  const int H = a.heads * d, ld = a.ldqkv;
  const int lp = (L + 31) / 32 * 32;
  char* base = reinterpret_cast<char*>(scratch);
  float* s = reinterpret_cast<float*>(base);                                   // [16][lp]
  uint16_t* p = reinterpret_cast<uint16_t*>(base + 64 * static_cast<size_t>(lp));  // [16][lp]
  float* ctx = reinterpret_cast<float*>(base + 96 * static_cast<size_t>(lp));      // [16][d]
  uint16_t* q16 = reinterpret_cast<uint16_t*>(ctx + 16 * d);                    // [lp][d]
  uint32_t* kt = reinterpret_cast<uint32_t*>(q16 + static_cast<size_t>(lp) * d);  // [d/2][lp]
  uint32_t* vt = kt + static_cast<size_t>(lp) * d / 2;                           // [lp/2][d]
  const float* qb = a.qkv + static_cast<size_t>(t0) * ld + h * d;
  const float* kb = qb + H;
  const float* vb = qb + 2 * H;
  // q rows and k rows (the latter into vt's space) in bf16, then K^T by the FP32 transpose (bit moves)
  for (int j = 0; j < lp; ++j) {
#pragma GCC unroll 4
    for (int c = 0; c < d; c += 16) {
      const __m256i qz = j < L ? bf16x16(_mm512_loadu_ps(qb + static_cast<size_t>(j) * ld + c)) : _mm256_setzero_si256();
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q16 + static_cast<size_t>(j) * d + c), qz);
      if (j < L)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(reinterpret_cast<uint16_t*>(vt) + static_cast<size_t>(j) * d + c),
                            bf16x16(_mm512_loadu_ps(kb + static_cast<size_t>(j) * ld + c)));
    }
  }
  transpose_k(reinterpret_cast<const float*>(vt), d / 2, L, d / 2, lp, reinterpret_cast<float*>(kt));
  // v in key pairs: dword (r, c) = bf16 v[2r][c] | bf16 v[2r + 1][c] << 16 (0 past L)
  for (int r = 0; r < lp / 2; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < d; c += 16) {
      const int j0 = 2 * r, j1 = 2 * r + 1;
      const __m512i lo = j0 < L ? _mm512_cvtepu16_epi32(bf16x16(_mm512_loadu_ps(vb + static_cast<size_t>(j0) * ld + c)))
                                : _mm512_setzero_si512();
      const __m512i hi = j1 < L ? _mm512_cvtepu16_epi32(bf16x16(_mm512_loadu_ps(vb + static_cast<size_t>(j1) * ld + c)))
                                : _mm512_setzero_si512();
      _mm512_storeu_si512(vt + static_cast<size_t>(r) * d + c, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
  AttnTileCfg cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  ZOI_TILE_FENCE();
  int pf = 0;
  for (int i0 = 0; i0 < L; i0 += 16) {
    const int pe = static_cast<int>((static_cast<long>(i0 + 16 < L ? i0 + 16 : L) * nL + L - 1) / L);
    prefetch_rows(a, nt0, nh, pf, pe);
    pf = pe;
    // s = q.k^T, 16 x 16 per tile: the q rows in tmm0 (d 32) / tmm0 + tmm3 (d 64) for all keys
    _tile_loadd(0, q16 + static_cast<size_t>(i0) * d, 2 * d);
    if (KC == 2) _tile_loadd(3, q16 + static_cast<size_t>(i0) * d + 32, 2 * d);
    for (int n0 = 0; n0 < lp; n0 += 16) {
      _tile_zero(2);
      _tile_loadd(1, kt + n0, 4 * lp);
      _tile_dpbf16ps(2, 0, 1);
      if (KC == 2) {
        _tile_loadd(4, kt + static_cast<size_t>(16) * lp + n0, 4 * lp);
        _tile_dpbf16ps(2, 3, 4);
      }
      _tile_stored(2, s + n0, 4 * lp);
    }
    ZOI_TILE_FENCE();
    const int rows = L - i0 < 16 ? L - i0 : 16;
    float inv[16];
    for (int r = 0; r < rows; ++r)
      inv[r] = softmax_row_bf16(s + static_cast<size_t>(r) * lp, L, lp, a.scale, p + static_cast<size_t>(r) * lp);
    // (rows past L: their p rows are stale; a tile's output row depends on its own input row only)
    ZOI_TILE_FENCE();
    _tile_zero(4);
    _tile_zero(5);
    if (NB == 4) {
      _tile_zero(6);
      _tile_zero(7);
    }
    for (int ks = 0; ks < lp / 32; ++ks) {
      const uint32_t* vk = vt + static_cast<size_t>(16 * ks) * d;
      _tile_loadd(0, p + 32 * ks, 2 * lp);
      _tile_loadd(1, vk, 4 * d);
      _tile_loadd(2, vk + 16, 4 * d);
      _tile_dpbf16ps(4, 0, 1);
      _tile_dpbf16ps(5, 0, 2);
      if (NB == 4) {
        _tile_loadd(3, vk + 32, 4 * d);
        _tile_loadd(1, vk + 48, 4 * d);
        _tile_dpbf16ps(6, 0, 3);
        _tile_dpbf16ps(7, 0, 1);
      }
    }
    _tile_stored(4, ctx, 4 * d);
    _tile_stored(5, ctx + 16, 4 * d);
    if (NB == 4) {
      _tile_stored(6, ctx + 32, 4 * d);
      _tile_stored(7, ctx + 48, 4 * d);
    }
    ZOI_TILE_FENCE();
    for (int r = 0; r < rows; ++r) {
      float* o = a.out + static_cast<size_t>(t0 + i0 + r) * a.ldo + h * d;
      const __m512 iv = _mm512_set1_ps(inv[r]);
#pragma GCC unroll 4
      for (int c = 0; c < d; c += 16) _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(ctx + r * d + c), iv));
    }
  }
  ZOI_TILE_FENCE();
  _tile_release();
  prefetch_rows(a, nt0, nh, pf, nL);
}

inline void one_head_bf16(const AttnArgs& a, int t0, int L, int h, float* scratch, int nt0, int nL, int nh) {
  if (a.d == 32)
    one_head_amx<2>(a, t0, L, h, scratch, nt0, nL, nh);
  else
    one_head_amx<4>(a, t0, L, h, scratch, nt0, nL, nh);
}
#undef ZOI_AMXBF16
#undef ZOI_TILE_FENCE
#else
inline bool attn_amx_ok(const AttnArgs&) { return false; }
inline void one_head_bf16(const AttnArgs&, int, int, int, float*, int, int, int) {}
#endif
