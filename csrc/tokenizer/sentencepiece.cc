#include "tokenizer/sentencepiece.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <unordered_map>

#include "tokenizer/grapheme_tables.h"
#include "tokenizer/unicode_tables.h"
#include "tokenizer/utf8.h"

namespace zoi::tok {
namespace {

using utf8::next_cp;
using utf8::props;

inline size_t cp_len(uint8_t c) { return c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1; }

// ---- extended grapheme clusters, as unicode-segmentation (the version HF builds with) ----

inline uint8_t gc(uint32_t cp) {
  return gr::kGcStage2[static_cast<size_t>(gr::kGcStage1[cp >> 8]) * 256 + (cp & 255)];
}

// End of the extended grapheme cluster that starts at i (< n). The pair rules of
// unicode-segmentation's GraphemeCursor, in its order; the look-behind of GB9c (a consonant,
// then linkers and InCB extenders with at least one linker), GB11 (a pictographic, Extend*,
// ZWJ) and GB12/13 (the parity of regional indicators) never reaches before the cluster's
// start, so it is kept as state from there.
size_t grapheme_end(const uint8_t* s, size_t n, size_t i) {
  size_t j = i;
  uint8_t f = gc(next_cp(s, n, j));
  uint8_t before = f & gr::kCatMask;
  bool cons = before == gr::kConsonant;  // the last non-linker, non-InCB-extend was a consonant
  int linkers = 0;
  bool pict = before == gr::kPict;  // the last non-Extend was a pictographic
  bool zwj_pict = false;            // (before is ZWJ) and a pictographic, Extend* came before it
  int ris = before == gr::kRI ? 1 : 0;
  while (j < n) {
    size_t k = j;
    const uint8_t g = gc(next_cp(s, n, k));
    const uint8_t after = g & gr::kCatMask;
    bool join;
    if (before == gr::kCR && after == gr::kLF) join = true;                                   // GB3
    else if (before == gr::kControl || before == gr::kCR || before == gr::kLF) join = false;  // GB4
    else if (after == gr::kControl || after == gr::kCR || after == gr::kLF) join = false;     // GB5
    else if (before == gr::kL && (after == gr::kL || after == gr::kV || after == gr::kLV || after == gr::kLVT))
      join = true;  // GB6
    else if ((before == gr::kLV || before == gr::kV) && (after == gr::kV || after == gr::kT)) join = true;  // GB7
    else if ((before == gr::kLVT || before == gr::kT) && after == gr::kT) join = true;                     // GB8
    else if (after == gr::kExtend || after == gr::kZWJ) join = true;                                     // GB9
    else if (after == gr::kSpacingMark) join = true;                                                     // GB9a
    else if (before == gr::kPrepend) join = true;                                                        // GB9b
    else if (after == gr::kConsonant) join = cons && linkers > 0;                                        // GB9c
    else if (before == gr::kZWJ && after == gr::kPict) join = zwj_pict;                                  // GB11
    else if (before == gr::kRI && after == gr::kRI) join = (ris & 1) != 0;                               // GB12/13
    else join = false;
    if (!join) return j;
    // the state after the character at j
    if (g & gr::kLinker) ++linkers;
    else if (!(g & gr::kInCBExtend)) {
      cons = after == gr::kConsonant;
      linkers = 0;
    }
    zwj_pict = after == gr::kZWJ && pict;
    if (after == gr::kPict) pict = true;
    else if (after != gr::kExtend) pict = false;
    ris = after == gr::kRI ? ris + 1 : 0;
    before = after;
    j = k;
  }
  return n;
}

inline uint64_t hash_bytes(const uint8_t* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
    p += 8;
    n -= 8;
  }
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  h = (h ^ v) * 0x94d049bb133111ebull;
  return h ^ (h >> 29);
}

inline bool is_ws(uint32_t cp) { return (props(cp) & uni::F_WS) != 0; }  // Rust's char::is_whitespace

std::atomic<uint64_t> g_serial{1};

inline bool same_bytes(const uint8_t* a, const uint8_t* b, size_t n) {
  while (n >= 8) {
    uint64_t x, y;
    std::memcpy(&x, a, 8);
    std::memcpy(&y, b, 8);
    if (x != y) return false;
    a += 8;
    b += 8;
    n -= 8;
  }
  while (n--)
    if (*a++ != *b++) return false;
  return true;
}

// model results of recent words, per thread: two-way sets (the one hit last is kept), short
// words with few pieces, tagged with the tokenizer they belong to
struct WordCache {
  static constexpr size_t kSets = 4096, kBytes = 32, kIds = 12;
  struct Slot {
    uint64_t h = 0;
    uint64_t owner = 0;  // 0: empty
    uint8_t len = 0, nids = 0;
    uint8_t bytes[kBytes];
    int32_t ids[kIds];
  };
  std::vector<Slot> slots;
  std::vector<uint8_t> mru;  // per set: the slot hit or filled last
  const Slot* find(uint64_t owner, uint64_t h, const uint8_t* w, size_t n) {
    if (slots.empty()) {
      slots.resize(2 * kSets);
      mru.assign(kSets, 0);
    }
    const size_t set = h & (kSets - 1);
    for (size_t k = 0; k < 2; ++k) {
      const Slot& s = slots[2 * set + k];
      if (s.owner == owner && s.h == h && s.len == n && same_bytes(s.bytes, w, n)) {
        mru[set] = static_cast<uint8_t>(k);
        return &s;
      }
    }
    return nullptr;
  }
  void put(uint64_t owner, uint64_t h, const uint8_t* w, size_t n, const int32_t* ids, size_t k) {
    if (n > kBytes || k > kIds) return;
    const size_t set = h & (kSets - 1);
    const uint8_t way = mru[set] ^ 1;
    mru[set] = way;
    Slot& s = slots[2 * set + way];
    s.owner = owner;
    s.h = h;
    s.len = static_cast<uint8_t>(n);
    s.nids = static_cast<uint8_t>(k);
    std::memcpy(s.bytes, w, n);
    std::memcpy(s.ids, ids, k * sizeof(int32_t));
  }
};

}  // namespace

