// Embeddings: x[t] = LN(word[ids[t]] + pos[positions[t]] (+ type[0])) * w + b (pos may be null:
// no position table, ModernBERT), the word table
// either float32 or INT8 per row (dequantised as float(q) * scale[id], like the emulation);
// optional fused quantisation of the output rows for the first INT8 GEMM.
#include "kernels.h"
#include "qrow.h"
#include "simd.h"

namespace zoi {
namespace ZOI_NS {

void ln_row(const float* x, const float* r, const float* w, const float* b, float eps, int H, float* y);

void embed(const EmbedArgs& a, int tid, int nt) {
  long lo, hi;
  split_range(a.T, tid, nt, &lo, &hi);
  const int H = a.H;
  for (long t = lo; t < hi; ++t) {
    float* y = a.y + t * a.ldy;
    const size_t id = static_cast<size_t>(a.ids[t]);
    // no position table (ModernBERT: RoPE in attention): nothing added
    const float* p = a.pos ? a.pos + static_cast<size_t>(a.positions[t]) * H : nullptr;
    const float* ty = a.types ? a.type + static_cast<size_t>(a.types[t]) * H : a.type0;
    if (a.word) {
      const float* wr = a.word + id * H;
      for (int k = 0; k < H; k += V::N) {
        const int n = H - k;
        V::T v = V::load_n(wr + k, n);
        if (p) v = V::add(v, V::load_n(p + k, n));
        if (ty) v = V::add(v, V::load_n(ty + k, n));
        V::store_n(y + k, v, n);
      }
    } else {
      const int8_t* wq = a.word_q + id * H;
      const float sc = a.word_scale[id];
      for (int k = 0; k < H; ++k) {
        float v = static_cast<float>(wq[k]) * sc + (p ? p[k] : 0.0f);
        y[k] = ty ? v + ty[k] : v;
      }
    }
    if (a.ln_w) ln_row(y, nullptr, a.ln_w, a.ln_b, a.eps, H, y);  // decoder architectures: no norm here
    if (a.qo.q) quantize_into(y, H, a.qo, static_cast<int>(t));
  }
}

}  // namespace ZOI_NS
}  // namespace zoi
