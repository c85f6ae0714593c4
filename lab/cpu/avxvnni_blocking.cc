// AVX-VNNI INT8 GEMM register blocking, 6 x 2 against 4 x 3 ymm accumulators, interleaved.
//   g++ -O3 -mavx2 -mfma -mavxvnni lab/cpu/avxvnni_blocking.cc -o /tmp/avxvnni_blocking && /tmp/avxvnni_blocking
// One thread; a MiniLM-shaped GEMM (A [M][K] u8 rows, weights packed per panel as
// [K/4][PW][4] s8 exactly as csrc/kernels/gemm_int8.cc packs them), the K loop of its micro-kernel
// and an s32 store per tile (the epilogue left out: it is the same for both). Thread CPU time,
// best of 5 per round, rounds alternate the order; prints GOP/s per variant and shape.
#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

static double cpu_s() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

template <int MR, int NB>
__attribute__((noinline)) void gemm(const uint8_t* a, int M, int K, const int8_t* w, int N, int32_t* out) {
  constexpr int PW = 8 * NB;
  const int kg = K / 4;
  for (int p = 0; p < N / PW; ++p) {
    const int8_t* wp = w + static_cast<size_t>(p) * K * PW;
    for (int m = 0; m + MR <= M; m += MR) {
      __m256i acc[MR][NB];
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) acc[r][j] = _mm256_setzero_si256();
      for (int g = 0; g < kg; ++g) {
        __m256i b[NB];
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) b[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + (g * PW + j * 8) * 4));
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          int32_t v;
          std::memcpy(&v, a + static_cast<size_t>(m + r) * K + g * 4, 4);
          const __m256i av = _mm256_set1_epi32(v);
#pragma GCC unroll 8
          for (int j = 0; j < NB; ++j) acc[r][j] = _mm256_dpbusd_avx_epi32(acc[r][j], av, b[j]);
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + static_cast<size_t>(m + r) * N + p * PW + j * 8), acc[r][j]);
    }
  }
}

template <int MR, int NB>
double run(const uint8_t* a, int M, int K, const int8_t* w, int N, int32_t* out) {
  double best = 1e9;
  const int Mu = M / MR * MR, Nu = N / (8 * NB) * (8 * NB);  // whole tiles only (same MACs counted)
  for (int i = 0; i < 5; ++i) {
    const double t = cpu_s();
    gemm<MR, NB>(a, Mu, K, w, Nu, out);
    best = std::min(best, cpu_s() - t);
  }
  return 2.0 * Mu * Nu * K / best / 1e9;
}

int main() {
  const int shapes[][3] = {{16, 1152, 384}, {128, 1152, 384}, {128, 1536, 384}, {128, 384, 1536}, {512, 1536, 384}};
  std::vector<uint8_t> a(512 * 1536);
  std::vector<int8_t> w(1536 * 1536);
  std::vector<int32_t> out(512 * 1536);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<int8_t>((i * 13) % 255 - 127);
  std::printf("M N K: GOP/s 6x2 | 4x3 (per round)\n");
  for (auto& s : shapes) {
    std::printf("%d %d %d:", s[0], s[1], s[2]);
    double sa = 0, sb = 0;
    for (int r = 0; r < 6; ++r) {
      double x, y;
      if (r % 2) { y = run<4, 3>(a.data(), s[0], s[2], w.data(), s[1], out.data()); x = run<6, 2>(a.data(), s[0], s[2], w.data(), s[1], out.data()); }
      else { x = run<6, 2>(a.data(), s[0], s[2], w.data(), s[1], out.data()); y = run<4, 3>(a.data(), s[0], s[2], w.data(), s[1], out.data()); }
      std::printf("  %.0f|%.0f", x, y);
      sa += x; sb += y;
    }
    std::printf("   mean 4x3/6x2 = %.3f\n", sb / sa);
  }
}