struct SpScratch {
  WordCache cache;
  std::string norm, tmp, pre;    // normalised segment, normalizer scratch, Metaspace's piece
  std::vector<int32_t> pieces;   // one word's ids
  struct Best {
    double score;
    int32_t start;  // -1: not reached
    int32_t id;
  };
  std::vector<Best> best;  // Unigram: best path ending at each byte
  std::vector<int32_t> path;
  std::vector<int32_t> sym;  // BPE symbols
  MergeScratch merge;         // long words' merge buffers
  std::vector<std::string>* collect = nullptr;  // pre_tokenize(): the words, not their ids
  std::vector<int32_t>* out = nullptr;
  int count = 0;
  int limit = 0;
  bool truncate = true;
  bool stop = false;
  bool over = false;

  void trim() {
    constexpr size_t kKeep = 1 << 16;
    auto drop = [](auto& v) {
      if (v.capacity() > kKeep) std::decay_t<decltype(v)>().swap(v);
    };
    drop(norm);
    drop(tmp);
    drop(pre);
    drop(pieces);
    drop(best);
    drop(path);
    drop(sym);
    drop(merge.hs);
    drop(merge.heap);
  }
};

// ---- the precompiled charsmap ----

bool Charsmap::load(const std::string& blob, std::string* err) {
  if (blob.size() < 4) {
    *err = "precompiled_charsmap shorter than its header";
    return false;
  }
  uint32_t trie_bytes;
  std::memcpy(&trie_bytes, blob.data(), 4);  // little-endian hosts only (x86-64, aarch64)
  const size_t units = trie_bytes / 4;
  if (4 + static_cast<size_t>(units) * 4 > blob.size()) {
    *err = "precompiled_charsmap trie longer than the blob";
    return false;
  }
  array_.resize(units);
  if (units) std::memcpy(array_.data(), blob.data() + 4, units * 4);
  normalized_ = blob.substr(4 + units * 4);
  // the replacements must be UTF-8 (HF refuses the file otherwise)
  const uint8_t* p = reinterpret_cast<const uint8_t*>(normalized_.data());
  for (size_t i = 0, n = normalized_.size(); i < n;) {
    const uint8_t c = p[i];
    const size_t len = cp_len(c);
    bool ok = (c < 0x80 || (c >= 0xC2 && c < 0xF5)) && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xC0) == 0x80;
    if (ok && len > 1) {
      size_t j = i;
      const uint32_t cp = next_cp(p, n, j);
      ok = !(cp >= 0xD800 && cp < 0xE000) && cp < 0x110000 && (len == 2 || cp >= (len == 3 ? 0x800u : 0x10000u));
    }
    if (!ok) {
      *err = "precompiled_charsmap replacements are not UTF-8";
      return false;
    }
    i += len;
  }
  for (int b = 0; b < 128; ++b) {
    const uint8_t c = static_cast<uint8_t>(b);
    const char* r;
    size_t len;
    if (transform(&c, 1, &r, &len)) {
      ascii_off_[b] = static_cast<int32_t>(r - normalized_.data());
      ascii_len_[b] = static_cast<uint32_t>(len);
    } else {
      ascii_off_[b] = -1;
      ascii_len_[b] = 0;
    }
  }
  return true;
}

// darts-clone's DoubleArray::commonPrefixSearch, first result only (HF takes results[0])
bool Charsmap::transform(const uint8_t* s, size_t n, const char** rep, size_t* len) const {
  if (array_.empty()) return false;
  const size_t size = array_.size();
  auto offset = [](uint32_t u) -> size_t { return static_cast<size_t>(u >> 10) << ((u & (1u << 9)) >> 6); };
  size_t pos = 0;
  uint32_t unit = array_[0];
  pos ^= offset(unit);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t c = s[i];
    if (c == 0) break;
    pos ^= c;
    if (pos >= size) return false;  // HF would panic on such a blob; no key here
    unit = array_[pos];
    if ((unit & ((1u << 31) | 0xFF)) != c) return false;
    pos ^= offset(unit);
    if ((unit >> 8) & 1) {
      if (pos >= size) return false;
      const size_t at = array_[pos] & ((1u << 31) - 1);
      if (at > normalized_.size()) return false;
      size_t e = at;
      while (e < normalized_.size() && normalized_[e] != 0) ++e;
      *rep = normalized_.data() + at;
      *len = e - at;
      return true;
    }
  }
  return false;
}

