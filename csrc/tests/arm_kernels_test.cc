// The C++ core's kernels driven directly, without Python: every ISA table of this build against
// the portable scalar table, on random inputs and awkward shapes (scripts/arm_check.sh builds it
// for aarch64 and runs it under qemu-aarch64; docs/ARM.md). INT8 results (integer sums, the
// epilogue without activation, the quantisers, LayerNorm) must be bit-identical, float kernels
// with fused multiply-adds within a tight tolerance.
//
// Cross-architecture: --dump FILE writes the scalar table's outputs of a fixed-seed case set,
// --ref FILE compares them (the x86-64 build of this driver dumps, the aarch64 build compares:
// the portable path computes the same numbers on both). --export-gemm DIR writes one INT8 GEMM's
// operands and s32 sums for tests/test_arm.py to replay through zoi._cpu on x86.
//
// Built with -DZOI_TEST_SCALAR_ONLY (the x86-64 reference build) it links the scalar kernels only.
//
// Usage: arm_kernels_test [--isas all|active|NAME,...] [--seed N] [--passes N] [--quick]
//          [--dump FILE | --ref FILE] [--export-gemm DIR] [--tok FIXTURE]
//          [--expect-best ISA] [--expect-active ISA] [--expect-unsupported ISA,...]
// ZOI_CPU_ISA=NAME forces the active ISA (--isas active), through zoi::set_forced_isa.
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "isa.h"
#include "kernels/kernels.h"
#include "runtime/pool.h"
#include "tokenizer/wordpiece.h"

namespace zoi {
#if defined(ZOI_TEST_SCALAR_ONLY)
// dispatch.cc (which references every ISA's table) is not linked in the scalar-only build
void throw_weight_out_of_range(size_t row, size_t col) {
  throw std::invalid_argument("INT8 weight -128 at row " + std::to_string(row) + ", column " + std::to_string(col));
}
#endif
}  // namespace zoi

