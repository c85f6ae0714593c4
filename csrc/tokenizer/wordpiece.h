// Native WordPiece tokenizer (BERT family), exact to HF `tokenizers` for the configurations
// zoi.frontend.wordpiece accepts: BertNormalizer (clean_text, handle_chinese_chars,
// strip_accents, lowercase), BertPreTokenizer, WordPiece (continuing-subword prefix,
// max_input_chars_per_word, [UNK]), added tokens matched in the raw text (leftmost-longest,
// normalized=false, no single_word/lstrip/rstrip) and a template "head $A tail".
//
// The Unicode tables (csrc/tokenizer/unicode_tables.h) are generated and checked against HF
// on every codepoint by scripts/gen_unicode_tables.py. Read-only after construction: encode()
// may run on any number of threads at once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/encoder.h"

namespace zoi::tok {

struct Config {
  bool clean_text = true;
  bool handle_chinese_chars = true;
  bool strip_accents = true;
  bool lowercase = true;
  std::string prefix = "##";
  int max_input_chars_per_word = 100;
  int32_t unk_id = 0;
  std::vector<int32_t> head, tail;  // post-processor ids around the sequence
  int max_len = 512;                // the model's limit, special tokens included
};

struct Scratch;  // per-thread work buffers (thread_local inside encode)

class WordPiece final : public TextEncoder {
 public:
  // vocab[i] has id ids[i]; added[i] (raw-text tokens) has id added_ids[i]
  WordPiece(const std::vector<std::string>& vocab, const std::vector<int32_t>& ids,
            const std::vector<std::string>& added, const std::vector<int32_t>& added_ids, Config cfg);

  // Tokenise one UTF-8 text (valid UTF-8), appending its ids (head + content + tail) to out.
  // truncate: content cut to max_len - specials (max_len <= 0: the config's). Else a text over
  // the limit returns false (out then holds a partial sequence; the caller drops it).
  bool encode(const char* s, size_t n, bool truncate, std::vector<int32_t>& out, int max_len = 0) const override;

  const Config& config() const { return cfg_; }
  int num_special() const override { return static_cast<int>(cfg_.head.size() + cfg_.tail.size()); }
  size_t vocab_size() const { return nvocab_; }

 private:
  // trie over the bytes of the vocabulary: children in one open-addressed table
  int child(int node, uint8_t b) const;
  int add_child(int node, uint8_t b);
  void insert(const std::string& s, int32_t id);
  void grow();
  // WordPiece on one pre-token (UTF-8 bytes, nchars codepoints); false once the limit is hit
  bool word(const char* w, size_t n, int nchars, Scratch& sc) const;
  // normalise + pre-tokenise + WordPiece one segment between added tokens
  bool segment(const char* s, size_t n, Scratch& sc) const;
  size_t match_added(const char* s, size_t n, size_t at, int32_t* id) const;

  Config cfg_;
  size_t nvocab_ = 0;
  std::vector<int32_t> term_;     // id of the vocab entry ending at a node, or -1
  std::vector<uint64_t> keys_;    // (node << 8 | byte) + 1, 0 = empty
  std::vector<int32_t> vals_;     // child node
  int root_children_[256];
  size_t nedges_ = 0;
  int shift_ = 64;
  int cont_root_ = -1;  // the node of the continuing-subword prefix (-1: none in the vocab)
  std::vector<std::string> added_;
  std::vector<int32_t> added_ids_;
  bool added_first_[256] = {};
};

}  // namespace zoi::tok