// HF's Precompiled::normalize: each extended grapheme cluster of under 6 bytes is replaced as
// a whole when a key prefixes it (the rest of the cluster is dropped); otherwise each of its
// characters by its own key, or kept.
void Charsmap::normalize(const uint8_t* s, size_t n, std::string& out) const {
  out.reserve(out.size() + n + n / 8);
  for (size_t i = 0; i < n;) {
    // a run of ASCII bytes without a key, each a cluster of its own (the last one only when
    // no non-ASCII character follows it, which could join it): copied as they are
    size_t j = i;
    while (j < n && s[j] < 0x80 && ascii_off_[s[j]] < 0 && s[j] != '\r') ++j;
    if (j < n && s[j] >= 0x80 && j > i) --j;
    if (j > i) {
      out.append(reinterpret_cast<const char*>(s) + i, j - i);
      i = j;
      continue;
    }
    const uint8_t c = s[i];
    if (c < 0x80 && c != '\r' && (i + 1 == n || s[i + 1] < 0x80)) {  // a cluster of one ASCII byte
      if (ascii_off_[c] >= 0) out.append(normalized_.data() + ascii_off_[c], ascii_len_[c]);
      else out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    const size_t e = grapheme_end(s, n, i);
    const char* r;
    size_t len;
    if (e - i < 6 && transform(s + i, e - i, &r, &len)) {
      out.append(r, len);
      i = e;
      continue;
    }
    while (i < e) {
      const size_t k = std::min(cp_len(s[i]), e - i);
      if (transform(s + i, k, &r, &len)) out.append(r, len);
      else out.append(reinterpret_cast<const char*>(s) + i, k);
      i += k;
    }
  }
}

// ---- construction ----

SentencePiece::~SentencePiece() = default;

SentencePiece::SentencePiece(const std::vector<std::string>& vocab, const std::vector<int32_t>& ids,
                             const std::vector<double>& scores, const std::vector<std::string>& merges,
                             const std::string& charsmap, const std::vector<std::string>& added,
                             const std::vector<int32_t>& added_ids, const std::vector<int>& added_flags,
                             const std::vector<std::string>& norm_added, const std::vector<int32_t>& norm_added_ids,
                             const std::vector<int>& norm_added_flags, SpConfig cfg)
    : cfg_(std::move(cfg)), serial_(g_serial.fetch_add(1)) {
  if (vocab.size() != ids.size()) throw std::invalid_argument("vocab and ids differ in length");
  if (cfg_.unigram && scores.size() != vocab.size()) throw std::invalid_argument("vocab and scores differ in length");
  if (added.size() != added_ids.size() || norm_added.size() != norm_added_ids.size() ||
      added.size() != added_flags.size() || norm_added.size() != norm_added_flags.size())
    throw std::invalid_argument("added tokens and their ids differ in length");
  if (cfg_.max_len < num_special()) throw std::invalid_argument("max_len is smaller than the special tokens");
  if (vocab.empty()) throw std::invalid_argument("empty vocabulary");
  for (const NormStep& st : cfg_.norm) {
    if (st.kind < NormStep::kPrecompiled || st.kind > NormStep::kPrepend)
      throw std::invalid_argument("unknown normalizer step");
    if (st.kind == NormStep::kPrecompiled && !has_charsmap_) {
      std::string err;
      if (!charsmap_.load(charsmap, &err)) throw std::invalid_argument(err);
      has_charsmap_ = true;
    }
    if ((st.kind == NormStep::kReplace || st.kind == NormStep::kLead) && st.a.empty())
      throw std::invalid_argument("a Replace step with an empty pattern");
  }
  for (const PreStep& st : cfg_.pre) {
    if (st.kind < PreStep::kWhitespaceSplit || st.kind > PreStep::kMetaspace)
      throw std::invalid_argument("unknown pre-tokenizer step");
    if (st.kind != PreStep::kWhitespaceSplit && st.a.empty())
      throw std::invalid_argument("a pre-tokenizer step with an empty pattern");
  }
  int32_t maxid = cfg_.unk_id;
  std::vector<std::pair<std::string, int32_t>> keys;
  keys.reserve(vocab.size());
  for (size_t i = 0; i < vocab.size(); ++i) {
    if (ids[i] < 0) throw std::invalid_argument("negative token id");
    maxid = std::max(maxid, ids[i]);
    keys.emplace_back(vocab[i], ids[i]);
  }
  if (cfg_.unigram) {
    // scores by id; the unknown-character score is HF's min_score - 10
    score_.assign(static_cast<size_t>(maxid) + 1, 0.0);
    double lo = scores[0];
    for (size_t i = 0; i < vocab.size(); ++i) {
      score_[ids[i]] = scores[i];
      lo = std::min(lo, scores[i]);
    }
    unk_score_ = lo - 10.0;
    if (cfg_.unk_id < 0) throw std::invalid_argument("Unigram without unk_id");
  }
  // a later duplicate string wins (HF's token -> id map keeps the last)
  build_trie(keys);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    byte_id_[b] = find(reinterpret_cast<const uint8_t*>(name), 6);
  }
  all_bytes_ = true;
  for (int b = 0; b < 256; ++b) all_bytes_ = all_bytes_ && byte_id_[b] >= 0;
  for (int b = 0; b < 128; ++b) {
    const uint8_t c = static_cast<uint8_t>(b);
    ascii_id_[b] = find(&c, 1);
  }
  if (!cfg_.unigram) {
    std::unordered_map<std::string, int32_t> by_str;
    by_str.reserve(vocab.size() * 2);
    for (size_t i = 0; i < vocab.size(); ++i) by_str[vocab[i]] = ids[i];
    const size_t nm = merges.size() / 2;
    merges_.reserve(nm);
    auto lookup = [&](const std::string& t) {
      auto it = by_str.find(t);
      if (it == by_str.end()) throw std::invalid_argument("merge token '" + t + "' is not in the vocabulary");
      return it->second;
    };
    for (size_t i = 0; i < nm; ++i) {
      const int32_t a = lookup(merges[2 * i]), b = lookup(merges[2 * i + 1]);
      const int32_t id = lookup(merges[2 * i] + merges[2 * i + 1]);
      merges_.set(a, b, static_cast<uint32_t>(i), id);
    }
  }
  cut_ = cfg_.cut;
  auto add_list = [&](const std::vector<std::string>& src, const std::vector<int32_t>& sids,
                      const std::vector<int>& sflags, AddedSet& dst, bool normalise) {
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i].empty()) continue;
      if (sids[i] < 0) throw std::invalid_argument("negative token id");
      std::string t = normalise ? normalize(src[i]) : src[i];
      if (t.empty()) continue;  // HF's trie never matches an empty pattern
      dst.first[static_cast<uint8_t>(t[0])] = true;
      dst.toks.push_back(std::move(t));
      dst.ids.push_back(sids[i]);
      dst.flags.push_back(static_cast<uint8_t>(sflags[i] & (AddedSet::kLstrip | AddedSet::kRstrip)));
      maxid = std::max(maxid, sids[i]);
    }
  };
  add_list(added, added_ids, added_flags, added_, false);
  add_list(norm_added, norm_added_ids, norm_added_flags, norm_added_, true);
  for (int32_t v : cfg_.head) maxid = std::max(maxid, v);
  for (int32_t v : cfg_.tail) maxid = std::max(maxid, v);
  nvocab_ = static_cast<size_t>(maxid) + 1;
}

