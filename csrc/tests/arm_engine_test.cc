// The whole native forward of a compiled model on this machine, without Python: replays a plan
// exported on x86-64 by scripts/arm_engine_export.py (the CPU backend's calls that build
// zoi::Engine, with their arrays) into the unchanged csrc/runtime/engine.cc, runs the exported
// batches on each ISA asked for and compares the outputs with the x86-64 engine's (stored in the
// file). scripts/arm_check.sh cross-compiles it for aarch64 and runs it under qemu-aarch64
// (docs/ARM.md, "End to end").
//
// What must hold (docs/ARM.md, Numerics):
//   scalar                  bit for bit the x86-64 scalar engine's output (the portable path
//                           computes the same numbers on both architectures)
//   neon / dotprod / i8mm   bit for bit each other (the same float code over V4; the INT8 GEMMs
//                           differ only in how they form the same integer sums), and within
//                           --tol (max |difference|, default 5e-3) with every row's cosine
//                           >= 1 - --tol / 10 of every x86-64 ISA's output: FP32 attention, GELU
//                           and their 4-lane reductions round differently from x86's 8 / 16
//                           lanes, and an activation row whose amax moves by an ulp quantises
//                           differently (x86's own ISAs differ as much from one another)
// Every output is poisoned (NaN) before each run; a NaN or infinity fails.
//
// Usage: arm_engine_test PLAN [--isas all|active|NAME,...] [--threads N] [--tol X]
//          [--expect-active ISA] [--expect-refused ISA,...]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "isa.h"
#include "kernels/kernels.h"
#include "runtime/engine.h"
#include "runtime/pool.h"

namespace {

int g_fail = 0, g_checks = 0;
void fail(const std::string& msg) {
  if (++g_fail <= 40) std::fprintf(stderr, "FAIL %s\n", msg.c_str());
}
void check(bool ok, const std::string& msg) {
  ++g_checks;
  if (!ok) fail(msg);
}

// ---------------------------------------------------------------- the plan file
struct Value {
  enum Tag { NONE = 0, INT = 1, FLOAT = 2, BOOL = 3, STR = 4, ARRAY = 5 } tag = NONE;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  int dtype = 0;  // 0 f32, 1 i8, 2 i32
  std::vector<int64_t> shape;
  zoi::AlignedBuf data;  // 64-byte aligned: the engine references some tables without copying
  template <class T>
  const T* ptr() const { return static_cast<const T*>(data.get()); }
};

struct Reader {
  std::vector<char> buf;
  size_t at = 0;
  explicit Reader(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open " + path + " (write it with scripts/arm_engine_export.py)");
    buf.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  void need(size_t n) {
    if (at + n > buf.size()) throw std::runtime_error("plan file truncated at byte " + std::to_string(at));
  }
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, buf.data() + at, sizeof(T));  // both architectures are little-endian
    at += sizeof(T);
    return v;
  }
  std::string str() {
    const uint32_t n = get<uint32_t>();
    need(n);
    std::string s(buf.data() + at, n);
    at += n;
    return s;
  }
  template <class T>
  std::vector<T> vec(size_t n) {
    need(n * sizeof(T));
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), buf.data() + at, n * sizeof(T));
    at += n * sizeof(T);
    return v;
  }
  Value value() {
    Value v;
    v.tag = static_cast<Value::Tag>(get<uint8_t>());
    switch (v.tag) {
      case Value::NONE: break;
      case Value::INT: v.i = get<int64_t>(); break;
      case Value::FLOAT: v.f = get<double>(); break;
      case Value::BOOL: v.b = get<uint8_t>() != 0; break;
      case Value::STR: v.s = str(); break;
      case Value::ARRAY: {
        v.dtype = get<uint8_t>();
        const int nd = get<uint8_t>();
        size_t n = 1;
        for (int d = 0; d < nd; ++d) {
          v.shape.push_back(get<int64_t>());
          n *= static_cast<size_t>(v.shape.back());
        }
        const size_t bytes = n * (v.dtype == 1 ? 1 : 4);
        need(bytes);
        v.data = zoi::aligned_bytes(bytes + 64);
        std::memcpy(v.data.get(), buf.data() + at, bytes);
        at += bytes;
        break;
      }
      default: throw std::runtime_error("plan file: unknown value tag " + std::to_string(v.tag));
    }
    return v;
  }
};

