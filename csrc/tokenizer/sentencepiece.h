// Native SentencePiece-family tokenizer: Unigram (XLM-R, BGE-M3, jina-embeddings-v3,
// multilingual-e5) and SentencePiece BPE (Gemma, EmbeddingGemma, Llama-2), exact to HF
// `tokenizers` for the configurations zoi.frontend.sentencepiece accepts:
// - normalizer: a sequence of Precompiled (sentencepiece's precompiled charsmap, read as HF's
//   spm_precompiled reads it: extended grapheme clusters of unicode-segmentation, a cluster of
//   under 6 bytes replaced by the shortest key that prefixes it, else each character by its
//   own key), Replace (a literal, or one of the space regexes transformers writes), Strip,
//   Prepend; or none;
// - pre-tokenizer: WhitespaceSplit, Split (a literal, any behaviour but Contiguous) and
//   Metaspace (prepend_scheme always / first / never, split or not) in sequence, or none;
// - model Unigram (Viterbi over the vocabulary, HF's tie order and unknown-character penalty,
//   unknown runs fused, byte_fallback) or BPE over characters (merges by rank, byte_fallback
//   to <0xXX> tokens, unk_token / fuse_unk, ignore_merges);
// - added tokens in the raw or the normalised text, leftmost-longest, lstrip / rstrip;
// - a template "head $A tail".
// Read-only after construction (each thread keeps its own cache of recent words, tagged with
// the tokenizer's serial): encode() may run on any number of threads at once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/encoder.h"

namespace zoi::tok {

// sentencepiece's precompiled_charsmap: [u32 trie bytes][darts-clone double array][NUL-ended
// replacements], looked up as HF's spm_precompiled does
class Charsmap {
 public:
  // false (and *err) when the blob is malformed or its replacements are not UTF-8
  bool load(const std::string& blob, std::string* err);
  // the replacement of the shortest key that prefixes s[0, n) (the search stops at a NUL
  // byte), or false
  bool transform(const uint8_t* s, size_t n, const char** rep, size_t* len) const;
  // the normalised text appended to out
  void normalize(const uint8_t* s, size_t n, std::string& out) const;

 private:
  std::vector<uint32_t> array_;
  std::string normalized_;
  int32_t ascii_off_[128];  // replacement of each ASCII byte alone: offset, -1 none
  uint32_t ascii_len_[128];
};

// one normalizer step
struct NormStep {
  enum Kind : int {
    kPrecompiled = 0,  // charsmap
    kReplace = 1,      // literal a -> b
    kSpaces = 2,       // runs of at least n ASCII spaces -> b (" {2,}", " +")
    kEdgeSpaces = 3,   // leading and trailing runs of ASCII spaces -> b ("\A +| +\z")
    kLead = 4,         // a at the start of the text -> b ("\A▁")
    kStrip = 5,        // whitespace stripped: n & 1 left, n & 2 right
    kPrepend = 6,      // a before a non-empty text
  };
  int kind = 0;
  std::string a, b;
  int n = 0;
};

// one pre-tokenizer step
struct PreStep {
  enum Kind : int {
    kWhitespaceSplit = 0,
    kSplit = 1,      // literal a, behaviour n (SplitBehavior)
    kMetaspace = 2,  // replacement a; n = prepend scheme (0 always, 1 first, 2 never); split
  };
  enum SplitBehavior : int { kRemoved = 0, kIsolated = 1, kMergedWithPrevious = 2, kMergedWithNext = 3 };
  int kind = 0;
  std::string a;
  int n = 0;
  bool split = true;
};

struct SpConfig {
  bool unigram = true;  // else BPE over characters
  std::vector<NormStep> norm;
  std::vector<PreStep> pre;
  int32_t unk_id = -1;     // Unigram: unk_id (required); BPE: unk_token's id or -1
  bool byte_fallback = false;
  bool fuse_unk = false;   // BPE (Unigram always fuses)
  bool ignore_merges = false;
  // BPE: a word may be cut before each occurrence of `cut` that follows another character
  // (the caller checked that no merge joins across such a point); empty: never
  std::string cut;
  std::vector<int32_t> head, tail;
  int max_len = 512;
};

struct SpScratch;

class SentencePiece final : public TextEncoder {
 public:
  // vocab[i] has id ids[i] and (Unigram) score scores[i]; merges (BPE): left, right
  // flattened in rank order; charsmap: the Precompiled step's blob (kPrecompiled steps use
  // it); added / norm_added as in ByteBPE. Throws std::invalid_argument where HF would
  // refuse the file.
  SentencePiece(const std::vector<std::string>& vocab, const std::vector<int32_t>& ids,
                const std::vector<double>& scores, const std::vector<std::string>& merges,
                const std::string& charsmap, const std::vector<std::string>& added,
                const std::vector<int32_t>& added_ids, const std::vector<int>& added_flags,
                const std::vector<std::string>& norm_added, const std::vector<int32_t>& norm_added_ids,
                const std::vector<int>& norm_added_flags, SpConfig cfg);
  ~SentencePiece() override;

  bool encode(const char* s, size_t n, bool truncate, std::vector<int32_t>& out, int max_len = 0) const override;
  int num_special() const override { return static_cast<int>(cfg_.head.size() + cfg_.tail.size()); }

  const SpConfig& config() const { return cfg_; }
  size_t vocab_size() const { return nvocab_; }
  std::string normalize(const std::string& s) const;
  std::vector<std::string> pre_tokenize(const std::string& s) const;

 private:
  // vocabulary trie: a double array over bytes; node 0 is the root, a child of s by byte c
  // is base[s] + c (check == s); term >= 0 on a node that ends a vocabulary entry (its id)
  struct DaNode {
    int32_t base, check, term;
  };
  void build_trie(const std::vector<std::pair<std::string, int32_t>>& keys);
  int32_t find(const uint8_t* s, size_t n) const;  // exact entry id, or -1
  void normalize_into(const uint8_t* s, size_t n, std::string& out, std::string& tmp) const;
  void take_added(const AddedSet& set, const uint8_t* s, size_t n, bool raw, bool at0, SpScratch& sc) const;
  void segment(const uint8_t* s, size_t n, bool at0, SpScratch& sc) const;
  void pre(size_t stage, const uint8_t* s, size_t n, bool at0, SpScratch& sc) const;
  void word(const uint8_t* w, size_t n, SpScratch& sc) const;
  void emit(const int32_t* ids, size_t k, SpScratch& sc) const;
  void unigram(const uint8_t* w, size_t n, std::vector<int32_t>& out, SpScratch& sc) const;
  void unk_run(const uint8_t* w, size_t n, std::vector<int32_t>& out) const;
  void bpe(const uint8_t* w, size_t n, std::vector<int32_t>& out, SpScratch& sc) const;
  int32_t char_id(const uint8_t* p, size_t len) const;

  SpConfig cfg_;
  Charsmap charsmap_;
  bool has_charsmap_ = false;
  size_t nvocab_ = 0;
  uint64_t serial_;
  std::vector<DaNode> da_;
  std::vector<double> score_;  // by id (Unigram)
  double unk_score_ = 0;
  int32_t byte_id_[256];       // <0xXX> tokens (-1: none)
  bool all_bytes_ = false;
  // BPE: single characters' ids (ASCII direct), merges (a, b) -> rank, new id
  int32_t ascii_id_[128];
  MergeTable merges_;
  std::string cut_;  // SpConfig::cut
  AddedSet added_, norm_added_;
};

}  // namespace zoi::tok
