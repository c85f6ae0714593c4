#include "tokenizer/wordpiece.h"

#include <algorithm>
#include <stdexcept>

#include "tokenizer/unicode_tables.h"
#include "tokenizer/utf8.h"

namespace zoi::tok {
namespace {

using utf8::next_cp;
using utf8::props;
using utf8::put_utf8;

template <class T, size_t N>
int find_sorted(const T (&a)[N], uint32_t cp) {
  const T* p = std::lower_bound(a, a + N, cp);
  return p != a + N && *p == cp ? static_cast<int>(p - a) : -1;
}

}  // namespace

struct Scratch {
  std::string word;
  int word_chars = 0;
  std::vector<uint32_t> run;  // combining marks waiting for canonical reordering (ccc << 24 | cp)
  std::vector<int32_t> pieces;  // one word's pieces
  std::vector<int32_t>* out = nullptr;
  int count = 0;  // content tokens so far
  int limit = 0;
  bool truncate = true;
  bool stop = false;  // limit reached (truncate) or passed (no truncate)
  bool over = false;
};

WordPiece::WordPiece(const std::vector<std::string>& vocab, const std::vector<int32_t>& ids,
                     const std::vector<std::string>& added, const std::vector<int32_t>& added_ids, Config cfg)
    : cfg_(std::move(cfg)) {
  if (vocab.size() != ids.size()) throw std::invalid_argument("vocab and ids differ in length");
  if (added.size() != added_ids.size()) throw std::invalid_argument("added and added_ids differ in length");
  if (cfg_.max_len < num_special()) throw std::invalid_argument("max_len is smaller than the special tokens");
  std::fill(std::begin(root_children_), std::end(root_children_), -1);
  term_.push_back(-1);  // root
  keys_.assign(1024, 0);
  vals_.assign(1024, 0);
  shift_ = 64 - 10;
  int32_t maxid = cfg_.unk_id;
  for (size_t i = 0; i < vocab.size(); ++i) {
    if (ids[i] < 0) throw std::invalid_argument("negative token id");
    if (!vocab[i].empty()) insert(vocab[i], ids[i]);
    maxid = std::max(maxid, ids[i]);
  }
  for (size_t i = 0; i < added.size(); ++i) {
    if (added[i].empty()) continue;
    if (added_ids[i] < 0) throw std::invalid_argument("negative token id");
    added_.push_back(added[i]);
    added_ids_.push_back(added_ids[i]);
    added_first_[static_cast<uint8_t>(added[i][0])] = true;
    maxid = std::max(maxid, added_ids[i]);
  }
  for (int32_t v : cfg_.head) maxid = std::max(maxid, v);
  for (int32_t v : cfg_.tail) maxid = std::max(maxid, v);
  nvocab_ = static_cast<size_t>(maxid) + 1;
  int node = 0;
  for (char c : cfg_.prefix) {
    node = child(node, static_cast<uint8_t>(c));
    if (node < 0) break;
  }
  cont_root_ = node;
}

int WordPiece::child(int node, uint8_t b) const {
  if (node == 0) return root_children_[b];
  const uint64_t key = ((static_cast<uint64_t>(node) << 8) | b) + 1;
  const size_t mask = keys_.size() - 1;
  for (size_t h = (key * 0x9E3779B97F4A7C15ull) >> shift_;; h = (h + 1) & mask) {
    if (keys_[h] == key) return vals_[h];
    if (keys_[h] == 0) return -1;
  }
}

void WordPiece::grow() {
  std::vector<uint64_t> ok = std::move(keys_);
  std::vector<int32_t> ov = std::move(vals_);
  keys_.assign(ok.size() * 2, 0);
  vals_.assign(ok.size() * 2, 0);
  --shift_;
  const size_t mask = keys_.size() - 1;
  for (size_t i = 0; i < ok.size(); ++i) {
    if (!ok[i]) continue;
    size_t h = (ok[i] * 0x9E3779B97F4A7C15ull) >> shift_;
    while (keys_[h]) h = (h + 1) & mask;
    keys_[h] = ok[i];
    vals_[h] = ov[i];
  }
}

int WordPiece::add_child(int node, uint8_t b) {
  int c = child(node, b);
  if (c >= 0) return c;
  c = static_cast<int>(term_.size());
  term_.push_back(-1);
  if (node == 0) {
    root_children_[b] = c;
    return c;
  }
  if ((nedges_ + 1) * 2 > keys_.size()) grow();
  const uint64_t key = ((static_cast<uint64_t>(node) << 8) | b) + 1;
  const size_t mask = keys_.size() - 1;
  size_t h = (key * 0x9E3779B97F4A7C15ull) >> shift_;
  while (keys_[h]) h = (h + 1) & mask;
  keys_[h] = key;
  vals_[h] = c;
  ++nedges_;
  return c;
}

void WordPiece::insert(const std::string& s, int32_t id) {
  int node = 0;
  for (char c : s) node = add_child(node, static_cast<uint8_t>(c));
  if (term_[node] < 0) term_[node] = id;  // a duplicate string keeps its first id
}

// HF WordPiece::tokenize: greedy longest match from the left, "##" before non-initial pieces,
// the whole word [UNK] if some position has no match or the word is too long.
bool WordPiece::word(const char* w, size_t n, int nchars, Scratch& sc) const {
  std::vector<int32_t>& pieces = sc.pieces;
  pieces.clear();
  if (nchars > cfg_.max_input_chars_per_word) {
    pieces.push_back(cfg_.unk_id);
  } else {
    for (size_t start = 0; start < n;) {
      int node = start == 0 ? 0 : cont_root_;
      int32_t best = -1;
      size_t best_end = start;
      for (size_t i = start; i < n && node >= 0; ++i) {
        node = child(node, static_cast<uint8_t>(w[i]));
        if (node >= 0 && term_[node] >= 0) {
          best = term_[node];
          best_end = i + 1;
        }
      }
      if (best < 0) {  // no piece here: the whole word is [UNK]
        pieces.clear();
        pieces.push_back(cfg_.unk_id);
        break;
      }
      pieces.push_back(best);
      start = best_end;
    }
  }
  for (int32_t id : pieces) {
    if (sc.count == sc.limit) {  // HF truncates the finished encoding: the first pieces stay
      sc.stop = true;
      sc.over = !sc.truncate;
      return false;
    }
    sc.out->push_back(id);
    ++sc.count;
  }
  return true;
}

bool WordPiece::segment(const char* s8, size_t n, Scratch& sc) const {
  const uint8_t* s = reinterpret_cast<const uint8_t*>(s8);
  const Config& c = cfg_;
  sc.word.clear();
  sc.word_chars = 0;
  sc.run.clear();
  auto end_word = [&]() {
    if (sc.word_chars == 0) return;
    word(sc.word.data(), sc.word.size(), sc.word_chars, sc);
    sc.word.clear();
    sc.word_chars = 0;
  };
  // pre-tokenizer (BertPreTokenizer): split on whitespace, isolate punctuation
  auto pre = [&](uint32_t cp) {
    const uint16_t p = props(cp);
    if (p & uni::F_WS) {
      end_word();
    } else if (p & uni::F_PUNCT) {
      end_word();
      if (sc.stop) return;
      put_utf8(sc.word, cp);
      sc.word_chars = 1;
      end_word();
    } else {  // past max_input_chars_per_word the word is [UNK]: count, keep no more bytes
      if (sc.word_chars < c.max_input_chars_per_word) put_utf8(sc.word, cp);
      ++sc.word_chars;
    }
  };
  auto lower = [&](uint32_t cp) {
    if (c.lowercase && (props(cp) & uni::F_LOWER)) {
      int k = find_sorted(uni::kLowerCp, cp);
      if (k >= 0) return pre(uni::kLowerTo[k]);
      k = find_sorted(uni::kLowerMultiCp, cp);
      if (k >= 0) {
        for (int j = uni::kLowerMultiOff[k]; j < uni::kLowerMultiOff[k + 1]; ++j) pre(uni::kLowerMultiData[j]);
        return;
      }
    }
    pre(cp);
  };
  // strip_accents: NFD (canonical reordering of each run of marks), then drop nonspacing marks
  auto flush_run = [&]() {
    if (sc.run.empty()) return;
    if (sc.run.size() > 1)
      std::stable_sort(sc.run.begin(), sc.run.end(), [](uint32_t a, uint32_t b) { return (a >> 24) < (b >> 24); });
    for (uint32_t v : sc.run) {
      const uint32_t cp = v & 0xFFFFFF;
      if (!(props(cp) & uni::F_MN)) lower(cp);
    }
    sc.run.clear();
  };
  auto nfd_part = [&](uint32_t cp) {
    const uint16_t p = props(cp);
    const uint32_t ccc = p >> 8;
    if (ccc == 0) {
      flush_run();
      if (!(p & uni::F_MN)) lower(cp);
    } else {
      sc.run.push_back(ccc << 24 | cp);
    }
  };
  auto accents = [&](uint32_t cp) {
    if (!c.strip_accents) return lower(cp);
    if (cp >= 0xAC00 && cp <= 0xD7A3) {  // Hangul syllable: algorithmic decomposition
      const uint32_t si = cp - 0xAC00;
      nfd_part(0x1100 + si / 588);
      nfd_part(0x1161 + (si % 588) / 28);
      if (si % 28) nfd_part(0x11A7 + si % 28);
      return;
    }
    if (props(cp) & uni::F_DECOMP) {
      const int k = find_sorted(uni::kDecompCp, cp);
      if (k >= 0) {
        for (int j = uni::kDecompOff[k]; j < uni::kDecompOff[k + 1]; ++j) nfd_part(uni::kDecompData[j]);
        return;
      }
    }
    nfd_part(cp);
  };
  size_t i = 0;
  while (i < n && !sc.stop) {
    uint32_t cp;
    if (s[i] < 0x80) {  // ASCII: no decomposition, class 0, not a mark
      if (!sc.run.empty()) flush_run();
      if (sc.stop) break;
      cp = s[i++];
      if (c.lowercase && cp - 'A' < 26u) cp += 32;
      const uint16_t p = props(cp);
      if (c.clean_text && (p & uni::F_DROP)) continue;
      pre(cp);
      continue;
    }
    cp = next_cp(s, n, i);
    const uint16_t p = props(cp);
    if (c.clean_text) {
      if (p & uni::F_DROP) continue;
      if (p & uni::F_WS) cp = ' ';
    }
    if (c.handle_chinese_chars && (p & uni::F_CJK)) {
      accents(' ');
      accents(cp);
      accents(' ');
    } else {
      accents(cp);
    }
  }
  if (!sc.stop) flush_run();
  if (!sc.stop) end_word();
  return !sc.over;
}

size_t WordPiece::match_added(const char* s, size_t n, size_t at, int32_t* id) const {
  size_t best = 0;
  for (size_t k = 0; k < added_.size(); ++k) {
    const std::string& a = added_[k];
    if (a.size() > best && a.size() <= n - at && std::equal(a.begin(), a.end(), s + at)) {
      best = a.size();
      *id = added_ids_[k];
    }
  }
  return best;
}

bool WordPiece::encode(const char* s, size_t n, bool truncate, std::vector<int32_t>& out, int max_len) const {
  thread_local Scratch sc;
  sc.out = &out;
  sc.count = 0;
  sc.limit = std::max(0, (max_len > 0 ? max_len : cfg_.max_len) - num_special());
  sc.truncate = truncate;
  sc.stop = sc.over = false;
  out.insert(out.end(), cfg_.head.begin(), cfg_.head.end());
  // added tokens in the raw text, leftmost-longest; the text between them is tokenised
  size_t seg = 0;
  if (!added_.empty()) {
    for (size_t i = 0; i < n && !sc.stop;) {
      int32_t id;
      const size_t len = added_first_[static_cast<uint8_t>(s[i])] ? match_added(s, n, i, &id) : 0;
      if (!len) {
        ++i;
        continue;
      }
      if (i > seg) segment(s + seg, i - seg, sc);
      if (sc.stop) break;
      if (sc.count == sc.limit) {
        sc.stop = true;
        sc.over = !truncate;
        break;
      }
      out.push_back(id);
      ++sc.count;
      i += len;
      seg = i;
    }
  }
  if (!sc.stop && seg < n) segment(s + seg, n - seg, sc);
  if (sc.over) return false;
  out.insert(out.end(), cfg_.tail.begin(), cfg_.tail.end());
  return true;
}

}  // namespace zoi::tok
