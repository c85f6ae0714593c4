// A/B of the AMX tile GEMM: csrc/kernels/gemm_amx.cc of a revision (namespace zoi::olda) against
// the working copy (zoi::newa), both over vnni's packed panels (gemm_int8.cc compiled as zoi::vnni),
// called alternately in one process: per (shape, epilogue) GOP/s from the calling threads' CPU time
// (CLOCK_THREAD_CPUTIME_ID), best of `reps` calls per round, median over `rounds`, and whether the two
// outputs are bit-identical (float y, or the quantised rows + scales + zero points of the fused path).
// Built and run by lab/cpu/amx_ab.sh.
//   amx_ab [threads rounds reps]
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <immintrin.h>

#include "kernels/kernels.h"

namespace zoi {
namespace vnni {
size_t pack_i8_bytes(int N, int K);
void pack_i8(const int8_t* w, int N, int K, void* dst, int32_t* colsum);
const KernelTable& table() {  // the amx tables copy vnni's; only their gemm_i8 / peak_i8 are used here
  static KernelTable k{};
  return k;
}
}  // namespace vnni
namespace olda { const KernelTable& table(); }
namespace newa { const KernelTable& table(); }
}  // namespace zoi

using namespace zoi;

static double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
static double wall_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

template <class T>
struct ABuf {  // 64-byte aligned, poisoned
  std::vector<unsigned char> raw;
  T* p;
  explicit ABuf(size_t n, unsigned char fill = 0xff) : raw(n * sizeof(T) + 64, fill) {
    p = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(raw.data()) + 63) / 64 * 64);
  }
};

struct Case {
  int M, N, K;
  const char* mode;  // none | gelu | res | gelu_q (GELU + the fused row quantisation) | res_q
};

struct Data {
  int M, N, K, Kp, Np;
  ABuf<uint8_t> a;
  ABuf<int8_t> w;
  std::vector<int32_t> colsum, azp;
  std::vector<float> ws, bias, as;
  ABuf<float> res;
  Data(int M_, int N_, int K_)
      : M(M_), N(N_), K(K_), Kp(round_up(K_, 4)), Np(round_up(N_, 48)), a(static_cast<size_t>(M_) * round_up(K_, 4)),
        w(vnni::pack_i8_bytes(N_, K_)), colsum(Np), azp(M_), ws(Np, 0.f), bias(Np, 0.f), as(M_),
        res(static_cast<size_t>(M_) * N_) {
    uint32_t st = 12345u + M * 7u + N * 13u + K;
    auto rnd = [&]() { st = st * 1664525u + 1013904223u; return st >> 8; };
    for (size_t i = 0; i < static_cast<size_t>(M) * Kp; ++i) a.p[i] = static_cast<uint8_t>(rnd() % 256);
    std::vector<int8_t> wr(static_cast<size_t>(N) * K);
    for (auto& v : wr) v = static_cast<int8_t>(static_cast<int>(rnd() % 255) - 127);
    vnni::pack_i8(wr.data(), N, K, w.p, colsum.data());
    for (int n = 0; n < N; ++n) {
      ws[n] = 1e-5f * (1 + rnd() % 100);
      bias[n] = (static_cast<int>(rnd() % 2001) - 1000) * 1e-3f;
    }
    for (int m = 0; m < M; ++m) {
      azp[m] = (m % 3 == 0) ? static_cast<int>(rnd() % 256) : 128;  // asymmetric and symmetric rows
      as[m] = 1e-3f * (1 + rnd() % 50);
    }
    for (size_t i = 0; i < static_cast<size_t>(M) * N; ++i) res.p[i] = (static_cast<int>(rnd() % 2001) - 1000) * 1e-3f;
  }
};

struct Out {
  ABuf<float> y;
  ABuf<uint8_t> q;
  std::vector<float> qs;
  std::vector<int32_t> qz;
  Out(int M, int N) : y(static_cast<size_t>(M) * N), q(static_cast<size_t>(M) * round_up(N, 4)), qs(M), qz(M) {}
};

static GemmI8Args args(const Data& d, Out& o, const char* mode) {
  GemmI8Args g;
  g.a = d.a.p; g.lda = d.Kp; g.a_scale = d.as.data(); g.a_zp = d.azp.data();
  g.w = d.w.p; g.colsum = d.colsum.data(); g.w_scale = d.ws.data(); g.bias = d.bias.data();
  g.M = d.M; g.N = d.N; g.Kp = d.Kp; g.y = o.y.p; g.ldy = d.N;
  const std::string m = mode;
  if (m.rfind("gelu", 0) == 0) g.act = ACT_GELU;
  if (m.rfind("res", 0) == 0) { g.res = d.res.p; g.ldr = d.N; }
  if (m.find("_y1") != std::string::npos) { g.ldy = 0; g.ldr = 0; }  // every row into one L1-hot row: no output traffic
  if (m.size() > 2 && m.compare(m.size() - 2, 2, "_q") == 0) {
    g.qo.q = o.q.p; g.qo.ldq = round_up(d.N, 4); g.qo.scale = o.qs.data(); g.qo.zp = o.qz.data();
  }
  return g;
}

