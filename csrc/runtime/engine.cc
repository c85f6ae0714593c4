#include "engine.h"

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <cstring>
#include <stdexcept>

#include <sys/mman.h>

#include "pool.h"

namespace zoi {

void AlignedFree::operator()(void* p) const {
  if (mapped) munmap(p, mapped);
  else std::free(p);
}

AlignedBuf aligned_bytes(size_t n) {
  size_t sz = (n + 63) / 64 * 64;
  if (sz == 0) sz = 64;
  constexpr size_t kMapMin = 256 << 10;
  if (sz >= kMapMin) {  // page-aligned, zero pages on first touch (no memset: nothing resident yet)
    void* p = mmap(nullptr, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_NOHUGEPAGE
    madvise(p, sz, MADV_NOHUGEPAGE);  // THP "always" would make each first touch 2 MiB resident
#endif
    return AlignedBuf(p, AlignedFree{sz});
  }
  void* p = std::aligned_alloc(64, sz);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, sz);
  return AlignedBuf(p);
}

Engine::Engine(size_t arena_bytes, int max_tokens, int max_batch, const std::string& isa, int nthreads)
    : max_tokens_(max_tokens), max_batch_(max_batch), arena_bytes_(arena_bytes) {
  Isa want;
  if (isa.empty()) want = active_isa();
  else if (!parse_isa(isa, &want))
    throw std::invalid_argument("unknown ISA '" + isa + "'; expected " +
#if defined(ZOI_ARCH_ARM64)
                                "i8mm|dotprod|neon|scalar"
#elif defined(ZOI_ARCH_X86)
                                "amx|vnni|avx512|avxvnni|avx2|scalar"
#else
                                "scalar"
#endif
    );
  kt_ = &kernel_table(want);
  if (max_tokens < 1 || max_batch < 1) throw std::invalid_argument("max_tokens and max_batch must be >= 1");
  const int pool_n = ThreadPool::instance().size();
  nthreads_ = nthreads <= 0 || nthreads > pool_n ? pool_n : nthreads;
  arena_ = aligned_bytes(arena_bytes);
}

void* Engine::keep(size_t bytes) {
  owned_.push_back(aligned_bytes(bytes));
  weights_bytes_ += bytes;
  return owned_.back().get();
}

void Engine::check_off(size_t off, size_t bytes) const {
  if (off % 4 != 0 || off + bytes > arena_bytes_)
    throw std::invalid_argument("buffer [" + std::to_string(off) + ", +" + std::to_string(bytes) +
                                ") does not fit the arena of " + std::to_string(arena_bytes_) + " bytes");
}

float* copy_f(void* dst, const float* src, size_t n) {
  std::memcpy(dst, src, n * sizeof(float));
  return static_cast<float*>(dst);
}

const float* Engine::keep_shared(const float* src, size_t n) {
  // same contents, not same address: a caller's temporary may reuse a freed address
  for (const auto& [p, m] : shared_)
    if (m == n && std::memcmp(p, src, n * sizeof(float)) == 0) return p;
  const float* p = copy_f(keep(n * 4), src, n);
  shared_.emplace_back(p, n);
  return p;
}

void Engine::add_embed(size_t out_off, int H, int vocab, int max_pos, const float* word, const int8_t* word_q,
                       const float* word_scale, const float* pos, const float* type0, const float* ln_w,
                       const float* ln_b, float eps) {
  check_off(out_off, static_cast<size_t>(max_tokens_) * H * 4);
  if (H > kMaxLnH) throw std::invalid_argument("hidden size above " + std::to_string(kMaxLnH));
  if (!word && !(word_q && word_scale)) throw std::invalid_argument("embed needs word or word_q + word_scale");
  Step s{};
  s.kind = EMBED;
  EmbedArgs& e = s.em;
  e.H = H;
  e.word = word;
  e.word_q = word_q;
  e.word_scale = word_scale;
  e.pos = pos;
  e.type0 = type0 ? copy_f(keep(H * 4), type0, H) : nullptr;
  e.ln_w = ln_w ? copy_f(keep(H * 4), ln_w, H) : nullptr;  // null: no norm (decoder architectures)
  e.ln_b = ln_w ? copy_f(keep(H * 4), ln_b, H) : nullptr;
  if (ln_w && !ln_b) throw std::invalid_argument("embed's LayerNorm needs ln_w and ln_b");
  e.eps = eps;
  e.y = buf(out_off);
  e.ldy = H;
  // referenced tables count as held weights too
  // (pos null: no position table, ModernBERT; max_pos still bounds the positions taken)
  if (max_pos < 1) throw std::invalid_argument("embed needs max_pos >= 1");
  weights_bytes_ += static_cast<size_t>(vocab) * H * (word ? 4 : 1) + (word ? 0 : vocab * 4) +
                    (pos ? static_cast<size_t>(max_pos) * H * 4 : 0);
  vocab_ = vocab;
  max_pos_ = max_pos;
  steps_.push_back(s);
}

void Engine::set_embed_types(const float* table, int n) {
  if (steps_.empty() || steps_.back().kind != EMBED) throw std::invalid_argument("set_embed_types follows add_embed");
  EmbedArgs& e = steps_.back().em;
  e.type = copy_f(keep(static_cast<size_t>(n) * e.H * 4), table, static_cast<size_t>(n) * e.H);
  ntypes_ = n;
}

void Engine::set_output(size_t off, int cols, bool rows_t) {
  check_off(off, static_cast<size_t>(rows_t ? max_tokens_ : max_batch_) * cols * 4);
  out_off_ = off;
  out_cols_ = cols;
  out_rows_t_ = rows_t;
  have_pool_ = true;
}

QuantOut Engine::quant_target(size_t in_off, int K, const QuantOut& params, int q_from, int q_min_m) {
  // The int8 input rows go to the shared scratch. Who writes them is the plan's decision
  // (zoi.graph.fusion, the IR attribute quant_in_by): q_from QFROM_PRODUCER: the previous step,
  // which produces exactly this buffer, in its epilogue (LayerNorm / embedding / GLU always; an
  // INT8 GEMM from q_min_m rows, the QUANT step below doing it for fewer); QFROM_STEP: a QUANT
  // step of its own. A decision the previous step cannot carry out is an error here, at build.
  if (q_from != QFROM_STEP && q_from != QFROM_PRODUCER)
    throw std::invalid_argument("q_from must be 0 (a quantise step) or 1 (the producer's epilogue)");
  const int kp = round_up(K, kt_->i8_kgroup);
  if (kp > max_kp_) max_kp_ = kp;
  QuantOut qo = params;
  qo.ldq = kp;
  Step* prev = steps_.empty() ? nullptr : &steps_.back();
  auto refuse = [&](const char* why) {
    static const char* names[] = {"embed", "quantize", "gemm_i8", "gemm_f32", "attention", "layernorm", "pool", "glu", "lora"};
    throw std::invalid_argument(std::string("the plan asks the step before this INT8 linear (") +
                                (prev ? names[prev->kind] : "none") + ") to write its int8 input copy, but " + why);
  };
  if (q_from == QFROM_PRODUCER) {
    if (!prev) refuse("there is no previous step");
    const bool whole = prev->kind == LN || prev->kind == EMBED || prev->kind == GLU;
    if (whole && q_min_m != 0) refuse("a whole-row epilogue quantises at every size (q_min_m must be 0)");
    if (prev->kind == LN && prev->ln.y == buf(in_off) && prev->ln.H == K && prev->ln.qo.ldq == 0) {
      prev->ln.qo = qo;
      return qo;
    }
    if (prev->kind == EMBED && prev->em.y == buf(in_off) && prev->em.H == K && prev->em.qo.ldq == 0) {
      prev->em.qo = qo;
      return qo;
    }
    if (prev->kind == GLU && prev->gl.y == buf(in_off) && prev->gl.n == K && prev->gl.qo.ldq == 0) {
      prev->gl.qo = qo;
      return qo;
    }
    if (whole) refuse("it does not write exactly this buffer, or already writes a copy");
    if (prev->kind != GEMM_I8) refuse("only a LayerNorm, an embedding, a GLU or an INT8 GEMM can");
    if (q_min_m < 1) refuse("an INT8 GEMM quantises its output from q_min_m >= 1 rows");
    if (!(prev->gi.y == buf(in_off) && prev->gi.N == K && prev->gi.ldy == K && !prev->gi.qo.ldq && prev->qslot == 0))
      refuse("that GEMM does not write exactly this buffer, already writes a copy, or reads the second slot");
  }
  Step s{};
  s.kind = QUANT;
  s.rows_b = rows_b_;
  s.qx = buf(in_off);
  s.qldx = K;
  s.qK = K;
  s.qo = qo;
  if (q_from == QFROM_PRODUCER) {  // the output of an INT8 GEMM: that GEMM quantises it (second slot) from q_min_m rows
    prev->gi.qo = qo;
    prev->qmin = q_min_m;
    s.fusedq = true;
    s.qslot = 1;
    s.qmin = q_min_m;
    fused_q_ = true;
  }
  steps_.push_back(s);
  return qo;
}

void check_i8_weight_bits(const int8_t* w, int N, int K, int w_bits) {
  if (w_bits != 7 && w_bits != 8)
    throw std::invalid_argument("INT8 weight bits must be 8 or 7, got " + std::to_string(w_bits));
  if (w_bits == 8) return;  // [-127, 127]: pack_i8 refuses -128
  for (size_t i = 0; i < static_cast<size_t>(N) * K; ++i)
    if (w[i] < -63 || w[i] > 63)  // the 7-bit K loop would saturate: never run it on such a weight
      throw std::invalid_argument("INT8 weight " + std::to_string(int(w[i])) + " at row " + std::to_string(i / K) +
                                  ", column " + std::to_string(i % K) +
                                  " of a linear marked 7-bit (weight_bits 7): 7-bit weights are in [-63, 63]; "
                                  "re-quantise the model (zoi compile --weight-bits 8 or auto)");
}

void Engine::add_linear_i8(size_t in_off, int K, size_t out_off, int N, const int8_t* w_q, const float* w_scale,
                           const float* b, int act, long res_off, float static_amax, bool asym,
                           const float* act_shift, const float* act_mul, int q_from, int q_min_m, bool y_dead,
                           int w_bits) {
  check_i8_weight_bits(w_q, N, K, w_bits);
  const size_t rows = static_cast<size_t>(rows_b_ ? max_batch_ : max_tokens_);
  check_off(in_off, rows * K * 4);
  check_off(out_off, rows * N * 4);
  if (res_off >= 0) check_off(static_cast<size_t>(res_off), rows * N * 4);
  if (asym && static_amax >= 0) throw std::invalid_argument("a linear is either static or dynamic_asym");
  QuantOut params;
  params.static_amax = static_amax;
  params.asym = asym ? 1 : 0;
  params.shift = act_shift ? copy_f(keep(static_cast<size_t>(K) * 4), act_shift, K) : nullptr;
  params.mul = act_mul ? copy_f(keep(static_cast<size_t>(K) * 4), act_mul, K) : nullptr;
  const QuantOut qo = quant_target(in_off, K, params, q_from, q_min_m);
  Step s{};
  s.kind = GEMM_I8;
  s.rows_b = rows_b_;
  s.ydead = y_dead;  // verified at finalize (check_dead_outputs)
  s.qslot = steps_.back().kind == QUANT ? steps_.back().qslot : 0;
  GemmI8Args& g = s.gi;
  const int np = round_up(N, kt_->i8_panel);
  void* w = keep(kt_->pack_i8_bytes(N, K));
  int32_t* colsum = static_cast<int32_t*>(keep(np * 4));
  kt_->pack_i8(w_q, N, K, w, colsum);
  float* ws = static_cast<float*>(keep(np * 4));
  float* bias = static_cast<float*>(keep(np * 4));
  std::memcpy(ws, w_scale, N * 4);
  if (b) std::memcpy(bias, b, N * 4);
  g.w = w;
  g.colsum = colsum;
  g.w_scale = ws;
  g.bias = bias;
  g.lda = qo.ldq;
  g.N = N;
  g.Kp = qo.ldq;
  g.y = buf(out_off);
  g.ldy = N;
  g.res = res_off >= 0 ? buf(static_cast<size_t>(res_off)) : nullptr;
  g.ldr = N;
  g.act = act;
  g.w_bits = w_bits;
  steps_.push_back(s);
}

void Engine::set_first_row_residual() {
  const size_t n = steps_.size();
  if (n < 2 || steps_.back().kind != GEMM_I8) throw std::invalid_argument("set_first_row_residual follows add_linear_i8");
  Step& g = steps_.back();
  if (g.rows_b) throw std::invalid_argument("the first-row residual applies to token rows, not to a head's rows per sequence");
  Step& w = steps_[n - 2];  // the writer of the int8 input copy (quant_target)
  switch (w.kind) {
    case QUANT:
      w.qo.first_row = 1;
      if (w.fusedq) steps_[n - 3].gi.qo.first_row = 1;  // the GEMM before quantises it from qmin rows
      break;
    case LN: w.ln.qo.first_row = 1; break;
    case EMBED: w.em.qo.first_row = 1; break;
    case GLU: w.gl.qo.first_row = 1; break;
    default: throw std::invalid_argument("set_first_row_residual: no quantise step before this INT8 linear");
  }
  g.frr = true;
  frr_ = true;
}

void Engine::add_linear_f32(size_t in_off, int K, size_t out_off, int N, const float* w, const float* b, int act,
                            long res_off) {
  const size_t rows = static_cast<size_t>(rows_b_ ? max_batch_ : max_tokens_);
  check_off(in_off, rows * K * 4);
  check_off(out_off, rows * N * 4);
  if (res_off >= 0) check_off(static_cast<size_t>(res_off), rows * N * 4);
  Step s{};
  s.kind = GEMM_F32;
  s.rows_b = rows_b_;
  GemmF32Args& g = s.gf;
  const int np = round_up(N, kt_->f32_panel);
  float* pw = static_cast<float*>(keep(kt_->pack_f32_bytes(N, K)));
  kt_->pack_f32(w, N, K, pw);
  float* bias = static_cast<float*>(keep(np * 4));
  if (b) std::memcpy(bias, b, N * 4);
  g.a = buf(in_off);
  g.lda = K;
  g.w = pw;
  g.bias = bias;
  g.N = N;
  g.K = K;
  g.y = buf(out_off);
  g.ldy = N;
  g.res = res_off >= 0 ? buf(static_cast<size_t>(res_off)) : nullptr;
  g.ldr = N;
  g.act = act;
  steps_.push_back(s);
}

void Engine::add_attention(size_t in_off, size_t out_off, int heads, int head_dim, float scale, int kv_heads) {
  if (heads < 1 || head_dim < 1 || kv_heads < 0 || (kv_heads > 0 && heads % kv_heads))
    throw std::invalid_argument("attention needs heads >= 1, head_dim >= 1 and kv_heads dividing heads");
  const int H = heads * head_dim, KV = (kv_heads > 0 ? kv_heads : heads) * head_dim;
  check_off(in_off, static_cast<size_t>(max_tokens_) * (H + 2 * KV) * 4);
  check_off(out_off, static_cast<size_t>(max_tokens_) * H * 4);
  Step s{};
  s.kind = ATTN;
  AttnArgs& a = s.at;
  a.qkv = buf(in_off);
  a.ldqkv = H + 2 * KV;
  a.kv_heads = kv_heads;
  a.heads = heads;
  a.d = head_dim;
  a.scale = scale;
  a.out = buf(out_off);
  a.ldo = H;
  if (head_dim > max_attn_d_) max_attn_d_ = head_dim;
  steps_.push_back(s);
}

void Engine::add_attention_ext(size_t in_off, size_t out_off, int heads, int head_dim, float scale,
                               const float* bias, int span, int window, const float* cos, const float* sin,
                               int rows, int kv_heads, bool causal, const float* q_norm, const float* k_norm,
                               float qk_eps) {
  if ((q_norm != nullptr) != (k_norm != nullptr) || (q_norm && !(qk_eps > 0.f)))
    throw std::invalid_argument("q / k norm needs both weights and an eps > 0");
  if (q_norm && head_dim > kMaxHeadDim)
    throw std::invalid_argument("q / k norm supports head_dim <= " + std::to_string(kMaxHeadDim));
  if (window < 0) throw std::invalid_argument("attention window must be >= 0");
  if (bias && span < 1) throw std::invalid_argument("attention bias needs a span >= 1");
  if ((cos != nullptr) != (sin != nullptr) || (cos && (rows < 1 || head_dim % 2)))
    throw std::invalid_argument("RoPE needs cos and sin tables [rows >= 1, head_dim / 2] and an even head_dim");
  add_attention(in_off, out_off, heads, head_dim, scale, kv_heads);
  AttnArgs& a = steps_.back().at;
  a.causal = causal;
  if (q_norm) {
    a.q_norm = copy_f(keep(head_dim * 4), q_norm, head_dim);
    a.k_norm = copy_f(keep(head_dim * 4), k_norm, head_dim);
    a.qk_eps = qk_eps;
  }
  auto limit = [&](int n) { max_seq_ = max_seq_ == 0 || n < max_seq_ ? n : max_seq_; };
  if (bias) {
    const size_t n = static_cast<size_t>(heads) * (2 * span - 1);
    a.bias = keep_shared(bias, n);  // one copy for every layer (MPNet's shared bias)
    a.bias_span = span;
    limit(span);
  }
  a.window = window;
  if (cos) {
    const size_t n = static_cast<size_t>(rows) * (head_dim / 2);
    a.rope_cos = keep_shared(cos, n);  // one copy per distinct table, not per layer
    a.rope_sin = keep_shared(sin, n);
    a.rope_rows = rows;
    limit(rows);
  }
}

void Engine::add_glu(size_t in_off, size_t out_off, int n, int act) {
  check_off(in_off, static_cast<size_t>(max_tokens_) * 2 * n * 4);
  check_off(out_off, static_cast<size_t>(max_tokens_) * n * 4);
  if (n < 1) throw std::invalid_argument("glu needs n >= 1");
  Step s{};
  s.kind = GLU;
  s.gl.x = buf(in_off);
  s.gl.ldx = 2 * n;
  s.gl.n = n;
  s.gl.act = act;
  s.gl.y = buf(out_off);
  s.gl.ldy = n;
  steps_.push_back(s);
}

void Engine::add_layernorm(size_t x_off, long res_off, size_t out_off, int H, const float* w, const float* b,
                           float eps, bool rms, bool post) {
  if (post && res_off < 0) throw std::invalid_argument("a post-norm residual needs a residual input");
  const size_t rows = static_cast<size_t>(rows_b_ ? max_batch_ : max_tokens_);
  check_off(x_off, rows * H * 4);
  check_off(out_off, rows * H * 4);
  if (res_off >= 0) check_off(static_cast<size_t>(res_off), rows * H * 4);
  if (H > kMaxLnH) throw std::invalid_argument("hidden size above " + std::to_string(kMaxLnH));
  Step s{};
  s.kind = LN;
  s.rows_b = rows_b_;
  LnArgs& l = s.ln;
  l.x = buf(x_off);
  l.ldx = H;
  l.r = res_off >= 0 ? buf(static_cast<size_t>(res_off)) : nullptr;
  l.ldr = H;
  l.w = copy_f(keep(H * 4), w, H);
  l.b = copy_f(keep(H * 4), b, H);
  l.eps = eps;
  l.rms = rms;
  l.post = post;
  l.H = H;
  l.y = buf(out_off);
  l.ldy = H;
  steps_.push_back(s);
}

void Engine::add_pool(size_t in_off, size_t out_off, int H, int mode) {
  check_off(in_off, static_cast<size_t>(max_tokens_) * H * 4);
  check_off(out_off, static_cast<size_t>(max_batch_) * H * 4);
  if (mode < 0 || mode > 4)
    throw std::invalid_argument("pool mode must be 0 (mean), 1 (cls), 2 (max), 3 (splade) or 4 (last)");
  Step s{};
  s.kind = POOL;
  s.po.x = buf(in_off);
  s.po.ldx = H;
  s.po.H = H;
  s.po.mode = mode;
  s.po.out = buf(out_off);
  s.po.ldo = H;
  out_off_ = out_off;
  out_cols_ = H;
  out_rows_t_ = false;
  have_pool_ = true;
  steps_.push_back(s);
}

void Engine::add_lora(size_t in_off, int K, size_t out_off, int N, const float* a, const float* b, int ntasks,
                      int r, int act, long res_off) {
  if (ntasks < 1 || r < 1 || r > kMaxLoraRank)
    throw std::invalid_argument("task adapters need >= 1 task and a rank in [1, " + std::to_string(kMaxLoraRank) + "]");
  if (ntasks_ && ntasks != ntasks_) throw std::invalid_argument("every task adapter stack must hold the same tasks");
  if (rows_b_) throw std::invalid_argument("task adapters run on token rows only");
  Step* prev = steps_.empty() ? nullptr : &steps_.back();
  const bool i8 = prev && prev->kind == GEMM_I8, f32 = prev && prev->kind == GEMM_F32;
  const float* py = i8 ? prev->gi.y : f32 ? prev->gf.y : nullptr;
  const int pn = i8 ? prev->gi.N : f32 ? prev->gf.N : 0;
  const int pact = i8 ? prev->gi.act : f32 ? prev->gf.act : 0;
  const bool pres = i8 ? prev->gi.res != nullptr : f32 ? prev->gf.res != nullptr : false;
  if (!py || py != buf(out_off) || pn != N || pact != ACT_NONE || pres || (i8 && (prev->gi.qo.ldq || prev->ydead)))
    throw std::invalid_argument("task adapters follow their linear's GEMM, added without activation, residual or "
                                "int8 copy of its output, writing this buffer");
  const size_t rows = static_cast<size_t>(max_tokens_);
  check_off(in_off, rows * K * 4);
  if (res_off >= 0) check_off(static_cast<size_t>(res_off), rows * N * 4);
  Step s{};
  s.kind = LORA;
  LoraArgs& l = s.lo;
  l.x = buf(in_off);
  l.ldx = K;
  l.K = K;
  l.y = buf(out_off);
  l.ldy = N;
  l.N = N;
  l.r = r;
  const size_t na = static_cast<size_t>(ntasks) * r * K, nb = static_cast<size_t>(ntasks) * r * N;
  l.a = copy_f(keep(na * 4), a, na);
  float* bt = static_cast<float*>(keep(nb * 4));  // [n][N][r] -> [n][r][N]: rows over N
  for (int t = 0; t < ntasks; ++t)
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < r; ++j)
        bt[(static_cast<size_t>(t) * r + j) * N + n] = b[(static_cast<size_t>(t) * N + n) * r + j];
  l.bt = bt;
  l.act = act;
  l.res = res_off >= 0 ? buf(static_cast<size_t>(res_off)) : nullptr;
  l.ldr = N;
  ntasks_ = ntasks;
  steps_.push_back(s);
}