namespace {

using zoi::Isa;
using zoi::KernelTable;

// ---------------------------------------------------------------- plumbing

int g_fail = 0, g_checks = 0;
void fail(const std::string& msg) {
  if (++g_fail <= 40) std::fprintf(stderr, "FAIL %s\n", msg.c_str());
}

struct Rng {  // splitmix64: the same stream on every architecture
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uni() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  float f(float lo, float hi) { return static_cast<float>(lo + (hi - lo) * uni()); }
  int i(int lo, int hi) { return lo + static_cast<int>(next() % static_cast<uint64_t>(hi - lo + 1)); }  // [lo, hi]
};

// 64-byte aligned, zero-filled buffer (the x86 kernels' aligned loads need it; so do panels)
template <class T>
struct Buf {
  struct Free { void operator()(void* p) const { std::free(p); } };
  std::unique_ptr<T, Free> p;
  size_t n = 0;
  Buf() = default;
  explicit Buf(size_t count) : n(count) {
    const size_t bytes = (count * sizeof(T) + 64 + 63) / 64 * 64;
    p.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
    std::memset(p.get(), 0, bytes);
  }
  T* data() const { return p.get(); }
  T& operator[](size_t i) const { return p.get()[i]; }
};

// one compared output: exact bytes, floats exact (any NaN equals any NaN: x86 and Arm make
// different default NaNs) or floats within atol + rtol * scale
enum Kind : int { kBytes = 0, kFloatExact = 1, kFloatClose = 2 };
struct Out {
  std::string tag;
  int kind = kBytes;
  std::vector<uint8_t> bytes;
  std::vector<float> scale;  // kFloatClose: the magnitude each element's tolerance scales with
  float rtol = 0.f, atol = 0.f;
};
using Outs = std::vector<Out>;

template <class T>
Out out_bytes(const std::string& tag, const T* p, size_t n) {
  Out o;
  o.tag = tag;
  o.kind = kBytes;
  o.bytes.assign(reinterpret_cast<const uint8_t*>(p), reinterpret_cast<const uint8_t*>(p + n));
  return o;
}
Out out_fexact(const std::string& tag, const float* p, size_t n) {
  Out o = out_bytes(tag, p, n);
  o.kind = kFloatExact;
  return o;
}
Out out_fclose(const std::string& tag, const float* p, size_t n, float rtol, float atol, std::vector<float> scale = {}) {
  Out o = out_bytes(tag, p, n);
  o.kind = kFloatClose;
  o.rtol = rtol;
  o.atol = atol;
  o.scale = std::move(scale);
  return o;
}

bool feq(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

// got against ref (ref's kind and tolerance); "" when equal, else the first difference
std::string compare(const Out& ref, const Out& got) {
  if (ref.bytes.size() != got.bytes.size()) return "size " + std::to_string(got.bytes.size()) + " != " + std::to_string(ref.bytes.size());
  char msg[256];
  if (ref.kind == kBytes) {
    for (size_t i = 0; i < ref.bytes.size(); ++i)
      if (ref.bytes[i] != got.bytes[i]) {
        std::snprintf(msg, sizeof msg, "byte %zu: %d != %d", i, got.bytes[i], ref.bytes[i]);
        return msg;
      }
    return "";
  }
  const size_t n = ref.bytes.size() / 4;
  const float* r = reinterpret_cast<const float*>(ref.bytes.data());
  const float* g = reinterpret_cast<const float*>(got.bytes.data());
  for (size_t i = 0; i < n; ++i) {
    if (feq(r[i], g[i])) continue;
    if (ref.kind == kFloatClose && !std::isnan(r[i]) && !std::isnan(g[i]) && std::isfinite(r[i]) == std::isfinite(g[i])) {
      const float sc = ref.scale.empty() ? std::fabs(r[i]) : ref.scale[i];
      if (std::isfinite(r[i]) && std::fabs(g[i] - r[i]) <= ref.atol + ref.rtol * sc) continue;
    }
    std::snprintf(msg, sizeof msg, "element %zu: %.9g != %.9g (diff %.3g)", i, g[i], r[i], static_cast<double>(g[i]) - r[i]);
    return msg;
  }
  return "";
}

struct Table {
  std::string name;
  const KernelTable* kt;
};
std::vector<Table> g_tables;  // [0] = scalar
bool g_record = false;
std::map<std::string, Out> g_dump;  // case/tag -> the scalar table's output (the fixed-seed pass)

// f(table) for the scalar table and every other; the others must match scalar's outputs
void run_case(const std::string& name, const std::function<Outs(const Table&)>& f) {
  const Outs ref = f(g_tables[0]);
  if (g_record)
    for (const Out& o : ref) g_dump[name + "/" + o.tag] = o;
  for (size_t t = 1; t < g_tables.size(); ++t) {
    const Outs got = f(g_tables[t]);
    for (size_t i = 0; i < ref.size(); ++i) {
      ++g_checks;
      const std::string d = compare(ref[i], got[i]);
      if (!d.empty()) fail(g_tables[t].name + " " + name + "/" + ref[i].tag + ": " + d);
    }
  }
}

void fill(Rng& rng, float* p, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; ++i) p[i] = rng.f(lo, hi);
}

// the stored A code of logical value q (zero point zp) in table t's format, and back
int a_off(const KernelTable& t, bool asym) { return asym ? t.i8_a_off_asym : t.i8_a_off_sym; }

// logical codes, zero points and scales of a quantised buffer (rows of ldq elements, K used)
void quant_outs(Outs& o, const std::string& tag, const KernelTable& t, const uint8_t* q, int ldq, int M, int K,
                const float* scale, const int32_t* zp, bool asym) {
  const int off = a_off(t, asym);
  std::vector<int32_t> codes(static_cast<size_t>(M) * ldq), z(M);
  for (int m = 0; m < M; ++m) {
    z[m] = zp[m] - off;
    for (int k = 0; k < ldq; ++k) {
      // the padding [K, ldq) holds the stored zero: as a logical code, the row's zero point
      codes[static_cast<size_t>(m) * ldq + k] = t.i8_a_get(q, ldq, m, k) - off;
    }
  }
  (void)K;
  o.push_back(out_bytes(tag + ".q", codes.data(), codes.size()));
  o.push_back(out_fexact(tag + ".scale", scale, M));
  o.push_back(out_bytes(tag + ".zp", z.data(), z.size()));
}

constexpr float kPoison = -1.2345e30f;  // written nowhere by a kernel: the strides' gaps keep it

// ---------------------------------------------------------------- INT8 GEMM

struct I8Spec {
  int M, N, K;
  bool asym = false;
  int act = zoi::ACT_NONE;
  bool res = false;
  int nt = 1;
  bool qo = false, qo_asym = false, scratch = false;
  bool raw = false;  // y_i32: the integer sums
  bool nan_row = false;  // a_scale NaN on row 0 (a NaN input row)
};

struct I8Data {
  std::vector<int> q;       // [M, K] logical codes (symmetric [-127, 127], asymmetric [0, 255])
  std::vector<int> zp;      // [M] logical zero points (0 symmetric)
  std::vector<int8_t> w;    // [N, K] in [-127, 127]
  std::vector<float> a_scale, w_scale, bias, res;
  int ldr = 0;
};

I8Data i8_data(Rng& rng, const I8Spec& s) {
  I8Data d;
  d.q.resize(static_cast<size_t>(s.M) * s.K);
  d.zp.assign(s.M, 0);
  d.w.resize(static_cast<size_t>(s.N) * s.K);
  for (int m = 0; m < s.M; ++m) {
    const int kind = m % 5;  // the extremes on the first rows, then random
    for (int k = 0; k < s.K; ++k) {
      int v = s.asym ? rng.i(0, 255) : rng.i(-127, 127);
      if (kind == 1 && m < 5) v = s.asym ? 255 : 127;
      if (kind == 2 && m < 5) v = s.asym ? 0 : -127;
      d.q[static_cast<size_t>(m) * s.K + k] = v;
    }
    if (s.asym) d.zp[m] = m == 1 ? 0 : m == 2 ? 255 : m == 3 ? 0 : m == 4 ? 255 : rng.i(0, 255);
  }
  for (int n = 0; n < s.N; ++n)
    for (int k = 0; k < s.K; ++k) {
      int v = rng.i(-127, 127);
      if (n == 0) v = 127;
      if (n == 1) v = -127;
      if (n == 2) v = k % 2 ? 127 : -127;
      d.w[static_cast<size_t>(n) * s.K + k] = static_cast<int8_t>(v);
    }
  d.a_scale.resize(s.M);
  d.w_scale.resize(s.N);
  d.bias.resize(s.N);
  fill(rng, d.a_scale.data(), s.M, 1e-3f, 2e-2f);
  fill(rng, d.w_scale.data(), s.N, 1e-3f, 2e-2f);
  fill(rng, d.bias.data(), s.N, -1.f, 1.f);
  if (s.nan_row) d.a_scale[0] = std::numeric_limits<float>::quiet_NaN();
  d.ldr = s.N + 1;
  d.res.resize(static_cast<size_t>(s.M) * d.ldr);
  fill(rng, d.res.data(), d.res.size(), -2.f, 2.f);
  return d;
}

zoi::ThreadPool* g_pool = nullptr;  // set: the GEMMs run their shares on the pool's threads
struct PoolGemm {
  const KernelTable* kt;
  const zoi::GemmI8Args* p;
};
void pool_gemm(void* ctx, int tid, int nt) {
  const auto* j = static_cast<const PoolGemm*>(ctx);
  j->kt->gemm_i8(*j->p, tid, nt);
}

Outs gemm_i8_run(const KernelTable& t, const I8Spec& s, const I8Data& d) {
  const int Kp = zoi::round_up(s.K, t.i8_kgroup), Np = zoi::round_up(s.N, t.i8_panel);
  const int off = a_off(t, s.asym);
  Buf<uint8_t> a(static_cast<size_t>(s.M) * Kp * t.i8_a_bytes);
  std::vector<int32_t> zp(s.M);
  for (int m = 0; m < s.M; ++m) {
    zp[m] = d.zp[m] + off;
    for (int k = 0; k < Kp; ++k) {  // the padding: any code (its weight is 0)
      const int v = k < s.K ? d.q[static_cast<size_t>(m) * s.K + k] + off : (s.asym ? 77 : -5 + (off > 0 ? 128 : 0));
      t.i8_a_set(a.data(), Kp, m, k, v);
    }
  }
  Buf<uint8_t> w(t.pack_i8_bytes(s.N, s.K));
  Buf<int32_t> colsum(Np);
  t.pack_i8(d.w.data(), s.N, s.K, w.data(), colsum.data());
  Buf<float> ws(Np), bias(Np);
  for (int n = 0; n < s.N; ++n) {
    ws[n] = d.w_scale[n];
    bias[n] = d.bias[n];
  }
  const int ldy = s.N + 3;
  zoi::GemmI8Args p;
  p.a = a.data();
  p.lda = Kp;
  p.a_scale = d.a_scale.data();
  p.w = w.data();
  p.colsum = colsum.data();
  p.a_zp = zp.data();
  p.w_scale = ws.data();
  p.bias = bias.data();
  p.M = s.M;
  p.N = s.N;
  p.Kp = Kp;
  p.ldy = ldy;
  p.act = s.act;
  if (s.res) {
    p.res = d.res.data();
    p.ldr = d.ldr;
  }
  Outs o;
  Buf<float> y(static_cast<size_t>(s.M) * ldy);
  for (size_t i = 0; i < y.n; ++i) y[i] = kPoison;
  p.y = y.data();
  Buf<int32_t> yi(static_cast<size_t>(s.M) * ldy);
  if (s.raw) {
    for (size_t i = 0; i < yi.n; ++i) yi[i] = 0x5A5A5A5A;
    p.y_i32 = yi.data();
  }
  const int ldq = zoi::round_up(s.N, t.i8_kgroup);
  Buf<uint8_t> q(static_cast<size_t>(s.M) * ldq * t.i8_a_bytes);
  Buf<float> qs(s.M);
  Buf<int32_t> qz(s.M);
  Buf<float> scratch(zoi::i8_qchunk_floats(s.N));
  if (s.qo) {
    p.qo.q = q.data();
    p.qo.ldq = ldq;
    p.qo.scale = qs.data();
    p.qo.zp = qz.data();
    p.qo.asym = s.qo_asym;
    if (s.scratch) p.y_scratch = scratch.data();
  }
  if (g_pool) {
    PoolGemm j{&t, &p};
    g_pool->run_all(pool_gemm, &j, s.nt);  // every share on its own thread
  } else {
    for (int tid = 0; tid < s.nt; ++tid) t.gemm_i8(p, tid, s.nt);
  }
  // colsum: the same on every table (sum of the row's weights; 0 in the padding columns)
  o.push_back(out_bytes("colsum", colsum.data(), s.N));
  if (s.raw) {
    o.push_back(out_bytes("y_i32", yi.data(), yi.n));
    return o;
  }
  if (!(s.qo && s.scratch)) {
    if (s.act == zoi::ACT_NONE) o.push_back(out_fexact("y", y.data(), y.n));
    else o.push_back(out_fclose("y", y.data(), y.n, 4e-6f, 2e-6f));
  }
  if (s.qo && s.act == zoi::ACT_NONE) quant_outs(o, "qo", t, q.data(), ldq, s.M, s.N, qs.data(), qz.data(), s.qo_asym);
  return o;
}

// the s32 sums of the logical codes, in int64 (the contract every table must meet)
std::vector<int32_t> gemm_exact(const I8Spec& s, const I8Data& d, int ldy) {
  std::vector<int32_t> y(static_cast<size_t>(s.M) * ldy, 0x5A5A5A5A);
  for (int m = 0; m < s.M; ++m)
    for (int n = 0; n < s.N; ++n) {
      int64_t acc = 0;
      for (int k = 0; k < s.K; ++k)
        acc += static_cast<int64_t>(d.q[static_cast<size_t>(m) * s.K + k] - d.zp[m]) * d.w[static_cast<size_t>(n) * s.K + k];
      y[static_cast<size_t>(m) * ldy + n] = static_cast<int32_t>(acc);
    }
  return y;
}

void test_gemm_i8(Rng& rng, bool quick) {
  // M, N, K: not multiples of the tiles (4 / 8 rows, 8 / 16 / 48 columns, 4 / 8 / 16 k), K odd,
  // single rows and columns, K % 8 == 4 (i8mm's half group), K % 16 in 1..15 (dotprod's tails)
  const int shapes[][3] = {{1, 1, 1},    {1, 7, 5},     {3, 13, 9},     {2, 3, 3},    {7, 64, 64},  {8, 16, 16},
                           {9, 8, 12},   {17, 131, 67}, {13, 65, 20},   {6, 385, 129}, {5, 48, 28}, {33, 97, 1031},
                           {100, 50, 130}, {64, 24, 36}, {16, 33, 260},
                           // MiniLM-sized: the projections (K 384) and the FFN (N or K 1536)
                           {128, 384, 384}, {32, 1536, 384}, {24, 384, 1536}};
  const int nshapes = quick ? 8 : static_cast<int>(sizeof shapes / sizeof shapes[0]);
  for (int si = 0; si < nshapes; ++si) {
    for (int asym = 0; asym < 2; ++asym) {
      I8Spec s;
      s.M = shapes[si][0];
      s.N = shapes[si][1];
      s.K = shapes[si][2];
      s.asym = asym;
      s.raw = true;
      s.nt = 1 + si % 3;
      const I8Data d = i8_data(rng, s);
      const std::string name = "gemm_i8_s32/" + std::to_string(s.M) + "x" + std::to_string(s.N) + "x" +
                               std::to_string(s.K) + (asym ? "/asym" : "/sym");
      run_case(name, [&](const Table& t) { return gemm_i8_run(*t.kt, s, d); });
      // and the scalar table against the exact integer sums
      const Outs sc = gemm_i8_run(*g_tables[0].kt, s, d);
      const std::vector<int32_t> want = gemm_exact(s, d, s.N + 3);
      ++g_checks;
      const std::string diff = compare(out_bytes("y_i32", want.data(), want.size()), sc[1]);
      if (!diff.empty()) fail("scalar " + name + " vs exact int64 sums: " + diff);
    }
  }
  // the float epilogue: without activation bit-identical (the emulation's order), with one close
  struct E { int M, N, K; bool asym; int act; bool res; int nt; bool nan; };
  const E eps[] = {{7, 29, 33, false, zoi::ACT_NONE, false, 1, false}, {17, 131, 67, true, zoi::ACT_NONE, true, 3, true},
                   {33, 48, 64, false, zoi::ACT_GELU, true, 2, false},  {9, 50, 21, true, zoi::ACT_SILU, false, 1, false},
                   {5, 20, 12, false, zoi::ACT_GELU_TANH, false, 1, false}, {12, 40, 44, true, zoi::ACT_TANH, true, 2, false},
                   {3, 8, 8, false, zoi::ACT_RELU, false, 1, true},     {4, 16, 16, true, zoi::ACT_SIGMOID, false, 1, false}};
  for (const E& e : eps) {
    I8Spec s;
    s.M = e.M; s.N = e.N; s.K = e.K; s.asym = e.asym; s.act = e.act; s.res = e.res; s.nt = e.nt; s.nan_row = e.nan;
    const I8Data d = i8_data(rng, s);
    run_case("gemm_i8/" + std::to_string(e.M) + "x" + std::to_string(e.N) + "x" + std::to_string(e.K) + "/act" +
                 std::to_string(e.act) + (e.res ? "/res" : "") + (e.nan ? "/nan" : ""),
             [&](const Table& t) { return gemm_i8_run(*t.kt, s, d); });
  }
  // fused quantisation of the output rows for the next GEMM (into y, or from the scratch only)
  const int qs[][4] = {{70, 36, 40, 0}, {130, 19, 24, 1}, {65, 100, 37, 1}, {3, 9, 4, 0}};
  for (const auto& e : qs) {
    for (int sc = 0; sc < 2; ++sc) {
      I8Spec s;
      s.M = e[0]; s.N = e[1]; s.K = e[2]; s.asym = e[3]; s.qo = true; s.qo_asym = !e[3]; s.scratch = sc; s.nt = 2;
      s.res = true;
      const I8Data d = i8_data(rng, s);
      run_case("gemm_i8_qo/" + std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K) +
                   (sc ? "/scratch" : "/y"),
               [&](const Table& t) { return gemm_i8_run(*t.kt, s, d); });
    }
  }
  // a weight of -128 is refused (the formats' bound), by every table
  for (const Table& t : g_tables) {
    std::vector<int8_t> w(12, 1);
    w[7] = -128;
    Buf<uint8_t> pk(t.kt->pack_i8_bytes(3, 4));
    Buf<int32_t> cs(zoi::round_up(3, t.kt->i8_panel));
    bool threw = false;
    try {
      t.kt->pack_i8(w.data(), 3, 4, pk.data(), cs.data());
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    ++g_checks;
    if (!threw) fail(t.name + " pack_i8 accepted a weight of -128");
  }
}

// ---------------------------------------------------------------- quantisation, LayerNorm, embedding

// rows of x with NaN / infinity / zero rows and outlier channels
void rows_with_specials(Rng& rng, float* x, int M, int K, int ldx, bool specials) {
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k) x[static_cast<size_t>(m) * ldx + k] = rng.f(-3.f, 3.f) * (k % 17 == 3 ? 12.f : 1.f);
  if (!specials) return;
  if (M > 1) x[static_cast<size_t>(1) * ldx + K / 2] = std::numeric_limits<float>::quiet_NaN();
  if (M > 2)
    for (int k = 0; k < K; ++k) x[static_cast<size_t>(2) * ldx + k] = 0.f;
  if (M > 3) x[static_cast<size_t>(3) * ldx] = std::numeric_limits<float>::infinity();
  if (M > 4)
    for (int k = 0; k < K; ++k) x[static_cast<size_t>(4) * ldx + k] = 0.25f;  // constant: asymmetric r = 0.25
  // exact ties of the rounding (to nearest even, not away from zero): symmetric amax 127 and
  // asymmetric range [0, 255] make the scale 1, and the values are halves
  if (M > 6 && K > 2) {
    float* s = x + static_cast<size_t>(5) * ldx;
    float* a = x + static_cast<size_t>(6) * ldx;
    for (int k = 0; k < K; ++k) {
      s[k] = static_cast<float>(k % 200 - 100) + 0.5f;
      a[k] = static_cast<float>(k % 250) + 0.5f;
    }
    s[0] = 127.f;
    a[0] = 0.f;
    a[1] = 255.f;
  }
}