struct Call {
  std::string name;
  std::vector<Value> args;
};
struct Batch {
  int T = 0, B = 0;
  bool normalize = false;
  std::vector<int32_t> ids, pos, cu;
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> want;  // x86-64 ISA -> [rows, cols]
};

// ---------------------------------------------------------------- replay (csrc/module.cc's bindings)
int parse_act(const std::string& a) {
  static const std::map<std::string, int> m = {{"none", zoi::ACT_NONE},       {"gelu", zoi::ACT_GELU},
                                                {"gelu_tanh", zoi::ACT_GELU_TANH}, {"relu", zoi::ACT_RELU},
                                                {"sigmoid", zoi::ACT_SIGMOID}, {"tanh", zoi::ACT_TANH},
                                                {"silu", zoi::ACT_SILU}};
  auto it = m.find(a);
  if (it == m.end()) throw std::runtime_error("plan: unknown activation " + a);
  return it->second;
}
int parse_pool(const std::string& m) {
  const char* names[] = {"mean", "cls", "max", "splade", "last"};
  for (int i = 0; i < 5; ++i)
    if (m == names[i]) return i;
  throw std::runtime_error("plan: unknown pool mode " + m);
}

struct Args {
  const Call& c;
  const Value& at(size_t i, Value::Tag tag, bool none_ok = false) const {
    if (i >= c.args.size()) throw std::runtime_error("plan: " + c.name + " has too few arguments");
    const Value& v = c.args[i];
    if (v.tag == tag || (none_ok && v.tag == Value::NONE)) return v;
    throw std::runtime_error("plan: " + c.name + " argument " + std::to_string(i) + " has the wrong type");
  }
  int64_t i(size_t k) const { return at(k, Value::INT).i; }
  double f(size_t k) const {
    const Value& v = c.args.at(k);
    return v.tag == Value::INT ? static_cast<double>(v.i) : at(k, Value::FLOAT).f;
  }
  bool b(size_t k) const { return at(k, Value::BOOL).b; }
  const std::string& s(size_t k) const { return at(k, Value::STR).s; }
  template <class T>
  const T* arr(size_t k, int dtype) const {  // nullptr for None
    const Value& v = at(k, Value::ARRAY, true);
    if (v.tag == Value::NONE) return nullptr;
    if (v.dtype != dtype) throw std::runtime_error("plan: " + c.name + " argument " + std::to_string(k) + " dtype");
    return v.ptr<T>();
  }
  int64_t dim(size_t k, int d) const { return at(k, Value::ARRAY).shape.at(d); }
  bool none(size_t k) const { return c.args.at(k).tag == Value::NONE; }
};

// the arguments this replay reads per call (the bindings' order): a plan with more, from a binding
// that grew a parameter, is refused rather than run without it
const std::map<std::string, size_t> kArity = {
    {"set_batch_rows", 1}, {"add_embed", 10},     {"add_linear_f32", 6},          {"add_linear_i8", 15},
    {"set_first_row_residual", 0}, {"add_attention", 6}, {"add_attention_ext", 14}, {"set_attention_precision", 1},
    {"add_glu", 4},        {"add_layernorm", 8},  {"add_pool", 4},                {"set_embed_types", 1},
    {"set_output", 3},     {"finalize", 0}};