// nt threads each call gemm(tid, nt) `reps` times with a spin barrier between calls; returns the
// best per-call CPU time of thread 0 and the mean over the threads of their CPU time per call
struct Timing { double cpu0, cpu_mean, wall; };
static Timing timed(const KernelTable& kt, const GemmI8Args& g, int nt, int reps) {
  std::atomic<int> arrived{0};
  std::atomic<int> gen{0};
  std::vector<double> best(nt, 1e30), tot(nt, 0.);
  auto barrier = [&]() {
    const int my = gen.load();
    if (arrived.fetch_add(1) + 1 == nt) { arrived.store(0); gen.fetch_add(1); }
    else while (gen.load() == my) {}
  };
  auto body = [&](int tid) {
    for (int r = 0; r < reps; ++r) {
      barrier();
      const double c0 = cpu_now();
      kt.gemm_i8(g, tid, nt);
      const double c = cpu_now() - c0;
      best[tid] = std::min(best[tid], c);
      tot[tid] += c;
    }
    barrier();
  };
  const double w0 = wall_now();
  std::vector<std::thread> th;
  for (int t = 1; t < nt; ++t) th.emplace_back(body, t);
  body(0);
  for (auto& t : th) t.join();
  const double w = (wall_now() - w0) / reps;
  double mean = 0;
  for (int t = 0; t < nt; ++t) mean += tot[t] / reps / nt;
  return {best[0], mean, w};
}

static bool same(const Data& d, const Out& x, const Out& y, const char* mode) {
  const size_t n = static_cast<size_t>(d.M) * d.N;
  if (std::memcmp(x.y.p, y.y.p, n * 4) != 0) return false;
  for (size_t i = 0; i < n; ++i) if (x.y.p[i] != x.y.p[i]) return false;  // NaN: poisoned cell left
  const std::string m = mode;
  if (m.size() > 2 && m.compare(m.size() - 2, 2, "_q") == 0) {
    const int ldq = round_up(d.N, 4);
    for (int r = 0; r < d.M; ++r)
      if (std::memcmp(x.q.p + static_cast<size_t>(r) * ldq, y.q.p + static_cast<size_t>(r) * ldq, d.N) != 0) return false;
    if (std::memcmp(x.qs.data(), y.qs.data(), d.M * 4) || std::memcmp(x.qz.data(), y.qz.data(), d.M * 4)) return false;
  }
  return true;
}