// A double array over the keys' bytes: the children of a node sit at base + byte + 1. The
// keys are sorted, so each node is a range of them (walked breadth first, no pointer trie);
// a node's base is the first that puts all its children on free slots, found along a list of
// the free slots (at most 256 tries, then past the end): a 250k-entry vocabulary builds in
// a fraction of a second.
void SentencePiece::build_trie(const std::vector<std::pair<std::string, int32_t>>& keys) {
  std::vector<uint32_t> order;
  order.reserve(keys.size());
  for (uint32_t i = 0; i < keys.size(); ++i)
    if (!keys[i].first.empty()) order.push_back(i);  // HF's trie never yields an empty token
  // equal strings keep their order: the last one's id wins, as in HF's token -> id map
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return keys[a].first < keys[b].first; });
  // the sorted keys in one buffer (the walk below reads them in order)
  std::string arena;
  std::vector<uint32_t> koff(order.size() + 1, 0);
  std::vector<int32_t> kid(order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    arena += keys[order[k]].first;
    koff[k + 1] = static_cast<uint32_t>(arena.size());
    kid[k] = keys[order[k]].second;
  }
  auto klen = [&](uint32_t k) { return koff[k + 1] - koff[k]; };
  // the free slots as a doubly linked list (-1 ends it); slot 0 is the root
  std::vector<int32_t> nxt, prv;
  int32_t head = -1, tail = -1;
  auto grow = [&](size_t sz) {
    const size_t old = da_.size();
    if (sz <= old) return;
    da_.resize(sz, DaNode{0, -1, -1});
    nxt.resize(sz, -1);
    prv.resize(sz, -1);
    for (size_t i = std::max<size_t>(old, 1); i < sz; ++i) {
      const int32_t v = static_cast<int32_t>(i);
      prv[v] = tail;
      if (tail >= 0) nxt[tail] = v;
      else head = v;
      tail = v;
    }
  };
  auto take = [&](int32_t v) {
    if (prv[v] >= 0) nxt[prv[v]] = nxt[v];
    else head = nxt[v];
    if (nxt[v] >= 0) prv[nxt[v]] = prv[v];
    else tail = prv[v];
  };
  grow(1024);
  da_[0].check = 0;
  struct Item {
    int32_t slot;
    uint32_t lo, hi, depth;  // the keys of this node: [lo, hi), sharing their first depth bytes
  };
  std::vector<Item> queue{{0, 0, static_cast<uint32_t>(order.size()), 0}};
  std::vector<std::pair<uint8_t, uint32_t>> kids;  // (byte, start of its range)
  for (size_t q = 0; q < queue.size(); ++q) {
    const Item it = queue[q];
    uint32_t k = it.lo;
    while (k < it.hi && klen(k) == it.depth) ++k;  // the keys ending here come first
    if (k > it.lo) da_[it.slot].term = kid[k - 1];
    kids.clear();
    for (; k < it.hi; ++k) {
      const uint8_t c = static_cast<uint8_t>(arena[koff[k] + it.depth]);
      if (kids.empty() || kids.back().first != c) kids.emplace_back(c, k);
    }
    if (kids.empty()) continue;
    const size_t first = kids[0].first + 1u, last = kids.back().first + 1u;
    size_t base = 0;
    int tries = 0;
    for (int32_t f = head; f >= 0 && tries < 256; f = nxt[f], ++tries) {
      if (static_cast<size_t>(f) <= first) continue;  // base >= 1
      const size_t b = static_cast<size_t>(f) - first;
      grow(b + last + 1);
      bool ok = true;
      for (const auto& kv : kids)
        if (da_[b + kv.first + 1].check >= 0) {
          ok = false;
          break;
        }
      if (ok) {
        base = b;
        break;
      }
    }
    if (!base) {  // past every used slot
      base = std::max<size_t>(da_.size(), first + 1) - first;
      grow(base + last + 1);
    }
    da_[it.slot].base = static_cast<int32_t>(base);
    for (size_t x = 0; x < kids.size(); ++x) {
      const int32_t slot = static_cast<int32_t>(base + kids[x].first + 1);
      da_[slot].check = it.slot;
      take(slot);
      const uint32_t end = x + 1 < kids.size() ? kids[x + 1].second : it.hi;
      queue.push_back({slot, kids[x].second, end, it.depth + 1});
    }
  }
  size_t used = da_.size();
  while (used > 1 && da_[used - 1].check < 0) --used;
  da_.resize(used + 257, DaNode{0, -1, -1});  // every child lookup of a used node stays inside
  da_.shrink_to_fit();
}

