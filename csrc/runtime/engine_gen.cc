// Generation on the engine (engine.h "generation"): the paged KV pool, the attention steps over it
// and the sampler. A step of generation is the encoder's plan run once over the packed tokens of
// every entry (prefill chunks and decode tokens together) with the attention reading and writing
// the pool, then the last token of each entry through the final norm, the LM head and the sampler.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "engine.h"
#include "sampler.h"

namespace zoi {

namespace {
// few tokens over a long context: the positions of each (token, kv head) are cut into splits so
// that every thread has work; partials merged after (paged_merge)
constexpr int kMaxSplitT = 16, kMaxSplits = 16, kSplitMinLen = 512, kSplitLen = 256;
}  // namespace

void Engine::set_kv_pool(int num_blocks, int block_size, int max_blocks, int table_rows, int max_pos) {
  if (finalized_ || kv_floats_ > 0) throw std::invalid_argument("set_kv_pool comes before the first paged attention");
  if (num_blocks < 1 || max_blocks < 1 || table_rows < 1 || max_pos < 1)
    throw std::invalid_argument("the KV pool needs num_blocks, max_blocks, table_rows and max_pos >= 1");
  if (block_size < 1 || block_size > kPagedMaxBlock)
    throw std::invalid_argument("block_size must lie in [1, " + std::to_string(kPagedMaxBlock) + "]");
  kv_blocks_ = num_blocks;
  kv_block_ = block_size;
  kv_max_blocks_ = max_blocks;
  kv_rows_ = table_rows;
  kv_max_pos_ = max_pos;
}

void Engine::add_attention_paged(size_t in_off, size_t out_off, int heads, int head_dim, float scale, int kv_heads,
                                 const float* cos, const float* sin, const float* q_norm, const float* k_norm,
                                 float qk_eps) {
  if (kv_rows_ == 0) throw std::invalid_argument("paged attention needs set_kv_pool first");
  if (heads < 1 || kv_heads < 1 || heads % kv_heads || head_dim < 2 || head_dim % 2 || head_dim > kMaxHeadDim)
    throw std::invalid_argument("paged attention needs kv_heads dividing heads and an even head_dim <= " +
                                std::to_string(kMaxHeadDim));
  if (!cos || !sin) throw std::invalid_argument("paged attention needs the RoPE tables");
  if ((q_norm != nullptr) != (k_norm != nullptr) || (q_norm && !(qk_eps > 0.f)))
    throw std::invalid_argument("q / k norm needs both weights and an eps > 0");
  if (paged_kv_heads_ && kv_heads != paged_kv_heads_)
    throw std::invalid_argument("every paged layer must have the same kv_heads");
  const int H = heads * head_dim, KV = kv_heads * head_dim;
  check_off(in_off, static_cast<size_t>(max_tokens_) * (H + 2 * KV) * 4);
  check_off(out_off, static_cast<size_t>(max_tokens_) * H * 4);
  paged_kv_heads_ = kv_heads;
  paged_part_floats_ = std::max(paged_part_floats_, heads * (head_dim + 2));
  const size_t layer = static_cast<size_t>(kv_blocks_) * kv_heads * kv_block_ * head_dim;
  const size_t rope = static_cast<size_t>(kv_max_pos_) * (head_dim / 2);
  Step q{};
  q.kind = QKV_PAGED;
  q.kv_off = kv_floats_;
  PagedQkvArgs& p = q.pq;
  p.qkv = buf(in_off);
  p.ldqkv = H + 2 * KV;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.d = head_dim;
  p.ldt = kv_max_blocks_;
  p.cos = keep_shared(cos, rope);  // one copy for every layer
  p.sin = keep_shared(sin, rope);
  if (q_norm) {
    p.q_norm = copy_f(keep(head_dim * 4), q_norm, head_dim);
    p.k_norm = copy_f(keep(head_dim * 4), k_norm, head_dim);
    p.qk_eps = qk_eps;
  }
  p.block = kv_block_;
  steps_.push_back(q);
  Step a{};
  a.kind = ATTN_PAGED;
  a.kv_off = kv_floats_;
  PagedAttnArgs& t = a.pa;
  t.q = buf(in_off);
  t.ldq = H + 2 * KV;
  t.heads = heads;
  t.kv_heads = kv_heads;
  t.d = head_dim;
  t.ldt = kv_max_blocks_;
  t.block = kv_block_;
  t.scale = scale;
  t.out = buf(out_off);
  t.ldo = H;
  steps_.push_back(a);
  a.kind = MERGE_PAGED;
  steps_.push_back(a);
  kv_floats_ += 2 * layer;
}

void Engine::add_sample(size_t logits_off, int vocab) {
  if (vocab < 1) throw std::invalid_argument("sampling needs a vocabulary");
  check_off(logits_off, static_cast<size_t>(max_batch_) * vocab * 4);
  Step s{};
  s.kind = SAMPLE;
  s.logits = buf(logits_off);
  s.vocab = vocab;
  steps_.push_back(s);
}

void Engine::finalize_gen() {
  bool paged = false;
  int vocab = 0;
  sample_step_ = -1;
  merge_steps_.clear();
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& s = steps_[i];
    paged = paged || s.kind == QKV_PAGED;
    if (s.kind == SAMPLE) {
      if (sample_step_ >= 0) throw std::invalid_argument("a plan samples once per step");
      sample_step_ = static_cast<int>(i);
      vocab = s.vocab;
    }
    if (s.kind == MERGE_PAGED) {
      merge_steps_.push_back(static_cast<int>(i));
      merge_parts_ = parts_[i];
    }
  }
  if (kv_rows_ > 0 && !paged) throw std::invalid_argument("a KV pool was set but no paged attention added");
  if (!paged) return;
  kv_ = aligned_bytes(kv_floats_ * 4);  // reserved once; pages resident as blocks are written
  float* kv = static_cast<float*>(kv_.get());
  const size_t gen_ints = 2 * static_cast<size_t>(max_tokens_) + max_batch_ + 1;
  gen_i32_ = aligned_bytes(gen_ints * 4);
  gen_pos_ = static_cast<int32_t*>(gen_i32_.get());
  gen_row_ = gen_pos_ + max_tokens_;
  gen_cu_ = gen_row_ + max_tokens_;
  part_ = aligned_bytes(static_cast<size_t>(kMaxSplitT) * kMaxSplits * paged_part_floats_ * 4);
  for (Step& s : steps_) {
    if (s.kind == QKV_PAGED) {
      const size_t layer = static_cast<size_t>(kv_blocks_) * s.pq.kv_heads * kv_block_ * s.pq.d;
      s.pq.kc = kv + s.kv_off;
      s.pq.vc = kv + s.kv_off + layer;
      s.pq.pos = gen_pos_;
      s.pq.row = gen_row_;
    } else if (s.kind == ATTN_PAGED || s.kind == MERGE_PAGED) {
      const size_t layer = static_cast<size_t>(kv_blocks_) * s.pa.kv_heads * kv_block_ * s.pa.d;
      s.pa.kc = kv + s.kv_off;
      s.pa.vc = kv + s.kv_off + layer;
      s.pa.pos = gen_pos_;
      s.pa.row = gen_row_;
      s.pa.part = static_cast<float*>(part_.get());
    }
  }
  if (sample_step_ >= 0) {
    const size_t n = static_cast<size_t>(max_batch_) * vocab;
    sidx_ = aligned_bytes(n * 4);
    scum_ = aligned_bytes(n * 8);
  }
  scratch_bytes_ += kv_floats_ * 4 + gen_ints * 4 + static_cast<size_t>(kMaxSplitT) * kMaxSplits * paged_part_floats_ * 4;
}