void Engine::set_embed_lora(const float* a, const float* b, const float* type_delta, int ntasks, int r) {
  if (steps_.empty() || steps_.back().kind != EMBED) throw std::invalid_argument("set_embed_lora follows add_embed");
  if (ntasks < 1 || r < 1 || r > kMaxLoraRank)
    throw std::invalid_argument("task adapters need >= 1 task and a rank in [1, " + std::to_string(kMaxLoraRank) + "]");
  if (ntasks_ && ntasks != ntasks_) throw std::invalid_argument("every task adapter stack must hold the same tasks");
  EmbedArgs& e = steps_.back().em;
  const size_t na = static_cast<size_t>(ntasks) * vocab_ * r, nb = static_cast<size_t>(ntasks) * r * e.H;
  e.lora_a = copy_f(keep(na * 4), a, na);
  e.lora_b = copy_f(keep(nb * 4), b, nb);
  e.lora_type = type_delta ? copy_f(keep(static_cast<size_t>(ntasks) * e.H * 4), type_delta,
                                    static_cast<size_t>(ntasks) * e.H)
                           : nullptr;
  e.lora_r = r;
  e.lora_V = vocab_;
  ntasks_ = ntasks;
}

void Engine::finalize() {
  if (!have_pool_) throw std::invalid_argument("the plan has no pool op");
  qbuf_bytes_ = static_cast<size_t>(max_tokens_) * (max_kp_ > 0 ? max_kp_ : 1) * kt_->i8_a_bytes;
  qbuf_ = aligned_bytes(qbuf_bytes_);
  qscale_ = aligned_bytes(static_cast<size_t>(max_tokens_) * 4);
  qzp_ = aligned_bytes(static_cast<size_t>(max_tokens_) * 4);
  if (fused_q_) {  // lazily-zero pages: resident only where a call writes them
    qbuf2_ = aligned_bytes(qbuf_bytes_);
    qscale2_ = aligned_bytes(static_cast<size_t>(max_tokens_) * 4);
    qzp2_ = aligned_bytes(static_cast<size_t>(max_tokens_) * 4);
  }
  if (frr_) {  // B rows per slot: the second quantisation of each sequence's first row
    const size_t rows = static_cast<size_t>(max_batch_);
    for (int sl = 0; sl < (fused_q_ ? 2 : 1); ++sl) {
      q2buf_[sl] = aligned_bytes(rows * (max_kp_ > 0 ? max_kp_ : 1) * kt_->i8_a_bytes);
      q2scale_[sl] = aligned_bytes(rows * 4);
      q2zp_[sl] = aligned_bytes(rows * 4);
    }
  }
  if (ntasks_) tok_task_ = aligned_bytes(static_cast<size_t>(max_tokens_) * 4);
  attn_stride_ = max_attn_d_ > 0 ? (attn_scratch_floats(max_tokens_, max_attn_d_) + 15) / 16 * 16 : 16;
  attn_ = aligned_bytes(attn_stride_ * 4 * nthreads_);
  scratch_bytes_ = (qbuf_bytes_ + static_cast<size_t>(max_tokens_) * 8) * (fused_q_ ? 2 : 1) + attn_stride_ * 4 * nthreads_;
  if (frr_)
    scratch_bytes_ += static_cast<size_t>(max_batch_) * ((max_kp_ > 0 ? max_kp_ : 1) * kt_->i8_a_bytes + 8) * (fused_q_ ? 2 : 1);
  check_dead_outputs();
  scratch_bytes_ += yscr_stride_ * 4 * nthreads_;
  // work parts per step, handed out dynamically: a few per thread, so a thread that other load
  // delays holds up at most one part, and the others take the rest
  sync_.reset(new StepSync[steps_.size()]);
  parts_.assign(steps_.size(), 1);
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Kind k = steps_[i].kind;
    parts_[i] = nthreads_ == 1 ? 1 : (k == GEMM_I8 || k == GEMM_F32 || k == ATTN || k == ATTN_PAGED) ? 4 * nthreads_ : 2 * nthreads_;
  }
  finalize_gen();
  void* qb[2] = {qbuf_.get(), qbuf2_.get()};
  float* qs[2] = {static_cast<float*>(qscale_.get()), static_cast<float*>(qscale2_.get())};
  int32_t* qz[2] = {static_cast<int32_t*>(qzp_.get()), static_cast<int32_t*>(qzp2_.get())};
  for (Step& s : steps_) {
    auto fix = [&](QuantOut& qo, int slot) {
      if (qo.ldq > 0) {
        qo.q = qb[slot];
        qo.scale = qs[slot];
        qo.zp = qz[slot];
        if (qo.first_row) {
          qo.q2 = q2buf_[slot].get();
          qo.scale2 = static_cast<float*>(q2scale_[slot].get());
          qo.zp2 = static_cast<int32_t*>(q2zp_[slot].get());
        }
      }
    };
    switch (s.kind) {
      case QUANT: fix(s.qo, s.qslot); break;
      case LN: fix(s.ln.qo, 0); break;
      case EMBED: fix(s.em.qo, 0); break;
      case GLU: fix(s.gl.qo, 0); break;
      case GEMM_I8:
        s.gi.a = qb[s.qslot]; s.gi.a_scale = qs[s.qslot]; s.gi.a_zp = qz[s.qslot];
        if (s.frr) {
          s.gi.a2 = q2buf_[s.qslot].get();
          s.gi.a2_scale = static_cast<float*>(q2scale_[s.qslot].get());
          s.gi.a2_zp = static_cast<int32_t*>(q2zp_[s.qslot].get());
        }
        fix(s.gi.qo, 1);
        break;
      case ATTN: s.at.scratch = static_cast<float*>(attn_.get()); s.at.scratch_stride = attn_stride_; break;
      default: break;
    }
  }
  finalized_ = true;
}