void test_quantize(Rng& rng, bool quick) {
  const int shapes[][2] = {{1, 1}, {3, 5}, {7, 37}, {9, 64}, {5, 130}, {2, 1031}, {7, 384}, {8, 3}};
  const int nshapes = quick ? 4 : 8;
  for (int si = 0; si < nshapes; ++si) {
    const int M = shapes[si][0], K = shapes[si][1], ldx = K + 2;
    std::vector<float> x(static_cast<size_t>(M) * ldx), shift(K), mul(K);
    rows_with_specials(rng, x.data(), M, K, ldx, true);
    fill(rng, shift.data(), K, -0.5f, 0.5f);
    fill(rng, mul.data(), K, 0.5f, 2.f);
    // modes 0-3: dynamic sym, dynamic asym, static amax, sym + shift / mul; 4-7: the same with
    // every row the first of a sequence (QuantOut::q2: the residual at the step scale * 2^-8)
    for (int mode = 0; mode < 8; ++mode) {
      run_case("quantize/" + std::to_string(M) + "x" + std::to_string(K) + "/mode" + std::to_string(mode), [&](const Table& t) {
        const int ldq = zoi::round_up(K, t.kt->i8_kgroup);
        Buf<uint8_t> q(static_cast<size_t>(M) * ldq * t.kt->i8_a_bytes);
        Buf<float> sc(M);
        Buf<int32_t> zp(M);
        zoi::QuantOut qo;
        qo.q = q.data();
        qo.ldq = ldq;
        qo.scale = sc.data();
        qo.zp = zp.data();
        qo.asym = mode % 4 == 1;
        if (mode % 4 == 2) qo.static_amax = 2.5f;
        if (mode % 4 == 3) {
          qo.shift = shift.data();
          qo.mul = mul.data();
        }
        Buf<uint8_t> q2(static_cast<size_t>(M) * ldq * t.kt->i8_a_bytes);
        Buf<float> sc2(M);
        Buf<int32_t> zp2(M);
        std::memset(q2.data(), 0x5A, q2.n);  // poisoned: a code or padding left unwritten shows
        for (int m = 0; m < M; ++m) sc2[m] = kPoison;
        std::vector<int32_t> cu(M + 1);
        for (int m = 0; m <= M; ++m) cu[m] = m;
        if (mode >= 4) {
          qo.first_row = 1;
          qo.q2 = q2.data();
          qo.scale2 = sc2.data();
          qo.zp2 = zp2.data();
          qo.cu = cu.data();
          qo.B = M;
        }
        for (int tid = 0; tid < 2; ++tid) t.kt->quantize_rows(x.data(), ldx, M, K, qo, tid, 2);
        Outs o;
        quant_outs(o, "q", *t.kt, q.data(), ldq, M, K, sc.data(), zp.data(), qo.asym);
        if (mode >= 4) quant_outs(o, "q2", *t.kt, q2.data(), ldq, M, K, sc2.data(), zp2.data(), false);
        return o;
      });
    }
  }
}

