// The native plan: built once from a CompiledModel (ops in order, packed weights, the
// planner's arena), then run(ids, positions, cu_seqlens) executes every op inside C++ on the
// shared thread pool: each op is cut into parts that the threads take dynamically, and a
// per-op completion counter orders the ops. No allocation after construction.
#pragma once
#include <cstddef>
#include <cstdint>
#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/kernels.h"

namespace zoi {

struct AlignedFree {
  size_t mapped = 0;  // > 0: an anonymous mapping of that many bytes
  void operator()(void* p) const;
};
using AlignedBuf = std::unique_ptr<void, AlignedFree>;
// 64-byte aligned, zero-filled. From 256 KiB on, an anonymous mapping whose pages the kernel
// supplies (zeroed) on first touch: a buffer sized for max_tokens (the arena, the quantised
// activations) costs resident memory only for the rows a call actually uses.
AlignedBuf aligned_bytes(size_t n);
// copies n floats to dst (a buffer the engine keeps) and returns it typed
float* copy_f(void* dst, const float* src, size_t n);

// w_bits of an INT8 linear (GemmI8Args::w_bits): 8, or 7 with every weight in [-63, 63]; anything
// else throws std::invalid_argument naming the first weight out of range
void check_i8_weight_bits(const int8_t* w, int N, int K, int w_bits);

class Engine {
 public:
  // arena_bytes: the planner's arena; nthreads 0 = the whole pool; isa "" = active_isa()
  Engine(size_t arena_bytes, int max_tokens, int max_batch, const std::string& isa, int nthreads);

  // ---- building (offsets are byte offsets into the arena; a "T" buffer has max_tokens rows)
  // Tables are referenced, not copied: the caller keeps word/word_q/word_scale/pos alive.
  void add_embed(size_t out_off, int H, int vocab, int max_pos, const float* word, const int8_t* word_q,
                 const float* word_scale, const float* pos, const float* type0, const float* ln_w,
                 const float* ln_b, float eps);
  void add_linear_f32(size_t in_off, int K, size_t out_off, int N, const float* w, const float* b, int act,
                      long res_off);
  // static_amax >= 0: static scheme; asym: dynamic_asym; act_shift / act_mul [K] (optional):
  // the per-channel transform of x before it is quantised. q_from: who writes the int8 copy of
  // x, as the plan decided it (zoi.graph.fusion): QFROM_STEP a quantise step, QFROM_PRODUCER the
  // previous step's epilogue (an INT8 GEMM from q_min_m rows on); refused if it cannot.
  // y_dead: the plan's quant_out_only (zoi.graph.fusion): this GEMM will quantise its output for
  // the next INT8 linear and nothing else reads its float rows, which then go to per-thread
  // scratch from q_min_m rows on; finalize refuses it when the steps contradict it
  void add_linear_i8(size_t in_off, int K, size_t out_off, int N, const int8_t* w_q, const float* w_scale,
                     const float* b, int act, long res_off, float static_amax, bool asym, const float* act_shift,
                     const float* act_mul, int q_from, int q_min_m, bool y_dead = false, int w_bits = 8);
  static constexpr int QFROM_STEP = 0, QFROM_PRODUCER = 1;
  // follows add_linear_i8 (token rows only): the first row of each sequence of that linear's
  // input is quantised twice, q1 = Q(x'), q2 = Q(x' - deq(q1)) (symmetric, step scale1 * 2^-8), and the GEMM
  // adds q2's term to that row before the activation (docs/QUANT.md, kernels.h QuantOut::q2)
  void set_first_row_residual();
  // kv_heads (0: heads): grouped KV heads, the qkv rows are q [heads d], k, v [kv_heads d]
  void add_attention(size_t in_off, size_t out_off, int heads, int head_dim, float scale, int kv_heads = 0);
  // with the optional inputs of AttnArgs (tables copied): bias [heads, 2 * span - 1] or null,
  // window (0: none), rope cos / sin [rows, head_dim / 2] or null
  // decoder architectures: kv_heads, causal, q_norm / k_norm [head_dim] (copied) with qk_eps
  void add_attention_ext(size_t in_off, size_t out_off, int heads, int head_dim, float scale, const float* bias,
                         int span, int window, const float* cos, const float* sin, int rows, int kv_heads = 0,
                         bool causal = false, const float* q_norm = nullptr, const float* k_norm = nullptr,
                         float qk_eps = 1e-6f);
  // opt-in: attention steps added so far use AttnArgs::prec = mode (0 FP32, 1 INT8 q.k^T,
  // 2 INT8 q.k^T and p.v (vnni / amx ISA), 3 AMX-BF16 q.k^T and p.v (amx ISA); where a mode
  // does not apply, the ISA forced by ZOI_CPU_ISA included: FP32)
  void set_attention_precision(int mode) {
    if (mode < 0 || mode > 3) throw std::invalid_argument("attention precision mode must be 0, 1, 2 or 3");
    for (auto& st : steps_)
      if (st.kind == ATTN) st.at.prec = mode;
  }
  // y [T, n] = act(x[:, :n]) * x[:, n:] (x [T, 2n])
  void add_glu(size_t in_off, size_t out_off, int n, int act);
  // rms: RMSNorm; post: the residual added after the norm (norm(x) + r)
  void add_layernorm(size_t x_off, long res_off, size_t out_off, int H, const float* w, const float* b, float eps,
                     bool rms = false, bool post = false);
  void add_pool(size_t in_off, size_t out_off, int H, int mode);