int32_t SentencePiece::find(const uint8_t* s, size_t n) const {
  size_t cur = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t nx = static_cast<size_t>(da_[cur].base) + s[i] + 1;
    if (da_[cur].base <= 0 || nx >= da_.size() || da_[nx].check != static_cast<int32_t>(cur)) return -1;
    cur = nx;
  }
  return n ? da_[cur].term : -1;
}

// ---- normalizer ----

void SentencePiece::normalize_into(const uint8_t* s, size_t n, std::string& out, std::string& tmp) const {
  out.assign(reinterpret_cast<const char*>(s), n);
  for (const NormStep& st : cfg_.norm) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(out.data());
    const size_t m = out.size();
    tmp.clear();
    switch (st.kind) {
      case NormStep::kPrecompiled:
        charsmap_.normalize(p, m, tmp);
        break;
      case NormStep::kReplace: {  // leftmost, non-overlapping
        size_t at = 0;
        for (;;) {
          const size_t f = out.find(st.a, at);
          if (f == std::string::npos) break;
          tmp.append(out, at, f - at);
          tmp += st.b;
          at = f + st.a.size();
        }
        if (at == 0) continue;  // no match: out stays
        tmp.append(out, at, std::string::npos);
        break;
      }
      case NormStep::kSpaces: {
        bool hit = false;
        for (size_t i = 0; i < m;) {
          if (p[i] != ' ') {
            tmp.push_back(static_cast<char>(p[i++]));
            continue;
          }
          size_t j = i;
          while (j < m && p[j] == ' ') ++j;
          if (j - i >= static_cast<size_t>(st.n)) {
            tmp += st.b;
            hit = true;
          } else {
            tmp.append(j - i, ' ');
          }
          i = j;
        }
        if (!hit) continue;
        break;
      }
      case NormStep::kEdgeSpaces: {
        size_t a = 0, b = m;
        while (a < m && p[a] == ' ') ++a;
        if (a == 0 || a < m)
          while (b > a && p[b - 1] == ' ') --b;
        if (a == 0 && b == m) continue;
        if (a > 0) tmp += st.b;
        tmp.append(out, a, b - a);
        if (b < m) tmp += st.b;
        break;
      }
      case NormStep::kLead:
        if (out.compare(0, st.a.size(), st.a) != 0) continue;
        tmp = st.b;
        tmp.append(out, st.a.size(), std::string::npos);
        break;
      case NormStep::kStrip: {
        size_t a = 0, b = m;
        if (st.n & 1)
          while (a < m) {
            size_t k = a;
            if (!is_ws(next_cp(p, m, k))) break;
            a = k;
          }
        if (st.n & 2)
          while (b > a) {
            size_t q = b - 1;
            while (q > a && (p[q] & 0xC0) == 0x80) --q;
            size_t k = q;
            if (!is_ws(next_cp(p, m, k))) break;
            b = q;
          }
        if (a == 0 && b == m) continue;
        tmp.assign(out, a, b - a);
        break;
      }
      case NormStep::kPrepend:
        if (m == 0) continue;
        tmp = st.a;
        tmp += out;
        break;
    }
    out.swap(tmp);
  }
}

