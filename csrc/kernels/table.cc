// Gathers this ISA's kernels into a KernelTable (compiled once per ISA like the kernels).
#include "kernels.h"

namespace zoi {
namespace ZOI_NS {

size_t pack_i8_bytes(int N, int K);
void pack_i8(const int8_t* w, int N, int K, void* dst, int32_t* colsum);
void gemm_i8(const GemmI8Args& a, int tid, int nt);
int i8_kgroup();
int i8_a_bytes();
int i8_a_off_sym();
int i8_a_off_asym();
int i8_a_get(const void* q, int ldq, int m, int k);
void i8_a_set(void* q, int ldq, int m, int k, int v);
int i8_panel();
size_t pack_f32_bytes(int N, int K);
void pack_f32(const float* w, int N, int K, float* dst);
void gemm_f32(const GemmF32Args& a, int tid, int nt);
int f32_panel();
void quantize_rows(const float* x, int ldx, int M, int K, const QuantOut& qo, int tid, int nt);
void layernorm(const LnArgs& a, int tid, int nt);
void embed(const EmbedArgs& a, int tid, int nt);
void attention(const AttnArgs& a, int tid, int nt);
void pool(const PoolArgs& a, int tid, int nt);
void normalize(float* p, int ld, int B, int H, int tid, int nt);
void activation(float* x, size_t n, int act);
double peak_i8(long iters);
void glu(const GluArgs& a, int tid, int nt);
void lora(const LoraArgs& a, int tid, int nt);
void paged_qkv(const PagedQkvArgs& a, int tid, int nt);
void paged_attention(const PagedAttnArgs& a, int tid, int nt);
void paged_merge(const PagedAttnArgs& a, int tid, int nt);

#if defined(ZOI_ISA_VNNI)
#define ZOI_ISA_ENUM Isa::Vnni
#elif defined(ZOI_ISA_AVX512)
#define ZOI_ISA_ENUM Isa::Avx512
#elif defined(ZOI_ISA_AVXVNNI)
#define ZOI_ISA_ENUM Isa::AvxVnni
#elif defined(ZOI_ISA_AVX2)
#define ZOI_ISA_ENUM Isa::Avx2
#elif defined(ZOI_ISA_I8MM)
#define ZOI_ISA_ENUM Isa::I8mm
#elif defined(ZOI_ISA_DOTPROD)
#define ZOI_ISA_ENUM Isa::Dotprod
#elif defined(ZOI_ISA_NEON)
#define ZOI_ISA_ENUM Isa::Neon
#else
#define ZOI_ISA_ENUM Isa::Scalar
#endif

const KernelTable& table() {
  static const KernelTable t = {
      ZOI_ISA_ENUM, i8_kgroup(), i8_a_bytes(), i8_a_off_sym(), i8_a_off_asym(), i8_panel(), f32_panel(),
      pack_i8_bytes, pack_i8, pack_f32_bytes, pack_f32, gemm_i8, gemm_f32, quantize_rows,
      layernorm, embed, attention, pool, normalize, activation, peak_i8, i8_a_get, i8_a_set,
      glu, lora, paged_qkv, paged_attention, paged_merge,
  };
  return t;
}

}  // namespace ZOI_NS
}  // namespace zoi