  // ---- task adapters (LoRA, per sequence: a run's tasks[b], -1 none; docs/ARCHITECTURE.md)
  // after the linear step just added (added without activation or residual): y += the adapters'
  // term of each row of a task, then act and the residual (res_off >= 0) on every row. a [n][r][K]
  // (A_t), b [n][N][r] (s B_t); both copied
  void add_lora(size_t in_off, int K, size_t out_off, int N, const float* a, const float* b, int ntasks, int r,
                int act, long res_off);
  // the last embed step adds A_t[id] B_t (a [n][V][r], b [n][r][H]) and type_delta[t] ([n][H] or
  // null) to the tokens of a sequence of task t (copied)
  void set_embed_lora(const float* a, const float* b, const float* type_delta, int ntasks, int r);
  int num_tasks() const { return ntasks_; }

  // ---- generation (docs/ARCHITECTURE.md "Generation"): the same steps with a paged KV cache
  // the KV pool, reserved once at finalize: num_blocks blocks of block_size tokens per layer and
  // K / V; block tables of table_rows rows x max_blocks; positions below max_pos (the RoPE tables'
  // rows). Call before the first add_attention_paged.
  void set_kv_pool(int num_blocks, int block_size, int max_blocks, int table_rows, int max_pos);
  // a decoder layer's attention over the pool: q / k RMSNorm (optional, q_norm / k_norm [head_dim]
  // copied), RoPE at each token's absolute position (cos / sin [max_pos, head_dim / 2], shared
  // copies), the token's K / V written to its block, causal attention over positions 0..pos
  void add_attention_paged(size_t in_off, size_t out_off, int heads, int head_dim, float scale, int kv_heads,
                           const float* cos, const float* sin, const float* q_norm, const float* k_norm,
                           float qk_eps);
  // one token per sequence from the B rows of logits [B, vocab] at logits_off (the last step;
  // sample_token of sampler.h with each entry's settings)
  void add_sample(size_t logits_off, int vocab);
  // one step of generation: B entries (one per sequence at most), entry b feeds counts[b] of the
  // T ids (packed in order) at positions starts[b].. of block-table row rows[b]; want[b]: sample
  // its next token into out[b] (else -1). samp [B, 3]: temperature, top_k, top_p; seeds and draw
  // index per entry. Throws std::invalid_argument on a malformed step before touching anything.
  // wall / cpu (optional, [num_steps()]): the kernel lab's per-step times of thread 0 (profile)
  void run_gen(const int32_t* ids, int T, const int32_t* rows, const int32_t* starts, const int32_t* counts,
               const int32_t* want, int B, const double* samp, const uint64_t* seeds, const int64_t* index,
               const int32_t* tables, int32_t* out, double* wall = nullptr, double* cpu = nullptr);
  // the logits of the last run_gen, B rows of out_cols() (tests)
  const float* gen_logits() const { return reinterpret_cast<const float*>(static_cast<const char*>(arena_.get()) + out_off_); }
  int last_batch() const { return B_; }
  size_t kv_bytes() const { return kv_floats_ * 4; }

  // ---- heads
  // steps added while on run over the batch's B rows (a linear / LayerNorm after a pool)
  void set_batch_rows(bool on) { rows_b_ = on; }
  // the last embed step adds type[types[t]] (table [n, H], copied) when a run passes types
  void set_embed_types(const float* table, int n);
  // the run's output: `cols` columns of B rows (rows_t false) or T rows, at arena offset off
  void set_output(size_t off, int cols, bool rows_t);

  // allocates the shared scratch (quantised activations, attention); call after the last add_*
  void finalize();

