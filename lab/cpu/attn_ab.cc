// Standalone A/B of two builds of csrc/kernels/attention.cc (thread CPU time, interleaved):
// lab/cpu/attn_ab.sh compiles the committed version (git show REV:...) into namespace zoi::olda
// and the working copy into zoi::newa, with the same ISA flags, and links this driver.
// Usage: attn_ab [B] [L] [heads] [d] [reps] [rounds] [prec] [same]   (default MiniLM 32x128: 32 128 12 32)
// prec: AttnArgs::prec of the new build's calls (0 FP32, 1 INT8 q.k^T, 2 INT8 q.k^T and p.v,
// 3 AMX-BF16: the new build's attention_amx, the amx table's entry, where it has one); the old build
// runs with prec = 0 (a revision without the field ignores it), or with prec too when `same` is 1
// (a refactor of a low-precision path: max|old-new| must be 0; prec 3: the old build's attention,
// which ran AMX-BF16 before the amx table got its own entry).
// Prints per round the CPU ms of one call of each (one thread, all items), the max abs
// difference between the two outputs, each one's max error against a float64 reference on the
// first sequence (all heads), and a last line of JSON.
#include <time.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/kernels.h"

namespace zoi {
namespace olda { void attention(const AttnArgs& a, int tid, int nt); }
namespace newa {
void attention(const AttnArgs& a, int tid, int nt);
__attribute__((weak)) void attention_amx(const AttnArgs& a, int tid, int nt);  // vnni builds only
}  // namespace newa
}  // namespace zoi

static double cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

int main(int argc, char** argv) {
  const int B = argc > 1 ? atoi(argv[1]) : 32, L = argc > 2 ? atoi(argv[2]) : 128;
  const int heads = argc > 3 ? atoi(argv[3]) : 12, d = argc > 4 ? atoi(argv[4]) : 32;
  const int reps = argc > 5 ? atoi(argv[5]) : 3, rounds = argc > 6 ? atoi(argv[6]) : 7;
  const int prec = argc > 7 ? atoi(argv[7]) : 0;
  const bool same = argc > 8 && atoi(argv[8]) != 0;
  auto* newf = prec == 3 && zoi::newa::attention_amx ? zoi::newa::attention_amx : zoi::newa::attention;
  const int T = B * L, H = heads * d;
  std::vector<float> qkv(static_cast<size_t>(T) * 3 * H), o1(static_cast<size_t>(T) * H), o2(o1.size());
  std::mt19937 g(1);
  std::normal_distribution<float> nd(0.f, 1.5f);
  for (auto& x : qkv) x = nd(g);
  std::vector<int32_t> cu(B + 1);
  for (int b = 0; b <= B; ++b) cu[b] = b * L;
  const size_t stride = (zoi::attn_scratch_floats(L, d) + 15) / 16 * 16;
  std::vector<float> scratch(stride + 64);
  zoi::AttnArgs a;
  a.qkv = qkv.data(); a.ldqkv = 3 * H; a.cu = cu.data(); a.B = B; a.heads = heads; a.d = d;
  a.scale = 1.f / std::sqrt(static_cast<float>(d)); a.ldo = H; a.scratch = scratch.data();
  a.scratch_stride = stride;
  double best1 = 1e30, best2 = 1e30;
  for (int r = 0; r < rounds; ++r) {
    a.out = o1.data();
    a.prec = same ? prec : 0;
    double t0 = cpu_ms();
    for (int i = 0; i < reps; ++i) zoi::olda::attention(a, 0, 1);
    double t1 = (cpu_ms() - t0) / reps;
    a.out = o2.data();
    a.prec = prec;
    t0 = cpu_ms();
    for (int i = 0; i < reps; ++i) newf(a, 0, 1);
    double t2 = (cpu_ms() - t0) / reps;
    a.prec = 0;
    best1 = t1 < best1 ? t1 : best1;
    best2 = t2 < best2 ? t2 : best2;
    printf("round %d: old %.3f ms  new %.3f ms  (%.3fx)\n", r, t1, t2, t2 / t1);
  }
  double md = 0, mx = 0;
  bool fin = true;
  for (size_t i = 0; i < o1.size(); ++i) {
    fin = fin && std::isfinite(o2[i]);
    md = std::fmax(md, std::fabs(o1[i] - o2[i]));
    mx = std::fmax(mx, std::fabs(o1[i]));
  }
  // float64 reference of sequence 0, every head
  double e1 = 0, e2 = 0, rmax = 0;
  std::vector<double> sc(L);
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < L; ++i) {
      const float* q = &qkv[static_cast<size_t>(i) * 3 * H + h * d];
      double m = -1e300, sum = 0;
      for (int j = 0; j < L; ++j) {
        const float* k = &qkv[static_cast<size_t>(j) * 3 * H + H + h * d];
        double t = 0;
        for (int c = 0; c < d; ++c) t += static_cast<double>(q[c]) * k[c];
        sc[j] = t * a.scale;
        m = sc[j] > m ? sc[j] : m;
      }
      for (int j = 0; j < L; ++j) sum += (sc[j] = std::exp(sc[j] - m));
      for (int c = 0; c < d; ++c) {
        double o = 0;
        for (int j = 0; j < L; ++j) o += sc[j] * qkv[static_cast<size_t>(j) * 3 * H + 2 * H + h * d + c];
        o /= sum;
        const size_t at = static_cast<size_t>(i) * H + h * d + c;
        e1 = std::fmax(e1, std::fabs(o1[at] - o));
        e2 = std::fmax(e2, std::fabs(o2[at] - o));
        rmax = std::fmax(rmax, std::fabs(o));
      }
    }
  printf("B=%d L=%d heads=%d d=%d prec=%d: best old %.3f ms, new %.3f ms (%.3fx); max|old-new| %.3g (max|old| %.3g) finite %d\n",
         B, L, heads, d, prec, best1, best2, best2 / best1, md, mx, fin);
  printf("seq 0 vs float64: max err old %.3g, new %.3g (max|ref| %.3g)\n", e1, e2, rmax);
  printf("{\"B\": %d, \"L\": %d, \"heads\": %d, \"d\": %d, \"prec\": %d, \"rounds\": %d, \"reps\": %d, "
         "\"old_ms\": %.4f, \"new_ms\": %.4f, \"ratio\": %.4f, \"max_abs_old_new\": %.4g, "
         "\"err64_old\": %.4g, \"err64_new\": %.4g, \"ref_max\": %.4g}\n",
         B, L, heads, d, prec, rounds, reps, best1, best2, best2 / best1, md, e1, e2, rmax);
  return fin ? 0 : 1;
}