void test_layernorm(Rng& rng, bool quick) {
  const int Hs[] = {1, 3, 8, 37, 128, 384, 130, 1031};
  const int nh = quick ? 5 : 8;
  for (int hi = 0; hi < nh; ++hi) {
    const int H = Hs[hi], M = 6, ld = H + 5;
    std::vector<float> x(static_cast<size_t>(M) * ld), r(static_cast<size_t>(M) * ld), w(H), b(H);
    rows_with_specials(rng, x.data(), M, H, ld, H > 1);
    fill(rng, r.data(), r.size(), -1.f, 1.f);
    fill(rng, w.data(), H, 0.5f, 1.5f);
    fill(rng, b.data(), H, -0.2f, 0.2f);
    for (int mode = 0; mode < 6; ++mode) {  // LN, LN + residual, RMS, RMS + post residual, LN + quant, RMS + asym quant
      run_case("layernorm/H" + std::to_string(H) + "/mode" + std::to_string(mode), [&](const Table& t) {
        zoi::LnArgs a;
        a.x = x.data();
        a.ldx = ld;
        if (mode == 1 || mode == 3 || mode == 4) {
          a.r = r.data();
          a.ldr = ld;
        }
        a.w = w.data();
        a.b = b.data();
        a.eps = 1e-6f;
        a.rms = mode == 2 || mode == 3 || mode == 5;
        a.post = mode == 3;
        a.M = M;
        a.H = H;
        Buf<float> y(static_cast<size_t>(M) * (H + 1));
        for (size_t i = 0; i < y.n; ++i) y[i] = kPoison;
        a.y = y.data();
        a.ldy = H + 1;
        const int ldq = zoi::round_up(H, t.kt->i8_kgroup);
        Buf<uint8_t> q(static_cast<size_t>(M) * ldq * t.kt->i8_a_bytes);
        Buf<float> sc(M);
        Buf<int32_t> zp(M);
        if (mode >= 4) {
          a.qo.q = q.data();
          a.qo.ldq = ldq;
          a.qo.scale = sc.data();
          a.qo.zp = zp.data();
          a.qo.asym = mode == 5;
        }
        for (int tid = 0; tid < 3; ++tid) t.kt->layernorm(a, tid, 3);
        Outs o;
        o.push_back(out_fexact("y", y.data(), y.n));
        if (mode >= 4) quant_outs(o, "q", *t.kt, q.data(), ldq, M, H, sc.data(), zp.data(), a.qo.asym);
        return o;
      });
    }
  }
}

void test_embed(Rng& rng, bool quick) {
  const int Hs[] = {8, 37, 384};
  for (int hi = 0; hi < (quick ? 2 : 3); ++hi) {
    const int H = Hs[hi], V = 50, P = 40, T = 13, r = 4;
    std::vector<float> word(static_cast<size_t>(V) * H), pos(static_cast<size_t>(P) * H), type(2 * H), lw(H), lb(H);
    std::vector<float> la(2 * V * r), lbm(2 * r * H), lt(2 * H);
    std::vector<int8_t> wq(static_cast<size_t>(V) * H);
    std::vector<float> wqs(V);
    fill(rng, word.data(), word.size(), -1.f, 1.f);
    fill(rng, pos.data(), pos.size(), -0.3f, 0.3f);
    fill(rng, type.data(), type.size(), -0.1f, 0.1f);
    fill(rng, lw.data(), H, 0.5f, 1.5f);
    fill(rng, lb.data(), H, -0.1f, 0.1f);
    fill(rng, la.data(), la.size(), -0.5f, 0.5f);
    fill(rng, lbm.data(), lbm.size(), -0.5f, 0.5f);
    fill(rng, lt.data(), lt.size(), -0.1f, 0.1f);
    for (auto& v : wq) v = static_cast<int8_t>(rng.i(-127, 127));
    fill(rng, wqs.data(), V, 1e-3f, 1e-2f);
    std::vector<int32_t> ids(T), positions(T), types(T), task(T);
    for (int t = 0; t < T; ++t) {
      ids[t] = rng.i(0, V - 1);
      positions[t] = t % P;
      types[t] = t % 2;
      task[t] = t % 3 - 1;  // -1: no adapter
    }
    for (int mode = 0; mode < 4; ++mode) {  // float + LN + quant, int8 rows + types, LoRA, no LN (decoders)
      run_case("embed/H" + std::to_string(H) + "/mode" + std::to_string(mode), [&](const Table& t) {
        zoi::EmbedArgs a;
        a.ids = ids.data();
        a.positions = positions.data();
        a.T = T;
        a.H = H;
        if (mode == 1) {
          a.word_q = wq.data();
          a.word_scale = wqs.data();
          a.type = type.data();
          a.types = types.data();
        } else {
          a.word = word.data();
          a.type0 = type.data();
        }
        a.pos = mode == 3 ? nullptr : pos.data();
        if (mode != 3) {
          a.ln_w = lw.data();
          a.ln_b = lb.data();
        }
        a.eps = 1e-12f;
        if (mode == 2) {
          a.tok_task = task.data();
          a.lora_a = la.data();
          a.lora_b = lbm.data();
          a.lora_type = lt.data();
          a.lora_r = r;
          a.lora_V = V;
        }
        Buf<float> y(static_cast<size_t>(T) * H);
        a.y = y.data();
        a.ldy = H;
        const int ldq = zoi::round_up(H, t.kt->i8_kgroup);
        Buf<uint8_t> q(static_cast<size_t>(T) * ldq * t.kt->i8_a_bytes);
        Buf<float> sc(T);
        Buf<int32_t> zp(T);
        if (mode == 0 || mode == 1) {
          a.qo.q = q.data();
          a.qo.ldq = ldq;
          a.qo.scale = sc.data();
          a.qo.zp = zp.data();
          a.qo.asym = mode == 1;
        }
        for (int tid = 0; tid < 2; ++tid) t.kt->embed(a, tid, 2);
        Outs o;
        // LoRA's r-term sums are fused multiply-adds in the vector builds (not in scalar's)
        if (mode == 2) o.push_back(out_fclose("y", y.data(), y.n, 1e-5f, 1e-6f));
        else o.push_back(out_fexact("y", y.data(), y.n));
        if (mode < 2) quant_outs(o, "q", *t.kt, q.data(), ldq, T, H, sc.data(), zp.data(), a.qo.asym);
        return o;
      });
    }
  }
}