  // ---- running: out [B, ldo] float32; throws std::invalid_argument on a malformed batch
  // tasks [B] (a model with adapters; nullptr: no sequence has a task): each in [-1, num_tasks)
  void run(const int32_t* ids, const int32_t* positions, const int32_t* cu, int T, int B, bool normalize,
           float* out, int ldo, const int32_t* tasks = nullptr);
  // run with token types (nullptr: type 0) and, when tap_out is set, a copy of the T rows of
  // tap_cols floats at arena offset tap_off (a buffer that outlives the run)
  void run_ex(const int32_t* ids, const int32_t* positions, const int32_t* types, const int32_t* cu, int T, int B,
              bool normalize, float* out, int ldo, size_t tap_off, int tap_cols, float* tap_out,
              const int32_t* tasks = nullptr);
  bool out_rows_t() const { return out_rows_t_; }
  // steps [first, last) only, on the same checks as run; nothing is copied out. The arena keeps
  // what earlier steps of the batch wrote, so a caller can read a buffer between two calls while
  // it is live (zoi.quant's calibration reads each linear's input before the linear runs)
  void run_steps(const int32_t* ids, const int32_t* positions, const int32_t* cu, int T, int B, int first, int last);
  // the arena's bytes (read-only views of the planner's buffers after run_steps)
  const void* arena_data() const { return arena_.get(); }

  // kernel lab: one run recording, per step, thread 0's wall and CPU seconds (after the barrier)
  // into wall[num_steps()], cpu[num_steps()]; step_kind(i) names the step
  void profile(const int32_t* ids, const int32_t* positions, const int32_t* cu, int T, int B, double* wall,
               double* cpu);
  const char* step_kind(int i) const;
  // what step i does with int8 copies (tests compare it with the plan): writes one (epilogue or
  // quantise step); min_m: rows from which an INT8 GEMM writes it (its QUANT step skips then)
  struct StepInfo {
    const char* kind = "";
    bool writes_copy = false, fused = false;
    int min_m = 0, slot = 0;
    bool y_scratch = false;  // GEMM_I8 writing a copy: its float rows go to scratch (y not written)
  };
  StepInfo step_info(int i) const;

  size_t weights_bytes() const { return weights_bytes_; }
  size_t arena_bytes() const { return arena_bytes_; }
  size_t scratch_bytes() const { return scratch_bytes_; }
  int out_cols() const { return out_cols_; }
  int nthreads() const { return nthreads_; }
  Isa isa() const { return kt_->isa; }
  int num_steps() const { return static_cast<int>(steps_.size()); }

 private:
  enum Kind { EMBED, QUANT, GEMM_I8, GEMM_F32, ATTN, LN, POOL, GLU, LORA, QKV_PAGED, ATTN_PAGED, MERGE_PAGED, SAMPLE };
  struct Step {
    Kind kind;
    bool rows_b = false;  // M = B (after a pool) instead of T
    GemmI8Args gi;
    GemmF32Args gf;
    LnArgs ln;
    EmbedArgs em;
    AttnArgs at;
    PoolArgs po;
    GluArgs gl;
    LoraArgs lo;
    PagedQkvArgs pq;    // QKV_PAGED
    PagedAttnArgs pa;   // ATTN_PAGED / MERGE_PAGED
    size_t kv_off = 0;  // QKV_PAGED / ATTN_PAGED / MERGE_PAGED: the layer's K pool in kv_ (floats; V follows)
    const float* logits = nullptr;  // SAMPLE: [B, vocab]
    int vocab = 0;
    // QUANT
    const float* qx = nullptr;
    int qldx = 0, qK = 0;
    QuantOut qo;
    bool fusedq = false;  // QUANT of a GEMM_I8's output: the GEMM does it when M >= qmin
    int qslot = 0;        // QUANT / GEMM_I8: which quantised-activation buffer it writes / reads
    int qmin = 0;         // QUANT (fusedq) / GEMM_I8 writing a copy: rows from which the GEMM does it
    bool ydead = false;   // GEMM_I8 writing a copy: nothing reads its float y after it (the plan's y_dead): scratch rows
    bool frr = false;     // GEMM_I8: its input's first rows quantised twice (set_first_row_residual)
  };
  // the second quantisation of the first row of each sequence, per quantised-activation slot
  AlignedBuf q2buf_[2], q2scale_[2], q2zp_[2];
  bool frr_ = false;
  // per step: parts handed out dynamically (next) and parts finished (done)
  struct alignas(64) StepSync {
    std::atomic<int> next{0};
    alignas(64) std::atomic<int> done{0};
  };
  static void job(void* self, int tid, int nt);
  // computes part `part` of `parts` of step s on pool thread `tid`
  void exec(const Step& s, int part, int parts, int tid);
  void check_dead_outputs();  // verifies the plan's Step::ydead, sizes the scratch for it (finalize)
  float* buf(size_t off) { return reinterpret_cast<float*>(static_cast<char*>(arena_.get()) + off); }
  void* keep(size_t bytes);  // owned, aligned, counted in weights_bytes_
  // an owned copy of src[0, n), shared with an earlier identical one (per-layer RoPE / bias tables)
  const float* keep_shared(const float* src, size_t n);
  void check_off(size_t off, size_t bytes) const;
  QuantOut quant_target(size_t in_off, int K, const QuantOut& params, int q_from, int q_min_m);
  void check_batch(const int32_t* ids, const int32_t* positions, const int32_t* types, const int32_t* cu, int T,
                   int B) const;
  void launch(int first, int last);  // runs steps [first, last) on the pool (mu_ held)

