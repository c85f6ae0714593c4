// AVX2 FP32 GEMM register blocking, 6 x 2 against 4 x 3 ymm accumulators (and K blocks), interleaved.
//   g++ -O3 -mavx2 -mfma lab/cpu/f32_blocking.cc -o /tmp/f32_blocking && /tmp/f32_blocking
// One thread; weights packed per panel as [K][PW] (csrc/kernels/gemm_f32.cc's layout), the K loop
// (FMA with the A element broadcast) and a plain store per tile. Thread CPU time, best of 3 per
// round, 6 rounds alternating the order.
#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <vector>

static double cpu_s() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

template <int MR, int NB>
__attribute__((noinline)) void gemm(const float* a, int M, int K, const float* w, int N, float* y, int KC) {
  constexpr int PW = 8 * NB;
  for (int p = 0; p < N / PW; ++p) {
    const float* wp = w + static_cast<size_t>(p) * K * PW;
    for (int k0 = 0; k0 < K; k0 += KC) {
      const int kc = std::min(KC, K - k0);
      for (int m = 0; m + MR <= M; m += MR) {
        __m256 acc[MR][NB];
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
          for (int j = 0; j < NB; ++j)
            acc[r][j] = k0 ? _mm256_loadu_ps(y + static_cast<size_t>(m + r) * N + p * PW + j * 8) : _mm256_setzero_ps();
        const float* ar = a + static_cast<size_t>(m) * K + k0;
        const float* wk = wp + static_cast<size_t>(k0) * PW;
        for (int k = 0; k < kc; ++k) {
          __m256 b[NB];
#pragma GCC unroll 8
          for (int j = 0; j < NB; ++j) b[j] = _mm256_loadu_ps(wk + k * PW + j * 8);
#pragma GCC unroll 8
          for (int r = 0; r < MR; ++r) {
            const __m256 av = _mm256_broadcast_ss(ar + static_cast<size_t>(r) * K + k);
#pragma GCC unroll 8
            for (int j = 0; j < NB; ++j) acc[r][j] = _mm256_fmadd_ps(av, b[j], acc[r][j]);
          }
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
          for (int j = 0; j < NB; ++j) _mm256_storeu_ps(y + static_cast<size_t>(m + r) * N + p * PW + j * 8, acc[r][j]);
      }
    }
  }
}

template <int MR, int NB>
double run(const float* a, int M, int K, const float* w, int N, float* y, int KC) {
  double best = 1e9;
  const int Mu = M / MR * MR, Nu = N / (8 * NB) * (8 * NB);
  for (int i = 0; i < 3; ++i) {
    const double t = cpu_s();
    gemm<MR, NB>(a, Mu, K, w, Nu, y, KC);
    best = std::min(best, cpu_s() - t);
  }
  return 2.0 * Mu * Nu * K / best / 1e9;
}

int main() {
  const int shapes[][3] = {{16, 1152, 384}, {96, 1536, 384}, {96, 384, 1536}, {96, 1152, 384}};
  std::vector<float> a(96 * 1536, 0.5f), w(1536 * 1536, 0.25f), y(96 * 1536);
  std::printf("M N K: GFLOP/s 6x2 KC256 | 4x3 KC256 | 6x2 KC=K (per round)\n");
  for (auto& s : shapes) {
    std::printf("%d %d %d:", s[0], s[1], s[2]);
    double sa = 0, sb = 0, sc = 0;
    for (int r = 0; r < 6; ++r) {
      double x, u, v;
      if (r % 2) {
        v = run<6, 2>(a.data(), s[0], s[2], w.data(), s[1], y.data(), s[2]);
        u = run<4, 3>(a.data(), s[0], s[2], w.data(), s[1], y.data(), 256);
        x = run<6, 2>(a.data(), s[0], s[2], w.data(), s[1], y.data(), 256);
      } else {
        x = run<6, 2>(a.data(), s[0], s[2], w.data(), s[1], y.data(), 256);
        u = run<4, 3>(a.data(), s[0], s[2], w.data(), s[1], y.data(), 256);
        v = run<6, 2>(a.data(), s[0], s[2], w.data(), s[1], y.data(), s[2]);
      }
      std::printf("  %.0f|%.0f|%.0f", x, u, v);
      sa += x; sb += u; sc += v;
    }
    std::printf("   4x3/6x2 %.3f, KC=K/KC256 %.3f\n", sb / sa, sc / sa);
  }
}