// ---- micro-benchmarks of the tile unit (amx_ab micro): tdpbusd throughput with 1-4 independent
// accumulator chains (no loads), and a K loop with its tile loads from L1 / L2-sized buffers
struct TileCfg {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static void cfg() {
  alignas(64) TileCfg c;
  for (int t = 0; t < 8; ++t) { c.colsb[t] = 64; c.rows[t] = 16; }
  _tile_loadconfig(&c);
}
template <int CH>
static double chains(long iters) {  // returns dp per second
  cfg();
  alignas(64) static uint8_t buf[1024];
  _tile_loadd(4, buf, 64); _tile_loadd(5, buf, 64); _tile_loadd(6, buf, 64); _tile_loadd(7, buf, 64);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  const double c0 = cpu_now();
  for (long i = 0; i < iters; ++i) {  // 12 dp per iteration over CH chains
    if (CH == 1) { _tile_dpbusd(0, 4, 6); _tile_dpbusd(0, 4, 7); _tile_dpbusd(0, 5, 6); _tile_dpbusd(0, 5, 7); _tile_dpbusd(0, 4, 6); _tile_dpbusd(0, 4, 7); _tile_dpbusd(0, 5, 6); _tile_dpbusd(0, 5, 7); _tile_dpbusd(0, 4, 6); _tile_dpbusd(0, 4, 7); _tile_dpbusd(0, 5, 6); _tile_dpbusd(0, 5, 7); }
    if (CH == 2) { _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7); _tile_dpbusd(0, 5, 6); _tile_dpbusd(1, 5, 7); _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7); _tile_dpbusd(0, 5, 6); _tile_dpbusd(1, 5, 7); _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7); _tile_dpbusd(0, 5, 6); _tile_dpbusd(1, 5, 7); }
    if (CH == 3) { _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7); _tile_dpbusd(2, 5, 6); _tile_dpbusd(0, 5, 7); _tile_dpbusd(1, 4, 6); _tile_dpbusd(2, 4, 7); _tile_dpbusd(0, 5, 6); _tile_dpbusd(1, 5, 7); _tile_dpbusd(2, 4, 6); _tile_dpbusd(0, 4, 7); _tile_dpbusd(1, 5, 6); _tile_dpbusd(2, 5, 7); }
    if (CH == 4) { _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7); _tile_dpbusd(2, 5, 6); _tile_dpbusd(3, 5, 7); _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7); _tile_dpbusd(2, 5, 6); _tile_dpbusd(3, 5, 7); _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7); _tile_dpbusd(2, 5, 6); _tile_dpbusd(3, 5, 7); }
  }
  const double t = cpu_now() - c0;
  alignas(64) static int32_t out[256];
  _tile_stored(0, out, 64);
  _tile_release();
  return 12.0 * iters / t;
}
// 2x2 K loop: per step 2 A + 2 B loads + 4 dp; A rows stride lda over `abytes`, B over `bbytes`
// (cycled), to see where the loads start to cost
static double loop22(size_t abytes, size_t bbytes, long steps) {
  cfg();
  std::vector<uint8_t> A(abytes + 64 * 16 * 2 + 4096, 1), B(bbytes + 192 * 16 + 4096, 1);
  uint8_t* a = A.data() + (64 - reinterpret_cast<uintptr_t>(A.data()) % 64) % 64;
  uint8_t* b = B.data() + (64 - reinterpret_cast<uintptr_t>(B.data()) % 64) % 64;
  const size_t lda = 384;  // A: 32 rows x 384 bytes per "block" (K = 384), 6 steps per block
  size_t ao = 0, bo = 0;
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  const double c0 = cpu_now();
  for (long s = 0; s < steps; ++s) {
    const uint8_t* ap = a + ao;
    const uint8_t* bp = b + bo;
    _tile_loadd(4, ap, lda);
    _tile_loadd(6, bp, 192);
    _tile_loadd(7, bp + 64, 192);
    _tile_loadd(5, ap + 16 * lda, lda);
    _tile_dpbusd(0, 4, 6); _tile_dpbusd(1, 4, 7); _tile_dpbusd(2, 5, 6); _tile_dpbusd(3, 5, 7);
    ao += 64; if (ao % lda == 0) { ao += 31 * lda; } if (ao + 32 * lda > abytes) ao = 0;
    bo += 16 * 192; if (bo + 16 * 192 > bbytes) bo = 0;
  }
  const double t = cpu_now() - c0;
  alignas(64) static int32_t out[256];
  _tile_stored(0, out, 64);
  _tile_release();
  return 4.0 * steps / t;
}
static double core_ghz() {  // a chain of dependent 1-cycle adds: cycles per second of this core
  long n = 200000000, x = 0;
  const double c0 = cpu_now();
  __asm__ volatile("1:\n\tadd $1, %1\n\tadd $1, %1\n\tadd $1, %1\n\tadd $1, %1\n\tsub $4, %0\n\tjnz 1b" : "+r"(n), "+r"(x));
  return 200000000.0 / (cpu_now() - c0) / 1e9;
}
static int micro_main() {
  std::printf("core clock ~%.2f GHz (dependent adds)\n", core_ghz());
  for (int r = 0; r < 2; ++r) {
    const long it = 200000;
    std::printf("tdpbusd per second (thread CPU), 12 per iteration: 1 chain %.3g  2 chains %.3g  3 chains %.3g  4 chains %.3g\n",
                chains<1>(it), chains<2>(it), chains<3>(it), chains<4>(it));
  }
  {  // both vCPUs at once: is the tile unit per vCPU (per-thread rate unchanged) or shared?
    double r2[2];
    std::thread other([&] { if (syscall(SYS_arch_prctl, 0x1023, 18) == 0) r2[1] = chains<4>(400000); });
    r2[0] = chains<4>(400000);
    other.join();
    std::printf("4 chains on 2 threads at once: %.3g and %.3g dp/s per thread\n", r2[0], r2[1]);
  }
  const long steps = 2000000;
  for (size_t ab : {size_t(12) << 10, size_t(96) << 10, size_t(384) << 10, size_t(1536) << 10})
    for (size_t bb : {size_t(12) << 10, size_t(48) << 10, size_t(442) << 10})
      std::printf("2x2 K loop, A over %5zu KiB, B over %4zu KiB: %.3g dp/s\n", ab >> 10, bb >> 10, loop22(ab, bb, steps));
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "micro") {
    if (syscall(SYS_arch_prctl, 0x1023, 18)) { std::perror("arch_prctl"); return 1; }
    return micro_main();
  }
  const int nt = argc > 1 ? std::atoi(argv[1]) : 1;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) {
    std::perror("arch_prctl(ARCH_REQ_XCOMP_PERM)");
    return 1;
  }
  setenv("ZOI_AMX_MIN_M", "1", 1);
  const KernelTable& A = olda::table();
  const KernelTable& B = newa::table();
  double la[3];
  getloadavg(la, 3);
  std::printf("threads %d rounds %d reps %d load %.2f\n", nt, rounds, reps, la[0]);
  for (int r = 0; r < 2; ++r) {
    const long it = 400000;
    double c0 = cpu_now();
    double oa = A.peak_i8(it);
    double ta = cpu_now() - c0;
    c0 = cpu_now();
    double ob = B.peak_i8(it);
    double tb = cpu_now() - c0;
    std::printf("peak loop: old %.0f GOP/s  new %.0f GOP/s (thread CPU)\n", oa / ta / 1e9, ob / tb / 1e9);
  }
  std::vector<Case> cases;
  const char* env = std::getenv("AMX_AB_CASES");  // "M,N,K,mode;..." or the MiniLM set below
  if (env && *env) {
    std::string s = env;
    size_t p = 0;
    while (p < s.size()) {
      size_t e = s.find(';', p);
      if (e == std::string::npos) e = s.size();
      int M, N, K;
      static std::vector<std::string> modes;
      char mode[32];
      if (std::sscanf(s.substr(p, e - p).c_str(), "%d,%d,%d,%31s", &M, &N, &K, mode) == 4) {
        modes.emplace_back(mode);
        cases.push_back({M, N, K, nullptr});
        cases.back().mode = strdup(mode);
      }
      p = e + 1;
    }
  } else {
    for (int M : {1024, 4096}) {
      cases.push_back({M, 1152, 384, "none"});   // QKV
      cases.push_back({M, 384, 384, "res"});     // attention output + residual
      cases.push_back({M, 1536, 384, "gelu_q"}); // FFN1: GELU, rows quantised for FFN2
      cases.push_back({M, 1536, 384, "gelu"});
      cases.push_back({M, 384, 1536, "res"});    // FFN2 + residual
    }
  }
  std::printf("GOP/s per thread from thread CPU time, best call of all rounds\n%5s %5s %5s %-8s %9s %9s %7s %s\n", "M", "N", "K", "mode", "old", "new", "new/old", "identical");
  for (const Case& c : cases) {
    Data d(c.M, c.N, c.K);
    Out oa(c.M, c.N), ob(c.M, c.N);
    std::memset(oa.y.p, 0xff, sizeof(float) * c.M * c.N);  // NaN poison
    std::memset(ob.y.p, 0xff, sizeof(float) * c.M * c.N);
    const GemmI8Args ga = args(d, oa, c.mode), gb = args(d, ob, c.mode);
    A.gemm_i8(ga, 0, 1);  // first call: correctness on poisoned outputs (single thread)
    B.gemm_i8(gb, 0, 1);
    bool ok = same(d, oa, ob, c.mode);
    std::vector<double> ra, rb, wa, wb;
    for (int r = 0; r < rounds; ++r) {
      Timing x = timed(A, ga, nt, reps), y = timed(B, gb, nt, reps);
      ra.push_back(x.cpu0); rb.push_back(y.cpu0); wa.push_back(x.wall); wb.push_back(y.wall);
    }
    ok = ok && same(d, oa, ob, c.mode);  // after the multi-threaded calls
    auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
    const double ops = 2.0 * c.M * c.N * c.K;
    // best per-call time over all rounds (the machine is shared: the least disturbed call), median beside it
    const double a = *std::min_element(ra.begin(), ra.end()), b = *std::min_element(rb.begin(), rb.end());
    const double am = med(ra), bm = med(rb);
    getloadavg(la, 3);
    std::printf("%5d %5d %5d %-8s %9.0f %9.0f %7.2f %s  (median: %.0f %.0f %.2f; wall ms old %.3f new %.3f; load %.1f)\n",
                c.M, c.N, c.K, c.mode, ops / a / 1e9 / nt, ops / b / 1e9 / nt, a / b, ok ? "yes" : "NO",
                ops / am / 1e9 / nt, ops / bm / 1e9 / nt, am / bm, med(wa) * 1e3, med(wb) * 1e3, la[0]);
    std::fflush(stdout);
  }
  return 0;
}