// An INT8 GEMM that quantises its output rows for the next INT8 GEMM (FFN1 -> FFN2, from qmin
// rows) writes the float rows of each row chunk to a per-thread scratch instead of y when nothing
// reads y after it (at M >= qmin the QUANT step skips and the consumer reads the int8 copy):
// 1.5-3x less time in that GEMM's output traffic (lab/cpu/README.md "FFN1 output in scratch").
// Whether nothing reads y is the plan's decision (zoi.graph.fusion quant_out_only, passed as
// add_linear_i8's y_dead; ZOI_I8_YSCRATCH=0 turns it off there); here it is only checked against
// the steps, and a contradiction refused: the GEMM must write a copy (qmin >= 1) that the next,
// fused QUANT step reads from y, and no later step may read a float input at y before some step
// writes at y (every input is the start of one of the planner's buffers, and a live buffer's
// bytes are never reused), nor the host read y as the run's output.
namespace {
// Engine::Kind's names (step_kind, the plan checks' messages)
const char* const kStepNames[] = {"embed", "quantize", "gemm_i8", "gemm_f32", "attention", "layernorm", "pool",
                                  "glu", "lora", "qkv_paged", "attention_paged", "merge_paged", "sample"};
}  // namespace

void Engine::check_dead_outputs() {
  const char* const* names = kStepNames;
  auto reads = [](const Step& s, const float* r[2]) -> int {
    switch (s.kind) {
      case EMBED: return 0;
      case QUANT: r[0] = s.qx; return 1;
      case GEMM_I8: r[0] = s.gi.res; return 1;  // a: the int8 scratch
      case GEMM_F32: r[0] = s.gf.a; r[1] = s.gf.res; return 2;
      case ATTN: r[0] = s.at.qkv; return 1;
      case LN: r[0] = s.ln.x; r[1] = s.ln.r; return 2;
      case POOL: r[0] = s.po.x; return 1;
      case GLU: r[0] = s.gl.x; return 1;
      case LORA: return -1;  // x, y (in place) and the residual: counted as reading y
      case QKV_PAGED: r[0] = s.pq.qkv; return 1;
      case ATTN_PAGED: r[0] = s.pa.q; return 1;
      case MERGE_PAGED: return 0;  // its partials
      case SAMPLE: r[0] = s.logits; return 1;
    }
    return -1;  // a kind not listed: y counts as read
  };
  auto writes = [](const Step& s) -> const float* {
    switch (s.kind) {
      case EMBED: return s.em.y;
      case GEMM_I8: return s.gi.y;
      case GEMM_F32: return s.gf.y;
      case ATTN: return s.at.out;
      case LN: return s.ln.y;
      case POOL: return s.po.out;
      case GLU: return s.gl.y;
      case ATTN_PAGED: return s.pa.out;
      case MERGE_PAGED: return s.pa.out;
      case LORA: return nullptr;  // updates y in place: what it reads stays live
      default: return nullptr;
    }
  };
  int maxn = 0;
  for (size_t i = 0; i < steps_.size(); ++i) {
    Step& g = steps_[i];
    if (g.kind != GEMM_I8 || !g.ydead) continue;
    auto refuse = [&](const std::string& why) {
      throw std::invalid_argument("the plan marks the float output of INT8 GEMM step " + std::to_string(i) +
                                  " as read only by its int8 copy (zoi.graph.fusion quant_out_only, y_dead), but " +
                                  why + "; fix the plan's attribute (or set ZOI_I8_YSCRATCH=0)");
    };
    const Step* q = i + 1 < steps_.size() ? &steps_[i + 1] : nullptr;  // its QUANT step: skipped from qmin rows
    if (g.gi.qo.ldq == 0 || g.qmin < 1 || !q ||
        !(q->kind == QUANT && q->fusedq && q->qx == g.gi.y && q->qmin == g.qmin))
      refuse("it writes no int8 copy of its output for the next INT8 linear");
    const float* y = g.gi.y;
    bool overwritten = false;
    for (size_t j = i + 2; j < steps_.size() && !overwritten; ++j) {
      const float* r[2] = {nullptr, nullptr};
      const int n = reads(steps_[j], r);
      if (n < 0 || (n > 0 && r[0] == y) || (n > 1 && r[1] == y))
        refuse("step " + std::to_string(j) + " (" + names[steps_[j].kind] + ") reads it");
      overwritten = writes(steps_[j]) == y;  // the output seen below is the later step's
    }
    if (!overwritten && y == buf(out_off_)) refuse("it is the run's output");
    if (g.gi.N > maxn) maxn = g.gi.N;
  }
  if (maxn == 0) return;
  yscr_stride_ = (i8_qchunk_floats(maxn) + 15) / 16 * 16;
  yscr_ = aligned_bytes(yscr_stride_ * 4 * nthreads_);
}