// ---------------------------------------------------------------- float kernels

void test_gemm_f32(Rng& rng, bool quick) {
  const int shapes[][3] = {{1, 1, 1}, {1, 7, 5}, {3, 13, 9}, {7, 64, 64}, {17, 131, 67}, {6, 40, 300}, {100, 33, 20}, {13, 50, 1031}};
  const int acts[] = {zoi::ACT_NONE, zoi::ACT_GELU, zoi::ACT_NONE, zoi::ACT_SILU, zoi::ACT_TANH, zoi::ACT_GELU_TANH, zoi::ACT_RELU, zoi::ACT_SIGMOID};
  const int ns = quick ? 5 : 8;
  for (int si = 0; si < ns; ++si) {
    const int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2], act = acts[si], lda = K + 1, ldy = N + 2;
    std::vector<float> a(static_cast<size_t>(M) * lda), w(static_cast<size_t>(N) * K), bias(N), res(static_cast<size_t>(M) * N);
    fill(rng, a.data(), a.size(), -1.f, 1.f);
    fill(rng, w.data(), w.size(), -1.f, 1.f);
    fill(rng, bias.data(), N, -1.f, 1.f);
    fill(rng, res.data(), res.size(), -1.f, 1.f);
    // the tolerance's scale: sum |a| |w| + |bias| + |res| (the FMA chains round differently)
    std::vector<float> scale(static_cast<size_t>(M) * ldy, 0.f);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        double s = std::fabs(bias[n]) + std::fabs(res[static_cast<size_t>(m) * N + n]);
        for (int k = 0; k < K; ++k) s += std::fabs(a[static_cast<size_t>(m) * lda + k] * w[static_cast<size_t>(n) * K + k]);
        scale[static_cast<size_t>(m) * ldy + n] = static_cast<float>(s);
      }
    const bool with_res = si % 2 == 1;
    run_case("gemm_f32/" + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + "/act" + std::to_string(act),
             [&](const Table& t) {
               const int Np = zoi::round_up(N, t.kt->f32_panel);
               Buf<float> pw(t.kt->pack_f32_bytes(N, K) / sizeof(float));
               t.kt->pack_f32(w.data(), N, K, pw.data());
               Buf<float> b(Np);
               for (int n = 0; n < N; ++n) b[n] = bias[n];
               Buf<float> y(static_cast<size_t>(M) * ldy);
               for (size_t i = 0; i < y.n; ++i) y[i] = kPoison;
               zoi::GemmF32Args p;
               p.a = a.data();
               p.lda = lda;
               p.w = pw.data();
               p.bias = b.data();
               p.M = M;
               p.N = N;
               p.K = K;
               p.y = y.data();
               p.ldy = ldy;
               p.act = act;
               if (with_res) {
                 p.res = res.data();
                 p.ldr = N;
               }
               for (int tid = 0; tid < 2; ++tid) t.kt->gemm_f32(p, tid, 2);
               return Outs{out_fclose("y", y.data(), y.n, 2e-6f, 1e-6f, scale)};
             });
  }
}

void test_activation(Rng& rng) {
  std::vector<float> x;
  for (int i = 0; i <= 2000; ++i) x.push_back(-12.f + 24.f * static_cast<float>(i) / 2000.f);
  for (float v : {0.f, -0.f, 1e-8f, -1e-8f, 30.f, -30.f, -90.f, 90.f, 1e30f, -1e30f}) x.push_back(v);
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  x.push_back(std::numeric_limits<float>::infinity());
  x.push_back(-std::numeric_limits<float>::infinity());
  for (int i = 0; i < 37; ++i) x.push_back(rng.f(-6.f, 6.f));  // a tail that is no multiple of a vector
  for (int act = 1; act <= 6; ++act) {
    run_case("activation/act" + std::to_string(act), [&](const Table& t) {
      std::vector<float> y = x;
      t.kt->activation(y.data(), y.size(), act);
      return Outs{out_fclose("y", y.data(), y.size(), 4e-6f, 2e-6f)};
    });
  }
}

void test_glu_lora(Rng& rng, bool quick) {
  for (int n : {5, 64, 131}) {
    if (quick && n == 131) continue;
    const int M = 7, ldx = 2 * n + 1;
    std::vector<float> x(static_cast<size_t>(M) * ldx);
    fill(rng, x.data(), x.size(), -4.f, 4.f);
    for (int act : {zoi::ACT_GELU, zoi::ACT_SILU}) {
      run_case("glu/n" + std::to_string(n) + "/act" + std::to_string(act), [&](const Table& t) {
        Buf<float> y(static_cast<size_t>(M) * n);
        zoi::GluArgs a;
        a.x = x.data();
        a.ldx = ldx;
        a.M = M;
        a.n = n;
        a.act = act;
        a.y = y.data();
        a.ldy = n;
        for (int tid = 0; tid < 2; ++tid) t.kt->glu(a, tid, 2);
        return Outs{out_fclose("y", y.data(), y.n, 2e-5f, 1e-5f)};
      });
    }
  }
  // LoRA: y += (x A_t^T) B_t^T per row of task t, then act, + res
  const int M = 6, K = 37, N = 21, r = 3, tasks = 2;
  std::vector<float> x(static_cast<size_t>(M) * K), y0(static_cast<size_t>(M) * N), A(tasks * r * K), Bt(tasks * r * N),
      res(static_cast<size_t>(M) * N);
  fill(rng, x.data(), x.size(), -1.f, 1.f);
  fill(rng, y0.data(), y0.size(), -1.f, 1.f);
  fill(rng, A.data(), A.size(), -0.3f, 0.3f);
  fill(rng, Bt.data(), Bt.size(), -0.3f, 0.3f);
  fill(rng, res.data(), res.size(), -1.f, 1.f);
  const std::vector<int32_t> task = {0, 1, -1, 1, 0, -1};
  run_case("lora", [&](const Table& t) {
    std::vector<float> y = y0;
    zoi::LoraArgs a;
    a.x = x.data();
    a.ldx = K;
    a.K = K;
    a.y = y.data();
    a.ldy = N;
    a.N = N;
    a.a = A.data();
    a.bt = Bt.data();
    a.r = r;
    a.tok_task = task.data();
    a.M = M;
    a.act = zoi::ACT_GELU;
    a.res = res.data();
    a.ldr = N;
    for (int tid = 0; tid < 2; ++tid) t.kt->lora(a, tid, 2);
    return Outs{out_fclose("y", y.data(), y.size(), 2e-5f, 2e-6f)};
  });
}

