// Standalone A/B of two builds of csrc/kernels/attention.cc (thread CPU time, interleaved):
// lab/cpu/attn_ab.sh compiles the committed version (git show REV:...) into namespace zoi::olda
// and the working copy into zoi::newa, with the same ISA flags, and links this driver.
// Usage: attn_ab [B] [L] [heads] [d] [reps] [rounds]   (default MiniLM 32x128: 32 128 12 32)
// Prints per round the CPU ms of one call of each (one thread, all items), and the max
// abs difference between the two outputs and a float64 reference-free check (finite).
#include <time.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/kernels.h"

namespace zoi {
namespace olda { void attention(const AttnArgs& a, int tid, int nt); }
namespace newa { void attention(const AttnArgs& a, int tid, int nt); }
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
    double t0 = cpu_ms();
    for (int i = 0; i < reps; ++i) zoi::olda::attention(a, 0, 1);
    double t1 = (cpu_ms() - t0) / reps;
    a.out = o2.data();
    t0 = cpu_ms();
    for (int i = 0; i < reps; ++i) zoi::newa::attention(a, 0, 1);
    double t2 = (cpu_ms() - t0) / reps;
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
  printf("B=%d L=%d heads=%d d=%d: best old %.3f ms, new %.3f ms (%.3fx); max|old-new| %.3g (max|old| %.3g) finite %d\n",
         B, L, heads, d, best1, best2, best2 / best1, md, mx, fin);
  return fin ? 0 : 1;
}
