// 7-bit weights (|w| <= 63) on AVX2: K-loop formulations against the exact 8-bit sign trick
// (lab/cpu/README.md "7-bit weights on AVX2: the kernel"). One tile of R rows x NB ymm columns
// over K = 384 with A and the panel in L1, thread CPU time per MAC (best of 5 x 20000 calls),
// rounds interleaved. Standalone, no zoi:
//   g++ -O3 -mavx2 -mfma -std=c++17 lab/cpu/avx2_w7_formulations.cc -o /tmp/f && /tmp/f
// sign8:  the 8-bit kernel (vpsignb, vpmaddubsw, vpmaddwd, vpaddd: 4 ops, 2 multiplies / 32 MACs)
// sign16: 7-bit weights, two k-groups' vpmaddubsw pairs summed in s16 (|pair| <= 2 * 128 * 63 =
//         16128, two <= 32256) before one vpmaddwd: 7 ops, 3 multiplies / 64 MACs
// ux:     7-bit weights, u8 a = a ^ 0x80 (a + 128) x s7 w (pairs <= 2 * 255 * 63 = 32130):
//         3 ops + one xor per row and k-group, 2 multiplies / 32 MACs; - 128 colsum after
// u7:     u7 activations (|a| <= 127) and 7-bit weights, sign16's loop on |a| <= 127 (same count:
//         the saving of u7 would come from dropping vpsignb, which needs |a| x |w| <= ... no:
//         shown only to check the count does not change)
#include <immintrin.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <cstdlib>
static double cpu_now(){timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+1e-9*t.tv_nsec;}
#define UNR _Pragma("GCC unroll 16")
template<int R,int NB> __attribute__((noinline)) void k_sign8(const int8_t* a,int lda,const int8_t* w,int kg,int32_t* out){
  __m256i acc[R][NB]; UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) acc[r][j]=_mm256_setzero_si256();
  const __m256i ones=_mm256_set1_epi16(1);
  for(int g=0;g<kg;++g){ const int8_t* wg=w+g*NB*32; __m256i b[NB]; UNR for(int j=0;j<NB;++j) b[j]=_mm256_load_si256((const __m256i*)(wg+j*32));
    UNR for(int r=0;r<R;++r){ int32_t v,u; memcpy(&v,a+r*2*lda+4*g,4); memcpy(&u,a+r*2*lda+lda+4*g,4); __m256i av=_mm256_set1_epi32(v); __m256i aa=_mm256_set1_epi32(u);
      UNR for(int j=0;j<NB;++j){ __m256i t=_mm256_sign_epi8(b[j],av); t=_mm256_maddubs_epi16(aa,t); t=_mm256_madd_epi16(t,ones); acc[r][j]=_mm256_add_epi32(acc[r][j],t);}}}
  UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) _mm256_storeu_si256((__m256i*)(out+(r*NB+j)*8),acc[r][j]);
}
template<int R,int NB> __attribute__((noinline)) void k_sign16(const int8_t* a,int lda,const int8_t* w,int kg,int32_t* out){
  __m256i acc[R][NB]; UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) acc[r][j]=_mm256_setzero_si256();
  const __m256i ones=_mm256_set1_epi16(1);
  for(int g=0;g+2<=kg;g+=2){ const int8_t* wg=w+g*NB*32; __m256i b0[NB],b1[NB]; UNR for(int j=0;j<NB;++j){ b0[j]=_mm256_load_si256((const __m256i*)(wg+j*32)); b1[j]=_mm256_load_si256((const __m256i*)(wg+NB*32+j*32)); }
    UNR for(int r=0;r<R;++r){ int64_t v,u; memcpy(&v,a+r*2*lda+4*g,8); memcpy(&u,a+r*2*lda+lda+4*g,8);
      __m256i av0=_mm256_set1_epi32(int32_t(v)), aa0=_mm256_set1_epi32(int32_t(u)), av1=_mm256_set1_epi32(int32_t(v>>32)), aa1=_mm256_set1_epi32(int32_t(u>>32));
      UNR for(int j=0;j<NB;++j){ __m256i t0=_mm256_maddubs_epi16(aa0,_mm256_sign_epi8(b0[j],av0)); __m256i t1=_mm256_maddubs_epi16(aa1,_mm256_sign_epi8(b1[j],av1));
        acc[r][j]=_mm256_add_epi32(acc[r][j],_mm256_madd_epi16(_mm256_add_epi16(t0,t1),ones));}}}
  UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) _mm256_storeu_si256((__m256i*)(out+(r*NB+j)*8),acc[r][j]);
}
template<int R,int NB> __attribute__((noinline)) void k_ux(const int8_t* a,int lda,const int8_t* w,int kg,int32_t* out){
  __m256i acc[R][NB]; UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) acc[r][j]=_mm256_setzero_si256();
  const __m256i ones=_mm256_set1_epi16(1), x80=_mm256_set1_epi8(char(0x80));
  for(int g=0;g<kg;++g){ const int8_t* wg=w+g*NB*32; __m256i b[NB]; UNR for(int j=0;j<NB;++j) b[j]=_mm256_load_si256((const __m256i*)(wg+j*32));
    UNR for(int r=0;r<R;++r){ int32_t v; memcpy(&v,a+r*2*lda+4*g,4); __m256i av=_mm256_xor_si256(_mm256_set1_epi32(v),x80);
      UNR for(int j=0;j<NB;++j){ __m256i t=_mm256_maddubs_epi16(av,b[j]); t=_mm256_madd_epi16(t,ones); acc[r][j]=_mm256_add_epi32(acc[r][j],t);}}}
  UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) _mm256_storeu_si256((__m256i*)(out+(r*NB+j)*8),acc[r][j]);
}
// u7 a (u8 |a| <= 127 stored as a + 128 would not fit; here: A stored u8 in [0, 127] with an offset),
// 7-bit w: vpmaddubsw pairs <= 2 * 127 * 63 = 16002, two k-groups summed in s16: 5 ops / 64 MACs
template<int R,int NB> __attribute__((noinline)) void k_u7(const int8_t* a,int lda,const int8_t* w,int kg,int32_t* out){
  __m256i acc[R][NB]; UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) acc[r][j]=_mm256_setzero_si256();
  const __m256i ones=_mm256_set1_epi16(1);
  for(int g=0;g+2<=kg;g+=2){ const int8_t* wg=w+g*NB*32; __m256i b0[NB],b1[NB]; UNR for(int j=0;j<NB;++j){ b0[j]=_mm256_load_si256((const __m256i*)(wg+j*32)); b1[j]=_mm256_load_si256((const __m256i*)(wg+NB*32+j*32)); }
    UNR for(int r=0;r<R;++r){ int64_t u; memcpy(&u,a+r*2*lda+lda+4*g,8);
      __m256i aa0=_mm256_set1_epi32(int32_t(u)), aa1=_mm256_set1_epi32(int32_t(u>>32));
      UNR for(int j=0;j<NB;++j){ __m256i t0=_mm256_maddubs_epi16(aa0,b0[j]); __m256i t1=_mm256_maddubs_epi16(aa1,b1[j]);
        acc[r][j]=_mm256_add_epi32(acc[r][j],_mm256_madd_epi16(_mm256_add_epi16(t0,t1),ones));}}}
  UNR for(int r=0;r<R;++r) UNR for(int j=0;j<NB;++j) _mm256_storeu_si256((__m256i*)(out+(r*NB+j)*8),acc[r][j]);
}
constexpr int K=384; alignas(64) int8_t W[K*64]; alignas(64) int8_t A[8*2*K]; int32_t O[8*4*8];
template<class F> double run(F f,long macs){ double best=1e9; for(int rep=0;rep<5;++rep){ double t0=cpu_now(); for(int i=0;i<20000;++i) f(); double t=cpu_now()-t0; if(t<best) best=t;} return best/(20000.0*macs)*1e12; }
int main(){
  for(int i=0;i<K*64;++i) W[i]=rand()%127-63;
  for(int r=0;r<8;++r) for(int k=0;k<K;++k){ int v=rand()%256-128; A[r*2*K+k]=v; A[r*2*K+K+k]=abs(v)>127?127:abs(v);} 
  const int kg=K/4;
  for(int round=0;round<5;++round){
    printf("round %d (ps/MAC)\n",round);
#define B(NAME,R,NB) printf("  %-8s %dx%d %.3f\n",#NAME,R,NB,run([&]{k_##NAME<R,NB>(A,K,W,kg,O);},long(R)*NB*8*K));
    B(sign8,5,2) B(sign16,3,3) B(ux,5,2) B(ux,6,2) B(ux,4,3) B(ux,3,4) B(u7,4,3)
  }
}
