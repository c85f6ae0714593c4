// AVX2 INT8 micro-kernel formulations, side by side (lab/cpu/README.md "AVX2"): one tile of
// R rows x NB ymm columns over K = 384 with A and the panel in L1, thread CPU time per MAC (best
// of 5 x 20000 calls), 3 rounds interleaved. Standalone, no zoi:
//   g++ -O3 -mavx2 -mfma -std=c++17 lab/cpu/avx2_formulations.cc -o /tmp/f && /tmp/f
// s16: the former 16-bit kernel (vpmaddwd + vpaddd, 2 per 16 MACs); widen: 8-bit weights
// sign-extended per k-group (vpmovsxbw) into the s16 kernel; sign: the sign trick with |a|
// computed per row and k-group (vpabsb); sign2: the sign trick with |a| stored by the quantiser
// (what gemm_int8.cc runs); ub: u8 x s8 vpmaddubsw without the sign trick -- NOT exact (its s16
// pairs saturate for 8-bit activations), shown only as the bound an inexact kernel would have.
#include <immintrin.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <cstdlib>
#include <vector>
static double cpu_now(){timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+1e-9*t.tv_nsec;}
#define UNR _Pragma("GCC unroll 16")
// A) s16 x s16 madd (current): KG=2, panel [g][8*NB cols][2] s16
template<int R,int NB> __attribute__((noinline)) void k_s16(const int16_t* a,int lda,const int16_t* w,int kg,int32_t* out){
  __m256i acc[R][NB]; UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) acc[r][j]=_mm256_setzero_si256();
  for(int g=0;g<kg;++g){ const int16_t* wg=w+g*NB*16; __m256i b[NB]; UNR for(int j=0;j<NB;++j) b[j]=_mm256_load_si256((const __m256i*)(wg+j*16));
    UNR for(int r=0;r<R;++r){ int32_t v; memcpy(&v,a+r*lda+2*g,4); __m256i av=_mm256_set1_epi32(v);
      UNR for(int j=0;j<NB;++j) acc[r][j]=_mm256_add_epi32(acc[r][j],_mm256_madd_epi16(av,b[j]));}}
  UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) _mm256_storeu_si256((__m256i*)(out+(r*NB+j)*8),acc[r][j]);
}
// B) sign trick: a s8, |a| u8 x sign(w,a) s8, KG=4, panel [g][8*NB][4] s8
template<int R,int NB> __attribute__((noinline)) void k_sign(const int8_t* a,int lda,const int8_t* w,int kg,int32_t* out){
  __m256i acc[R][NB]; UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) acc[r][j]=_mm256_setzero_si256();
  const __m256i ones=_mm256_set1_epi16(1);
  for(int g=0;g<kg;++g){ const int8_t* wg=w+g*NB*32; __m256i b[NB]; UNR for(int j=0;j<NB;++j) b[j]=_mm256_load_si256((const __m256i*)(wg+j*32));
    UNR for(int r=0;r<R;++r){ int32_t v; memcpy(&v,a+r*lda+4*g,4); __m256i av=_mm256_set1_epi32(v); __m256i aa=_mm256_abs_epi8(av);
      UNR for(int j=0;j<NB;++j){ __m256i t=_mm256_sign_epi8(b[j],av); t=_mm256_maddubs_epi16(aa,t); t=_mm256_madd_epi16(t,ones); acc[r][j]=_mm256_add_epi32(acc[r][j],t);}}}
  UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) _mm256_storeu_si256((__m256i*)(out+(r*NB+j)*8),acc[r][j]);
}
// B2) sign trick with |a| precomputed row (2 broadcasts, no abs)
template<int R,int NB> __attribute__((noinline)) void k_sign2(const int8_t* a,const uint8_t* aa_,int lda,const int8_t* w,int kg,int32_t* out){
  __m256i acc[R][NB]; UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) acc[r][j]=_mm256_setzero_si256();
  const __m256i ones=_mm256_set1_epi16(1);
  for(int g=0;g<kg;++g){ const int8_t* wg=w+g*NB*32; __m256i b[NB]; UNR for(int j=0;j<NB;++j) b[j]=_mm256_load_si256((const __m256i*)(wg+j*32));
    UNR for(int r=0;r<R;++r){ int32_t v,u; memcpy(&v,a+r*lda+4*g,4); memcpy(&u,aa_+r*lda+4*g,4); __m256i av=_mm256_set1_epi32(v); __m256i aa=_mm256_set1_epi32(u);
      UNR for(int j=0;j<NB;++j){ __m256i t=_mm256_sign_epi8(b[j],av); t=_mm256_maddubs_epi16(aa,t); t=_mm256_madd_epi16(t,ones); acc[r][j]=_mm256_add_epi32(acc[r][j],t);}}}
  UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) _mm256_storeu_si256((__m256i*)(out+(r*NB+j)*8),acc[r][j]);
}
// C) widen: s8 weights -> vpmovsxbw per (g,j), A s16 broadcast; KG=2 panel [g][8*NB][2] s8
template<int R,int NB> __attribute__((noinline)) void k_widen(const int16_t* a,int lda,const int8_t* w,int kg,int32_t* out){
  __m256i acc[R][NB]; UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) acc[r][j]=_mm256_setzero_si256();
  for(int g=0;g<kg;++g){ const int8_t* wg=w+g*NB*16; __m256i b[NB]; UNR for(int j=0;j<NB;++j) b[j]=_mm256_cvtepi8_epi16(_mm_load_si128((const __m128i*)(wg+j*16)));
    UNR for(int r=0;r<R;++r){ int32_t v; memcpy(&v,a+r*lda+2*g,4); __m256i av=_mm256_set1_epi32(v);
      UNR for(int j=0;j<NB;++j) acc[r][j]=_mm256_add_epi32(acc[r][j],_mm256_madd_epi16(av,b[j]));}}
  UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) _mm256_storeu_si256((__m256i*)(out+(r*NB+j)*8),acc[r][j]);
}
// D) non-exact maddubs (upper bound)
template<int R,int NB> __attribute__((noinline)) void k_ub(const uint8_t* a,int lda,const int8_t* w,int kg,int32_t* out){
  __m256i acc[R][NB]; UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) acc[r][j]=_mm256_setzero_si256();
  const __m256i ones=_mm256_set1_epi16(1);
  for(int g=0;g<kg;++g){ const int8_t* wg=w+g*NB*32; __m256i b[NB]; UNR for(int j=0;j<NB;++j) b[j]=_mm256_load_si256((const __m256i*)(wg+j*32));
    UNR for(int r=0;r<R;++r){ int32_t v; memcpy(&v,a+r*lda+4*g,4); __m256i av=_mm256_set1_epi32(v);
      UNR for(int j=0;j<NB;++j){ __m256i t=_mm256_maddubs_epi16(av,b[j]); t=_mm256_madd_epi16(t,ones); acc[r][j]=_mm256_add_epi32(acc[r][j],t);}}}
  UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) _mm256_storeu_si256((__m256i*)(out+(r*NB+j)*8),acc[r][j]);
}
int K=384; alignas(64) int8_t W8[384*64]; alignas(64) int16_t W16[384*64]; alignas(64) int8_t A8[8*512]; alignas(64) uint8_t AA[8*512]; alignas(64) int16_t A16[8*512]; int32_t O[8*4*8];
template<class F> double run(F f,long macs){ double best=1e9; for(int rep=0;rep<5;++rep){ double t0=cpu_now(); for(int i=0;i<20000;++i) f(); double t=cpu_now()-t0; if(t<best) best=t;} return best/(20000.0*macs)*1e12; } // ps per MAC
// FP32 FMA peak: 12 independent ymm accumulators
__attribute__((noinline)) void fma_loop(long n, float* out){
  __m256 a[12]; for(int i=0;i<12;++i) a[i]=_mm256_set1_ps(1.f+i*1e-3f);
  const __m256 x=_mm256_set1_ps(0.999f), y=_mm256_set1_ps(1e-4f);
  for(long it=0;it<n;++it){ UNR for(int i=0;i<12;++i) a[i]=_mm256_fmadd_ps(a[i],x,y);}
  __m256 s=a[0]; for(int i=1;i<12;++i) s=_mm256_add_ps(s,a[i]); _mm256_storeu_ps(out,s);
}
int main(){ for(int i=0;i<384*64;++i){W8[i]=rand()%255-127;W16[i]=W8[i];} for(int i=0;i<8*512;++i){A8[i]=rand()%256-128;AA[i]=abs(A8[i]);A16[i]=A8[i];}
  { float o[8]; double best=1e9; for(int rep=0;rep<5;++rep){ double t0=cpu_now(); fma_loop(20000000,o); double t=cpu_now()-t0; if(t<best) best=t;}
    printf("fp32 FMA ymm peak: %.1f GFLOP/s per thread (CPU time)\n", 20000000.0*12*16/best/1e9); }
  for(int round=0;round<3;++round){
  printf("round %d (ps/MAC, lower better)\n",round);
  printf(" s16 6x2   %.2f\n",run([]{k_s16<6,2>(A16,512,W16,K/2,O);},6L*16*K));
  printf(" s16 4x3   %.2f\n",run([]{k_s16<4,3>(A16,512,W16,K/2,O);},4L*24*K));
  printf(" widen 6x2 %.2f\n",run([]{k_widen<6,2>(A16,512,W8,K/2,O);},6L*16*K));
  printf(" widen 4x3 %.2f\n",run([]{k_widen<4,3>(A16,512,W8,K/2,O);},4L*24*K));
  printf(" sign 4x2  %.2f\n",run([]{k_sign<4,2>(A8,512,W8,K/4,O);},4L*16*K));
  printf(" sign 5x2  %.2f\n",run([]{k_sign<5,2>(A8,512,W8,K/4,O);},5L*16*K));
  printf(" sign 6x2  %.2f\n",run([]{k_sign<6,2>(A8,512,W8,K/4,O);},6L*16*K));
  printf(" sign 3x3  %.2f\n",run([]{k_sign<3,3>(A8,512,W8,K/4,O);},3L*24*K));
  printf(" sign2 4x2 %.2f\n",run([]{k_sign2<4,2>(A8,AA,512,W8,K/4,O);},4L*16*K));
  printf(" sign2 5x2 %.2f\n",run([]{k_sign2<5,2>(A8,AA,512,W8,K/4,O);},5L*16*K));
  printf(" ub 6x2    %.2f\n",run([]{k_ub<6,2>((const uint8_t*)A8,512,W8,K/4,O);},6L*16*K));
  printf(" ub 4x3    %.2f\n",run([]{k_ub<4,3>((const uint8_t*)A8,512,W8,K/4,O);},4L*24*K));
  }
}