std::string SentencePiece::normalize(const std::string& s) const {
  std::string out, tmp;
  normalize_into(reinterpret_cast<const uint8_t*>(s.data()), s.size(), out, tmp);
  return out;
}

// ---- the pipeline ----

// the added tokens of one set in s (added.h split_added); the text between them is a raw
// segment (normalised, then matched against the normalised set) or, raw = false, already
// normalised text to pre-tokenize (at0: s starts the input, for the dummy prefix)
void SentencePiece::take_added(const AddedSet& set, const uint8_t* s, size_t n, bool raw, bool at0,
                               SpScratch& sc) const {
  split_added(
      set, s, n, sc, [](uint32_t cp) { return (utf8::props(cp) & uni::F_WS) != 0; },
      [&](size_t a, size_t b) {
        if (raw) segment(s + a, b - a, at0 && a == 0, sc);
        else pre(0, s + a, b - a, at0 && a == 0, sc);
      });
}

// one piece of the raw text between added tokens: normalise, take out the added tokens
// matched in the normalised text, pre-tokenize and tokenise the rest
void SentencePiece::segment(const uint8_t* s, size_t n, bool at0, SpScratch& sc) const {
  if (!cfg_.norm.empty()) {
    normalize_into(s, n, sc.norm, sc.tmp);
    s = reinterpret_cast<const uint8_t*>(sc.norm.data());
    n = sc.norm.size();
  }
  if (norm_added_.empty()) pre(0, s, n, at0, sc);
  else take_added(norm_added_, s, n, false, at0, sc);
}

// pre-tokenizer step `stage` on s[0, n); at0: the piece starts the text (Metaspace's
// prepend_scheme first)
void SentencePiece::pre(size_t stage, const uint8_t* s, size_t n, bool at0, SpScratch& sc) const {
  if (n == 0 || sc.stop) return;
  if (stage == cfg_.pre.size()) {
    word(s, n, sc);
    return;
  }
  const PreStep& st = cfg_.pre[stage];
  if (st.kind == PreStep::kWhitespaceSplit) {
    auto ws_at = [&](size_t i, size_t* next) {
      const uint8_t c = s[i];
      if (c < 0x80) {
        *next = i + 1;
        return c == ' ' || (c >= '\t' && c <= '\r');
      }
      *next = i;
      return is_ws(next_cp(s, n, *next));
    };
    for (size_t i = 0; i < n && !sc.stop;) {
      size_t k;
      if (ws_at(i, &k)) {
        i = k;
        continue;
      }
      size_t e = k;
      while (e < n && !ws_at(e, &k)) e = k;
      pre(stage + 1, s + i, e - i, at0 && i == 0, sc);
      i = e;
    }
    return;
  }
  const std::string& pat = st.a;
  if (st.kind == PreStep::kSplit) {
    // the literal's occurrences, leftmost and non-overlapping; the pieces by behaviour
    const std::string_view v(reinterpret_cast<const char*>(s), n);
    size_t at = 0;  // start of the pending piece
    for (size_t i = 0; i < n && !sc.stop;) {
      const size_t f = v.find(pat, i);
      if (f == std::string_view::npos) break;
      const size_t e = f + pat.size();
      switch (st.n) {
        case PreStep::kRemoved:
          pre(stage + 1, s + at, f - at, at0 && at == 0, sc);
          at = e;
          break;
        case PreStep::kIsolated:
          pre(stage + 1, s + at, f - at, at0 && at == 0, sc);
          pre(stage + 1, s + f, e - f, at0 && f == 0, sc);
          at = e;
          break;
        case PreStep::kMergedWithPrevious:
          pre(stage + 1, s + at, e - at, at0 && at == 0, sc);
          at = e;
          break;
        default:  // kMergedWithNext
          pre(stage + 1, s + at, f - at, at0 && at == 0, sc);
          at = f;
          break;
      }
      i = e;
    }
    if (!sc.stop) pre(stage + 1, s + at, n - at, at0 && at == 0, sc);
    return;
  }
  // Metaspace: spaces -> the replacement, which is then prepended (by scheme) unless the
  // piece starts with it; with split, a new piece at every replacement
  std::string local;
  std::string& w = stage + 1 == cfg_.pre.size() ? sc.pre : local;
  w.clear();
  const bool lead = n >= pat.size() && std::memcmp(s, pat.data(), pat.size()) == 0;
  if ((st.n == 0 || (st.n == 1 && at0)) && !lead && s[0] != ' ') w = pat;
  for (size_t i = 0; i < n;) {
    const void* sp = std::memchr(s + i, ' ', n - i);
    const size_t e = sp ? static_cast<size_t>(static_cast<const uint8_t*>(sp) - s) : n;
    w.append(reinterpret_cast<const char*>(s) + i, e - i);
    if (e < n) w += pat;
    i = e + 1;
  }
  const uint8_t* p = reinterpret_cast<const uint8_t*>(w.data());
  const size_t m = w.size();
  if (!st.split) {
    pre(stage + 1, p, m, at0, sc);
    return;
  }
  // MergedWithNext: each replacement starts a piece
  size_t at = 0;
  const uint8_t c0 = static_cast<uint8_t>(pat[0]);
  for (size_t i = 0; i + pat.size() <= m && !sc.stop;) {
    const void* f = std::memchr(p + i, c0, m - i);
    if (!f) break;
    i = static_cast<size_t>(static_cast<const uint8_t*>(f) - p);
    if (i + pat.size() > m) break;
    if (std::memcmp(p + i, pat.data(), pat.size()) == 0) {
      if (i > at) pre(stage + 1, p + at, i - at, at0 && at == 0, sc);
      at = i;
      i += pat.size();
    } else {
      ++i;
    }
  }
  if (!sc.stop && at < m) pre(stage + 1, p + at, m - at, at0 && at == 0, sc);
}

