// nanobind entry point of zoi._cpu: CPU info, the Engine (whole plan in one call, GIL
// released) and per-kernel bindings (tests, kernel lab) with an explicit ISA argument.
// Kernel bindings take their outputs as arguments (tests poison them first) and run the
// kernel's thread shares tid = 0..nt-1 one after the other on the calling thread.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <ctime>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <vector>

#include "isa.h"
#include "kernels/kernels.h"
#include "runtime/engine.h"
#include "runtime/pool.h"
#include "bind.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using zoi_bind::Arr;
using zoi_bind::Opt;
using zoi_bind::table_for;

// the ISA names of this build's architecture (any other is refused as unsupported)
#if defined(ZOI_ARCH_ARM64)
constexpr const char* kUnknownIsa = "unknown ISA; expected i8mm|dotprod|neon|scalar";
#elif defined(ZOI_ARCH_X86)
constexpr const char* kUnknownIsa = "unknown ISA; expected amx|vnni|avx512|avxvnni|avx2|scalar";
#else
constexpr const char* kUnknownIsa = "unknown ISA; expected scalar";
#endif

}  // namespace

const zoi::KernelTable& zoi_bind::table_for(const std::string& isa) {
  zoi::Isa i;
  if (isa.empty()) return zoi::kernel_table(zoi::active_isa());
  if (!zoi::parse_isa(isa, &i)) throw nb::value_error(kUnknownIsa);
  return zoi::kernel_table(i);
}

namespace {

int parse_act(const std::string& a) {
  if (a == "none") return zoi::ACT_NONE;
  if (a == "gelu") return zoi::ACT_GELU;
  if (a == "gelu_tanh") return zoi::ACT_GELU_TANH;
  if (a == "relu") return zoi::ACT_RELU;
  if (a == "sigmoid") return zoi::ACT_SIGMOID;
  if (a == "tanh") return zoi::ACT_TANH;
  if (a == "silu") return zoi::ACT_SILU;
  throw nb::value_error("act must be one of none, gelu, gelu_tanh, relu, sigmoid, tanh, silu");
}

int parse_pool(const std::string& m) {
  if (m == "mean") return 0;
  if (m == "cls") return 1;
  if (m == "max") return 2;
  if (m == "splade") return 3;
  if (m == "last") return 4;
  throw nb::value_error("pool mode must be mean, cls, max, splade or last");
}

template <class T>
void need(const Arr<T>& a, size_t ndim, std::initializer_list<long> shape, const char* what) {
  if (a.ndim() != ndim) throw nb::value_error((std::string(what) + ": wrong number of dimensions").c_str());
  size_t i = 0;
  for (long s : shape) {
    if (s >= 0 && static_cast<long>(a.shape(i)) != s)
      throw nb::value_error((std::string(what) + ": wrong shape").c_str());
    ++i;
  }
}

template <class F>
void for_threads(int nt, F&& f) {
  if (nt < 1) nt = 1;
  for (int t = 0; t < nt; ++t) f(t, nt);
}

// A-format buffer (kernels.h) for M rows of Kp, with scales and zero points
struct QBuf {
  std::vector<uint8_t> bytes;
  std::vector<float> scale;
  std::vector<int32_t> zp;
  zoi::QuantOut qo;
  QBuf(const zoi::KernelTable& kt, int M, int K, const zoi::QuantOut& params) {
    const int kp = zoi::round_up(K > 0 ? K : 1, kt.i8_kgroup);
    bytes.assign(static_cast<size_t>(M) * kp * kt.i8_a_bytes + 64, 0);
    scale.assign(M > 0 ? M : 1, 0.f);
    zp.assign(M > 0 ? M : 1, 0);
    qo = params;
    qo.q = bytes.data();
    qo.ldq = kp;
    qo.scale = scale.data();
    qo.zp = zp.data();
  }
  int stored(const zoi::KernelTable& kt, int m, int k) const { return kt.i8_a_get(bytes.data(), qo.ldq, m, k); }
  void set(const zoi::KernelTable& kt, int m, int k, int v) { kt.i8_a_set(bytes.data(), qo.ldq, m, k, v); }
};

struct PackedI8 {
  std::vector<uint8_t> raw;
  void* w;
  std::vector<int32_t> colsum;
  std::vector<float> ws, bias;
  PackedI8(const zoi::KernelTable& kt, const int8_t* wq, int N, int K, const float* w_scale, const float* b) {
    raw.assign(kt.pack_i8_bytes(N, K) + 64, 0);
    w = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(raw.data()) + 63) / 64 * 64);
    const int np = zoi::round_up(N, kt.i8_panel);
    colsum.assign(np, 0);
    ws.assign(np, 0.f);
    bias.assign(np, 0.f);
    kt.pack_i8(wq, N, K, w, colsum.data());
    if (w_scale) std::memcpy(ws.data(), w_scale, N * 4);
    if (b) std::memcpy(bias.data(), b, N * 4);
  }
};

template <class F>
void trampoline(void* c, int t, int n) { (*static_cast<F*>(c))(t, n); }

template <class F>
void pool_run(F& f, int nt) { zoi::ThreadPool::instance().run_all(&trampoline<F>, &f, nt); }  // static: all join

}  // namespace

void bind_tokenizer(nb::module_& m);  // csrc/tokenizer/bind.cc

// csrc/runtime/bind_gen.cc: the engine's generation methods and the paged attention kernels
void bind_generation(nb::class_<zoi::Engine>& cls, nb::module_& m);