  const KernelTable* kt_;
  int max_tokens_, max_batch_, nthreads_;
  size_t arena_bytes_, weights_bytes_ = 0, scratch_bytes_ = 0;
  AlignedBuf arena_, qbuf_, qscale_, qzp_, attn_;
  AlignedBuf yscr_;          // per pool thread: i8_qchunk_floats(N) floats for GEMMs with ydead
  size_t yscr_stride_ = 0;   // floats per thread
  AlignedBuf qbuf2_, qscale2_, qzp2_;  // the second slot: a GEMM_I8 quantising its output for the next
  size_t qbuf_bytes_ = 0, attn_stride_ = 0;
  int max_kp_ = 0, max_attn_d_ = 0;
  bool fused_q_ = false;  // some GEMM_I8 quantises its output (the second slot exists)
  std::vector<AlignedBuf> owned_;
  std::vector<std::pair<const float*, size_t>> shared_;  // keep_shared's copies
  std::vector<Step> steps_;
  std::vector<int> parts_;
  std::unique_ptr<StepSync[]> sync_;
  int vocab_ = 0, max_pos_ = 0;
  int max_seq_ = 0;  // > 0: the longest sequence the attention tables cover
  size_t out_off_ = 0;
  int out_cols_ = 0;
  bool have_pool_ = false, finalized_ = false;
  bool rows_b_ = false, out_rows_t_ = false;
  int ntypes_ = 0;
  const int32_t* types_ = nullptr;
  int ntasks_ = 0;                  // task adapters of the model (0: none)
  AlignedBuf tok_task_;             // [max_tokens] int32: the run's task of each token
  bool run_tasks_ = false;          // the run passed tasks (tok_task_ filled)
  std::mutex mu_;
  // per-run inputs
  const int32_t* ids_ = nullptr;
  const int32_t* positions_ = nullptr;
  const int32_t* cu_ = nullptr;
  int T_ = 0, B_ = 0;
  int first_ = 0, last_ = 0;  // the steps a launch runs
  // generation: the pool (set_kv_pool) and one run_gen's inputs
  int kv_blocks_ = 0, kv_block_ = 0, kv_max_blocks_ = 0, kv_rows_ = 0, kv_max_pos_ = 0;
  size_t kv_floats_ = 0;        // both pools of every paged layer
  int paged_kv_heads_ = 0, paged_part_floats_ = 0;
  AlignedBuf kv_, gen_i32_, part_, sidx_, scum_;
  int32_t* gen_pos_ = nullptr;  // [max_tokens]: each token's position
  int32_t* gen_row_ = nullptr;  // [max_tokens]: each token's block-table row
  int32_t* gen_cu_ = nullptr;   // [max_batch + 1]
  const int32_t* tables_ = nullptr;
  const int32_t* want_ = nullptr;
  const double* samp_ = nullptr;
  const uint64_t* seeds_ = nullptr;
  const int64_t* index_ = nullptr;
  int32_t* out_tok_ = nullptr;
  int splits_ = 1, chunk_ = 1 << 30;
  int sample_step_ = -1;          // the SAMPLE step (its parts: one per entry of a run)
  std::vector<int> merge_steps_;  // the MERGE_PAGED steps: no parts when a run has no splits
  int merge_parts_ = 1;
  void finalize_gen();  // the pool, the run tables and the sampler's scratch (finalize)
  void exec_gen(const Step& s, int part, int parts);
  double* prof_wall_ = nullptr;
  double* prof_cpu_ = nullptr;
};

}  // namespace zoi
