// Native byte-level BPE tokenizer (GPT-2, RoBERTa, Llama-3, Qwen2/Qwen3), exact to HF
// `tokenizers` for the configurations zoi.frontend.bpe accepts: normalizer NFC or none;
// pre-tokenizer ByteLevel after any number of Split(regex, Isolated) steps, each regex one
// of the three below (matched by hand, not by a regex engine); model BPE over the 256 byte
// symbols (vocab + merges, ignore_merges, [UNK] or dropped unknown bytes, no dropout);
// added tokens matched in the raw text (normalized=false) or in the normalised text
// (normalized=true), leftmost-longest, with lstrip / rstrip (not single_word); a template
// "head $A tail".
//
// The Unicode classes (\p{L}, \p{N}, \s as HF's Oniguruma matches them) and the NFC tables
// come from csrc/tokenizer/unicode_tables.h (scripts/gen_unicode_tables.py, HF's answers
// probed codepoint by codepoint). Read-only after construction, except a per-token memo
// written with relaxed atomics (each thread also keeps its own cache of recent words,
// tagged with the tokenizer's serial): encode() may run on any number of threads at once.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/added.h"
#include "tokenizer/encoder.h"
#include "tokenizer/merges.h"

namespace zoi::tok {

// The pre-tokenizer regexes, by the files that use them.
enum SplitKind : int {
  // Qwen2 / Qwen3:
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kSplitQwen2 = 0,
  // Llama-3: the same with \p{N}{1,3}
  kSplitLlama3 = 1,
  // GPT-2 (ByteLevel's use_regex): 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kSplitGpt2 = 2,
};

struct BpeConfig {
  std::vector<int> splits;  // SplitKind, applied in order (each to the pieces of the one before)
  bool nfc = false;
  bool ignore_merges = false;
  int32_t unk_id = -1;  // a byte without a symbol: [UNK] (-1: dropped, as HF without unk_token)
  bool fuse_unk = false;
  std::vector<int32_t> head, tail;  // post-processor ids around the sequence
  int max_len = 512;                // the model's limit, special tokens included
};

struct BpeScratch;  // per-thread work buffers (thread_local inside encode)

class ByteBPE final : public TextEncoder {
 public:
  // vocab[i] (byte-level string, as in tokenizer.json) has id ids[i]; merges: "a b" strings
  // (paired=false) or a, b flattened (paired=true), in rank order. added (raw-text tokens)
  // has ids added_ids and AddedSet flags added_flags; norm_added (matched after
  // normalisation, their contents normalised here) likewise. No added token may start with
  // whitespace when one of its set strips (the caller checks). Throws std::invalid_argument
  // where HF would refuse the file (a merge outside the vocab).
  ByteBPE(const std::vector<std::string>& vocab, const std::vector<int32_t>& ids,
          const std::vector<std::string>& merges, bool paired, const std::vector<std::string>& added,
          const std::vector<int32_t>& added_ids, const std::vector<int>& added_flags,
          const std::vector<std::string>& norm_added, const std::vector<int32_t>& norm_added_ids,
          const std::vector<int>& norm_added_flags, BpeConfig cfg);
  ~ByteBPE() override;

  bool encode(const char* s, size_t n, bool truncate, std::vector<int32_t>& out, int max_len = 0) const override;
  int num_special() const override { return static_cast<int>(cfg_.head.size() + cfg_.tail.size()); }

  const BpeConfig& config() const { return cfg_; }
  size_t vocab_size() const { return nvocab_; }
  // the normaliser alone (NFC or the identity), and the pre-tokenizer's pieces of a text
  std::string normalize(const std::string& s) const;
  std::vector<std::string> pre_tokenize(const std::string& s) const;

 private:
  int32_t find_bytes(const uint8_t* p, size_t n, uint64_t h) const;  // vocab entry index, or -1
  void add_bytes(const std::string& b, int32_t id);
  void bpe(const uint8_t* w, size_t n, std::vector<int32_t>& pieces, BpeScratch& sc) const;
  void word(const uint8_t* w, size_t n, BpeScratch& sc) const;
  void split(size_t stage, const uint8_t* s, size_t n, BpeScratch& sc) const;
  void segment(const uint8_t* s, size_t n, BpeScratch& sc) const;
  void nfc(const uint8_t* s, size_t n, std::string& out, std::vector<uint32_t>& run) const;
  // s[0, n) with the tokens of `set` taken out: their ids to the output, the texts between
  // them to segment() (raw) or to the pre-tokenizer (normalised)
  void take_added(const AddedSet& set, const uint8_t* s, size_t n, bool raw, BpeScratch& sc) const;

  BpeConfig cfg_;
  size_t nvocab_ = 0;
  uint64_t serial_;  // this tokenizer, for the per-thread word cache (never reused)
  int32_t byte_id_[256];
  // the vocab entries made of byte-level symbols, by their bytes: open addressing, a slot
  // holding the upper half of the hash (checked before the bytes) << 32 | entry index + 1
  // (0: empty)
  struct Entry {
    uint32_t off, len;  // bytes in arena_
    int32_t id;
  };
  std::string arena_;
  std::vector<Entry> entries_;
  std::vector<uint64_t> slots_;
  size_t smask_ = 0;
  // whether BPE of an entry's bytes gives that entry alone: 0 unknown, 1 yes, 2 no; a memo
  // every thread may fill (the answer is the same whoever computes it)
  std::unique_ptr<std::atomic<uint8_t>[]> self_;
  // merges: (a, b) -> rank, new id
  MergeTable merges_;
  AddedSet added_, norm_added_;
};

}  // namespace zoi::tok