void Engine::exec(const Step& s, int part, int parts, int tid) {
  const KernelTable& k = *kt_;
  const int t = part, nt = parts;
  const int M = s.rows_b ? B_ : T_;
  switch (s.kind) {
    case EMBED: {
      EmbedArgs a = s.em;
      a.tok_task = run_tasks_ && a.lora_a ? static_cast<const int32_t*>(tok_task_.get()) : nullptr;
      a.ids = ids_;
      a.positions = positions_;
      a.types = types_ && a.type ? types_ : nullptr;
      a.T = T_;
      if (a.qo.q2) { a.qo.cu = cu_; a.qo.B = B_; }
      k.embed(a, t, nt);
      break;
    }
    case QUANT:  // M: tokens, or sequences for a head's B-row steps (the producer has the same M)
      if (!(s.fusedq && M >= s.qmin)) {
        if (s.qo.q2) {
          QuantOut qo = s.qo;
          qo.cu = cu_;
          qo.B = B_;
          k.quantize_rows(s.qx, s.qldx, M, s.qK, qo, t, nt);
        } else {
          k.quantize_rows(s.qx, s.qldx, M, s.qK, s.qo, t, nt);
        }
      }
      break;
    case GEMM_I8: {
      GemmI8Args a = s.gi;
      a.M = M;
      if (M < s.qmin) a.qo.q = nullptr;  // the QUANT step after it does it
      else if (s.ydead && a.qo.q) a.y_scratch = static_cast<float*>(yscr_.get()) + static_cast<size_t>(tid) * yscr_stride_;
      if (a.a2 || a.qo.q2) { a.cu = cu_; a.B = B_; a.qo.cu = cu_; a.qo.B = B_; }
      k.gemm_i8(a, t, nt);
      break;
    }
    case GEMM_F32: {
      GemmF32Args a = s.gf;
      a.M = M;
      k.gemm_f32(a, t, nt);
      break;
    }
    case ATTN: {
      AttnArgs a = s.at;
      a.cu = cu_;
      a.B = B_;
      a.scratch = s.at.scratch + static_cast<size_t>(tid) * attn_stride_;  // the pool thread's scratch
      a.scratch_stride = 0;
      k.attention(a, t, nt);
      break;
    }
    case LN: {
      LnArgs a = s.ln;
      a.M = M;
      if (a.qo.q2) { a.qo.cu = cu_; a.qo.B = B_; }
      k.layernorm(a, t, nt);
      break;
    }
    case GLU: {
      GluArgs a = s.gl;
      a.M = T_;
      if (a.qo.q2) { a.qo.cu = cu_; a.qo.B = B_; }
      k.glu(a, t, nt);
      break;
    }
    case LORA: {
      LoraArgs a = s.lo;
      a.M = T_;
      a.tok_task = run_tasks_ ? static_cast<const int32_t*>(tok_task_.get()) : nullptr;
      k.lora(a, t, nt);
      break;
    }
    case POOL: {
      PoolArgs a = s.po;
      a.cu = cu_;
      a.B = B_;
      k.pool(a, t, nt);
      break;
    }
    case QKV_PAGED:
    case ATTN_PAGED:
    case MERGE_PAGED:
    case SAMPLE: exec_gen(s, t, nt); break;
  }
}