NB_MODULE(_cpu, m) {
  m.doc() = "zoi native CPU core";
  // engines still referenced by daemon threads at interpreter exit are not leaks worth a report
  nb::set_leak_warnings(false);
  // the measured size from which an INT8 GEMM quantises its own output for the next INT8 GEMM
  // (zoi.graph.fusion.LINEAR_QUANT_MIN_TOKENS is the plan's copy of it; tests check they agree)
  m.attr("I8_FUSE_QUANT_MIN_M") = zoi::kI8FuseQuantMinM;
  m.def("cpu_info", []() {
    const zoi::CpuFeatures& f = zoi::cpu_features();
    nb::dict d;
    d["vendor"] = f.vendor;
    d["brand"] = f.brand;
#if defined(ZOI_ARCH_ARM64)
    // the Linux HWCAP names (/proc/cpuinfo's flags)
    d["asimd"] = f.asimd;
    d["asimddp"] = f.asimddp;
    d["i8mm"] = f.i8mm;
    d["sve"] = f.sve;
    d["sve2"] = f.sve2;
#else
    d["avx2"] = f.avx2;
    d["fma"] = f.fma;
    d["avx512f"] = f.avx512f;
    d["avx512bw"] = f.avx512bw;
    d["avx512vl"] = f.avx512vl;
    d["avx512vnni"] = f.avx512vnni;
    d["avx_vnni"] = f.avx_vnni;
    d["amx_tile"] = f.amx_tile;
    d["amx_int8"] = f.amx_int8;
#endif
    d["best_isa"] = zoi::isa_name(zoi::best_isa());
    return d;
  });
  m.def("active_isa", []() { return std::string(zoi::isa_name(zoi::active_isa())); },
        "ISA the dispatcher uses: the best this CPU runs, or the one set_forced_isa chose");
  m.def("isa_supported", [](const std::string& s) {
    zoi::Isa i;
    if (!zoi::parse_isa(s, &i)) throw nb::value_error(kUnknownIsa);
    return zoi::isa_supported(i);
  });
  m.def("pool_size", []() { return zoi::ThreadPool::instance().size(); },
        "threads of the shared pool (configure_pool; default: CPUs in the affinity mask)");
  m.def("pool_cpus", []() {
    nb::list l;
    for (int c : zoi::ThreadPool::instance().cpus()) l.append(c);
    return l;
  });

  // ------------------------------------------------------------------ CPU options
  // Set by zoi.backends.cpu.options (CpuOptions.apply) before an engine is built: the core reads
  // no environment variable. Process-wide; bad values raise ValueError.
  m.def("set_forced_isa", [](const std::string& isa) { zoi::set_forced_isa(isa); }, "isa"_a,
        "the ISA of engines built with isa '' and of active_isa ('' : the best this CPU runs)");
  m.def("configure_pool", [](int num_threads, bool pin) { zoi::ThreadPool::configure(num_threads, pin); },
        "num_threads"_a, "pin"_a, nb::call_guard<nb::gil_scoped_release>(),
        "the shared pool's threads (0: one per CPU of the affinity mask) and pinning; a running pool "
        "restarts its workers once its current job is done");
  m.def("pool_pinned", []() { return zoi::ThreadPool::instance().pinned(); });
  m.def("set_amx_thresholds", [](int min_m, long nt_bytes) { zoi::set_amx_thresholds(min_m, nt_bytes); },
        "min_m"_a, "nt_bytes"_a, "the AMX-INT8 GEMM: vnni's kernel below min_m rows; streaming stores from nt_bytes");
  m.def("amx_thresholds", []() { return nb::make_tuple(zoi::amx_min_m_option(), zoi::amx_nt_bytes_option()); });
  m.def("cpu_option_defaults", []() {
    nb::dict d;
    d["isa"] = nb::none();
    d["num_threads"] = 0;
    d["pin"] = true;
    d["amx_min_m"] = zoi::kAmxMinMDefault;
    d["amx_nt_bytes"] = zoi::kAmxNtBytesDefault;
    return d;
  });

  // ------------------------------------------------------------------ kernels (tests / lab)
  m.def("k_activation", [](Arr<float> x, const std::string& act, const std::string& isa) {
    table_for(isa).activation(x.data(), x.size(), parse_act(act));
  }, "x"_a, "act"_a, "isa"_a = "");

  // q: the logical integers (symmetric: -127..127; asym: 0..255), zp: 0 when symmetric
  m.def("k_quantize", [](Arr<const float> x, Arr<int16_t> q, Arr<float> scale, Arr<int32_t> zp, float static_amax,
                         bool asym, Opt<const float> shift, Opt<const float> mul, const std::string& isa, int nt) {
    const auto& kt = table_for(isa);
    need(x, 2, {-1, -1}, "x");
    const int M = x.shape(0), K = x.shape(1);
    need(q, 2, {M, K}, "q");
    need(scale, 1, {M}, "scale");
    need(zp, 1, {M}, "zp");
    if (shift) need(*shift, 1, {K}, "shift");
    if (mul) need(*mul, 1, {K}, "mul");
    zoi::QuantOut params;
    params.static_amax = static_amax;
    params.asym = asym;
    params.shift = shift ? shift->data() : nullptr;
    params.mul = mul ? mul->data() : nullptr;
    QBuf qb(kt, M, K, params);
    for_threads(nt, [&](int t, int n) { kt.quantize_rows(x.data(), K, M, K, qb.qo, t, n); });
    const int off = asym ? kt.i8_a_off_asym : kt.i8_a_off_sym;
    for (int i = 0; i < M; ++i) {
      scale.data()[i] = qb.scale[i];
      zp.data()[i] = qb.zp[i] - off;
      for (int k = 0; k < K; ++k) q.data()[static_cast<size_t>(i) * K + k] = static_cast<int16_t>(qb.stored(kt, i, k) - off);
    }
  }, "x"_a, "q"_a, "scale"_a, "zp"_a, "static_amax"_a = -1.f, "asym"_a = false, "shift"_a.none() = nb::none(),
     "mul"_a.none() = nb::none(), "isa"_a = "", "nt"_a = 1);

  // k_quantize with the first-row residual on (QuantOut::q2): rows cu[b] also write q2 [B, W >= K]
  // (logical -127..127; columns K..W-1: the stored padding as logical values, then 0) and scale2 [B];
  // the buffers are poisoned first, so a code or padding left unwritten shows
  m.def("k_quantize_first_rows", [](Arr<const float> x, Arr<const int32_t> cu, Arr<int16_t> q, Arr<float> scale,
                                    Arr<int32_t> zp, Arr<int16_t> q2, Arr<float> scale2, float static_amax, bool asym,
                                    Opt<const float> shift, Opt<const float> mul, const std::string& isa, int nt) {
    const auto& kt = table_for(isa);
    need(x, 2, {-1, -1}, "x");
    const int M = x.shape(0), K = x.shape(1);
    need(cu, 1, {-1}, "cu_seqlens");
    const int B = static_cast<int>(cu.shape(0)) - 1;
    if (B < 1 || cu.data()[0] != 0 || cu.data()[B] != M)
      throw nb::value_error("cu_seqlens must run from 0 to the rows of x");
    need(q, 2, {M, K}, "q");
    need(scale, 1, {M}, "scale");
    need(zp, 1, {M}, "zp");
    need(q2, 2, {B, -1}, "q2");
    need(scale2, 1, {B}, "scale2");
    if (q2.shape(1) < static_cast<size_t>(K)) throw nb::value_error("q2 needs at least K columns");
    if (shift) need(*shift, 1, {K}, "shift");
    if (mul) need(*mul, 1, {K}, "mul");
    zoi::QuantOut params;
    params.static_amax = static_amax;
    params.asym = asym;
    params.shift = shift ? shift->data() : nullptr;
    params.mul = mul ? mul->data() : nullptr;
    QBuf qb(kt, M, K, params);
    QBuf q2b(kt, B, K, zoi::QuantOut{});
    std::fill(q2b.bytes.begin(), q2b.bytes.end(), uint8_t{0x5A});
    std::vector<int32_t> zp2(B, -999);
    for (int b = 0; b < B; ++b) q2b.scale[b] = -1.f;
    qb.qo.first_row = 1;
    qb.qo.q2 = q2b.bytes.data();
    qb.qo.scale2 = q2b.scale.data();
    qb.qo.zp2 = zp2.data();
    qb.qo.cu = cu.data();
    qb.qo.B = B;
    for_threads(nt, [&](int t, int n) { kt.quantize_rows(x.data(), K, M, K, qb.qo, t, n); });
    const int off = asym ? kt.i8_a_off_asym : kt.i8_a_off_sym, off2 = kt.i8_a_off_sym;
    for (int i = 0; i < M; ++i) {
      scale.data()[i] = qb.scale[i];
      zp.data()[i] = qb.zp[i] - off;
      for (int k = 0; k < K; ++k) q.data()[static_cast<size_t>(i) * K + k] = static_cast<int16_t>(qb.stored(kt, i, k) - off);
    }
    const int W = static_cast<int>(q2.shape(1));
    for (int b = 0; b < B; ++b) {
      if (zp2[b] != off2) throw std::runtime_error("k_quantize_first_rows: a first row's zp2 was not written");
      scale2.data()[b] = q2b.scale[b];
      for (int k = 0; k < W; ++k)
        q2.data()[static_cast<size_t>(b) * W + k] = static_cast<int16_t>(k < q2b.qo.ldq ? q2b.stored(kt, b, k) - off2 : 0);
    }
  }, "x"_a, "cu"_a, "q"_a, "scale"_a, "zp"_a, "q2"_a, "scale2"_a, "static_amax"_a = -1.f, "asym"_a = false,
     "shift"_a.none() = nb::none(), "mul"_a.none() = nb::none(), "isa"_a = "", "nt"_a = 1);

  // exact integer sums: q int16 [M,K] (symmetric -127..127 when zp is None; else 0..255 with zp [M])
  m.def("k_gemm_s32", [](Arr<const int16_t> q, Opt<const int32_t> zp, Arr<const int8_t> wq, Arr<int32_t> out,
                         const std::string& isa, int nt, int w_bits) {
    const auto& kt = table_for(isa);
    need(q, 2, {-1, -1}, "q");
    const int M = q.shape(0), K = q.shape(1);
    need(wq, 2, {-1, K}, "w_q");
    const int N = wq.shape(0);
    need(out, 2, {M, N}, "out");
    if (zp) need(*zp, 1, {M}, "zp");
    zoi::QuantOut params;
    QBuf qb(kt, M, K, params);
    const int off = zp ? kt.i8_a_off_asym : kt.i8_a_off_sym;
    for (int i = 0; i < M; ++i) {
      const int z = (zp ? zp->data()[i] : 0) + off;
      for (int k = 0; k < K; ++k) qb.set(kt, i, k, q.data()[static_cast<size_t>(i) * K + k] + off);
      for (int k = K; k < qb.qo.ldq; ++k) qb.set(kt, i, k, z);
      qb.scale[i] = 1.f;
      qb.zp[i] = z;
    }
    PackedI8 pw(kt, wq.data(), N, K, nullptr, nullptr);
    zoi::GemmI8Args a;
    a.a = qb.bytes.data(); a.lda = qb.qo.ldq; a.a_scale = qb.scale.data(); a.a_zp = qb.zp.data();
    a.w = pw.w; a.colsum = pw.colsum.data(); a.w_scale = pw.ws.data(); a.bias = pw.bias.data();
    a.M = M; a.N = N; a.Kp = qb.qo.ldq; a.ldy = N; a.y_i32 = out.data();
    zoi::check_i8_weight_bits(wq.data(), N, K, w_bits);
    a.w_bits = w_bits;
    for_threads(nt, [&](int t, int n) { kt.gemm_i8(a, t, n); });
  }, "q"_a, "zp"_a.none(), "w_q"_a, "out"_a, "isa"_a = "", "nt"_a = 1, "w_bits"_a = 8);

  m.def("k_linear_i8", [](Arr<const float> x, Arr<const int8_t> wq, Arr<const float> w_scale, Opt<const float> b,
                          const std::string& act, Opt<const float> res, float static_amax, Arr<float> y,
                          const std::string& isa, int nt, bool asym, Opt<const float> shift, Opt<const float> mul,
                          int w_bits) {
    const auto& kt = table_for(isa);
    need(x, 2, {-1, -1}, "x");
    const int M = x.shape(0), K = x.shape(1);
    need(wq, 2, {-1, K}, "w_q");
    const int N = wq.shape(0);
    need(w_scale, 1, {N}, "w_scale");
    if (b) need(*b, 1, {N}, "b");
    if (res) need(*res, 2, {M, N}, "res");
    need(y, 2, {M, N}, "y");
    if (shift) need(*shift, 1, {K}, "shift");
    if (mul) need(*mul, 1, {K}, "mul");
    zoi::QuantOut params;
    params.static_amax = static_amax;
    params.asym = asym;
    params.shift = shift ? shift->data() : nullptr;
    params.mul = mul ? mul->data() : nullptr;
    QBuf qb(kt, M, K, params);
    for_threads(nt, [&](int t, int n) { kt.quantize_rows(x.data(), K, M, K, qb.qo, t, n); });
    PackedI8 pw(kt, wq.data(), N, K, w_scale.data(), b ? b->data() : nullptr);
    zoi::GemmI8Args a;
    a.a = qb.bytes.data(); a.lda = qb.qo.ldq; a.a_scale = qb.scale.data(); a.a_zp = qb.zp.data();
    a.w = pw.w; a.colsum = pw.colsum.data(); a.w_scale = pw.ws.data(); a.bias = pw.bias.data();
    a.M = M; a.N = N; a.Kp = qb.qo.ldq; a.y = y.data(); a.ldy = N;
    a.res = res ? res->data() : nullptr; a.ldr = N; a.act = parse_act(act);
    zoi::check_i8_weight_bits(wq.data(), N, K, w_bits);
    a.w_bits = w_bits;
    for_threads(nt, [&](int t, int n) { kt.gemm_i8(a, t, n); });
  }, "x"_a, "w_q"_a, "w_scale"_a, "b"_a.none(), "act"_a, "res"_a.none(), "static_amax"_a, "y"_a,
     "isa"_a = "", "nt"_a = 1, "asym"_a = false, "shift"_a.none() = nb::none(), "mul"_a.none() = nb::none(),
     "w_bits"_a = 8);

  // tests: an INT8 GEMM that quantises its output rows (N = K of the next GEMM) as the engine's
  // FFN1 -> FFN2 does; y_scratch: the float rows go to per-thread scratch, y is not written.
  // Writes q (stored - zp, [M, N]), qscale [M], qzp [M].
  m.def("k_linear_i8_fusedq", [](Arr<const float> x, Arr<const int8_t> wq, Arr<const float> w_scale,
                                 Opt<const float> b, const std::string& act, Arr<float> y, bool y_scratch,
                                 Arr<int16_t> q, Arr<float> qscale, Arr<int32_t> qzp, float static_amax, bool asym, const std::string& isa, int nt) {
    const auto& kt = table_for(isa);
    need(x, 2, {-1, -1}, "x");
    const int M = x.shape(0), K = x.shape(1);
    need(wq, 2, {-1, K}, "w_q");
    const int N = wq.shape(0);
    need(w_scale, 1, {N}, "w_scale");
    if (b) need(*b, 1, {N}, "b");
    need(y, 2, {M, N}, "y");
    need(q, 2, {M, N}, "q");
    need(qscale, 1, {M}, "qscale");
    need(qzp, 1, {M}, "qzp");
    zoi::QuantOut params;
    QBuf qb(kt, M, K, params);
    for_threads(nt, [&](int t, int n) { kt.quantize_rows(x.data(), K, M, K, qb.qo, t, n); });
    PackedI8 pw(kt, wq.data(), N, K, w_scale.data(), b ? b->data() : nullptr);
    zoi::QuantOut po;
    po.static_amax = static_amax;
    po.asym = asym;
    QBuf qo(kt, M, N, po);
    std::vector<float> scr;
    if (y_scratch) scr.assign(static_cast<size_t>(nt < 1 ? 1 : nt) * zoi::i8_qchunk_floats(N) + 16, 0.f);
    float* s0 = y_scratch ? reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scr.data()) + 63) & ~uintptr_t(63)) : nullptr;
    zoi::GemmI8Args a;
    a.a = qb.bytes.data(); a.lda = qb.qo.ldq; a.a_scale = qb.scale.data(); a.a_zp = qb.zp.data();
    a.w = pw.w; a.colsum = pw.colsum.data(); a.w_scale = pw.ws.data(); a.bias = pw.bias.data();
    a.M = M; a.N = N; a.Kp = qb.qo.ldq; a.y = y.data(); a.ldy = N; a.act = parse_act(act);
    a.qo = qo.qo;
    for_threads(nt, [&](int t, int n) {
      zoi::GemmI8Args c = a;
      if (s0) c.y_scratch = s0 + static_cast<size_t>(t) * zoi::i8_qchunk_floats(N);
      kt.gemm_i8(c, t, n);
    });
    for (int i = 0; i < M; ++i) {
      qscale.data()[i] = qo.scale[i];
      qzp.data()[i] = qo.zp[i];
      for (int k = 0; k < N; ++k) q.data()[static_cast<size_t>(i) * N + k] = static_cast<int16_t>(qo.stored(kt, i, k) - qo.zp[i]);
    }
  }, "x"_a, "w_q"_a, "w_scale"_a, "b"_a.none(), "act"_a, "y"_a, "y_scratch"_a, "q"_a, "qscale"_a, "qzp"_a, "static_amax"_a = -1.f,
     "asym"_a = false, "isa"_a = "", "nt"_a = 1);

  m.def("k_linear_f32", [](Arr<const float> x, Arr<const float> w, Opt<const float> b, const std::string& act,
                           Opt<const float> res, Arr<float> y, const std::string& isa, int nt) {
    const auto& kt = table_for(isa);
    need(x, 2, {-1, -1}, "x");
    const int M = x.shape(0), K = x.shape(1);
    need(w, 2, {-1, K}, "w");
    const int N = w.shape(0);
    if (b) need(*b, 1, {N}, "b");
    if (res) need(*res, 2, {M, N}, "res");
    need(y, 2, {M, N}, "y");
    std::vector<float> raw(kt.pack_f32_bytes(N, K) / 4 + 16);
    float* pw = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(raw.data()) + 63) / 64 * 64);
    kt.pack_f32(w.data(), N, K, pw);
    std::vector<float> bias(zoi::round_up(N, kt.f32_panel), 0.f);
    if (b) std::memcpy(bias.data(), b->data(), N * 4);
    zoi::GemmF32Args a;
    a.a = x.data(); a.lda = K; a.w = pw; a.bias = bias.data(); a.M = M; a.N = N; a.K = K;
    a.y = y.data(); a.ldy = N; a.res = res ? res->data() : nullptr; a.ldr = N; a.act = parse_act(act);
    for_threads(nt, [&](int t, int n) { kt.gemm_f32(a, t, n); });
  }, "x"_a, "w"_a, "b"_a.none(), "act"_a, "res"_a.none(), "y"_a, "isa"_a = "", "nt"_a = 1);

  m.def("k_layernorm", [](Arr<const float> x, Opt<const float> r, Arr<const float> w, Arr<const float> b, float eps,
                          Arr<float> y, Opt<int16_t> q, Opt<float> qscale, float static_amax, const std::string& isa,
                          int nt, bool rms, bool post) {
    if (post && !r) throw nb::value_error("post needs a residual r");
    const auto& kt = table_for(isa);
    need(x, 2, {-1, -1}, "x");
    const int M = x.shape(0), H = x.shape(1);
    if (r) need(*r, 2, {M, H}, "r");
    need(w, 1, {H}, "w");
    need(b, 1, {H}, "b");
    need(y, 2, {M, H}, "y");
    if (H > zoi::kMaxLnH) throw nb::value_error("H too large");
    zoi::QuantOut params;
    params.static_amax = static_amax;
    QBuf qb(kt, M, H, params);
    zoi::LnArgs a;
    a.x = x.data(); a.ldx = H; a.r = r ? r->data() : nullptr; a.ldr = H; a.w = w.data(); a.b = b.data();
    a.eps = eps; a.M = M; a.H = H; a.y = y.data(); a.ldy = H; a.rms = rms; a.post = post;
    if (q) a.qo = qb.qo;
    for_threads(nt, [&](int t, int n) { kt.layernorm(a, t, n); });
    if (q) {
      need(*q, 2, {M, H}, "q");
      for (int i = 0; i < M; ++i) {
        if (qscale) qscale->data()[i] = qb.scale[i];
        for (int k = 0; k < H; ++k)
          q->data()[static_cast<size_t>(i) * H + k] = static_cast<int16_t>(qb.stored(kt, i, k) - qb.zp[i]);
      }
    }
  }, "x"_a, "r"_a.none(), "w"_a, "b"_a, "eps"_a, "y"_a, "q"_a.none() = nb::none(), "qscale"_a.none() = nb::none(),
     "static_amax"_a = -1.f, "isa"_a = "", "nt"_a = 1, "rms"_a = false, "post"_a = false);

  m.def("k_embed", [](Arr<const int32_t> ids, Arr<const int32_t> positions, Opt<const float> word,
                      Opt<const int8_t> word_q, Opt<const float> word_scale, Opt<const float> pos,
                      Opt<const float> type0, Arr<const float> ln_w, Arr<const float> ln_b, float eps, Arr<float> y,
                      const std::string& isa, int nt) {
    const auto& kt = table_for(isa);
    const int T = ids.shape(0), H = y.shape(1);
    need(y, 2, {T, H}, "y");
    if (H > zoi::kMaxLnH) throw nb::value_error("H too large");
    need(positions, 1, {T}, "positions");
    const long V = word ? static_cast<long>(word->shape(0)) : (word_q ? static_cast<long>(word_q->shape(0)) : 0);
    for (int t = 0; t < T; ++t) {
      if (ids.data()[t] < 0 || ids.data()[t] >= V) throw nb::value_error("id out of range");
      if (pos && (positions.data()[t] < 0 || positions.data()[t] >= static_cast<long>(pos->shape(0))))
        throw nb::value_error("position out of range");
    }
    zoi::EmbedArgs a;
    a.ids = ids.data(); a.positions = positions.data(); a.T = T; a.H = H;
    a.word = word ? word->data() : nullptr;
    a.word_q = word_q ? word_q->data() : nullptr;
    a.word_scale = word_scale ? word_scale->data() : nullptr;
    if (!a.word && !(a.word_q && a.word_scale)) throw nb::value_error("need word or word_q + word_scale");
    if (pos) need(*pos, 2, {-1, H}, "pos");
    a.pos = pos ? pos->data() : nullptr; a.type0 = type0 ? type0->data() : nullptr; a.ln_w = ln_w.data(); a.ln_b = ln_b.data();
    a.eps = eps; a.y = y.data(); a.ldy = H;
    for_threads(nt, [&](int t, int n) { kt.embed(a, t, n); });
  }, "ids"_a, "positions"_a, "word"_a.none(), "word_q"_a.none(), "word_scale"_a.none(), "pos"_a.none(), "type0"_a.none(),
     "ln_w"_a, "ln_b"_a, "eps"_a, "y"_a, "isa"_a = "", "nt"_a = 1);

  m.def("k_attention", [](Arr<const float> qkv, Arr<const int32_t> cu, int heads, int d, float scale, Arr<float> out,
                          const std::string& isa, int nt, int prec) {
    const auto& kt = table_for(isa);
    if (prec < 0 || prec > 3) throw nb::value_error("prec must be 0, 1, 2 or 3");
    const int T = qkv.shape(0), H = heads * d;
    need(qkv, 2, {T, 3 * H}, "qkv");
    need(out, 2, {T, H}, "out");
    const int B = static_cast<int>(cu.shape(0)) - 1;
    if (B < 1 || cu.data()[0] != 0 || cu.data()[B] != T) throw nb::value_error("bad cu_seqlens");
    int maxlen = 1;
    for (int b = 0; b < B; ++b) {
      const int L = cu.data()[b + 1] - cu.data()[b];
      if (L <= 0) throw nb::value_error("empty sequence");
      maxlen = L > maxlen ? L : maxlen;
    }
    if (nt < 1) nt = 1;
    const size_t stride = (zoi::attn_scratch_floats(maxlen, d) + 15) / 16 * 16;
    std::vector<float> scratch(stride * nt + 16);
    zoi::AttnArgs a;
    a.qkv = qkv.data(); a.ldqkv = 3 * H; a.cu = cu.data(); a.B = B; a.heads = heads; a.d = d; a.scale = scale;
    a.out = out.data(); a.ldo = H; a.scratch = scratch.data(); a.scratch_stride = stride; a.prec = prec;
    for_threads(nt, [&](int t, int n) { kt.attention(a, t, n); });
  }, "qkv"_a, "cu"_a, "heads"_a, "d"_a, "scale"_a, "out"_a, "isa"_a = "", "nt"_a = 1, "prec"_a = 0);

  m.def("k_attention_ext", [](Arr<const float> qkv, Arr<const int32_t> cu, int heads, int d, float scale,
                              Arr<float> out, Opt<const float> bias, int window, Opt<const float> cos,
                              Opt<const float> sin, const std::string& isa, int nt, int kv_heads, bool causal,
                              Opt<const float> q_norm, Opt<const float> k_norm, float qk_eps) {
    const auto& kt = table_for(isa);
    if (kv_heads < 0 || (kv_heads > 0 && heads % kv_heads)) throw nb::value_error("kv_heads must divide heads");
    const int T = qkv.shape(0), H = heads * d, KV = (kv_heads > 0 ? kv_heads : heads) * d;
    need(qkv, 2, {T, H + 2 * KV}, "qkv");
    if (q_norm.has_value() != k_norm.has_value()) throw nb::value_error("q_norm and k_norm go together");
    if (q_norm) {
      need(*q_norm, 1, {d}, "q_norm");
      need(*k_norm, 1, {d}, "k_norm");
      if (d > zoi::kMaxHeadDim) throw nb::value_error("head dim too large for q / k norm");
    }
    need(out, 2, {T, H}, "out");
    const int B = static_cast<int>(cu.shape(0)) - 1;
    if (B < 1 || cu.data()[0] != 0 || cu.data()[B] != T) throw nb::value_error("bad cu_seqlens");
    int maxlen = 1;
    for (int b = 0; b < B; ++b) {
      const int L = cu.data()[b + 1] - cu.data()[b];
      if (L <= 0) throw nb::value_error("empty sequence");
      maxlen = L > maxlen ? L : maxlen;
    }
    zoi::AttnArgs a;
    if (bias) {
      need(*bias, 2, {heads, -1}, "bias");
      const int w = bias->shape(1);
      if (w % 2 == 0 || (w + 1) / 2 < maxlen) throw nb::value_error("bias must be [heads, 2P-1] with P >= max length");
      a.bias = bias->data(); a.bias_span = (w + 1) / 2;
    }
    if (cos || sin) {
      if (!cos || !sin || d % 2) throw nb::value_error("RoPE needs cos and sin and an even d");
      need(*cos, 2, {-1, d / 2}, "cos");
      need(*sin, 2, {static_cast<int>(cos->shape(0)), d / 2}, "sin");
      if (static_cast<int>(cos->shape(0)) < maxlen) throw nb::value_error("RoPE tables shorter than a sequence");
      a.rope_cos = cos->data(); a.rope_sin = sin->data(); a.rope_rows = cos->shape(0);
    }
    if (window < 0) throw nb::value_error("window must be >= 0");
    a.window = window;
    if (nt < 1) nt = 1;
    const size_t stride = (zoi::attn_scratch_floats(maxlen, d) + 15) / 16 * 16;
    std::vector<float> scratch(stride * nt + 16);
    a.qkv = qkv.data(); a.ldqkv = H + 2 * KV; a.cu = cu.data(); a.B = B; a.heads = heads; a.d = d; a.scale = scale;
    a.out = out.data(); a.ldo = H; a.scratch = scratch.data(); a.scratch_stride = stride;
    a.kv_heads = kv_heads; a.causal = causal;
    if (q_norm) { a.q_norm = q_norm->data(); a.k_norm = k_norm->data(); a.qk_eps = qk_eps; }
    for_threads(nt, [&](int t, int n) { kt.attention(a, t, n); });
  }, "qkv"_a, "cu"_a, "heads"_a, "d"_a, "scale"_a, "out"_a, "bias"_a.none(), "window"_a, "cos"_a.none(),
     "sin"_a.none(), "isa"_a = "", "nt"_a = 1, "kv_heads"_a = 0, "causal"_a = false,
     "q_norm"_a.none() = nb::none(), "k_norm"_a.none() = nb::none(), "qk_eps"_a = 1e-6f);

  m.def("k_glu", [](Arr<const float> x, const std::string& act, Arr<float> y, const std::string& isa, int nt) {
    const auto& kt = table_for(isa);
    const int M = x.shape(0), n = y.ndim() == 2 ? static_cast<int>(y.shape(1)) : 0;
    need(x, 2, {M, 2 * n}, "x");
    need(y, 2, {M, n}, "y");
    zoi::GluArgs a;
    a.x = x.data(); a.ldx = 2 * n; a.M = M; a.n = n; a.act = parse_act(act); a.y = y.data(); a.ldy = n;
    if (nt < 1) nt = 1;
    for_threads(nt, [&](int t, int k) { kt.glu(a, t, k); });
  }, "x"_a, "act"_a, "y"_a, "isa"_a = "", "nt"_a = 1);

  m.def("k_pool", [](Arr<const float> x, Arr<const int32_t> cu, const std::string& mode, Arr<float> out,
                     const std::string& isa, int nt) {
    const auto& kt = table_for(isa);
    const int T = x.shape(0), H = x.shape(1), B = static_cast<int>(cu.shape(0)) - 1;
    need(out, 2, {B, H}, "out");
    if (B < 1 || cu.data()[0] != 0 || cu.data()[B] != T) throw nb::value_error("bad cu_seqlens");
    zoi::PoolArgs a;
    a.x = x.data(); a.ldx = H; a.cu = cu.data(); a.B = B; a.H = H; a.mode = parse_pool(mode); a.out = out.data();
    a.ldo = H;
    for_threads(nt, [&](int t, int n) { kt.pool(a, t, n); });
  }, "x"_a, "cu"_a, "mode"_a, "out"_a, "isa"_a = "", "nt"_a = 1);

  m.def("k_normalize", [](Arr<float> p, const std::string& isa) {
    const auto& kt = table_for(isa);
    need(p, 2, {-1, -1}, "p");
    kt.normalize(p.data(), p.shape(1), p.shape(0), p.shape(1), 0, 1);
  }, "p"_a, "isa"_a = "");

  m.def("kernel_layout", [](const std::string& isa) {
    const auto& kt = table_for(isa);
    nb::dict d;
    d["isa"] = zoi::isa_name(kt.isa);
    d["i8_kgroup"] = kt.i8_kgroup;
    d["i8_a_bytes"] = kt.i8_a_bytes;
    d["i8_a_off_sym"] = kt.i8_a_off_sym;
    d["i8_a_off_asym"] = kt.i8_a_off_asym;
    d["i8_panel"] = kt.i8_panel;
    d["f32_panel"] = kt.f32_panel;
    return d;
  }, "isa"_a = "");

  // ------------------------------------------------------------------ kernel lab
  m.def("bench_peak_i8", [](const std::string& isa, int nt, long iters) {
    const auto& kt = table_for(isa);
    std::vector<double> ops(64, 0.0);
    nb::gil_scoped_release nogil;
    auto t0 = std::chrono::steady_clock::now();
    auto f = [&](int t, int) { ops[t] = kt.peak_i8(iters); };
    pool_run(f, nt);
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double tot = 0;
    for (double o : ops) tot += o;
    return tot / sec / 1e9;
  }, "isa"_a = "", "nt"_a = 1, "iters"_a = 20000000, "register-only INT8 dot loop on nt pool threads: GOP/s");

  m.def("bench_gemm", [](const std::string& kind, int M, int N, int K, const std::string& isa, int nt, int iters,
                         const std::string& act) {
    const auto& kt = table_for(isa);
    std::vector<int8_t> wq(static_cast<size_t>(N) * K);
    std::vector<float> wf(static_cast<size_t>(N) * K), x(static_cast<size_t>(M) * K), y(static_cast<size_t>(M) * N);
    uint32_t st = 12345;
    auto rnd = [&]() { st = st * 1664525u + 1013904223u; return static_cast<int>((st >> 9) % 255) - 127; };
    for (auto& v : wq) v = static_cast<int8_t>(rnd());
    for (auto& v : wf) v = rnd() / 127.f;
    for (auto& v : x) v = rnd() / 127.f;
    std::vector<float> ws(N, 0.01f), b(N, 0.f);
    double sec = 0, cpu = 0;
    auto cpu_now = [] {
      timespec ts;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
      return ts.tv_sec + 1e-9 * ts.tv_nsec;
    };
    if (kind == "i8" || kind == "i8w7") {  // i8w7: weights in [-63, 63] run as 7-bit (GemmI8Args::w_bits)
      const bool w7 = kind == "i8w7";
      if (w7)
        for (auto& v : wq) v = static_cast<int8_t>(v / 2);
      QBuf qb(kt, M, K, zoi::QuantOut{});
      kt.quantize_rows(x.data(), K, M, K, qb.qo, 0, 1);
      PackedI8 pw(kt, wq.data(), N, K, ws.data(), b.data());
      zoi::GemmI8Args a;
      a.a = qb.bytes.data(); a.lda = qb.qo.ldq; a.a_scale = qb.scale.data(); a.a_zp = qb.zp.data();
      a.w = pw.w; a.colsum = pw.colsum.data(); a.w_scale = pw.ws.data(); a.bias = pw.bias.data();
      a.M = M; a.N = N; a.Kp = qb.qo.ldq; a.y = y.data(); a.ldy = N; a.act = parse_act(act);
      a.w_bits = w7 ? 7 : 8;
      nb::gil_scoped_release nogil;
      auto f = [&](int t, int n) {
        for (int i = 0; i < iters; ++i) { kt.gemm_i8(a, t, n); zoi::ThreadPool::instance().barrier(); }
      };
      pool_run(f, 1);  // warm
      auto t0 = std::chrono::steady_clock::now();
      double c0 = cpu_now();
      pool_run(f, nt);
      cpu = cpu_now() - c0;
      sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else if (kind == "f32") {
      std::vector<float> raw(kt.pack_f32_bytes(N, K) / 4 + 16);
      float* pw = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(raw.data()) + 63) / 64 * 64);
      kt.pack_f32(wf.data(), N, K, pw);
      std::vector<float> bias(zoi::round_up(N, kt.f32_panel), 0.f);
      zoi::GemmF32Args a;
      a.a = x.data(); a.lda = K; a.w = pw; a.bias = bias.data(); a.M = M; a.N = N; a.K = K; a.y = y.data(); a.ldy = N;
      a.act = parse_act(act);
      nb::gil_scoped_release nogil;
      auto f = [&](int t, int n) {
        for (int i = 0; i < iters; ++i) { kt.gemm_f32(a, t, n); zoi::ThreadPool::instance().barrier(); }
      };
      pool_run(f, 1);
      auto t0 = std::chrono::steady_clock::now();
      double c0 = cpu_now();
      pool_run(f, nt);
      cpu = cpu_now() - c0;
      sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      throw nb::value_error("kind must be i8, i8w7 or f32");
    }
    return nb::make_tuple(sec / iters, cpu / iters);
  }, "kind"_a, "M"_a, "N"_a, "K"_a, "isa"_a = "", "nt"_a = 1, "iters"_a = 10, "act"_a = "none",
     "(wall s, calling thread's CPU s) per GEMM (random data, packed weights, through the pool)");

  // ------------------------------------------------------------------ engine
  auto engine = nb::class_<zoi::Engine>(m, "Engine");
  engine
      .def(nb::init<size_t, int, int, const std::string&, int>(), "arena_bytes"_a, "max_tokens"_a, "max_batch"_a,
           "isa"_a = "", "nthreads"_a = 0)
      .def("add_embed", [](zoi::Engine& e, size_t out_off, Opt<const float> word, Opt<const int8_t> word_q,
                           Opt<const float> word_scale, Opt<const float> pos, Opt<const float> type0,
                           Opt<const float> ln_w, Opt<const float> ln_b, float eps, int max_pos) {
        int V, H;
        if (word) { need(*word, 2, {-1, -1}, "word"); V = word->shape(0); H = word->shape(1); }
        else if (word_q && word_scale) {
          need(*word_q, 2, {-1, -1}, "word_q"); V = word_q->shape(0); H = word_q->shape(1);
          need(*word_scale, 1, {V}, "word_scale");
        } else throw nb::value_error("need word or word_q + word_scale");
        if (ln_w.has_value() != ln_b.has_value()) throw nb::value_error("ln_w and ln_b go together (or neither)");
        if (ln_w) { need(*ln_w, 1, {H}, "ln_w"); need(*ln_b, 1, {H}, "ln_b"); }
        // pos None: no position table (ModernBERT, RoPE); max_pos then bounds the positions
        if (pos) {
          need(*pos, 2, {-1, H}, "pos");
          if (max_pos >= 0 && max_pos != static_cast<int>(pos->shape(0)))
            throw nb::value_error("max_pos differs from the rows of pos");
          max_pos = static_cast<int>(pos->shape(0));
        } else if (max_pos < 1) {
          throw nb::value_error("without a position table, max_pos (positions a sequence may take) must be >= 1");
        }
        if (type0) need(*type0, 1, {H}, "type0");
        e.add_embed(out_off, H, V, max_pos, word ? word->data() : nullptr, word ? nullptr : word_q->data(),
                    word ? nullptr : word_scale->data(), pos ? pos->data() : nullptr, type0 ? type0->data() : nullptr,
                    ln_w ? ln_w->data() : nullptr, ln_b ? ln_b->data() : nullptr, eps);
      },
      // the tables are referenced, not copied (the word table is the largest array of a small
      // model): the engine keeps the arrays passed alive, and takes them only as they are
      // (noconvert: a converted temporary would die with the call)
      "out_off"_a, "word"_a.none().noconvert(), "word_q"_a.none().noconvert(), "word_scale"_a.none().noconvert(),
      "pos"_a.none().noconvert(), "type0"_a.none(), "ln_w"_a.none(), "ln_b"_a.none(), "eps"_a, "max_pos"_a = -1,
      nb::keep_alive<1, 3>(), nb::keep_alive<1, 4>(), nb::keep_alive<1, 5>(), nb::keep_alive<1, 6>(),
      "(tables are referenced and kept alive by the engine; pos None: no position table, max_pos rows)")
      .def("add_linear_f32", [](zoi::Engine& e, size_t in_off, size_t out_off, Arr<const float> w,
                                Opt<const float> b, const std::string& act, long res_off) {
        need(w, 2, {-1, -1}, "w");
        const int N = w.shape(0), K = w.shape(1);
        if (b) need(*b, 1, {N}, "b");
        e.add_linear_f32(in_off, K, out_off, N, w.data(), b ? b->data() : nullptr, parse_act(act), res_off);
      }, "in_off"_a, "out_off"_a, "w"_a, "b"_a.none(), "act"_a, "res_off"_a = -1)
      .def("add_linear_i8", [](zoi::Engine& e, size_t in_off, size_t out_off, Arr<const int8_t> w_q,
                               Arr<const float> w_scale, Opt<const float> b, const std::string& act, long res_off,
                               float static_amax, bool asym, Opt<const float> act_shift, Opt<const float> act_mul,
                               int q_from, int q_min_m, bool y_dead, int w_bits) {
        need(w_q, 2, {-1, -1}, "w_q");
        const int N = w_q.shape(0), K = w_q.shape(1);
        need(w_scale, 1, {N}, "w_scale");
        if (b) need(*b, 1, {N}, "b");
        if (act_shift) need(*act_shift, 1, {K}, "act_shift");
        if (act_mul) need(*act_mul, 1, {K}, "act_mul");
        e.add_linear_i8(in_off, K, out_off, N, w_q.data(), w_scale.data(), b ? b->data() : nullptr, parse_act(act),
                        res_off, static_amax, asym, act_shift ? act_shift->data() : nullptr,
                        act_mul ? act_mul->data() : nullptr, q_from, q_min_m, y_dead, w_bits);
      }, "in_off"_a, "out_off"_a, "w_q"_a, "w_scale"_a, "b"_a.none(), "act"_a, "res_off"_a = -1,
         "static_amax"_a = -1.f, "asym"_a = false, "act_shift"_a.none() = nb::none(), "act_mul"_a.none() = nb::none(),
         "q_from"_a, "q_min_m"_a = 0, "y_dead"_a = false, "w_bits"_a = 8,
         "q_from (the plan's decision, zoi.graph.fusion): 0 a quantise step makes the int8 input copy, 1 the "
         "previous step's epilogue (an INT8 GEMM's from q_min_m rows); refused when that step cannot. "
         "y_dead (the plan's quant_out_only): nothing but the next INT8 linear's copy reads this GEMM's float "
         "output, whose rows then go to per-thread scratch; finalize refuses it when the steps contradict it")
      .def("set_first_row_residual", &zoi::Engine::set_first_row_residual,
           "follows add_linear_i8: the first row of each sequence of its input quantised twice (docs/QUANT.md)")
      .def("add_attention", &zoi::Engine::add_attention, "in_off"_a, "out_off"_a, "heads"_a, "head_dim"_a, "scale"_a,
           "kv_heads"_a = 0)
      .def("set_attention_precision", &zoi::Engine::set_attention_precision, "mode"_a,
           "opt-in: 0 FP32 attention, 1 INT8 q.k^T, 2 INT8 q.k^T and p.v (VNNI / AMX tables), "
           "3 AMX-BF16 q.k^T and p.v (the amx ISA on AMX-BF16 CPUs, head dim 32 / 64); FP32 where a mode does not apply")
      .def("add_attention_ext", [](zoi::Engine& e, size_t in_off, size_t out_off, int heads, int head_dim,
                                   float scale, Opt<const float> bias, int window, Opt<const float> cos,
                                   Opt<const float> sin, int kv_heads, bool causal, Opt<const float> q_norm,
                                   Opt<const float> k_norm, float qk_eps) {
        if (q_norm) need(*q_norm, 1, {head_dim}, "q_norm");
        if (k_norm) need(*k_norm, 1, {head_dim}, "k_norm");
        int span = 0, rows = 0;
        if (bias) {
          need(*bias, 2, {heads, -1}, "bias");
          if (bias->shape(1) % 2 == 0) throw nb::value_error("bias must be [heads, 2P-1]");
          span = (static_cast<int>(bias->shape(1)) + 1) / 2;
        }
        if (cos && sin) {
          need(*cos, 2, {-1, head_dim / 2}, "cos");
          rows = cos->shape(0);
          need(*sin, 2, {rows, head_dim / 2}, "sin");
        }
        e.add_attention_ext(in_off, out_off, heads, head_dim, scale, bias ? bias->data() : nullptr, span, window,
                            cos ? cos->data() : nullptr, sin ? sin->data() : nullptr, rows, kv_heads, causal,
                            q_norm ? q_norm->data() : nullptr, k_norm ? k_norm->data() : nullptr, qk_eps);
      }, "in_off"_a, "out_off"_a, "heads"_a, "head_dim"_a, "scale"_a, "bias"_a.none(), "window"_a, "cos"_a.none(),
         "sin"_a.none(), "kv_heads"_a = 0, "causal"_a = false, "q_norm"_a.none() = nb::none(),
         "k_norm"_a.none() = nb::none(), "qk_eps"_a = 1e-6f)
      .def("add_glu", [](zoi::Engine& e, size_t in_off, size_t out_off, int n, const std::string& act) {
        e.add_glu(in_off, out_off, n, parse_act(act));
      }, "in_off"_a, "out_off"_a, "n"_a, "act"_a)
      .def("add_layernorm", [](zoi::Engine& e, size_t x_off, long res_off, size_t out_off, Arr<const float> w,
                               Arr<const float> b, float eps, bool rms, bool post) {
        const int H = w.shape(0);
        need(b, 1, {H}, "b");
        e.add_layernorm(x_off, res_off, out_off, H, w.data(), b.data(), eps, rms, post);
      }, "x_off"_a, "res_off"_a, "out_off"_a, "w"_a, "b"_a, "eps"_a, "rms"_a = false, "post"_a = false)
      .def("add_pool", [](zoi::Engine& e, size_t in_off, size_t out_off, int H, const std::string& mode) {
        e.add_pool(in_off, out_off, H, parse_pool(mode));
      }, "in_off"_a, "out_off"_a, "H"_a, "mode"_a)
      .def("add_lora", [](zoi::Engine& e, size_t in_off, size_t out_off, Arr<const float> a, Arr<const float> b,
                          const std::string& act, long res_off) {
        need(a, 3, {-1, -1, -1}, "lora a");
        const int n = a.shape(0), r = a.shape(1), K = a.shape(2);
        need(b, 3, {n, -1, r}, "lora b");
        e.add_lora(in_off, K, out_off, static_cast<int>(b.shape(1)), a.data(), b.data(), n, r, parse_act(act), res_off);
      }, "in_off"_a, "out_off"_a, "a"_a, "b"_a, "act"_a, "res_off"_a = -1,
         "task adapters after the linear step just added (without act / residual): a [n, r, K], b [n, N, r] "
         "(s B); then act and the residual on every row (copied)")
      .def("set_embed_lora", [](zoi::Engine& e, Arr<const float> a, Arr<const float> b, Opt<const float> type_delta) {
        need(a, 3, {-1, -1, -1}, "lora a");
        const int n = a.shape(0), r = a.shape(2);
        need(b, 3, {n, r, -1}, "lora b");
        if (type_delta) need(*type_delta, 2, {n, static_cast<int>(b.shape(2))}, "lora type");
        e.set_embed_lora(a.data(), b.data(), type_delta ? type_delta->data() : nullptr, n, r);
      }, "a"_a, "b"_a, "type_delta"_a.none(),
         "the last embed's task adapters: a [n, V, r], b [n, r, H] (s B), type_delta [n, H] or None (copied)")
      .def_prop_ro("num_tasks", &zoi::Engine::num_tasks)
      .def("finalize", &zoi::Engine::finalize)
      .def("run", [](zoi::Engine& e, Arr<const int32_t> ids, Arr<const int32_t> positions, Arr<const int32_t> cu,
                     bool normalize, Arr<float> out, std::optional<Arr<const int32_t>> tasks) {
        const int T = ids.shape(0), B = static_cast<int>(cu.shape(0)) - 1;
        if (positions.shape(0) != ids.shape(0)) throw nb::value_error("positions and ids differ in length");
        if (tasks && static_cast<int>(tasks->shape(0)) != B) throw nb::value_error("tasks must hold one id per sequence");
        const int rows = e.out_rows_t() ? T : B;
        if (out.ndim() != 2 || static_cast<int>(out.shape(0)) < rows || static_cast<int>(out.shape(1)) != e.out_cols())
          throw nb::value_error("out must be float32 [>= B, H] ([>= T, cols] for a per-token output)");
        nb::gil_scoped_release nogil;
        e.run(ids.data(), positions.data(), cu.data(), T, B, normalize, out.data(), e.out_cols(),
              tasks ? tasks->data() : nullptr);
      }, "ids"_a, "positions"_a, "cu_seqlens"_a, "normalize"_a, "out"_a, "tasks"_a.none() = nb::none(),
         "Runs the whole plan in one native call with the GIL released; writes out[:B]; tasks [B]: the task "
         "adapter of each sequence (-1 none)")
      .def("set_batch_rows", &zoi::Engine::set_batch_rows, "on"_a,
           "steps added while on run over the B rows of a pooled batch (heads)")
      .def("set_embed_types", [](zoi::Engine& e, Arr<const float> table) {
        need(table, 2, {-1, -1}, "type table");
        e.set_embed_types(table.data(), static_cast<int>(table.shape(0)));
      }, "table"_a, "the last embed adds table[types[t]] when a run passes types (copied)")
      .def("set_output", &zoi::Engine::set_output, "off"_a, "cols"_a, "rows_t"_a,
           "the run's output buffer: cols columns, T rows (rows_t) or B rows")
      .def("run_ex", [](zoi::Engine& e, Arr<const int32_t> ids, Arr<const int32_t> positions,
                        std::optional<Arr<const int32_t>> types, Arr<const int32_t> cu, Arr<float> out, long tap_off,
                        std::optional<Arr<float>> tap_out, std::optional<Arr<const int32_t>> tasks) {
        const int T = ids.shape(0), B = static_cast<int>(cu.shape(0)) - 1;
        if (tasks && static_cast<int>(tasks->shape(0)) != B) throw nb::value_error("tasks must hold one id per sequence");
        if (positions.shape(0) != ids.shape(0)) throw nb::value_error("positions and ids differ in length");
        if (types && static_cast<int>(types->shape(0)) != T) throw nb::value_error("types and ids differ in length");
        const int rows = e.out_rows_t() ? T : B;
        if (out.ndim() != 2 || static_cast<int>(out.shape(0)) < rows || static_cast<int>(out.shape(1)) != e.out_cols())
          throw nb::value_error("out must be float32 [>= rows, cols] of the output");
        int tap_cols = 0;
        if (tap_out) {
          if (tap_off < 0 || tap_out->ndim() != 2 || static_cast<int>(tap_out->shape(0)) < T)
            throw nb::value_error("tap_out must be float32 [>= T, cols] with tap_off >= 0");
          tap_cols = static_cast<int>(tap_out->shape(1));
        }
        nb::gil_scoped_release nogil;
        e.run_ex(ids.data(), positions.data(), types ? types->data() : nullptr, cu.data(), T, B, false, out.data(),
                 e.out_cols(), tap_out ? static_cast<size_t>(tap_off) : 0, tap_cols, tap_out ? tap_out->data() : nullptr,
                 tasks ? tasks->data() : nullptr);
      }, "ids"_a, "positions"_a, "types"_a.none(), "cu_seqlens"_a, "out"_a, "tap_off"_a = -1,
         "tap_out"_a.none() = nb::none(), "tasks"_a.none() = nb::none(),
         "run with token types (None: type 0); tap_out [T, cols] gets the buffer at tap_off (heads, token embeddings)")
      .def("run_steps", [](zoi::Engine& e, Arr<const int32_t> ids, Arr<const int32_t> positions,
                           Arr<const int32_t> cu, int first, int last) {
        const int T = ids.shape(0), B = static_cast<int>(cu.shape(0)) - 1;
        if (positions.shape(0) != ids.shape(0)) throw nb::value_error("positions and ids differ in length");
        nb::gil_scoped_release nogil;
        e.run_steps(ids.data(), positions.data(), cu.data(), T, B, first, last);
      }, "ids"_a, "positions"_a, "cu_seqlens"_a, "first"_a, "last"_a,
         "Runs steps [first, last) of the plan (GIL released); the arena keeps what the batch's earlier steps "
         "wrote, so a buffer can be read with arena() between two calls while it is live (calibration)")
      .def("arena", [](nb::handle self) {
        const zoi::Engine& e = nb::cast<const zoi::Engine&>(self);
        const size_t n = e.arena_bytes();
        return nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>>(e.arena_data(), {n}, self);
      }, "A read-only uint8 view of the arena (the planner's offsets); it keeps the engine alive")
      .def("run_repeat", [](zoi::Engine& e, Arr<const int32_t> ids, Arr<const int32_t> positions,
                            Arr<const int32_t> cu, bool normalize, Arr<float> out, int n) {
        const int T = ids.shape(0), B = static_cast<int>(cu.shape(0)) - 1;
        if (out.ndim() != 2 || static_cast<int>(out.shape(0)) < B || static_cast<int>(out.shape(1)) != e.out_cols())
          throw nb::value_error("out must be float32 [>= B, H]");
        nb::gil_scoped_release nogil;
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n; ++i) e.run(ids.data(), positions.data(), cu.data(), T, B, normalize, out.data(), e.out_cols());
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }, "ids"_a, "positions"_a, "cu_seqlens"_a, "normalize"_a, "out"_a, "n"_a,
         "n runs back to back inside C++ (benchmarks, allocation tests); returns seconds")
      .def("profile", [](zoi::Engine& e, Arr<const int32_t> ids, Arr<const int32_t> positions, Arr<const int32_t> cu) {
        const int T = ids.shape(0), B = static_cast<int>(cu.shape(0)) - 1;
        if (positions.shape(0) != ids.shape(0)) throw nb::value_error("positions and ids differ in length");
        std::vector<double> wall(e.num_steps()), cpu(e.num_steps());
        {
          nb::gil_scoped_release nogil;
          e.profile(ids.data(), positions.data(), cu.data(), T, B, wall.data(), cpu.data());
        }
        nb::list l;
        for (int i = 0; i < e.num_steps(); ++i) l.append(nb::make_tuple(std::string(e.step_kind(i)), wall[i], cpu[i]));
        return l;
      }, "ids"_a, "positions"_a, "cu_seqlens"_a,
         "kernel lab: one run (the batch checked as run's); [(step kind, thread-0 wall s, thread-0 CPU s)] per step")
      .def("steps_info", [](const zoi::Engine& e) {
        nb::list l;
        for (int i = 0; i < e.num_steps(); ++i) {
          const auto r = e.step_info(i);
          nb::dict d;
          d["kind"] = std::string(r.kind);
          d["writes_copy"] = r.writes_copy;
          d["fused"] = r.fused;
          d["min_m"] = r.min_m;
          d["slot"] = r.slot;
          d["y_scratch"] = r.y_scratch;
          l.append(d);
        }
        return l;
      }, "per step: {kind, writes_copy, fused, min_m, slot, y_scratch}: what it does with int8 copies (the plan realised)")
      .def_prop_ro("weights_bytes", &zoi::Engine::weights_bytes)
      .def_prop_ro("arena_bytes", &zoi::Engine::arena_bytes)
      .def_prop_ro("scratch_bytes", &zoi::Engine::scratch_bytes)
      .def_prop_ro("nthreads", &zoi::Engine::nthreads)
      .def_prop_ro("num_steps", &zoi::Engine::num_steps)
      .def_prop_ro("isa", [](const zoi::Engine& e) { return std::string(zoi::isa_name(e.isa())); });

  bind_generation(engine, m);
  bind_tokenizer(m);
}