void test_attention(Rng& rng, bool quick) {
  struct A { int heads, kv, d; bool causal; int window; bool bias, rope, norm; std::vector<int> lens; };
  const std::vector<A> cases = {
      {2, 0, 32, false, 0, false, false, false, {5, 1, 19}},
      {3, 0, 16, false, 0, true, false, false, {7, 12}},
      {4, 2, 24, true, 0, false, true, true, {9, 3, 17}},
      {2, 0, 64, false, 3, false, true, false, {20, 6}},
      {4, 1, 8, true, 0, false, false, false, {33}},
      {1, 0, 20, false, 0, false, false, false, {1, 2, 3}},
  };
  const size_t ncases = quick ? 3 : cases.size();
  for (size_t ci = 0; ci < ncases; ++ci) {
    const A& c = cases[ci];
    const int kvh = c.kv > 0 ? c.kv : c.heads, H = c.heads * c.d, ld = H + 2 * kvh * c.d;
    std::vector<int32_t> cu = {0};
    int maxlen = 1;
    for (int L : c.lens) {
      cu.push_back(cu.back() + L);
      maxlen = L > maxlen ? L : maxlen;
    }
    const int T = cu.back(), B = static_cast<int>(c.lens.size());
    std::vector<float> qkv(static_cast<size_t>(T) * ld), bias, cosb, sinb, qn(c.d), kn(c.d);
    fill(rng, qkv.data(), qkv.size(), -1.5f, 1.5f);
    float vmax = 0.f;
    for (int t = 0; t < T; ++t)
      for (int i = H + kvh * c.d; i < ld; ++i) vmax = std::fmax(vmax, std::fabs(qkv[static_cast<size_t>(t) * ld + i]));
    const int span = maxlen + 2;
    if (c.bias) {
      bias.resize(static_cast<size_t>(c.heads) * (2 * span - 1));
      fill(rng, bias.data(), bias.size(), -1.f, 1.f);
    }
    if (c.rope) {
      cosb.resize(static_cast<size_t>(span) * c.d / 2);
      sinb.resize(cosb.size());
      for (int p = 0; p < span; ++p)
        for (int i = 0; i < c.d / 2; ++i) {
          const double th = p * std::pow(10000.0, -2.0 * i / c.d);
          cosb[static_cast<size_t>(p) * c.d / 2 + i] = static_cast<float>(std::cos(th));
          sinb[static_cast<size_t>(p) * c.d / 2 + i] = static_cast<float>(std::sin(th));
        }
    }
    fill(rng, qn.data(), c.d, 0.5f, 1.5f);
    fill(rng, kn.data(), c.d, 0.5f, 1.5f);
    run_case("attention/" + std::to_string(ci), [&](const Table& t) {
      const int nt = 2;
      const size_t stride = (zoi::attn_scratch_floats(maxlen, c.d) + 15) / 16 * 16;
      Buf<float> scratch(stride * nt);
      Buf<float> out(static_cast<size_t>(T) * H);
      zoi::AttnArgs a;
      a.qkv = qkv.data();
      a.ldqkv = ld;
      a.cu = cu.data();
      a.B = B;
      a.heads = c.heads;
      a.d = c.d;
      a.scale = 1.f / std::sqrt(static_cast<float>(c.d));
      a.out = out.data();
      a.ldo = H;
      a.scratch = scratch.data();
      a.scratch_stride = stride;
      if (c.bias) {
        a.bias = bias.data();
        a.bias_span = span;
      }
      a.window = c.window;
      if (c.rope) {
        a.rope_cos = cosb.data();
        a.rope_sin = sinb.data();
        a.rope_rows = span;
      }
      a.kv_heads = c.kv;
      a.causal = c.causal;
      if (c.norm) {
        a.q_norm = qn.data();
        a.k_norm = kn.data();
      }
      for (int tid = 0; tid < nt; ++tid) t.kt->attention(a, tid, nt);
      return Outs{out_fclose("out", out.data(), out.n, 0.f, 2e-5f * vmax)};
    });
  }
}

void test_pool(Rng& rng) {
  const int H = 37, B = 3;
  const std::vector<int32_t> cu = {0, 1, 6, 13};
  std::vector<float> x(static_cast<size_t>(cu.back()) * (H + 1));
  fill(rng, x.data(), x.size(), -2.f, 2.f);
  for (int mode = 0; mode < 5; ++mode) {
    run_case("pool/mode" + std::to_string(mode), [&](const Table& t) {
      std::vector<float> out(static_cast<size_t>(B) * H, kPoison);
      zoi::PoolArgs a;
      a.x = x.data();
      a.ldx = H + 1;
      a.cu = cu.data();
      a.B = B;
      a.H = H;
      a.mode = mode;
      a.out = out.data();
      a.ldo = H;
      for (int tid = 0; tid < 2; ++tid) t.kt->pool(a, tid, 2);
      if (mode == 0)
        for (int tid = 0; tid < 2; ++tid) t.kt->normalize(out.data(), H, B, H, tid, 2);
      // splade's log1p is the C library's: its last bit differs between the x86-64 and aarch64
      // glibc (the tables of one build share it: exact there)
      if (mode == 3) return Outs{out_fclose("out", out.data(), out.size(), 2.5e-7f, 0.f)};
      return Outs{out_fexact("out", out.data(), out.size())};
    });
  }
}

// generation's attention over the paged KV cache: q / k RMSNorm + RoPE + the cache write, then
// the attention over block tables with and without splits over the context (paged_merge)
void test_paged(Rng& rng, bool quick) {
  const int T = 5, heads = 6, kvh = 2, D = 20, bs = 3, NB = 24, mb = 8, rows = 2, P = mb * bs;
  const int ld = (heads + 2 * kvh) * D;
  std::vector<float> qkv(static_cast<size_t>(T) * ld), cs(static_cast<size_t>(P) * D / 2), sn(cs.size()), qn(D), kn(D);
  std::vector<float> kc0(static_cast<size_t>(NB) * kvh * bs * D), vc0(kc0.size());
  fill(rng, qkv.data(), qkv.size(), -2.f, 2.f);
  fill(rng, cs.data(), cs.size(), -1.f, 1.f);
  fill(rng, sn.data(), sn.size(), -1.f, 1.f);
  fill(rng, qn.data(), D, 0.5f, 1.5f);
  fill(rng, kn.data(), D, 0.5f, 1.5f);
  fill(rng, kc0.data(), kc0.size(), -1.f, 1.f);
  fill(rng, vc0.data(), vc0.size(), -1.f, 1.f);
  std::vector<int32_t> tables(static_cast<size_t>(rows) * mb), pos = {0, 4, P - 1, 7, 13}, row = {0, 0, 1, 1, 0};
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < mb; ++b) tables[static_cast<size_t>(r) * mb + b] = (r * mb + b * 5) % NB;
  for (int splits : {1, 3}) {
    if (quick && splits > 1) break;
    run_case("paged/splits" + std::to_string(splits), [&](const Table& t) {
      std::vector<float> x = qkv, kc = kc0, vc = vc0, out(static_cast<size_t>(T) * heads * D, kPoison);
      zoi::PagedQkvArgs q;
      q.qkv = x.data(); q.ldqkv = ld; q.T = T; q.heads = heads; q.kv_heads = kvh; q.d = D;
      q.pos = pos.data(); q.row = row.data(); q.tables = tables.data(); q.ldt = mb;
      q.cos = cs.data(); q.sin = sn.data(); q.q_norm = qn.data(); q.k_norm = kn.data();
      q.kc = kc.data(); q.vc = vc.data(); q.block = bs;
      for (int part = 0; part < 2; ++part) t.kt->paged_qkv(q, part, 2);
      zoi::PagedAttnArgs a;
      a.q = x.data(); a.ldq = ld; a.T = T; a.heads = heads; a.kv_heads = kvh; a.d = D;
      a.pos = pos.data(); a.row = row.data(); a.tables = tables.data(); a.ldt = mb;
      a.kc = kc.data(); a.vc = vc.data(); a.block = bs; a.scale = 0.2f;
      a.splits = splits; a.chunk = splits > 1 ? (P + splits - 1) / splits : (1 << 30);
      std::vector<float> part(static_cast<size_t>(T) * heads * splits * (D + 2));
      a.part = part.data(); a.out = out.data(); a.ldo = heads * D;
      const int n = T * kvh * splits;
      for (int i = 0; i < n; ++i) t.kt->paged_attention(a, i, n);
      for (int i = 0; i < T * kvh; ++i) t.kt->paged_merge(a, i, T * kvh);
      return Outs{out_fclose("qkv", x.data(), x.size(), 4e-6f, 1e-6f), out_fclose("kc", kc.data(), kc.size(), 4e-6f, 1e-6f),
                  out_fclose("out", out.data(), out.size(), 2e-5f, 1e-6f)};
    });
  }
}