void SentencePiece::emit(const int32_t* ids, size_t k, SpScratch& sc) const {
  for (size_t i = 0; i < k; ++i) {
    if (sc.count == sc.limit) {  // HF truncates the finished encoding: the first pieces stay
      sc.stop = true;
      sc.over = !sc.truncate;
      return;
    }
    sc.out->push_back(ids[i]);
    ++sc.count;
  }
}

void SentencePiece::word(const uint8_t* w, size_t n, SpScratch& sc) const {
  if (sc.collect) {
    sc.collect->emplace_back(reinterpret_cast<const char*>(w), n);
    return;
  }
  if (!cfg_.unigram) {
    if (cfg_.ignore_merges) {
      const int32_t id = find(w, n);
      if (id >= 0) {
        emit(&id, 1, sc);
        return;
      }
    }
    // cut before each replacement character that follows another character: no merge joins
    // across such a point (the caller checked the merges), so each part merges alone
    if (!cut_.empty() && n > cut_.size()) {
      size_t at = 0;
      const uint8_t c0 = static_cast<uint8_t>(cut_[0]);
      for (size_t i = 1; i + cut_.size() <= n && !sc.stop; ++i) {
        if (w[i] != c0 || std::memcmp(w + i, cut_.data(), cut_.size()) != 0) continue;
        if (i >= cut_.size() && std::memcmp(w + i - cut_.size(), cut_.data(), cut_.size()) == 0) continue;
        const uint8_t* part = w + at;
        const size_t len = i - at;
        at = i;
        const uint64_t h = hash_bytes(part, len);
        if (const WordCache::Slot* hit = sc.cache.find(serial_, h, part, len)) {
          emit(hit->ids, hit->nids, sc);
          continue;
        }
        sc.pieces.clear();
        bpe(part, len, sc.pieces, sc);
        sc.cache.put(serial_, h, part, len, sc.pieces.data(), sc.pieces.size());
        emit(sc.pieces.data(), sc.pieces.size(), sc);
      }
      if (sc.stop) return;
      w += at;
      n -= at;
    }
  }
  const uint64_t h = hash_bytes(w, n);
  if (const WordCache::Slot* hit = sc.cache.find(serial_, h, w, n)) {
    emit(hit->ids, hit->nids, sc);
    return;
  }
  sc.pieces.clear();
  if (cfg_.unigram) unigram(w, n, sc.pieces, sc);
  else bpe(w, n, sc.pieces, sc);
  sc.cache.put(serial_, h, w, n, sc.pieces.data(), sc.pieces.size());
  emit(sc.pieces.data(), sc.pieces.size(), sc);
}

// ---- Unigram ----

// a run of unknown characters (fused): its id when the run is a vocabulary entry, else its
// bytes' <0xXX> tokens (byte_fallback, all of them present), else unk_id
void SentencePiece::unk_run(const uint8_t* w, size_t n, std::vector<int32_t>& out) const {
  const int32_t id = find(w, n);
  if (id >= 0) {
    out.push_back(id);
    return;
  }
  if (cfg_.byte_fallback) {
    bool all = true;
    for (size_t i = 0; i < n && all; ++i) all = byte_id_[w[i]] >= 0;
    if (all) {
      for (size_t i = 0; i < n; ++i) out.push_back(byte_id_[w[i]]);
      return;
    }
  }
  out.push_back(cfg_.unk_id);
}