void replay(zoi::Engine& e, const std::vector<Call>& calls) {
  for (size_t n = 1; n < calls.size(); ++n) {  // calls[0]: the constructor
    const Call& c = calls[n];
    const Args a{c};
    auto ar = kArity.find(c.name);
    if (ar != kArity.end() && c.args.size() > ar->second)
      throw std::runtime_error("plan: " + c.name + " has " + std::to_string(c.args.size()) + " arguments, this driver reads " +
                               std::to_string(ar->second) + ": teach csrc/tests/arm_engine_test.cc the new ones");
    if (c.name == "set_batch_rows") {
      e.set_batch_rows(a.b(0));
    } else if (c.name == "add_embed") {
      const bool have_word = !a.none(1);
      const int V = static_cast<int>(a.dim(have_word ? 1 : 2, 0)), H = static_cast<int>(a.dim(have_word ? 1 : 2, 1));
      int max_pos = static_cast<int>(a.i(9));
      if (!a.none(4)) max_pos = static_cast<int>(a.dim(4, 0));
      e.add_embed(a.i(0), H, V, max_pos, a.arr<float>(1, 0), have_word ? nullptr : a.arr<int8_t>(2, 1),
                  have_word ? nullptr : a.arr<float>(3, 0), a.arr<float>(4, 0), a.arr<float>(5, 0), a.arr<float>(6, 0),
                  a.arr<float>(7, 0), static_cast<float>(a.f(8)));
    } else if (c.name == "add_linear_f32") {
      e.add_linear_f32(a.i(0), static_cast<int>(a.dim(2, 1)), a.i(1), static_cast<int>(a.dim(2, 0)), a.arr<float>(2, 0),
                       a.arr<float>(3, 0), parse_act(a.s(4)), static_cast<long>(a.i(5)));
    } else if (c.name == "add_linear_i8") {
      e.add_linear_i8(a.i(0), static_cast<int>(a.dim(2, 1)), a.i(1), static_cast<int>(a.dim(2, 0)),
                      a.arr<int8_t>(2, 1), a.arr<float>(3, 0), a.arr<float>(4, 0), parse_act(a.s(5)),
                      static_cast<long>(a.i(6)), static_cast<float>(a.f(7)), a.b(8), a.arr<float>(9, 0),
                      a.arr<float>(10, 0), static_cast<int>(a.i(11)), static_cast<int>(a.i(12)), a.b(13),
                      c.args.size() > 14 ? static_cast<int>(a.i(14)) : 8);
    } else if (c.name == "set_first_row_residual") {
      e.set_first_row_residual();
    } else if (c.name == "add_attention") {
      e.add_attention(a.i(0), a.i(1), static_cast<int>(a.i(2)), static_cast<int>(a.i(3)),
                      static_cast<float>(a.f(4)), static_cast<int>(a.i(5)));
    } else if (c.name == "add_attention_ext") {
      const int heads = static_cast<int>(a.i(2)), d = static_cast<int>(a.i(3));
      const int span = a.none(5) ? 0 : static_cast<int>((a.dim(5, 1) + 1) / 2);
      const int rows = a.none(7) ? 0 : static_cast<int>(a.dim(7, 0));
      e.add_attention_ext(a.i(0), a.i(1), heads, d, static_cast<float>(a.f(4)), a.arr<float>(5, 0), span,
                          static_cast<int>(a.i(6)), a.arr<float>(7, 0), a.arr<float>(8, 0), rows,
                          static_cast<int>(a.i(9)), a.b(10), a.arr<float>(11, 0), a.arr<float>(12, 0),
                          static_cast<float>(a.f(13)));
    } else if (c.name == "set_attention_precision") {
      e.set_attention_precision(static_cast<int>(a.i(0)));
    } else if (c.name == "add_glu") {
      e.add_glu(a.i(0), a.i(1), static_cast<int>(a.i(2)), parse_act(a.s(3)));
    } else if (c.name == "add_layernorm") {
      e.add_layernorm(a.i(0), static_cast<long>(a.i(1)), a.i(2), static_cast<int>(a.dim(3, 0)), a.arr<float>(3, 0),
                      a.arr<float>(4, 0), static_cast<float>(a.f(5)), a.b(6), a.b(7));
    } else if (c.name == "add_pool") {
      e.add_pool(a.i(0), a.i(1), static_cast<int>(a.i(2)), parse_pool(a.s(3)));
    } else if (c.name == "set_embed_types") {
      e.set_embed_types(a.arr<float>(0, 0), static_cast<int>(a.dim(0, 0)));
    } else if (c.name == "set_output") {
      e.set_output(a.i(0), static_cast<int>(a.i(1)), a.b(2));
    } else if (c.name == "finalize") {
      e.finalize();
    } else {
      throw std::runtime_error("plan: unknown call " + c.name);
    }
  }
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

// max |a - b| (infinity where either is not finite) and the smallest row cosine
void compare(const std::vector<float>& got, const std::vector<float>& want, int rows, int cols, double* maxdiff,
             double* mincos) {
  *maxdiff = 0;
  *mincos = 1;
  for (int r = 0; r < rows; ++r) {
    double dot = 0, ng = 0, nw = 0;
    for (int c = 0; c < cols; ++c) {
      const double g = got[static_cast<size_t>(r) * cols + c], w = want[static_cast<size_t>(r) * cols + c];
      const double d = std::isfinite(g) && std::isfinite(w) ? std::fabs(g - w) : INFINITY;
      if (!(d <= *maxdiff)) *maxdiff = d;
      dot += g * w;
      ng += g * g;
      nw += w * w;
    }
    const double cs = ng > 0 && nw > 0 ? dot / std::sqrt(ng * nw) : 0;
    if (!(cs >= *mincos)) *mincos = cs;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string plan, isas_arg = "all", exp_active, exp_refused;
  int threads = 0;
  double tol = 5e-3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--isas") isas_arg = val();
    else if (a == "--threads") threads = std::stoi(val());
    else if (a == "--tol") tol = std::stod(val());
    else if (a == "--expect-active") exp_active = val();
    else if (a == "--expect-refused") exp_refused = val();
    else if (!a.empty() && a[0] != '-' && plan.empty()) plan = a;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (plan.empty()) {
    std::fprintf(stderr, "usage: arm_engine_test PLAN [--isas all|active|NAME,...] [--threads N] [--tol X] "
                         "[--expect-active ISA] [--expect-refused ISA,...]\n");
    return 2;
  }
  try {
    Reader rd(plan);
    rd.need(8);
    if (std::memcmp(rd.buf.data(), "ZOIPLAN1", 8) != 0) throw std::runtime_error(plan + " is not a zoi plan file");
    rd.at = 8;
    std::vector<Call> calls(rd.get<uint32_t>());
    for (Call& c : calls) {
      c.name = rd.str();
      const int n = rd.get<uint8_t>();
      for (int k = 0; k < n; ++k) c.args.push_back(rd.value());
    }
    if (calls.empty() || calls[0].name != "init") throw std::runtime_error("plan: the first call must be init");
    if (calls[0].args.size() != 5) throw std::runtime_error("plan: Engine() takes 5 arguments here, the plan has " +
                                                            std::to_string(calls[0].args.size()));
    std::vector<Batch> batches(rd.get<uint32_t>());
    for (Batch& b : batches) {
      b.T = rd.get<int32_t>();
      b.B = rd.get<int32_t>();
      b.normalize = rd.get<uint8_t>() != 0;
      b.ids = rd.vec<int32_t>(b.T);
      b.pos = rd.vec<int32_t>(b.T);
      b.cu = rd.vec<int32_t>(b.B + 1);
      const uint32_t n = rd.get<uint32_t>();
      for (uint32_t k = 0; k < n; ++k) {
        const std::string isa = rd.str();
        const int rows = rd.get<int32_t>(), cols = rd.get<int32_t>();
        b.want[isa] = {{rows, cols}, rd.vec<float>(static_cast<size_t>(rows) * cols)};
      }
    }
    if (rd.at != rd.buf.size()) throw std::runtime_error("plan: trailing bytes");
    if (batches.empty() || !batches[0].want.count("scalar"))
      throw std::runtime_error("plan: no batches, or no x86-64 scalar outputs");

    const std::string active = zoi::isa_name(zoi::active_isa());
    std::printf("engine plan %s: %zu calls, %zu batches; this CPU: best %s, active %s\n", plan.c_str(), calls.size(),
                batches.size(), zoi::isa_name(zoi::best_isa()), active.c_str());
    if (!exp_active.empty()) check(active == exp_active, "active ISA " + active + ", expected " + exp_active);

    const Args init{calls[0]};
    auto make = [&](const std::string& isa) {
      return std::make_unique<zoi::Engine>(init.i(0), static_cast<int>(init.i(1)), static_cast<int>(init.i(2)), isa,
                                           threads);
    };
    // an ISA this CPU lacks, and a name no build knows, are refused with a message naming them
    for (const std::string& isa : split(exp_refused)) {
      std::string msg;
      try {
        make(isa);
      } catch (const std::invalid_argument& e) {
        msg = e.what();
      }
      check(msg.find(isa) != std::string::npos, "Engine(" + isa + ") not refused naming it: '" + msg + "'");
    }
    {
      std::string msg;
      try {
        make("nosuchisa");
      } catch (const std::invalid_argument& e) {
        msg = e.what();
      }
#if defined(ZOI_ARCH_ARM64)
      const char* names = "i8mm|dotprod|neon|scalar";
#else
      const char* names = "scalar";
#endif
      check(msg.find(names) != std::string::npos, std::string("unknown ISA message '") + msg + "' lacks " + names);
    }

    std::vector<std::string> isas;
    if (isas_arg == "active") isas = {""};
    else if (isas_arg == "all") {
      for (const char* n : {"scalar", "neon", "dotprod", "i8mm", "avx2", "avxvnni", "avx512", "vnni", "amx"}) {
        zoi::Isa i;
        if (zoi::parse_isa(n, &i) && zoi::isa_supported(i)) isas.push_back(n);
      }
    } else isas = split(isas_arg);

    std::map<size_t, std::vector<float>> vec_ref;  // batch -> the first vector ISA's output (bit for bit)
    std::string vec_ref_isa;
    for (const std::string& want_isa : isas) {
      auto e = make(want_isa);
      replay(*e, calls);
      const std::string isa = zoi::isa_name(e->isa());
      for (size_t bi = 0; bi < batches.size(); ++bi) {
        const Batch& b = batches[bi];
        const int rows = e->out_rows_t() ? b.T : b.B, cols = e->out_cols();
        std::vector<float> out(static_cast<size_t>(rows) * cols, std::numeric_limits<float>::quiet_NaN());
        e->run(b.ids.data(), b.pos.data(), b.cu.data(), b.T, b.B, b.normalize, out.data(), cols);
        bool finite = true;
        for (float v : out) finite = finite && std::isfinite(v);
        check(finite, isa + " batch " + std::to_string(bi) + ": a NaN or infinity in the output");
        std::string line = isa + " batch " + std::to_string(bi) + " (T " + std::to_string(b.T) + ", B " +
                           std::to_string(b.B) + "):";
        for (const auto& [xisa, w] : b.want) {
          if (w.first[0] != rows || w.first[1] != cols) {
            fail(isa + ": output shape differs from the x86-64 " + xisa + " engine's");
            continue;
          }
          double md, mc;
          compare(out, w.second, rows, cols, &md, &mc);
          const bool same = std::memcmp(out.data(), w.second.data(), out.size() * 4) == 0;
          char buf[160];
          std::snprintf(buf, sizeof buf, " x86 %s %s (max %.3g, cos %.9f);", xisa.c_str(),
                        same ? "bit-identical" : "differs", md, mc);
          line += buf;
          if (isa == "scalar") {
            if (xisa == "scalar") check(same, "scalar batch " + std::to_string(bi) + " differs from the x86-64 scalar engine (max " + std::to_string(md) + ")");
          } else {
            check(md <= tol && mc >= 1 - tol / 10, isa + " batch " + std::to_string(bi) + " vs x86-64 " + xisa + ": max " +
                                                  std::to_string(md) + ", cos " + std::to_string(mc) + " beyond " +
                                                  std::to_string(tol));
          }
        }
        if (isa != "scalar") {
          auto it = vec_ref.find(bi);
          if (it == vec_ref.end()) {
            vec_ref[bi] = out;
            vec_ref_isa = isa;
          } else {
            const bool same = std::memcmp(out.data(), it->second.data(), out.size() * 4) == 0;
            check(same, isa + " batch " + std::to_string(bi) + " differs from " + vec_ref_isa + " (the same sums)");
            line += same ? " = " + vec_ref_isa + " bit for bit" : " != " + vec_ref_isa;
          }
        }
        std::printf("%s\n", line.c_str());
      }
    }
  } catch (const std::exception& e) {
    fail(std::string("exception: ") + e.what());
  }
  std::printf("%s: %d checks, %d failed\n", g_fail ? "FAIL" : "PASS", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