// the thread pool (futexes, affinity) on this architecture: GEMM shares on 4 threads equal the
// shares computed one after another; a barrier holds every thread of a job
struct BarrierJob {
  std::atomic<int> phase_sum[3];
  int bad = 0;
};
void barrier_job(void* ctx, int tid, int nt) {
  auto* j = static_cast<BarrierJob*>(ctx);
  for (int ph = 0; ph < 3; ++ph) {
    j->phase_sum[ph].fetch_add(tid + 1);
    g_pool->barrier();
    if (j->phase_sum[ph].load() != nt * (nt + 1) / 2) j->bad = 1;
  }
}
void test_thread_pool(Rng& rng) {
  zoi::ThreadPool pool(4);
  for (const Table& t : g_tables) {
    for (int asym = 0; asym < 2; ++asym) {
      I8Spec s;
      s.M = 37;
      s.N = 70;
      s.K = 90;
      s.asym = asym;
      s.act = zoi::ACT_GELU;
      s.res = true;
      s.nt = 4;
      const I8Data d = i8_data(rng, s);
      const Outs seq = gemm_i8_run(*t.kt, s, d);
      Outs par;
      for (int rep = 0; rep < 20; ++rep) {
        g_pool = &pool;
        par = gemm_i8_run(*t.kt, s, d);
        g_pool = nullptr;
        for (size_t i = 0; i < seq.size(); ++i) {
          ++g_checks;
          const std::string diff = compare(seq[i], par[i]);
          if (!diff.empty())
            fail(t.name + " GEMM on the thread pool differs from its shares in sequence (repeat " + std::to_string(rep) +
                 ", " + seq[i].tag + "): " + diff);
        }
      }
    }
  }
  g_pool = &pool;
  for (int rep = 0; rep < 50; ++rep) {
    BarrierJob j;
    for (auto& a : j.phase_sum) a = 0;
    pool.run_all(barrier_job, &j, 4);
    ++g_checks;
    if (j.bad) fail("thread pool barrier let a thread through early");
  }
  g_pool = nullptr;
}

void test_peak() {
  for (const Table& t : g_tables) {
    const double ops = t.kt->peak_i8(1000);
    ++g_checks;
    if (!(ops > 0)) fail(t.name + " peak_i8 returned no work");
  }
}

// ---------------------------------------------------------------- tables, detection

const KernelTable* table_of(Isa i) {
#if defined(ZOI_TEST_SCALAR_ONLY)
  return i == Isa::Scalar ? &zoi::scalar::table() : nullptr;
#else
  return &zoi::kernel_table(i);
#endif
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> r;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, sep))
    if (!x.empty()) r.push_back(x);
  return r;
}

Isa isa_or_die(const std::string& name) {
  Isa i;
  if (!zoi::parse_isa(name, &i)) {
    std::fprintf(stderr, "unknown ISA %s\n", name.c_str());
    std::exit(2);
  }
  return i;
}

#if defined(ZOI_ARCH_ARM64)
const Isa kBuildIsas[] = {Isa::Neon, Isa::Dotprod, Isa::I8mm};
#elif defined(ZOI_ARCH_X86) && !defined(ZOI_TEST_SCALAR_ONLY)
const Isa kBuildIsas[] = {Isa::Avx2, Isa::AvxVnni, Isa::Avx512, Isa::Vnni, Isa::Amx};
#else
const Isa kBuildIsas[] = {Isa::Scalar};
#endif

void check_detection(const std::string& best, const std::string& active, const std::string& unsupported) {
  const zoi::CpuFeatures& f = zoi::cpu_features();
  std::printf("cpu: vendor '%s' brand '%s' asimd %d asimddp %d i8mm %d sve %d sve2 %d; best %s, active %s\n",
              f.vendor.c_str(), f.brand.c_str(), f.asimd, f.asimddp, f.i8mm, f.sve, f.sve2,
              zoi::isa_name(zoi::best_isa()), zoi::isa_name(zoi::active_isa()));
  ++g_checks;
  if (!best.empty() && best != zoi::isa_name(zoi::best_isa()))
    fail(std::string("best ISA ") + zoi::isa_name(zoi::best_isa()) + ", expected " + best);
  ++g_checks;
  if (!active.empty() && active != zoi::isa_name(zoi::active_isa()))
    fail(std::string("active ISA ") + zoi::isa_name(zoi::active_isa()) + ", expected " + active);
  // an ISA this CPU lacks: not supported, its table refused, ZOI_CPU_ISA naming it refused
  for (const std::string& name : split(unsupported, ',')) {
    const Isa i = isa_or_die(name);
    g_checks += 3;
    if (zoi::isa_supported(i)) fail(name + " reported supported");
#if !defined(ZOI_TEST_SCALAR_ONLY)
    bool threw = false;
    try {
      zoi::kernel_table(i);
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    if (!threw) fail("kernel_table(" + name + ") not refused");
#endif
    const Isa before = zoi::active_isa();
    bool refused = false;
    try {
      zoi::set_forced_isa(name);
    } catch (const std::invalid_argument&) {
      refused = true;
    }
    ++g_checks;
    if (!refused) fail("forcing " + name + " not refused");
    if (zoi::active_isa() != before) fail("a refused " + name + " changed the active ISA");
  }
  // every ISA name round-trips; an unknown one is refused
  for (int v = 0; v <= 8; ++v) {
    Isa back;
    ++g_checks;
    if (!zoi::parse_isa(zoi::isa_name(static_cast<Isa>(v)), &back) || back != static_cast<Isa>(v))
      fail(std::string("ISA name does not round-trip: ") + zoi::isa_name(static_cast<Isa>(v)));
  }
}

void check_table_layout(const Table& t) {
  ++g_checks;
  if (std::string(zoi::isa_name(t.kt->isa)) != t.name) fail(t.name + " table reports ISA " + zoi::isa_name(t.kt->isa));
#if defined(ZOI_ARCH_ARM64)
  // aarch64: every table keeps scalar's A format (s8, off 0 / -128, one byte per element)
  ++g_checks;
  if (t.kt->i8_kgroup != 4 || t.kt->i8_a_bytes != 1 || t.kt->i8_a_off_sym != 0 || t.kt->i8_a_off_asym != -128)
    fail(t.name + " A format differs from scalar's");
#endif
}

// ---------------------------------------------------------------- the reference dump

void write_dump(const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  auto u32 = [&](uint32_t v) { f.write(reinterpret_cast<const char*>(&v), 4); };
  auto f32 = [&](float v) { f.write(reinterpret_cast<const char*>(&v), 4); };
  u32(static_cast<uint32_t>(g_dump.size()));
  for (const auto& [key, o] : g_dump) {
    u32(static_cast<uint32_t>(key.size()));
    f.write(key.data(), static_cast<std::streamsize>(key.size()));
    u32(static_cast<uint32_t>(o.kind));
    f32(o.rtol);
    f32(o.atol);
    u32(static_cast<uint32_t>(o.bytes.size()));
    f.write(reinterpret_cast<const char*>(o.bytes.data()), static_cast<std::streamsize>(o.bytes.size()));
    u32(static_cast<uint32_t>(o.scale.size()));
    f.write(reinterpret_cast<const char*>(o.scale.data()), static_cast<std::streamsize>(o.scale.size() * 4));
  }
  if (!f) fail("cannot write " + path);
}

// the scalar table's outputs here against the dump of another build (the x86-64 one)
void compare_dump(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    fail("cannot read " + path);
    return;
  }
  auto u32 = [&]() { uint32_t v = 0; f.read(reinterpret_cast<char*>(&v), 4); return v; };
  auto f32 = [&]() { float v = 0; f.read(reinterpret_cast<char*>(&v), 4); return v; };
  const uint32_t n = u32();
  size_t seen = 0;
  for (uint32_t i = 0; i < n && f; ++i) {
    std::string key(u32(), '\0');
    f.read(key.data(), static_cast<std::streamsize>(key.size()));
    Out ref;
    ref.tag = key;
    ref.kind = static_cast<int>(u32());
    ref.rtol = f32();
    ref.atol = f32();
    ref.bytes.resize(u32());
    f.read(reinterpret_cast<char*>(ref.bytes.data()), static_cast<std::streamsize>(ref.bytes.size()));
    ref.scale.resize(u32());
    f.read(reinterpret_cast<char*>(ref.scale.data()), static_cast<std::streamsize>(ref.scale.size() * 4));
    const auto it = g_dump.find(key);
    if (it == g_dump.end()) continue;  // a case --quick leaves out
    ++g_checks;
    ++seen;
    // the portable path on both architectures: same operations, same IEEE roundings; the other
    // build's tolerance only where its own ISA comparison had one
    const std::string d = compare(ref, it->second);
    if (!d.empty()) fail("scalar vs the reference build: " + key + ": " + d);
  }
  ++g_checks;
  if (seen != g_dump.size())
    fail("reference dump " + path + ": " + std::to_string(seen) + " of the " + std::to_string(g_dump.size()) +
         " outputs here found there (a stale dump?)");
  std::printf("reference %s: %zu outputs compared\n", path.c_str(), seen);
}