// HF Unigram::encode_optimized: the best path ending at each character boundary, from the
// boundaries in order; at each start the vocabulary entries that begin there, shortest first,
// then (no single-character entry) the unknown character; a candidate replaces the best only
// when strictly better. Consecutive unk_id nodes are fused into one piece.
void SentencePiece::unigram(const uint8_t* w, size_t n, std::vector<int32_t>& out, SpScratch& sc) const {
  auto& best = sc.best;
  best.assign(n + 1, SpScratch::Best{0.0, -1, 0});
  const DaNode* da = da_.data();
  const size_t dsize = da_.size();
  for (size_t i = 0; i < n;) {
    const size_t mb = cp_len(w[i]) <= n - i ? cp_len(w[i]) : 1;
    const double here = best[i].score;
    bool single = false;
    size_t cur = 0;
    for (size_t j = i; j < n; ++j) {
      const int32_t b = da[cur].base;
      const size_t nx = static_cast<size_t>(b) + w[j] + 1;
      if (b <= 0 || nx >= dsize || da[nx].check != static_cast<int32_t>(cur)) break;
      cur = nx;
      const int32_t id = da[cur].term;
      if (id < 0) continue;
      SpScratch::Best& t = best[j + 1];
      const double cand = score_[id] + here;
      if (t.start < 0 || cand > t.score) {
        t.score = cand;
        t.start = static_cast<int32_t>(i);
        t.id = id;
      }
      if (j + 1 - i == mb) single = true;
    }
    if (!single) {
      SpScratch::Best& t = best[i + mb];
      const double cand = unk_score_ + here;
      if (t.start < 0 || cand > t.score) {
        t.score = cand;
        t.start = static_cast<int32_t>(i);
        t.id = cfg_.unk_id;
      }
    }
    i += mb;
  }
  // back from the end: the path's nodes (start offsets), then forward with unk runs fused
  auto& path = sc.path;
  path.clear();
  for (size_t e = n; e > 0;) {
    path.push_back(static_cast<int32_t>(e));
    e = static_cast<size_t>(best[e].start);
  }
  size_t run = SIZE_MAX;  // start of the pending unk run
  size_t prev = 0;
  for (size_t k = path.size(); k-- > 0;) {
    const size_t e = static_cast<size_t>(path[k]);
    const int32_t id = best[e].id;
    if (id == cfg_.unk_id) {
      if (run == SIZE_MAX) run = prev;
    } else {
      if (run != SIZE_MAX) {
        unk_run(w + run, prev - run, out);
        run = SIZE_MAX;
      }
      out.push_back(id);
    }
    prev = e;
  }
  if (run != SIZE_MAX) unk_run(w + run, n - run, out);
}

// ---- BPE over characters ----

int32_t SentencePiece::char_id(const uint8_t* p, size_t len) const {
  if (len == 1 && p[0] < 0x80) return ascii_id_[p[0]];
  return find(p, len);
}

// HF BPE::merge_word + Word::merge_all: one symbol per character (its entry; else its bytes'
// <0xXX> tokens with byte_fallback when all exist, added at once; else [UNK], fused or not,
// added before the next known character), then the merges (tokenizer/merges.h).
void SentencePiece::bpe(const uint8_t* w, size_t n, std::vector<int32_t>& out, SpScratch& sc) const {
  std::vector<int32_t>& sym = sc.sym;
  sym.clear();
  bool unk = false;
  for (size_t i = 0; i < n;) {
    const size_t len = std::min(cp_len(w[i]), n - i);
    const int32_t id = char_id(w + i, len);
    if (id >= 0) {
      if (unk) sym.push_back(cfg_.unk_id);
      unk = false;
      sym.push_back(id);
    } else {
      bool bytes = false;
      if (cfg_.byte_fallback) {
        bytes = true;
        for (size_t k = 0; k < len && bytes; ++k) bytes = byte_id_[w[i + k]] >= 0;
        if (bytes)
          for (size_t k = 0; k < len; ++k) sym.push_back(byte_id_[w[i + k]]);
      }
      if (!bytes && cfg_.unk_id >= 0) {
        if (unk && !cfg_.fuse_unk) sym.push_back(cfg_.unk_id);
        unk = true;
      }
    }
    i += len;
  }
  if (unk) sym.push_back(cfg_.unk_id);
  merge_word(merges_, sym, out, sc.merge);
}

// ---- entry points ----

std::vector<std::string> SentencePiece::pre_tokenize(const std::string& s) const {
  SpScratch sc;
  std::vector<std::string> pieces;
  sc.collect = &pieces;
  pre(0, reinterpret_cast<const uint8_t*>(s.data()), s.size(), true, sc);
  return pieces;
}

bool SentencePiece::encode(const char* s8, size_t n, bool truncate, std::vector<int32_t>& out, int max_len) const {
  thread_local SpScratch sc;
  const uint8_t* s = reinterpret_cast<const uint8_t*>(s8);
  sc.collect = nullptr;
  sc.out = &out;
  sc.count = 0;
  sc.limit = std::max(0, (max_len > 0 ? max_len : cfg_.max_len) - num_special());
  sc.truncate = truncate;
  sc.stop = sc.over = false;
  out.insert(out.end(), cfg_.head.begin(), cfg_.head.end());
  if (added_.empty()) segment(s, n, true, sc);
  else take_added(added_, s, n, true, true, sc);
  sc.trim();
  if (sc.over) return false;
  out.insert(out.end(), cfg_.tail.begin(), cfg_.tail.end());
  return true;
}

}  // namespace zoi::tok
