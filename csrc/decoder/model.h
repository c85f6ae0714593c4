// The native decoder: weights (FP32 or INT8 per channel, packed by zoi/decoder/cpu.py),
// a static paged KV pool (num_blocks x block_size tokens, one arena) and the scratch of a step, all
// allocated at construction. step() runs a whole forward + sampling of a packed batch (prefill
// chunks and decode tokens together) on the shared thread pool in one call: ops in order, each cut
// into parts the threads take dynamically, a completion counter per op.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../kernels/kernels.h"
#include "../runtime/engine.h"
#include "dkernels.h"

namespace zoi {

struct DecConfig {
  int vocab = 0, hidden = 0, inter = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float eps = 1e-6f;
  int qk_norm = 0;
  int wtype = 0;  // 0 fp32, 1 int8 weights (FP32 activations), 2 w8a8 (csrc/kernels INT8 GEMM)
  int max_tokens = 256, max_batch = 8, num_blocks = 0, block_size = 16, max_blocks = 0, max_pos = 0;
  int nthreads = 0;  // 0: the whole pool
};

class DecoderModel {
 public:
  DecoderModel(const DecConfig& c, const std::string& isa);
  // copies `bytes` into the slot's own buffer; throws on an unknown slot or a wrong size
  void set(int layer, const std::string& slot, const void* data, size_t bytes);
  size_t slot_bytes(int layer, const std::string& slot) const;  // 0: not a slot of this model
  void finalize();  // throws naming the first required slot not set
  // B entries (at most one per sequence): entry b feeds counts[b] tokens of ids (packed in order)
  // at positions starts[b].. of block-table row rows[b]; want[b]: sample its next token into out[b]
  // (else -1). samp [B, 3]: temperature, top_k, top_p; seeds, draw index per entry.
  void step(const int32_t* ids, int T, const int32_t* rows, const int32_t* starts, const int32_t* counts,
            const int32_t* want, int B, const double* samp, const uint64_t* seeds, const int64_t* index,
            const int32_t* tables, int32_t* out);
  const float* logits() const { return logits_; }  // [last_rows, vocab] of the last step
  int last_rows() const { return nw_; }
  const DecConfig& config() const { return c_; }
  Isa isa() const { return isa_; }  // as chosen (avxvnni runs the AVX2 decoder kernels)
  int nthreads() const { return nthreads_; }
  size_t weights_bytes() const { return weights_bytes_; }
  size_t kv_bytes() const { return kv_bytes_; }

 private:
  enum Kind { EMBED, NORM, LIN, QKVP, ATTN, MERGE, SILU, SAMPLE, QUANT, GEMM8 };
  // a w8a8 linear: weights packed by the kernel table (pack_i8), colsum, scale and bias [Npad]
  struct Lin8 {
    AlignedBuf w, colsum, scale, bias;
    int N = 0, K = 0, Kp = 0;
  };
  struct Op {
    Kind kind;
    int parts = 1;
    DecLinear lin;
    GemmI8Args gi;
    QuantOut qo;
    const float* qx = nullptr;
    int qldx = 0, qM = 0, qK = 0;
    DecNorm nrm;
    DecQkvPost qp;
    DecAttn at;
  };
  struct alignas(64) Sync {
    std::atomic<int> next{0};
    alignas(64) std::atomic<int> done{0};
  };
  static void job(void* self, int tid, int nt);
  void exec(const Op& op, int part);
  void sample_row(int w);
  float* slot(int layer, int id);
  int slot_id(const std::string& s) const;

  DecConfig c_;
  const DecKernels* dk_;
  Isa isa_ = Isa::Scalar;
  const KernelTable* kt_;
  std::vector<Lin8> lin8_;  // [layers + 1][4]: qkv, o, gu, d (lm_head in the last row's first)
  AlignedBuf qbuf_, qscale_, qzp_;
  Lin8& lin8(int layer, int w_id);
  int nthreads_ = 1;
  size_t weights_bytes_ = 0, kv_bytes_ = 0;
  std::vector<AlignedBuf> bufs_;      // [layers + 1][slots]
  std::vector<size_t> buf_bytes_;
  AlignedBuf kv_, scratch_, sidx_, scum_;
  float *xa_, *xb_, *hn_, *qkv_, *ctx_, *gu_, *act_, *xg_, *logits_, *part_;
  int32_t *pos_, *row_, *gidx_;
  std::vector<Op> ops_;
  size_t max_ops_ = 0;
  std::unique_ptr<Sync[]> sync_;
  std::mutex mu_;
  bool finalized_ = false;
  // per step
  const int32_t* ids_ = nullptr;
  int T_ = 0, nw_ = 0;
  int wsrc_[1024];
  const double* samp_ = nullptr;
  const uint64_t* seeds_ = nullptr;
  const int64_t* index_ = nullptr;
  int32_t* out_ = nullptr;
};

}  // namespace zoi
