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
    // the task adapters (zoi.numerics.reference.lora_embed): word + A_t[id] B_t, then pos, type,
    // lora_type[task]
    const int task = a.tok_task ? a.tok_task[t] : -1;
    const int r = a.lora_r;
    const float* la = task >= 0 ? a.lora_a + (static_cast<size_t>(task) * a.lora_V + id) * r : nullptr;
    const float* lb = task >= 0 ? a.lora_b + static_cast<size_t>(task) * r * H : nullptr;
    const float* lt = task >= 0 && a.lora_type ? a.lora_type + static_cast<size_t>(task) * H : nullptr;
    if (a.word) {
      const float* wr = a.word + id * H;
      for (int k = 0; k < H; k += V::N) {
        const int n = H - k;
        V::T v = V::load_n(wr + k, n);
        if (la) {
          V::T d = V::mul(V::set(la[0]), V::load_n(lb + k, n));
          for (int j = 1; j < r; ++j) d = V::fma(V::set(la[j]), V::load_n(lb + static_cast<size_t>(j) * H + k, n), d);
          v = V::add(v, d);
        }
        if (p) v = V::add(v, V::load_n(p + k, n));
        if (ty) v = V::add(v, V::load_n(ty + k, n));
        if (lt) v = V::add(v, V::load_n(lt + k, n));
        V::store_n(y + k, v, n);
      }
    } else {
      const int8_t* wq = a.word_q + id * H;
      const float sc = a.word_scale[id];
      for (int k = 0; k < H; ++k) {
        float v = static_cast<float>(wq[k]) * sc;
        if (la) {
          float d = la[0] * lb[k];
          for (int j = 1; j < r; ++j) d = S1::fma(la[j], lb[static_cast<size_t>(j) * H + k], d);
          v = v + d;
        }
        v = v + (p ? p[k] : 0.0f);
        v = ty ? v + ty[k] : v;
        y[k] = lt ? v + lt[k] : v;
      }
    }
    if (a.ln_w) ln_row(y, nullptr, a.ln_w, a.ln_b, a.eps, H, y);  // decoder architectures: no norm here
    if (a.qo.q) quantize_into(y, H, a.qo, static_cast<int>(t));
  }
}

}  // namespace ZOI_NS
}  // namespace zoi
