// nanobind: the engine's generation methods (engine.h "generation") and the paged attention
// kernels one by one (tests: outputs are arguments, so that tests poison them first; parts run one
// after the other on the caller).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "../bind.h"
#include "engine.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {
using zoi_bind::Arr;
using zoi_bind::Opt;
using zoi_bind::table_for;

void need_len(size_t n, size_t want, const char* what) {
  if (n != want) throw nb::value_error((std::string(what) + " has the wrong length").c_str());
}
}  // namespace

void bind_generation(nb::class_<zoi::Engine>& cls, nb::module_& m) {
  cls.def("set_kv_pool", &zoi::Engine::set_kv_pool, "num_blocks"_a, "block_size"_a, "max_blocks"_a, "table_rows"_a,
          "max_pos"_a,
          "the KV pool of generation (reserved at finalize): blocks of block_size tokens per layer; block "
          "tables [table_rows, max_blocks]; positions below max_pos")
      .def("add_attention_paged", [](zoi::Engine& e, size_t in_off, size_t out_off, int heads, int head_dim,
                                     float scale, int kv_heads, Arr<const float> cos, Arr<const float> sin,
                                     Opt<const float> q_norm, Opt<const float> k_norm, float qk_eps) {
        if (cos.ndim() != 2 || sin.ndim() != 2 || cos.shape(1) != static_cast<size_t>(head_dim / 2) ||
            sin.shape(0) != cos.shape(0) || sin.shape(1) != cos.shape(1))
          throw nb::value_error("cos / sin must be [max_pos, head_dim / 2]");
        if (q_norm) need_len(q_norm->size(), head_dim, "q_norm");
        if (k_norm) need_len(k_norm->size(), head_dim, "k_norm");
        e.add_attention_paged(in_off, out_off, heads, head_dim, scale, kv_heads, cos.data(), sin.data(),
                              q_norm ? q_norm->data() : nullptr, k_norm ? k_norm->data() : nullptr, qk_eps);
      }, "in_off"_a, "out_off"_a, "heads"_a, "head_dim"_a, "scale"_a, "kv_heads"_a, "cos"_a, "sin"_a,
         "q_norm"_a.none() = nb::none(), "k_norm"_a.none() = nb::none(), "qk_eps"_a = 1e-6f,
         "a decoder layer's attention over the KV pool (cos / sin [max_pos, head_dim / 2], at least the pool's "
         "max_pos rows; shared copies)")
      .def("add_sample", &zoi::Engine::add_sample, "logits_off"_a, "vocab"_a,
           "one token per sequence from the B rows of logits [B, vocab] at logits_off")
      .def("run_gen", [](zoi::Engine& e, Arr<const int32_t> ids, Arr<const int32_t> rows, Arr<const int32_t> starts,
                         Arr<const int32_t> counts, Arr<const int32_t> want, Arr<const double> samp,
                         Arr<const uint64_t> seeds, Arr<const int64_t> index, Arr<const int32_t> tables,
                         Arr<int32_t> out) {
        const size_t B = rows.size();
        need_len(starts.size(), B, "starts");
        need_len(counts.size(), B, "counts");
        need_len(want.size(), B, "want");
        need_len(seeds.size(), B, "seeds");
        need_len(index.size(), B, "index");
        need_len(samp.size(), 3 * B, "samp (3 per entry)");
        if (out.size() < B) throw nb::value_error("out must hold one token per entry");
        if (tables.ndim() != 2) throw nb::value_error("tables must be [rows, max_blocks]");
        nb::gil_scoped_release nogil;
        e.run_gen(ids.data(), static_cast<int>(ids.size()), rows.data(), starts.data(), counts.data(), want.data(),
                  static_cast<int>(B), samp.data(), seeds.data(), index.data(), tables.data(), out.data());
      }, "ids"_a, "rows"_a, "starts"_a, "counts"_a, "want"_a, "samp"_a, "seeds"_a, "index"_a, "tables"_a, "out"_a,
         "one generation step in one native call (GIL released): out[b] = the sampled next token of entry b, -1 "
         "where want[b] is 0")
      .def("profile_gen", [](zoi::Engine& e, Arr<const int32_t> ids, Arr<const int32_t> rows, Arr<const int32_t> starts,
                             Arr<const int32_t> counts, Arr<const int32_t> tables) {
        const size_t B = rows.size();
        need_len(starts.size(), B, "starts");
        need_len(counts.size(), B, "counts");
        if (tables.ndim() != 2) throw nb::value_error("tables must be [rows, max_blocks]");
        std::vector<int32_t> want(B, 1), out(B);
        std::vector<double> samp(3 * B, 0.0), wall(e.num_steps()), cpu(e.num_steps());
        std::vector<uint64_t> seeds(B, 0);
        std::vector<int64_t> index(B, 0);
        {
          nb::gil_scoped_release nogil;
          e.run_gen(ids.data(), static_cast<int>(ids.size()), rows.data(), starts.data(), counts.data(), want.data(),
                    static_cast<int>(B), samp.data(), seeds.data(), index.data(), tables.data(), out.data(), wall.data(),
                    cpu.data());
        }
        nb::list l;
        for (int i = 0; i < e.num_steps(); ++i) l.append(nb::make_tuple(std::string(e.step_kind(i)), wall[i], cpu[i]));
        return l;
      }, "ids"_a, "rows"_a, "starts"_a, "counts"_a, "tables"_a,
         "kernel lab: one greedy generation step; [(step kind, thread-0 wall s, thread-0 CPU s)] per step (it writes "
         "the KV cache as run_gen does)")
      .def("gen_logits", [](const zoi::Engine& e) {
        const size_t B = static_cast<size_t>(e.last_batch()), V = static_cast<size_t>(e.out_cols());
        float* data = new float[B * V];
        std::memcpy(data, e.gen_logits(), B * V * sizeof(float));
        nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
        return nb::ndarray<nb::numpy, float, nb::ndim<2>>(data, {B, V}, owner);
      }, "a copy of the logits [B, vocab] of the last run_gen (tests)")
      .def_prop_ro("kv_bytes", &zoi::Engine::kv_bytes);

  // paged attention of T tokens (q [T, heads * D]) over caches [num_blocks, kv_heads, block, D]
  m.def("k_paged_attention", [](Arr<const float> q, Arr<const float> kc, Arr<const float> vc,
                                         Arr<const int32_t> pos, Arr<const int32_t> row, Arr<const int32_t> tables,
                                         int heads, int splits, int chunk, Arr<float> out, const std::string& isa) {
          const auto& k = table_for(isa);
          if (kc.ndim() != 4 || vc.size() != kc.size() || tables.ndim() != 2) throw nb::value_error("kc, vc [NB, kv_heads, block, D]; tables 2-D");
          const int T = static_cast<int>(pos.size()), nkv = static_cast<int>(kc.shape(1));
          const int bs = static_cast<int>(kc.shape(2)), D = static_cast<int>(kc.shape(3));
          if (row.size() != pos.size() || q.size() != static_cast<size_t>(T) * heads * D || out.size() != q.size() ||
              heads % nkv || D > zoi::kMaxHeadDim || bs > zoi::kPagedMaxBlock || splits < 1)
            throw nb::value_error("q, out [T, heads * D]; pos, row [T]; heads % kv_heads == 0");
          zoi::PagedAttnArgs a;
          a.q = q.data(); a.ldq = heads * D; a.T = T; a.heads = heads; a.kv_heads = nkv; a.d = D;
          a.pos = pos.data(); a.row = row.data(); a.tables = tables.data(); a.ldt = static_cast<int>(tables.shape(1));
          a.kc = kc.data(); a.vc = vc.data(); a.block = bs; a.scale = 1.f / std::sqrt(static_cast<float>(D));
          a.splits = splits; a.chunk = splits > 1 ? chunk : (1 << 30); a.out = out.data(); a.ldo = heads * D;
          std::vector<float> part(splits > 1 ? static_cast<size_t>(T) * heads * splits * (D + 2) : 1);
          a.part = part.data();
          const int P = T * nkv * splits;
          for (int p = 0; p < P; ++p) k.paged_attention(a, p, P);
          for (int p = 0; p < T * nkv; ++p) k.paged_merge(a, p, T * nkv);
        }, "q"_a, "kc"_a, "vc"_a, "pos"_a, "row"_a, "tables"_a, "heads"_a, "splits"_a, "chunk"_a, "out"_a, "isa"_a = "");
}