void Engine::exec_gen(const Step& s, int part, int parts) {
  const KernelTable& k = *kt_;
  switch (s.kind) {
    case QKV_PAGED: {
      PagedQkvArgs a = s.pq;
      a.T = T_;
      a.tables = tables_;
      k.paged_qkv(a, part, parts);
      break;
    }
    case ATTN_PAGED:
    case MERGE_PAGED: {
      PagedAttnArgs a = s.pa;
      a.T = T_;
      a.tables = tables_;
      a.splits = splits_;
      a.chunk = chunk_;
      if (s.kind == ATTN_PAGED) k.paged_attention(a, part, parts);
      else k.paged_merge(a, part, parts);
      break;
    }
    case SAMPLE: {  // part b: entry b
      if (!want_[part]) break;
      const size_t V = static_cast<size_t>(s.vocab);
      const double* sp = samp_ + 3 * static_cast<size_t>(part);
      out_tok_[part] = sample_token(s.logits + part * V, s.vocab, sp[0], static_cast<long>(sp[1]), sp[2], seeds_[part],
                                    index_[part], static_cast<int32_t*>(sidx_.get()) + part * V,
                                    static_cast<double*>(scum_.get()) + part * V);
      break;
    }
    default: break;
  }
}

void Engine::run_gen(const int32_t* ids, int T, const int32_t* rows, const int32_t* starts, const int32_t* counts,
                     const int32_t* want, int B, const double* samp, const uint64_t* seeds, const int64_t* index,
                     const int32_t* tables, int32_t* out, double* wall, double* cpu) {
  if (!finalized_) throw std::invalid_argument("Engine.finalize() was not called");
  if (kv_rows_ == 0 || !kv_) throw std::invalid_argument("this plan has no KV cache: run it with run()");
  if (T < 1 || T > max_tokens_) throw std::invalid_argument("tokens per step must lie in [1, max_tokens]");
  if (B < 1 || B > max_batch_ || B > kv_rows_) throw std::invalid_argument("entries per step must lie in [1, max_batch]");
  const long ctx = std::min<long>(kv_max_pos_, static_cast<long>(kv_max_blocks_) * kv_block_);
  long sum = 0;
  int lmax = 0;
  for (int b = 0; b < B; ++b) {
    const int s = starts[b], n = counts[b], r = rows[b];
    if (n < 1 || s < 0 || r < 0 || r >= kv_rows_)
      throw std::invalid_argument("entry " + std::to_string(b) + ": bad row / start / count");
    if (static_cast<long>(s) + n > ctx) throw std::invalid_argument("entry " + std::to_string(b) + ": positions beyond the context");
    if (sum + n > T) throw std::invalid_argument("counts do not add up to the number of ids");
    const int nb = (s + n + kv_block_ - 1) / kv_block_;
    for (int i = 0; i < nb; ++i) {
      const int blk = tables[static_cast<size_t>(r) * kv_max_blocks_ + i];
      if (blk < 0 || blk >= kv_blocks_) throw std::invalid_argument("block table holds a block outside the pool");
    }
    sum += n;
    lmax = std::max(lmax, s + n);
  }
  if (sum != T) throw std::invalid_argument("counts do not add up to the number of ids");
  for (int t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= vocab_) throw std::invalid_argument("token id outside the vocabulary");
  std::lock_guard<std::mutex> g(mu_);
  long t0 = 0;
  gen_cu_[0] = 0;
  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < counts[b]; ++i) {
      gen_pos_[t0 + i] = starts[b] + i;
      gen_row_[t0 + i] = rows[b];
    }
    t0 += counts[b];
    gen_cu_[b + 1] = static_cast<int32_t>(t0);
    out[b] = -1;
  }
  splits_ = 1;
  chunk_ = 1 << 30;
  if (T <= kMaxSplitT && T * paged_kv_heads_ < 4 * nthreads_ && lmax > kSplitMinLen) {
    splits_ = std::min(kMaxSplits, (lmax + kSplitLen - 1) / kSplitLen);
    chunk_ = (lmax + splits_ - 1) / splits_;
  }
  if (sample_step_ >= 0) parts_[sample_step_] = B;  // one entry a part: a sort over the vocabulary each
  for (int i : merge_steps_) parts_[i] = splits_ > 1 ? merge_parts_ : 0;  // nothing to merge: no parts
  ids_ = ids;
  positions_ = gen_pos_;
  cu_ = gen_cu_;
  T_ = T;
  B_ = B;
  types_ = nullptr;
  run_tasks_ = false;
  tables_ = tables;
  want_ = want;
  samp_ = samp;
  seeds_ = seeds;
  index_ = index;
  out_tok_ = out;
  prof_wall_ = wall;
  prof_cpu_ = wall ? cpu : nullptr;
  launch(0, num_steps());
  prof_wall_ = prof_cpu_ = nullptr;
  tables_ = nullptr;
  want_ = nullptr;
  out_tok_ = nullptr;
}

}  // namespace zoi
