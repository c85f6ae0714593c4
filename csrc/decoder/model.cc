// The native decoder's step (model.h).
#include "model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "../kernels/kernels.h"
#include "../runtime/pool.h"

namespace zoi {

namespace {
const char* const kSlots[] = {"embed", "norm", "cos", "sin", "lm_w", "lm_s",  // global (layer -1)
                              "ln1", "ln2", "qkv_w", "qkv_s", "qkv_b", "qn", "kn", "o_w", "o_s", "o_b",
                              "gu_w", "gu_s", "d_w", "d_s"};
constexpr int kNumSlots = 20, kFirstLayerSlot = 6;
constexpr int kStepSpin = 4000;
constexpr int kMaxSplitT = 16, kMaxSplits = 16;
inline size_t rup(size_t n, size_t m) { return (n + m - 1) / m * m; }
inline int cap(long n, int c) { return static_cast<int>(n < 1 ? 1 : n > c ? c : n); }

uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

const DecKernels& dec_kernels(Isa isa) {
  if (!isa_supported(isa)) throw std::invalid_argument(std::string("ISA ") + isa_name(isa) + " is not supported by this CPU");
  switch (isa) {
#if defined(ZOI_ARCH_X86)
    case Isa::Vnni: return vnni::dec_table();
    case Isa::Amx: return vnni::dec_table();  // w8a8 GEMMs use kernel_table's amx
    case Isa::Avx512: return avx512::dec_table();
    case Isa::Avx2: return avx2::dec_table();
    case Isa::AvxVnni: return avx2::dec_table();  // the decoder's own kernels are AVX2 there; w8a8 GEMMs use kernel_table's avxvnni
#elif defined(ZOI_ARCH_ARM64)
    case Isa::Neon:
    case Isa::Dotprod:
    case Isa::I8mm: return neon::dec_table();  // w8a8 GEMMs use kernel_table's dotprod / i8mm
#endif
    default: return scalar::dec_table();
  }
}

DecoderModel::DecoderModel(const DecConfig& c, const std::string& isa) : c_(c) {
  Isa i = active_isa();
  if (!isa.empty() && !parse_isa(isa, &i)) throw std::invalid_argument("unknown ISA; expected amx|vnni|avx512|avxvnni|avx2|scalar");
  dk_ = &dec_kernels(i);
  isa_ = i;
  kt_ = &kernel_table(i);
  if (c.vocab < 1 || c.hidden < 1 || c.inter < 1 || c.layers < 1 || c.heads < 1 || c.kv_heads < 1 ||
      c.heads % c.kv_heads || c.head_dim < 2 || c.head_dim % 2 || c.head_dim > kDecMaxD)
    throw std::invalid_argument("bad model shape (heads % kv_heads, even head_dim <= 512)");
  if (c.block_size < 1 || c.block_size > kDecMaxBlock) throw std::invalid_argument("block_size must lie in [1, 256]");
  if (c.max_tokens < 1 || c.max_batch < 1 || c.max_batch > 1024 || c.num_blocks < 1 || c.max_blocks < 1 || c.max_pos < 1)
    throw std::invalid_argument("max_tokens, max_batch (<= 1024), num_blocks, max_blocks, max_pos must be positive");
  if (c.wtype < 0 || c.wtype > 2) throw std::invalid_argument("wtype must be 0 (fp32), 1 (int8) or 2 (w8a8)");
  const int pool = ThreadPool::instance().size();
  nthreads_ = c.nthreads > 0 && c.nthreads < pool ? c.nthreads : pool;
  bufs_.resize(static_cast<size_t>(c.layers + 1) * kNumSlots);
  buf_bytes_.assign(bufs_.size(), 0);
  const size_t T = c.max_tokens, H = c.hidden, D = c.head_dim;
  const size_t nq = static_cast<size_t>(c.heads + 2 * c.kv_heads) * D;
  kv_bytes_ = 2ull * c.layers * c.num_blocks * c.kv_heads * c.block_size * D * sizeof(float);
  kv_ = aligned_bytes(kv_bytes_);
  const size_t sizes[] = {T * H, T * H, T * H, T * nq, T * c.heads * D, T * 2 * c.inter, T * c.inter,
                          static_cast<size_t>(c.max_batch) * H, static_cast<size_t>(c.max_batch) * c.vocab,
                          static_cast<size_t>(kMaxSplitT) * kMaxSplits * c.heads * (D + 2), T, T,
                          static_cast<size_t>(c.max_batch)};
  size_t total = 0;
  for (size_t s : sizes) total += rup(s, 16);
  scratch_ = aligned_bytes(total * sizeof(float));
  float* p = static_cast<float*>(scratch_.get());
  float** fl[] = {&xa_, &xb_, &hn_, &qkv_, &ctx_, &gu_, &act_, &xg_, &logits_, &part_};
  size_t k = 0;
  for (float** f : fl) { *f = p; p += rup(sizes[k++], 16); }
  pos_ = reinterpret_cast<int32_t*>(p); p += rup(sizes[k++], 16);
  row_ = reinterpret_cast<int32_t*>(p); p += rup(sizes[k++], 16);
  gidx_ = reinterpret_cast<int32_t*>(p);
  sidx_ = aligned_bytes(static_cast<size_t>(c.max_batch) * c.vocab * sizeof(int32_t));
  scum_ = aligned_bytes(static_cast<size_t>(c.max_batch) * c.vocab * sizeof(double));
  if (c.wtype == 2) {
    lin8_.resize(static_cast<size_t>(c.layers + 1) * 4);
    const int kmax = std::max(std::max(c.hidden, c.heads * c.head_dim), c.inter);
    const size_t kp = round_up(kmax, kt_->i8_kgroup);
    qbuf_ = aligned_bytes(T * kp * kt_->i8_a_bytes + 64);
    qscale_ = aligned_bytes(T * sizeof(float));
    qzp_ = aligned_bytes(T * sizeof(int32_t));
  }
  const size_t max_ops = 4 + 16 * static_cast<size_t>(c.layers);
  ops_.reserve(max_ops);
  max_ops_ = max_ops;
  sync_.reset(new Sync[max_ops]);
}

int DecoderModel::slot_id(const std::string& s) const {
  for (int i = 0; i < kNumSlots; ++i)
    if (s == kSlots[i]) return i;
  return -1;
}

size_t DecoderModel::slot_bytes(int layer, const std::string& name) const {
  const int id = slot_id(name);
  if (id < 0 || (layer < 0) != (id < kFirstLayerSlot) || layer >= c_.layers) return 0;
  const size_t wb = c_.wtype ? 1 : 4, H = c_.hidden, D = c_.head_dim, I = c_.inter;
  const size_t nq = static_cast<size_t>(c_.heads + 2 * c_.kv_heads) * D;
  const bool raw = c_.wtype == 2;  // w8a8: int8 [N, K] and scale [N] as given; packed here
  auto np = [raw](size_t n) { return raw ? n : rup(n, kDecPanel); };
  auto sc = [&](size_t n) { return c_.wtype ? np(n) * 4 : 0; };
  switch (id) {
    case 0: return static_cast<size_t>(c_.vocab) * H * 4;
    case 1: return H * 4;
    case 2: case 3: return static_cast<size_t>(c_.max_pos) * (D / 2) * 4;
    case 4: return np(c_.vocab) * H * wb;
    case 5: return sc(c_.vocab);
    case 6: case 7: return H * 4;
    case 8: return np(nq) * H * wb;
    case 9: return sc(nq);
    case 10: return nq * 4;
    case 11: case 12: return c_.qk_norm ? D * 4 : 0;
    case 13: return np(H) * c_.heads * D * wb;
    case 14: return sc(H);
    case 15: return H * 4;
    case 16: return np(2 * I) * H * wb;
    case 17: return sc(2 * I);
    case 18: return np(H) * I * wb;
    case 19: return sc(H);
  }
  return 0;
}

void DecoderModel::set(int layer, const std::string& name, const void* data, size_t bytes) {
  const size_t want = slot_bytes(layer, name);
  if (want == 0) throw std::invalid_argument("'" + name + "' is not a weight slot of this model (layer " + std::to_string(layer) + ")");
  if (bytes != want)
    throw std::invalid_argument("slot '" + name + "' of layer " + std::to_string(layer) + ": " + std::to_string(bytes) +
                                " bytes, expected " + std::to_string(want));
  const size_t k = static_cast<size_t>(layer < 0 ? c_.layers : layer) * kNumSlots + slot_id(name);
  if (!bufs_[k]) weights_bytes_ += want;
  bufs_[k] = aligned_bytes(want);
  std::memcpy(bufs_[k].get(), data, want);
  buf_bytes_[k] = want;
  const int id = slot_id(name);
  if (c_.wtype == 2 && (id == 4 || id == 8 || id == 13 || id == 16 || id == 18)) {
    const size_t nq = static_cast<size_t>(c_.heads + 2 * c_.kv_heads) * c_.head_dim;
    int N = 0, K = 0;
    switch (id) {
      case 4: N = c_.vocab; K = c_.hidden; break;
      case 8: N = static_cast<int>(nq); K = c_.hidden; break;
      case 13: N = c_.hidden; K = c_.heads * c_.head_dim; break;
      case 16: N = 2 * c_.inter; K = c_.hidden; break;
      default: N = c_.hidden; K = c_.inter; break;
    }
    Lin8& L = lin8(layer, id);
    L.N = N;
    L.K = K;
    L.Kp = round_up(K, kt_->i8_kgroup);
    const int np = round_up(N, kt_->i8_panel);
    L.w = aligned_bytes(kt_->pack_i8_bytes(N, K));
    L.colsum = aligned_bytes(np * sizeof(int32_t));
    kt_->pack_i8(static_cast<const int8_t*>(bufs_[k].get()), N, K, L.w.get(), static_cast<int32_t*>(L.colsum.get()));
    weights_bytes_ += kt_->pack_i8_bytes(N, K) - want;
    bufs_[k].reset();  // the packed copy replaces the raw one
    buf_bytes_[k] = want;
  }
}

DecoderModel::Lin8& DecoderModel::lin8(int layer, int w_id) {
  const int j = w_id == 4 || w_id == 8 ? 0 : w_id == 13 ? 1 : w_id == 16 ? 2 : 3;
  return lin8_[static_cast<size_t>(layer < 0 ? c_.layers : layer) * 4 + j];
}

float* DecoderModel::slot(int layer, int id) {
  return static_cast<float*>(bufs_[static_cast<size_t>(layer < 0 ? c_.layers : layer) * kNumSlots + id].get());
}

void DecoderModel::finalize() {
  for (int l = -1; l < c_.layers; ++l)
    for (int id = l < 0 ? 0 : kFirstLayerSlot; id < (l < 0 ? kFirstLayerSlot : kNumSlots); ++id) {
      if (id == 10 || id == 15) continue;  // biases are optional
      const bool packed8 = c_.wtype == 2 && (id == 4 || id == 8 || id == 13 || id == 16 || id == 18);
      const bool have = packed8 ? static_cast<bool>(lin8(l, id).w) : slot(l, id) != nullptr;
      if (slot_bytes(l, kSlots[id]) && !have)
        throw std::invalid_argument(std::string("weight slot '") + kSlots[id] + "' of layer " + std::to_string(l) + " not set");
    }
  if (c_.wtype != 2 || finalized_) return;
  for (int l = -1; l < c_.layers; ++l)
    for (int id : {4, 8, 13, 16, 18}) {
      if ((l < 0) != (id == 4)) continue;
      Lin8& L = lin8(l, id);
      const int np = round_up(L.N, kt_->i8_panel);
      L.scale = aligned_bytes(np * sizeof(float));
      L.bias = aligned_bytes(np * sizeof(float));
      float* sc = static_cast<float*>(L.scale.get());
      float* b = static_cast<float*>(L.bias.get());
      std::memset(sc, 0, np * sizeof(float));
      std::memset(b, 0, np * sizeof(float));
      std::memcpy(sc, slot(l, id + 1), L.N * sizeof(float));
      const int bid = id == 8 ? 10 : id == 13 ? 15 : -1;
      if (bid >= 0 && slot(l, bid)) std::memcpy(b, slot(l, bid), L.N * sizeof(float));
    }
  finalized_ = true;
}

void DecoderModel::step(const int32_t* ids, int T, const int32_t* rows, const int32_t* starts, const int32_t* counts,
                        const int32_t* want, int B, const double* samp, const uint64_t* seeds, const int64_t* index,
                        const int32_t* tables, int32_t* out) {
  std::lock_guard<std::mutex> g(mu_);
  finalize();
  if (T < 1 || T > c_.max_tokens) throw std::invalid_argument("tokens per step must lie in [1, max_tokens]");
  if (B < 1 || B > c_.max_batch) throw std::invalid_argument("entries per step must lie in [1, max_batch]");
  long sum = 0;
  int lmax = 0;
  nw_ = 0;
  for (int b = 0; b < B; ++b) {
    const int s = starts[b], n = counts[b], r = rows[b];
    if (n < 1 || s < 0 || r < 0 || r >= c_.max_batch)
      throw std::invalid_argument("entry " + std::to_string(b) + ": bad row / start / count");
    if (static_cast<long>(s) + n > std::min<long>(c_.max_pos, static_cast<long>(c_.max_blocks) * c_.block_size))
      throw std::invalid_argument("entry " + std::to_string(b) + ": positions beyond the context");
    const int nb = (s + n + c_.block_size - 1) / c_.block_size;
    for (int i = 0; i < nb; ++i) {
      const int blk = tables[static_cast<size_t>(r) * c_.max_blocks + i];
      if (blk < 0 || blk >= c_.num_blocks) throw std::invalid_argument("block table holds a block outside the pool");
    }
    for (int i = 0; i < n; ++i) {
      pos_[sum + i] = s + i;
      row_[sum + i] = r;
    }
    sum += n;
    lmax = std::max(lmax, s + n);
    out[b] = -1;
    if (want[b]) {
      gidx_[nw_] = static_cast<int32_t>(sum - 1);
      wsrc_[nw_++] = b;
    }
  }
  if (sum != T) throw std::invalid_argument("counts do not add up to the number of ids");
  for (int t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= c_.vocab) throw std::invalid_argument("token id outside the vocabulary");
  ids_ = ids;
  T_ = T;
  samp_ = samp;
  seeds_ = seeds;
  index_ = index;
  out_ = out;

  const int H = c_.hidden, D = c_.head_dim, nh = c_.heads, nkv = c_.kv_heads, I = c_.inter;
  const int nq = (nh + 2 * nkv) * D;
  const int nt = nthreads_;
  int splits = 1, chunk = 1 << 30;
  if (T <= kMaxSplitT && T * nkv < 4 * nt && lmax > 512) {
    splits = std::min(kMaxSplits, (lmax + 255) / 256);
    chunk = (lmax + splits - 1) / splits;
  }
  const size_t layer_kv = static_cast<size_t>(c_.num_blocks) * nkv * c_.block_size * D;
  float* kv = static_cast<float*>(kv_.get());
  ops_.clear();
  auto lin = [&](const float* x, int ldx, int l, int w_id, int s_id, int b_id, int M, int N, int K, float* y,
                 const float* res) {
    if (c_.wtype == 2) {  // quantise the rows per token, then the INT8 GEMM of csrc/kernels
      Lin8& L = lin8(l, w_id);
      Op qop{QUANT};
      qop.qx = x; qop.qldx = ldx; qop.qM = M; qop.qK = K;
      qop.qo.q = qbuf_.get(); qop.qo.ldq = L.Kp;
      qop.qo.scale = static_cast<float*>(qscale_.get()); qop.qo.zp = static_cast<int32_t*>(qzp_.get());
      qop.parts = cap(M, 64);
      ops_.push_back(qop);
      Op g{GEMM8};
      g.gi.a = qbuf_.get(); g.gi.lda = L.Kp; g.gi.a_scale = qop.qo.scale; g.gi.w = L.w.get();
      g.gi.colsum = static_cast<const int32_t*>(L.colsum.get()); g.gi.a_zp = qop.qo.zp;
      g.gi.w_scale = static_cast<const float*>(L.scale.get()); g.gi.bias = static_cast<const float*>(L.bias.get());
      g.gi.M = M; g.gi.N = N; g.gi.Kp = L.Kp; g.gi.y = y; g.gi.ldy = N; g.gi.res = res; g.gi.ldr = N;
      const long np = (N + kt_->i8_panel - 1) / kt_->i8_panel;
      g.parts = cap(np * ((M + 63) / 64), 256);
      ops_.push_back(g);
      return;
    }
    Op o{LIN};
    o.lin.x = x; o.lin.ldx = ldx;
    o.lin.w = slot(l, w_id); o.lin.wtype = c_.wtype;
    o.lin.scale = c_.wtype ? slot(l, s_id) : nullptr;
    o.lin.bias = b_id >= 0 ? slot(l, b_id) : nullptr;
    o.lin.M = M; o.lin.N = N; o.lin.K = K;
    o.lin.y = y; o.lin.ldy = N;
    o.lin.res = res; o.lin.ldr = N;
    o.parts = dk_->linear_parts(M, N);
    ops_.push_back(o);
  };
  auto norm = [&](const float* x, const float* w, int M, float* y, const int32_t* rows_) {
    Op o{NORM};
    o.nrm.x = x; o.nrm.ldx = H; o.nrm.w = w; o.nrm.eps = c_.eps; o.nrm.M = M; o.nrm.H = H;
    o.nrm.y = y; o.nrm.ldy = H; o.nrm.rows = rows_;
    o.parts = cap(M, 64);
    ops_.push_back(o);
  };
  {
    Op o{EMBED};
    o.parts = cap(T, 64);
    ops_.push_back(o);
  }
  for (int l = 0; l < c_.layers; ++l) {
    norm(xa_, slot(l, 6), T, hn_, nullptr);
    lin(hn_, H, l, 8, 9, slot(l, 10) ? 10 : -1, T, nq, H, qkv_, nullptr);
    Op q{QKVP};
    q.qp.qkv = qkv_; q.qp.ldqkv = nq; q.qp.T = T; q.qp.nh = nh; q.qp.nkv = nkv; q.qp.D = D;
    q.qp.pos = pos_; q.qp.row = row_; q.qp.tables = tables; q.qp.ldt = c_.max_blocks;
    q.qp.cos = slot(-1, 2); q.qp.sin = slot(-1, 3);
    q.qp.qn = c_.qk_norm ? slot(l, 11) : nullptr; q.qp.kn = c_.qk_norm ? slot(l, 12) : nullptr; q.qp.eps = c_.eps;
    q.qp.kc = kv + 2 * l * layer_kv; q.qp.vc = kv + (2 * l + 1) * layer_kv; q.qp.bs = c_.block_size;
    q.parts = cap(T, 64);
    ops_.push_back(q);
    Op a{ATTN};
    a.at.q = qkv_; a.at.ldq = nq; a.at.T = T; a.at.nh = nh; a.at.nkv = nkv; a.at.D = D;
    a.at.pos = pos_; a.at.row = row_; a.at.tables = tables; a.at.ldt = c_.max_blocks;
    a.at.kc = q.qp.kc; a.at.vc = q.qp.vc; a.at.bs = c_.block_size;
    a.at.scale = 1.f / std::sqrt(static_cast<float>(D));
    a.at.splits = splits; a.at.chunk = chunk; a.at.out = ctx_; a.at.ldo = nh * D; a.at.part = part_;
    a.parts = cap(static_cast<long>(T) * nkv * splits, 1024);
    ops_.push_back(a);
    if (splits > 1) {
      a.kind = MERGE;
      a.parts = cap(static_cast<long>(T) * nkv, 256);
      ops_.push_back(a);
    }
    lin(ctx_, nh * D, l, 13, 14, slot(l, 15) ? 15 : -1, T, H, nh * D, xb_, xa_);
    norm(xb_, slot(l, 7), T, hn_, nullptr);
    lin(hn_, H, l, 16, 17, -1, T, 2 * I, H, gu_, nullptr);
    Op s{SILU};
    s.parts = cap(static_cast<long>(T) * ((I + 511) / 512), 256);
    ops_.push_back(s);
    lin(act_, I, l, 18, 19, -1, T, H, I, xa_, xb_);
  }
  if (nw_ > 0) {
    norm(xa_, slot(-1, 1), nw_, xg_, gidx_);
    lin(xg_, H, -1, 4, 5, -1, nw_, c_.vocab, H, logits_, nullptr);
    Op o{SAMPLE};
    o.parts = nw_;
    ops_.push_back(o);
  }
  if (ops_.size() > max_ops_) throw std::logic_error("decoder step: more ops than sized for");  // never
  for (size_t i = 0; i < ops_.size(); ++i) {
    sync_[i].next.store(0, std::memory_order_relaxed);
    sync_[i].done.store(0, std::memory_order_relaxed);
  }
  ThreadPool::instance().run(&DecoderModel::job, this, nthreads_);
}

void DecoderModel::job(void* self, int tid, int nt) {
  (void)tid;
  (void)nt;
  DecoderModel* m = static_cast<DecoderModel*>(self);
  for (size_t i = 0; i < m->ops_.size(); ++i) {
    Sync& sy = m->sync_[i];
    const Op& op = m->ops_[i];
    for (;;) {
      const int p = sy.next.fetch_add(1, std::memory_order_acq_rel);
      if (p >= op.parts) break;
      m->exec(op, p);
      if (sy.done.fetch_add(1, std::memory_order_acq_rel) + 1 == op.parts) futex_wake_all(&sy.done);
    }
    for (;;) {
      const int d = sy.done.load(std::memory_order_acquire);
      if (d >= op.parts) break;
      futex_wait_while(&sy.done, d, kStepSpin);
    }
  }
}

void DecoderModel::exec(const Op& op, int part) {
  switch (op.kind) {
    case EMBED: {
      long lo, hi;
      split_range(T_, part, op.parts, &lo, &hi);
      const float* e = slot(-1, 0);
      for (long t = lo; t < hi; ++t)
        std::memcpy(xa_ + t * c_.hidden, e + static_cast<size_t>(ids_[t]) * c_.hidden, c_.hidden * sizeof(float));
      break;
    }
    case NORM: dk_->rmsnorm(op.nrm, part, op.parts); break;
    case LIN: dk_->linear(op.lin, part, op.parts); break;
    case QKVP: dk_->qkv_post(op.qp, part, op.parts); break;
    case ATTN: dk_->attention(op.at, part, op.parts); break;
    case MERGE: dk_->attn_merge(op.at, part, op.parts); break;
    case SILU: dk_->silu_mul(gu_, 2 * c_.inter, T_, c_.inter, act_, c_.inter, part, op.parts); break;
    case SAMPLE: sample_row(part); break;
    case QUANT: kt_->quantize_rows(op.qx, op.qldx, op.qM, op.qK, op.qo, part, op.parts); break;
    case GEMM8: kt_->gemm_i8(op.gi, part, op.parts); break;
  }
}

// The sampler of zoi/decoder/reference.py::sample, in float64: greedy (lowest id on ties) or
// temperature -> top-k -> top-p -> a counter-based draw (splitmix64 of seed and index).
void DecoderModel::sample_row(int w) {
  const int b = wsrc_[w], V = c_.vocab;
  const float* lg = logits_ + static_cast<size_t>(w) * V;
  const double temp = samp_[3 * b], top_p = samp_[3 * b + 2];
  const long top_k = static_cast<long>(samp_[3 * b + 1]);
  if (temp <= 0.0 || top_k == 1) {
    int best = 0;
    for (int i = 1; i < V; ++i)
      if (lg[i] > lg[best]) best = i;
    out_[b] = best;
    return;
  }
  int32_t* idx = static_cast<int32_t*>(sidx_.get()) + static_cast<size_t>(w) * V;
  double* cum = static_cast<double*>(scum_.get()) + static_cast<size_t>(w) * V;
  for (int i = 0; i < V; ++i) idx[i] = i;
  auto before = [&](int32_t a, int32_t c) {
    const double za = lg[a] / temp, zc = lg[c] / temp;
    return za > zc || (za == zc && a < c);
  };
  int n = V;
  if (top_k > 0 && top_k < V) {
    n = static_cast<int>(top_k);
    std::partial_sort(idx, idx + n, idx + V, before);
  } else {
    std::sort(idx, idx + V, before);
  }
  const double z0 = lg[idx[0]] / temp;
  double acc = 0.0;
  for (int i = 0; i < n; ++i) {
    acc += std::exp(lg[idx[i]] / temp - z0);
    cum[i] = acc;
  }
  int keep = n;
  if (top_p < 1.0) {
    const double target = top_p * cum[n - 1];
    keep = static_cast<int>(std::lower_bound(cum, cum + n, target) - cum) + 1;
    keep = std::min(std::max(keep, 1), n);
  }
  const uint64_t r = mix64(mix64(seeds_[b]) ^ static_cast<uint64_t>(index_[b]));
  const double u = static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0) * cum[keep - 1];
  int j = static_cast<int>(std::upper_bound(cum, cum + keep, u) - cum);
  out_[b] = idx[std::min(j, keep - 1)];
}

}  // namespace zoi