// one INT8 GEMM's operands and s32 sums (the last table's: i8mm under -cpu max) for
// tests/test_arm.py, which replays them through the x86-64 zoi._cpu on every ISA
void export_gemm(const std::string& dir) {
  for (int asym = 0; asym < 2; ++asym) {
    Rng rng(777 + asym);
    I8Spec s;
    s.M = 19;
    s.N = 37;
    s.K = 71;
    s.asym = asym;
    s.raw = true;
    const I8Data d = i8_data(rng, s);
    const Outs o = gemm_i8_run(*g_tables.back().kt, s, d);
    std::ofstream f(dir + (asym ? "/gemm_asym.bin" : "/gemm_sym.bin"), std::ios::binary);
    auto i32 = [&](int32_t v) { f.write(reinterpret_cast<const char*>(&v), 4); };
    i32(s.M);
    i32(s.N);
    i32(s.K);
    for (int v : d.q) i32(v);
    for (int v : d.zp) i32(v);
    f.write(reinterpret_cast<const char*>(d.w.data()), static_cast<std::streamsize>(d.w.size()));
    const int32_t* y = reinterpret_cast<const int32_t*>(o[1].bytes.data());
    for (int m = 0; m < s.M; ++m) f.write(reinterpret_cast<const char*>(y + static_cast<size_t>(m) * (s.N + 3)), 4 * s.N);
  }
}

// ---------------------------------------------------------------- the native tokenizer

// fixture (scripts/gen_arm_tokenizer_fixture.py): "config key=value ...", "vocab ID TOKEN" lines,
// then "text HEX" / "ids N N ..." pairs, expected from the x86-64 build of zoi._cpu.WordPiece
void test_tokenizer(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    fail("cannot read " + path);
    return;
  }
  zoi::tok::Config cfg;
  std::vector<std::string> vocab, added;
  std::vector<int32_t> ids, added_ids;
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> want;
  std::string line;
  auto hex = [](const std::string& h) {
    std::string s;
    for (size_t i = 0; i + 1 < h.size(); i += 2) s.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
    return s;
  };
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    if (kind == "config") {
      std::string kv;
      while (in >> kv) {
        const size_t eq = kv.find('=');
        const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
        if (k == "unk") cfg.unk_id = std::stoi(v);
        else if (k == "head") cfg.head = {std::stoi(v)};
        else if (k == "tail") cfg.tail = {std::stoi(v)};
        else if (k == "max_len") cfg.max_len = std::stoi(v);
        else if (k == "lowercase") cfg.lowercase = v == "1";
        else if (k == "strip_accents") cfg.strip_accents = v == "1";
        else if (k == "max_chars") cfg.max_input_chars_per_word = std::stoi(v);
      }
    } else if (kind == "vocab" || kind == "added") {
      int32_t id;
      std::string tokhex;
      in >> id >> tokhex;
      (kind == "vocab" ? vocab : added).push_back(hex(tokhex));
      (kind == "vocab" ? ids : added_ids).push_back(id);
    } else if (kind == "text") {
      std::string h;
      in >> h;
      texts.push_back(hex(h));
    } else if (kind == "ids") {
      std::vector<int32_t> v;
      int32_t x;
      while (in >> x) v.push_back(x);
      want.push_back(v);
    }
  }
  ++g_checks;
  if (texts.empty() || texts.size() != want.size()) {
    fail("tokenizer fixture " + path + " malformed");
    return;
  }
  const zoi::tok::WordPiece wp(vocab, ids, added, added_ids, cfg);
  size_t ok = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<int32_t> got;
    wp.encode(texts[i].data(), texts[i].size(), true, got);
    ++g_checks;
    if (got == want[i]) {
      ++ok;
      continue;
    }
    std::string g, w;
    for (int32_t v : got) g += std::to_string(v) + " ";
    for (int32_t v : want[i]) w += std::to_string(v) + " ";
    fail("tokenizer text " + std::to_string(i) + ": got [" + g + "] want [" + w + "]");
  }
  std::printf("tokenizer: %zu / %zu texts as the x86-64 build (%zu vocabulary entries)\n", ok, texts.size(), vocab.size());
}

}  // namespace

int main(int argc, char** argv) {
  std::string isas = "all", dump, ref, tok, exp_best, exp_active, exp_unsup, export_dir;
  uint64_t seed = static_cast<uint64_t>(std::time(nullptr)) ^ 0x5EEDull;
  int passes = 1;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--isas") isas = val();
    else if (a == "--seed") seed = std::stoull(val());
    else if (a == "--passes") passes = std::stoi(val());
    else if (a == "--quick") quick = true;
    else if (a == "--dump") dump = val();
    else if (a == "--ref") ref = val();
    else if (a == "--tok") tok = val();
    else if (a == "--export-gemm") export_dir = val();
    else if (a == "--expect-best") exp_best = val();
    else if (a == "--expect-active") exp_active = val();
    else if (a == "--expect-unsupported") exp_unsup = val();
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  try {
    // this driver is its own API edge: ZOI_CPU_ISA forces the active ISA as CpuOptions.isa does
    // (the core reads no environment variable)
    if (const char* forced = std::getenv("ZOI_CPU_ISA"); forced && *forced) zoi::set_forced_isa(forced);
    check_detection(exp_best, exp_active, exp_unsup);
    g_tables.push_back({"scalar", table_of(Isa::Scalar)});
    std::vector<Isa> want;
    if (isas == "all") {
      for (Isa i : kBuildIsas)
        if (i != Isa::Scalar && zoi::isa_supported(i)) want.push_back(i);
    } else if (isas == "active") {
      if (zoi::active_isa() != Isa::Scalar) want.push_back(zoi::active_isa());
    } else {
      for (const std::string& n : split(isas, ','))
        if (n != "scalar") want.push_back(isa_or_die(n));
    }
    for (Isa i : want) g_tables.push_back({zoi::isa_name(i), table_of(i)});
    std::string names;
    for (const Table& t : g_tables) {
      check_table_layout(t);
      names += t.name + " ";
    }
    std::printf("tables: %s(each against scalar)\n", names.c_str());
    // pass 0: the fixed seed (the cross-build reference), then fresh seeds
    constexpr uint64_t kRefSeed = 20260101;
    for (int pass = 0; pass <= passes; ++pass) {
      const uint64_t s = pass == 0 ? kRefSeed : seed + static_cast<uint64_t>(pass);
      if (pass > 0) std::printf("pass %d: seed %llu\n", pass, static_cast<unsigned long long>(s));
      g_record = pass == 0;
      const bool q = quick;
      Rng rng(s);
      test_gemm_i8(rng, q);
      test_quantize(rng, q);
      test_layernorm(rng, q);
      test_embed(rng, q);
      test_gemm_f32(rng, q);
      test_activation(rng);
      test_glu_lora(rng, q);
      test_attention(rng, q);
      test_pool(rng);
      test_paged(rng, q);
    }
    test_peak();
    {
      Rng rng(seed ^ 0xB00Cull);
      test_thread_pool(rng);
    }
    if (!dump.empty()) write_dump(dump);
    if (!ref.empty()) compare_dump(ref);
    if (!export_dir.empty()) export_gemm(export_dir);
    if (!tok.empty()) test_tokenizer(tok);
  } catch (const std::exception& e) {
    fail(std::string("exception: ") + e.what());
  }
  std::printf("%s: %d checks, %d failed\n", g_fail ? "FAILED" : "OK", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