namespace {
constexpr int kStepSpin = 4000;  // ~100 us of pause before sleeping while a step finishes

double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
double wall_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

// Every thread walks the steps in order: takes parts of step i until none is left, then waits
// until all parts of step i are done (the data dependency), then goes on. A thread that
// arrives late finds the parts taken and the step done, and catches up without waiting.
void Engine::job(void* self, int tid, int nt) {
  (void)nt;
  Engine* e = static_cast<Engine*>(self);
  const bool prof = tid == 0 && e->prof_wall_;
  for (int i = e->first_; i < e->last_; ++i) {
    const double w0 = prof ? wall_now() : 0, c0 = prof ? cpu_now() : 0;
    StepSync& sy = e->sync_[i];
    const int parts = e->parts_[i];
    for (;;) {
      const int p = sy.next.fetch_add(1, std::memory_order_acq_rel);
      if (p >= parts) break;
      e->exec(e->steps_[i], p, parts, tid);
      if (sy.done.fetch_add(1, std::memory_order_acq_rel) + 1 == parts) futex_wake_all(&sy.done);
    }
    for (;;) {
      const int d = sy.done.load(std::memory_order_acquire);
      if (d >= parts) break;
      futex_wait_while(&sy.done, d, kStepSpin);
    }
    if (prof) {
      e->prof_wall_[i] = wall_now() - w0;
      e->prof_cpu_[i] = cpu_now() - c0;
    }
  }
}

void Engine::profile(const int32_t* ids, const int32_t* positions, const int32_t* cu, int T, int B, double* wall,
                     double* cpu) {
  check_batch(ids, positions, nullptr, cu, T, B);  // the lab's runs too: a batch past the plan is refused
  std::lock_guard<std::mutex> g(mu_);
  prof_wall_ = wall;
  prof_cpu_ = cpu;
  ids_ = ids;
  positions_ = positions;
  cu_ = cu;
  T_ = T;
  B_ = B;
  launch(0, num_steps());
  prof_wall_ = prof_cpu_ = nullptr;
}

const char* Engine::step_kind(int i) const {
  return kStepNames[steps_.at(i).kind];
}

Engine::StepInfo Engine::step_info(int i) const {
  const Step& s = steps_.at(i);
  StepInfo r;
  r.kind = step_kind(i);
  switch (s.kind) {
    case LN: r.writes_copy = s.ln.qo.ldq > 0; break;
    case EMBED: r.writes_copy = s.em.qo.ldq > 0; break;
    case GLU: r.writes_copy = s.gl.qo.ldq > 0; break;
    case GEMM_I8: r.writes_copy = s.gi.qo.ldq > 0; r.min_m = s.qmin; r.slot = s.qslot; r.y_scratch = s.ydead; break;
    case QUANT: r.writes_copy = true; r.min_m = s.fusedq ? s.qmin : 0; r.slot = s.qslot; r.fused = s.fusedq; break;
    default: break;
  }
  return r;
}

void Engine::run(const int32_t* ids, const int32_t* positions, const int32_t* cu, int T, int B, bool normalize,
                 float* out, int ldo, const int32_t* tasks) {
  run_ex(ids, positions, nullptr, cu, T, B, normalize, out, ldo, 0, 0, nullptr, tasks);
}

void Engine::check_batch(const int32_t* ids, const int32_t* positions, const int32_t* types, const int32_t* cu,
                         int T, int B) const {
  if (!finalized_) throw std::invalid_argument("Engine.finalize() was not called");
  if (kv_rows_ > 0) throw std::invalid_argument("a plan with a KV cache runs one generation step at a time (run_gen)");
  if (T < 1 || T > max_tokens_) throw std::invalid_argument("T must be in [1, max_tokens]");
  if (B < 1 || B > max_batch_) throw std::invalid_argument("B must be in [1, max_batch]");
  if (cu[0] != 0 || cu[B] != T) throw std::invalid_argument("cu_seqlens must start at 0 and end at T");
  for (int b = 0; b < B; ++b)
    if (cu[b + 1] <= cu[b]) throw std::invalid_argument("cu_seqlens must be strictly increasing (no empty sequence)");
  if (max_seq_ > 0)
    for (int b = 0; b < B; ++b)
      if (cu[b + 1] - cu[b] > max_seq_)
        throw std::invalid_argument("a sequence is longer than the model's " + std::to_string(max_seq_) + " positions");
  for (int t = 0; t < T; ++t) {
    if (ids[t] < 0 || ids[t] >= vocab_) throw std::invalid_argument("token id out of the vocabulary");
    if (positions[t] < 0 || positions[t] >= max_pos_) throw std::invalid_argument("position out of the table");
    if (types && (types[t] < 0 || types[t] >= ntypes_)) throw std::invalid_argument("token type out of the table");
  }
}

void Engine::launch(int first, int last) {
  for (int i = first; i < last; ++i) {
    sync_[i].next.store(0, std::memory_order_relaxed);
    sync_[i].done.store(0, std::memory_order_relaxed);
  }
  first_ = first;
  last_ = last;
  ThreadPool::instance().run(&Engine::job, this, nthreads_);
}

void Engine::run_ex(const int32_t* ids, const int32_t* positions, const int32_t* types, const int32_t* cu, int T,
                    int B, bool normalize, float* out, int ldo, size_t tap_off, int tap_cols, float* tap_out,
                    const int32_t* tasks) {
  check_batch(ids, positions, types, cu, T, B);
  if (tasks) {
    if (!ntasks_) throw std::invalid_argument("tasks given, but the model has no task adapters");
    for (int b = 0; b < B; ++b)
      if (tasks[b] < -1 || tasks[b] >= ntasks_)
        throw std::invalid_argument("task id out of range: each must be -1 (none) or in [0, " +
                                    std::to_string(ntasks_) + ")");
  }
  if (tap_out) check_off(tap_off, static_cast<size_t>(T) * tap_cols * 4);
  // Whether the tap's buffer is the float output of a GEMM whose rows go to scratch (y_dead) is
  // the caller's check (zoi.backends.cpu: it knows which op writes the buffer). An address test
  // here would be wrong: the planner gives a dead GEMM output and a later buffer one slot.
  std::lock_guard<std::mutex> g(mu_);
  ids_ = ids;
  positions_ = positions;
  cu_ = cu;
  T_ = T;
  B_ = B;
  types_ = types;
  run_tasks_ = false;
  if (tasks) {  // each token's task: the kernels read it per row
    int32_t* tt = static_cast<int32_t*>(tok_task_.get());
    bool any = false;
    for (int b = 0; b < B; ++b) {
      for (int t = cu[b]; t < cu[b + 1]; ++t) tt[t] = tasks[b];
      any = any || tasks[b] >= 0;
    }
    run_tasks_ = any;
  }
  launch(0, num_steps());
  types_ = nullptr;
  run_tasks_ = false;
  const float* src = buf(out_off_);
  const int rows = out_rows_t_ ? T : B;
  for (int b = 0; b < rows; ++b) std::memcpy(out + static_cast<size_t>(b) * ldo, src + static_cast<size_t>(b) * out_cols_, out_cols_ * 4);
  if (tap_out) std::memcpy(tap_out, buf(tap_off), static_cast<size_t>(T) * tap_cols * 4);
  if (normalize) kt_->normalize(out, ldo, rows, out_cols_, 0, 1);
}

void Engine::run_steps(const int32_t* ids, const int32_t* positions, const int32_t* cu, int T, int B, int first,
                       int last) {
  if (first < 0 || last > num_steps() || first > last)
    throw std::invalid_argument("run_steps needs 0 <= first <= last <= num_steps");
  check_batch(ids, positions, nullptr, cu, T, B);
  std::lock_guard<std::mutex> g(mu_);
  ids_ = ids;
  positions_ = positions;
  cu_ = cu;
  T_ = T;
  B_ = B;
  types_ = nullptr;
  run_tasks_ = false;
  launch(first, last);
}

}  // namespace zoi
