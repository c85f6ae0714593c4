// nanobind: zoi._cpu.DecoderModel and the decoder kernels one by one (tests; outputs are
// arguments so that tests poison them first; parts run one after the other on the caller).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "model.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {
template <class T>
using Arr = nb::ndarray<T, nb::c_contig, nb::device::cpu>;

const zoi::DecKernels& dk_for(const std::string& isa) {
  zoi::Isa i = zoi::active_isa();
  if (!isa.empty() && !zoi::parse_isa(isa, &i)) throw nb::value_error("unknown ISA; expected amx|vnni|avx512|avxvnni|avx2|scalar");
  try {
    return zoi::dec_kernels(i);
  } catch (const std::invalid_argument& e) {
    throw nb::value_error(e.what());
  }
}

template <class T>
size_t nbytes(const Arr<T>& a) { return a.size() * sizeof(std::remove_const_t<T>); }
}  // namespace

void bind_decoder(nb::module_& m) {
  nb::class_<zoi::DecoderModel>(m, "DecoderModel")
      .def("__init__", [](zoi::DecoderModel* self, int vocab, int hidden, int inter, int layers, int heads,
                          int kv_heads, int head_dim, float eps, bool qk_norm, int wtype, int max_tokens,
                          int max_batch, int num_blocks, int block_size, int max_blocks, int max_pos, int nthreads,
                          const std::string& isa) {
             zoi::DecConfig c;
             c.vocab = vocab; c.hidden = hidden; c.inter = inter; c.layers = layers; c.heads = heads;
             c.kv_heads = kv_heads; c.head_dim = head_dim; c.eps = eps; c.qk_norm = qk_norm; c.wtype = wtype;
             c.max_tokens = max_tokens; c.max_batch = max_batch; c.num_blocks = num_blocks; c.block_size = block_size;
             c.max_blocks = max_blocks; c.max_pos = max_pos; c.nthreads = nthreads;
             try {
               new (self) zoi::DecoderModel(c, isa);
             } catch (const std::invalid_argument& e) {
               throw nb::value_error(e.what());
             }
           }, "vocab"_a, "hidden"_a, "inter"_a, "layers"_a, "heads"_a, "kv_heads"_a, "head_dim"_a, "eps"_a,
           "qk_norm"_a, "wtype"_a, "max_tokens"_a, "max_batch"_a, "num_blocks"_a, "block_size"_a, "max_blocks"_a,
           "max_pos"_a, "nthreads"_a = 0, "isa"_a = "")
      .def("set", [](zoi::DecoderModel& d, int layer, const std::string& slot, Arr<const uint8_t> data) {
             try {
               d.set(layer, slot, data.data(), data.size());
             } catch (const std::invalid_argument& e) {
               throw nb::value_error(e.what());
             }
           }, "layer"_a, "slot"_a, "data"_a, "copy a weight (raw bytes) into its slot; layer -1: global")
      .def("slot_bytes", &zoi::DecoderModel::slot_bytes)
      .def("finalize", [](zoi::DecoderModel& d) {
             try { d.finalize(); } catch (const std::invalid_argument& e) { throw nb::value_error(e.what()); }
           })
      .def("step", [](zoi::DecoderModel& d, Arr<const int32_t> ids, Arr<const int32_t> rows, Arr<const int32_t> starts,
                      Arr<const int32_t> counts, Arr<const int32_t> want, Arr<const double> samp,
                      Arr<const uint64_t> seeds, Arr<const int64_t> index, Arr<const int32_t> tables,
                      Arr<int32_t> out) {
             const int B = static_cast<int>(rows.size());
             if (starts.size() != rows.size() || counts.size() != rows.size() || want.size() != rows.size() ||
                 seeds.size() != rows.size() || index.size() != rows.size() || out.size() != rows.size() ||
                 samp.size() != 3 * rows.size())
               throw nb::value_error("rows, starts, counts, want, seeds, index, out: one value per entry; samp [B, 3]");
             const auto& c = d.config();
             if (tables.size() != static_cast<size_t>(c.max_batch) * c.max_blocks)
               throw nb::value_error("block tables must be [max_batch, max_blocks] int32");
             try {
               nb::gil_scoped_release nogil;
               d.step(ids.data(), static_cast<int>(ids.size()), rows.data(), starts.data(), counts.data(), want.data(),
                      B, samp.data(), seeds.data(), index.data(), tables.data(), out.data());
             } catch (const std::invalid_argument& e) {
               throw nb::value_error(e.what());
             }
           }, "ids"_a, "rows"_a, "starts"_a, "counts"_a, "want"_a, "samp"_a, "seeds"_a, "index"_a, "tables"_a, "out"_a,
           "one forward + sampling of a packed batch, GIL released")
      .def("logits", [](const zoi::DecoderModel& d) {
             const int n = d.last_rows(), V = d.config().vocab;
             float* buf = new float[static_cast<size_t>(n) * V];
             std::memcpy(buf, d.logits(), sizeof(float) * n * V);
             nb::capsule owner(buf, [](void* p) noexcept { delete[] static_cast<float*>(p); });
             return nb::ndarray<nb::numpy, float, nb::ndim<2>>(buf, {static_cast<size_t>(n), static_cast<size_t>(V)}, owner);
           }, "a copy of the last step's logits of the sampled entries [n, vocab]")
      .def_prop_ro("isa", [](const zoi::DecoderModel& d) { return std::string(zoi::isa_name(d.isa())); })
      .def_prop_ro("nthreads", &zoi::DecoderModel::nthreads)
      .def_prop_ro("weights_bytes", &zoi::DecoderModel::weights_bytes)
      .def_prop_ro("kv_bytes", &zoi::DecoderModel::kv_bytes);

  m.def("k_dec_linear", [](Arr<const float> x, Arr<const uint8_t> w, std::optional<Arr<const float>> scale,
                           std::optional<Arr<const float>> bias, std::optional<Arr<const float>> res, int N, bool int8,
                           Arr<float> y, const std::string& isa, int parts) {
          const auto& k = dk_for(isa);
          if (x.ndim() != 2 || y.ndim() != 2 || y.shape(0) != x.shape(0) || static_cast<int>(y.shape(1)) != N)
            throw nb::value_error("x [M, K], y [M, N]");
          const int M = static_cast<int>(x.shape(0)), K = static_cast<int>(x.shape(1));
          const size_t np = (static_cast<size_t>(N) + zoi::kDecPanel - 1) / zoi::kDecPanel * zoi::kDecPanel;
          if (w.size() != np * K * (int8 ? 1 : 4)) throw nb::value_error("w: packed [Npad/32, K, 32] of the weight type");
          if (int8 && (!scale || scale->size() != np)) throw nb::value_error("int8 needs scale [Npad]");
          if (bias && static_cast<int>(bias->size()) != N) throw nb::value_error("bias [N]");
          if (res && (res->size() != static_cast<size_t>(M) * N)) throw nb::value_error("res [M, N]");
          zoi::DecLinear a;
          a.x = x.data(); a.ldx = K; a.w = w.data(); a.wtype = int8 ? 1 : 0;
          a.scale = int8 ? scale->data() : nullptr; a.bias = bias ? bias->data() : nullptr;
          a.M = M; a.N = N; a.K = K; a.y = y.data(); a.ldy = N;
          a.res = res ? res->data() : nullptr; a.ldr = N;
          const int P = parts > 0 ? parts : k.linear_parts(M, N);
          for (int p = 0; p < P; ++p) k.linear(a, p, P);
        }, "x"_a, "w"_a, "scale"_a.none(), "bias"_a.none(), "res"_a.none(), "N"_a, "int8"_a, "y"_a, "isa"_a = "",
        "parts"_a = 0);

  m.def("k_dec_rmsnorm", [](Arr<const float> x, Arr<const float> w, float eps, Arr<float> y, const std::string& isa) {
          const auto& k = dk_for(isa);
          if (x.ndim() != 2 || y.size() != x.size() || w.size() != x.shape(1)) throw nb::value_error("x, y [M, H]; w [H]");
          zoi::DecNorm a;
          a.x = x.data(); a.ldx = static_cast<int>(x.shape(1)); a.w = w.data(); a.eps = eps;
          a.M = static_cast<int>(x.shape(0)); a.H = a.ldx; a.y = y.data(); a.ldy = a.ldx;
          for (int p = 0; p < 3; ++p) k.rmsnorm(a, p, 3);
        }, "x"_a, "w"_a, "eps"_a, "y"_a, "isa"_a = "");

  m.def("k_dec_silu_mul", [](Arr<const float> gu, Arr<float> y, const std::string& isa) {
          const auto& k = dk_for(isa);
          if (gu.ndim() != 2 || y.ndim() != 2 || gu.shape(1) != 2 * y.shape(1) || gu.shape(0) != y.shape(0))
            throw nb::value_error("gu [M, 2I], y [M, I]");
          const int M = static_cast<int>(y.shape(0)), I = static_cast<int>(y.shape(1));
          for (int p = 0; p < 5; ++p) k.silu_mul(gu.data(), 2 * I, M, I, y.data(), I, p, 5);
        }, "gu"_a, "y"_a, "isa"_a = "");

  // paged attention of T tokens (q [T, nh * D]) over caches [num_blocks, nkv, bs, D]
  m.def("k_dec_attention", [](Arr<const float> q, Arr<const float> kc, Arr<const float> vc, Arr<const int32_t> pos,
                              Arr<const int32_t> row, Arr<const int32_t> tables, int nh, int splits, int chunk,
                              Arr<float> out, const std::string& isa) {
          const auto& k = dk_for(isa);
          if (kc.ndim() != 4 || vc.size() != kc.size() || tables.ndim() != 2) throw nb::value_error("kc, vc [NB, nkv, bs, D]; tables 2-D");
          const int T = static_cast<int>(pos.size()), nkv = static_cast<int>(kc.shape(1));
          const int bs = static_cast<int>(kc.shape(2)), D = static_cast<int>(kc.shape(3));
          if (row.size() != pos.size() || q.size() != static_cast<size_t>(T) * nh * D || out.size() != q.size() ||
              nh % nkv || D > zoi::kDecMaxD || bs > zoi::kDecMaxBlock || splits < 1)
            throw nb::value_error("q, out [T, nh * D]; pos, row [T]; nh % nkv == 0");
          zoi::DecAttn a;
          a.q = q.data(); a.ldq = nh * D; a.T = T; a.nh = nh; a.nkv = nkv; a.D = D;
          a.pos = pos.data(); a.row = row.data(); a.tables = tables.data(); a.ldt = static_cast<int>(tables.shape(1));
          a.kc = kc.data(); a.vc = vc.data(); a.bs = bs; a.scale = 1.f / std::sqrt(static_cast<float>(D));
          a.splits = splits; a.chunk = splits > 1 ? chunk : (1 << 30); a.out = out.data(); a.ldo = nh * D;
          std::vector<float> part(splits > 1 ? static_cast<size_t>(T) * nh * splits * (D + 2) : 1);
          a.part = part.data();
          const int P = T * nkv * splits;
          for (int p = 0; p < P; ++p) k.attention(a, p, P);
          for (int p = 0; p < T * nkv; ++p) k.attn_merge(a, p, T * nkv);
        }, "q"_a, "kc"_a, "vc"_a, "pos"_a, "row"_a, "tables"_a, "nh"_a, "splits"_a, "chunk"_a, "out"_a, "isa"_a = "");
}
