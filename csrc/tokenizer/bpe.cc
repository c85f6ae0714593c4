#include "tokenizer/bpe.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string_view>
#include <type_traits>
#include <unordered_map>

#include "tokenizer/unicode_tables.h"
#include "tokenizer/utf8.h"

namespace zoi::tok {
namespace {

using utf8::next_cp;
using utf8::props;
using utf8::put_utf8;

inline uint8_t rx(uint32_t cp) {
  return uni::kRxStage2[static_cast<size_t>(uni::kRxStage1[cp >> 8]) * 256 + (cp & 255)];
}
inline uint8_t ccc(uint32_t cp) { return static_cast<uint8_t>(props(cp) >> 8); }

// ---- byte-level alphabet (GPT-2's bytes_to_unicode) ----

// byte -> the codepoint that stands for it in vocab strings, and back (-1: not a symbol)
struct ByteMap {
  uint32_t to_cp[256];
  int16_t from_cp[512];
  ByteMap() {
    std::fill(std::begin(from_cp), std::end(from_cp), int16_t{-1});
    uint32_t extra = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      to_cp[b] = printable ? b : extra++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// a vocab string's bytes, or false when a character is not a byte symbol (such an entry can
// never be the result of byte-level BPE)
bool symbols_to_bytes(const std::string& s, std::string& out) {
  out.clear();
  const uint8_t* p = reinterpret_cast<const uint8_t*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = next_cp(p, s.size(), i);
    if (cp >= 512 || byte_map().from_cp[cp] < 0) return false;
    out.push_back(static_cast<char>(byte_map().from_cp[cp]));
  }
  return true;
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

// ---- pre-tokenizer regexes, matched by hand ----

struct Ch {
  uint32_t cp;
  uint32_t len;
  uint8_t cls;
};
inline Ch char_at(const uint8_t* s, size_t n, size_t i) {
  if (s[i] < 0x80) return {s[i], 1, rx(s[i])};
  size_t j = i;
  const uint32_t cp = next_cp(s, n, j);
  return {cp, static_cast<uint32_t>(j - i), rx(cp)};
}
constexpr uint8_t kLNS = uni::RX_L | uni::RX_N | uni::RX_WS;
inline bool is_other(const Ch& c) { return !(c.cls & kLNS); }  // [^\s\p{L}\p{N}]

// end of the run of characters having a class in `mask`, from i
inline size_t run_of(const uint8_t* s, size_t n, size_t i, uint8_t mask) {
  while (i < n) {
    if (s[i] < 0x80) {
      if (!(rx(s[i]) & mask)) break;
      ++i;
      continue;
    }
    const Ch c = char_at(s, n, i);
    if (!(c.cls & mask)) break;
    i += c.len;
  }
  return i;
}
inline size_t run_other(const uint8_t* s, size_t n, size_t i) {
  while (i < n) {
    const Ch c = char_at(s, n, i);
    if (!is_other(c)) break;
    i += c.len;
  }
  return i;
}
inline size_t run_crlf(const uint8_t* s, size_t n, size_t i) {
  while (i < n && (s[i] == '\r' || s[i] == '\n')) ++i;
  return i;
}

// The letters of a contraction after an apostrophe at i ('s 't 're 've 'm 'll 'd): their
// byte length, 0 if none. Case-insensitive as Oniguruma folds: ASCII, and U+017F (long s)
// for s; HF was probed on every codepoint for each letter position.
inline size_t contraction(const uint8_t* s, size_t n, size_t i, bool fold) {
  if (i >= n) return 0;
  uint8_t a = s[i];
  if (fold) {
    if (a == 0xC5 && i + 1 < n && s[i + 1] == 0xBF) return 2;
    if (a >= 'A' && a <= 'Z') a |= 0x20;
  }
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 1;
  if (i + 1 < n) {
    uint8_t b = s[i + 1];
    if (fold && b >= 'A' && b <= 'Z') b |= 0x20;
    if ((a == 'r' || a == 'v') && b == 'e') return 2;
    if (a == 'l' && b == 'l') return 2;
  }
  return 0;
}

// A whitespace run from i (s[i] is whitespace): \s*[\r\n]+ (newline: the run up to its last
// CR / LF), then \s+(?!\S) (the run, less its last character unless the text ends there),
// then \s+.
inline size_t spaces(const uint8_t* s, size_t n, size_t i, bool newline) {
  size_t j = i, last = i, nl_end = 0;
  int count = 0;
  while (j < n) {
    const Ch c = char_at(s, n, j);
    if (!(c.cls & uni::RX_WS)) break;
    last = j;
    j += c.len;
    ++count;
    if (c.cp == '\r' || c.cp == '\n') nl_end = j;
  }
  if (newline && nl_end) return nl_end;
  if (j == n || count < 2) return j;
  return last;
}

// End of the regex match that starts at i (< n). Every character starts a match of these
// regexes, so the matches tile the text and HF's Isolated split keeps them as the pieces.
size_t match_at(int kind, const uint8_t* s, size_t n, size_t i) {
  const Ch c = char_at(s, n, i);
  const size_t i1 = i + c.len;
  if (c.cp == '\'') {
    const size_t k = contraction(s, n, i1, kind != kSplitGpt2);
    if (k) return i1 + k;
  }
  const bool more = i1 < n;
  const Ch d = more ? char_at(s, n, i1) : Ch{0, 0, 0};
  if (kind == kSplitGpt2) {
    if (c.cp == ' ' && more) {  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
      if (d.cls & uni::RX_L) return run_of(s, n, i1 + d.len, uni::RX_L);
      if (d.cls & uni::RX_N) return run_of(s, n, i1 + d.len, uni::RX_N);
      if (is_other(d)) return run_other(s, n, i1 + d.len);
    }
    if (c.cls & uni::RX_L) return run_of(s, n, i1, uni::RX_L);
    if (c.cls & uni::RX_N) return run_of(s, n, i1, uni::RX_N);
    if (is_other(c)) return run_other(s, n, i1);
    return spaces(s, n, i, false);
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c.cls & uni::RX_L) return run_of(s, n, i1, uni::RX_L);
  if (!(c.cls & uni::RX_N) && c.cp != '\r' && c.cp != '\n' && (d.cls & uni::RX_L))
    return run_of(s, n, i1 + d.len, uni::RX_L);
  // \p{N} (Llama-3: \p{N}{1,3})
  if (c.cls & uni::RX_N) {
    size_t e = i1;
    for (int k = 1; k < (kind == kSplitLlama3 ? 3 : 1) && e < n; ++k) {
      const Ch x = char_at(s, n, e);
      if (!(x.cls & uni::RX_N)) break;
      e += x.len;
    }
    return e;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  if (c.cp == ' ' && more && is_other(d)) return run_crlf(s, n, run_other(s, n, i1 + d.len));
  if (is_other(c)) return run_crlf(s, n, run_other(s, n, i1));
  return spaces(s, n, i, true);
}

// ---- NFC ----

uint32_t compose(uint32_t a, uint32_t b) {
  if (a - 0x1100u < 19 && b - 0x1161u < 21) return 0xAC00 + ((a - 0x1100) * 21 + (b - 0x1161)) * 28;
  if (a - 0xAC00u < 11172 && (a - 0xAC00) % 28 == 0 && b - 0x11A8u < 27) return a + (b - 0x11A7);
  const uint64_t key = static_cast<uint64_t>(a) << 21 | b;
  const uint64_t* end = uni::kCompKey + sizeof(uni::kCompKey) / sizeof(uni::kCompKey[0]);
  const uint64_t* p = std::lower_bound(uni::kCompKey, end, key);
  return p != end && *p == key ? uni::kCompTo[p - uni::kCompKey] : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp - 0xAC00u < 11172) {  // Hangul syllable: algorithmic
    const uint32_t si = cp - 0xAC00;
    out.push_back(0x1100 + si / 588);
    out.push_back(0x1161 + (si % 588) / 28);
    if (si % 28) out.push_back(0x11A7 + si % 28);
    return;
  }
  if (props(cp) & uni::F_DECOMP) {
    const uint32_t* end = uni::kDecompCp + sizeof(uni::kDecompCp) / sizeof(uni::kDecompCp[0]);
    const uint32_t* p = std::lower_bound(uni::kDecompCp, end, cp);
    if (p != end && *p == cp) {
      const size_t k = p - uni::kDecompCp;
      for (int j = uni::kDecompOff[k]; j < uni::kDecompOff[k + 1]; ++j) out.push_back(uni::kDecompData[j]);
      return;
    }
  }
  out.push_back(cp);
}

// NFC of one run of decomposed codepoints (no boundary inside but at its start): canonical
// order (stable, by class, within each run of non-starters), then canonical composition as
// the unicode-normalization crate composes.
void compose_run(std::vector<uint32_t>& r, std::string& out) {
  const size_t n = r.size();
  for (size_t a = 0; a < n;) {  // each run of non-starters, sorted stably by class
    if (!ccc(r[a])) {
      ++a;
      continue;
    }
    size_t b = a + 1;
    while (b < n && ccc(r[b])) ++b;
    if (b - a <= 16) {  // insertion sort: real runs are a few marks
      for (size_t i = a + 1; i < b; ++i) {
        const uint32_t v = r[i];
        const uint8_t cv = ccc(v);
        size_t j = i;
        while (j > a && ccc(r[j - 1]) > cv) {
          r[j] = r[j - 1];
          --j;
        }
        r[j] = v;
      }
    } else {  // a text of thousands of marks: n log n
      std::stable_sort(r.begin() + a, r.begin() + b, [](uint32_t x, uint32_t y) { return ccc(x) < ccc(y); });
    }
    a = b;
  }
  size_t starter = SIZE_MAX, w = 0;
  int last = -1;  // class of the last character kept after the starter (-1: none)
  for (size_t i = 0; i < n; ++i) {
    const uint32_t cp = r[i];
    const uint8_t c = ccc(cp);
    if (starter != SIZE_MAX && (last < 0 || last < c)) {
      const uint32_t k = compose(r[starter], cp);
      if (k) {
        r[starter] = k;
        continue;
      }
    }
    if (c == 0) {
      starter = w;
      last = -1;
    } else {
      last = c;
    }
    r[w++] = cp;
  }
  for (size_t i = 0; i < w; ++i) put_utf8(out, r[i]);
  r.clear();
}

// true when every character is an NFC boundary (then NFC leaves the text as it is)
bool nfc_quick(const uint8_t* s, size_t n) {
  for (size_t i = 0; i < n;) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    if (!(rx(next_cp(s, n, i)) & uni::RX_NFC_BOUNDARY)) return false;
  }
  return true;
}

std::atomic<uint64_t> g_serial{1};

// BPE results of the words that are not one vocab entry, per thread: direct-mapped, short
// words with few pieces (most of real text's), tagged with the tokenizer they belong to.
struct WordCache {
  static constexpr size_t kSlots = 2048, kBytes = 24, kIds = 10;
  struct Slot {
    uint64_t h = 0;
    uint64_t owner = 0;  // 0: empty
    uint8_t len = 0, nids = 0;
    uint8_t bytes[kBytes];
    int32_t ids[kIds];
  };
  std::vector<Slot> slots;
  Slot* find(uint64_t owner, uint64_t h, const uint8_t* w, size_t n) {
    if (slots.empty()) slots.resize(kSlots);
    Slot& s = slots[h & (kSlots - 1)];
    if (s.owner == owner && s.h == h && s.len == n && std::memcmp(s.bytes, w, n) == 0) return &s;
    return nullptr;
  }
  void put(uint64_t owner, uint64_t h, const uint8_t* w, size_t n, const int32_t* ids, size_t k) {
    if (n > kBytes || k > kIds) return;
    Slot& s = slots[h & (kSlots - 1)];
    s.owner = owner;
    s.h = h;
    s.len = static_cast<uint8_t>(n);
    s.nids = static_cast<uint8_t>(k);
    std::memcpy(s.bytes, w, n);
    std::memcpy(s.ids, ids, k * sizeof(int32_t));
  }
};

}  // namespace

struct BpeScratch {
  WordCache cache;
  std::string norm;            // the normalised segment
  std::vector<uint32_t> run;   // NFC: decomposed codepoints since the last boundary
  std::vector<int32_t> pieces;  // one word's ids
  std::vector<int32_t> sym;     // BPE symbols
  MergeScratch merge;           // long words' merge buffers
  std::vector<std::string>* collect = nullptr;  // pre_tokenize(): the pieces, not their ids
  std::vector<int32_t>* out = nullptr;
  int count = 0;  // content tokens so far
  int limit = 0;
  bool truncate = true;
  bool stop = false;  // limit reached (truncate) or passed (no truncate)
  bool over = false;

  // after a huge word or text: give the memory back (every pool thread keeps a scratch)
  void trim() {
    constexpr size_t kKeep = 1 << 16;
    auto drop = [](auto& v) {
      if (v.capacity() > kKeep) std::decay_t<decltype(v)>().swap(v);
    };
    drop(norm);
    drop(run);
    drop(pieces);
    drop(sym);
    drop(merge.hs);
    drop(merge.heap);
  }
};

ByteBPE::~ByteBPE() = default;

ByteBPE::ByteBPE(const std::vector<std::string>& vocab, const std::vector<int32_t>& ids,
                 const std::vector<std::string>& merges, bool paired, const std::vector<std::string>& added,
                 const std::vector<int32_t>& added_ids, const std::vector<int>& added_flags,
                 const std::vector<std::string>& norm_added, const std::vector<int32_t>& norm_added_ids,
                 const std::vector<int>& norm_added_flags, BpeConfig cfg)
    : cfg_(std::move(cfg)), serial_(g_serial.fetch_add(1)) {
  if (vocab.size() != ids.size()) throw std::invalid_argument("vocab and ids differ in length");
  if (added.size() != added_ids.size() || norm_added.size() != norm_added_ids.size() ||
      added.size() != added_flags.size() || norm_added.size() != norm_added_flags.size())
    throw std::invalid_argument("added tokens and their ids differ in length");
  if (cfg_.max_len < num_special()) throw std::invalid_argument("max_len is smaller than the special tokens");
  for (int k : cfg_.splits)
    if (k < kSplitQwen2 || k > kSplitGpt2) throw std::invalid_argument("unknown split kind");
  std::unordered_map<std::string_view, int32_t> by_str;
  by_str.reserve(vocab.size() * 2);
  int32_t maxid = cfg_.unk_id;
  for (size_t i = 0; i < vocab.size(); ++i) {
    if (ids[i] < 0) throw std::invalid_argument("negative token id");
    by_str.emplace(vocab[i], ids[i]);
    maxid = std::max(maxid, ids[i]);
  }
  // vocab entries by their bytes
  size_t cap = 16;
  while (cap < vocab.size() * 2) cap <<= 1;
  slots_.assign(cap, 0);
  smask_ = cap - 1;
  std::string b;
  for (size_t i = 0; i < vocab.size(); ++i)
    if (!vocab[i].empty() && symbols_to_bytes(vocab[i], b)) {
      const uint8_t* p = reinterpret_cast<const uint8_t*>(b.data());
      if (find_bytes(p, b.size(), hash_bytes(p, b.size())) < 0) add_bytes(b, ids[i]);
    }
  self_.reset(new std::atomic<uint8_t>[entries_.size() + 1]);
  for (size_t i = 0; i <= entries_.size(); ++i) self_[i].store(0, std::memory_order_relaxed);
  for (int v = 0; v < 256; ++v) {
    std::string sym;
    put_utf8(sym, byte_map().to_cp[v]);
    auto it = by_str.find(sym);
    byte_id_[v] = it == by_str.end() ? -1 : it->second;
  }
  // merges, as HF reads them: a later duplicate pair replaces the earlier one's rank
  const size_t nm = paired ? merges.size() / 2 : merges.size();
  merges_.reserve(nm);
  auto lookup = [&](const std::string& t) {
    auto it = by_str.find(t);
    if (it == by_str.end()) throw std::invalid_argument("merge token '" + t + "' is not in the vocabulary");
    return it->second;
  };
  std::string left, right;
  uint32_t rank = 0;
  for (size_t i = 0; i < nm; ++i) {
    if (paired) {
      left = merges[2 * i];
      right = merges[2 * i + 1];
    } else {
      const std::string& m = merges[i];
      if (m.rfind("#version", 0) == 0) continue;  // HF skips these lines and their ranks
      const size_t sp = m.find(' ');
      if (sp == std::string::npos || m.find(' ', sp + 1) != std::string::npos)
        throw std::invalid_argument("merge '" + m + "' is not two tokens");
      left = m.substr(0, sp);
      right = m.substr(sp + 1);
    }
    const int32_t a = lookup(left), c = lookup(right), id = lookup(left + right);
    merges_.set(a, c, rank++, id);
  }
  auto add_list = [&](const std::vector<std::string>& src, const std::vector<int32_t>& sids,
                      const std::vector<int>& sflags, AddedSet& dst, bool normalise) {
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i].empty()) continue;
      if (sids[i] < 0) throw std::invalid_argument("negative token id");
      std::string t = normalise ? normalize(src[i]) : src[i];
      if (t.empty()) throw std::invalid_argument("an added token normalises to nothing");
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

int32_t ByteBPE::find_bytes(const uint8_t* p, size_t n, uint64_t hash) const {
  const uint32_t tag = static_cast<uint32_t>(hash >> 32);
  for (size_t h = hash & smask_;; h = (h + 1) & smask_) {
    const uint64_t v = slots_[h];
    if (!v) return -1;
    if (static_cast<uint32_t>(v >> 32) != tag) continue;
    const Entry& e = entries_[static_cast<uint32_t>(v) - 1];
    if (e.len == n && std::memcmp(arena_.data() + e.off, p, n) == 0) return static_cast<int32_t>(static_cast<uint32_t>(v) - 1);
  }
}

void ByteBPE::add_bytes(const std::string& b, int32_t id) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(b.data());
  const uint64_t hash = hash_bytes(p, b.size());
  size_t h = hash & smask_;
  while (slots_[h]) h = (h + 1) & smask_;
  entries_.push_back({static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(b.size()), id});
  arena_ += b;
  slots_[h] = (hash >> 32) << 32 | entries_.size();
}

// HF BPE::merge_word + Word::merge_all: one symbol per byte ([UNK], fused or not, or nothing
// for a byte without a symbol), then the merges (tokenizer/merges.h).
void ByteBPE::bpe(const uint8_t* w, size_t n, std::vector<int32_t>& pieces, BpeScratch& sc) const {
  std::vector<int32_t>& sym = sc.sym;
  sym.clear();
  bool unk = false;
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = byte_id_[w[i]];
    if (id >= 0) {
      if (unk) sym.push_back(cfg_.unk_id);
      unk = false;
      sym.push_back(id);
    } else if (cfg_.unk_id >= 0) {
      if (unk && !cfg_.fuse_unk) sym.push_back(cfg_.unk_id);
      unk = true;
    }
  }
  if (unk) sym.push_back(cfg_.unk_id);
  merge_word(merges_, sym, pieces, sc.merge);
}

void ByteBPE::word(const uint8_t* w, size_t n, BpeScratch& sc) const {
  if (sc.collect) {
    sc.collect->emplace_back(reinterpret_cast<const char*>(w), n);
    return;
  }
  std::vector<int32_t>& pieces = sc.pieces;
  pieces.clear();
  if (n == 1 && byte_id_[w[0]] >= 0) {
    pieces.push_back(byte_id_[w[0]]);
  } else {
    // a word that is a vocab entry: that entry when merges are ignored, or when BPE gave the
    // entry alone the last time any thread met it (most words of real text); other words
    // from this thread's cache, else BPE
    const uint64_t h = hash_bytes(w, n);
    const int32_t e = find_bytes(w, n, h);
    const uint8_t known = e >= 0 ? self_[e].load(std::memory_order_relaxed) : 0;
    if (e >= 0 && (cfg_.ignore_merges || known == 1)) {
      pieces.push_back(entries_[e].id);
    } else if (const WordCache::Slot* hit = sc.cache.find(serial_, h, w, n)) {
      pieces.assign(hit->ids, hit->ids + hit->nids);
    } else {
      bpe(w, n, pieces, sc);
      if (e >= 0 && known == 0)
        self_[e].store(pieces.size() == 1 && pieces[0] == entries_[e].id ? 1 : 2, std::memory_order_relaxed);
      if (!(e >= 0 && pieces.size() == 1 && pieces[0] == entries_[e].id))
        sc.cache.put(serial_, h, w, n, pieces.data(), pieces.size());
    }
  }
  for (int32_t id : pieces) {
    if (sc.count == sc.limit) {  // HF truncates the finished encoding: the first pieces stay
      sc.stop = true;
      sc.over = !sc.truncate;
      return;
    }
    sc.out->push_back(id);
    ++sc.count;
  }
}

void ByteBPE::split(size_t stage, const uint8_t* s, size_t n, BpeScratch& sc) const {
  if (stage == cfg_.splits.size()) {
    if (n) word(s, n, sc);
    return;
  }
  const int kind = cfg_.splits[stage];
  for (size_t i = 0; i < n && !sc.stop;) {
    const size_t e = match_at(kind, s, n, i);
    split(stage + 1, s + i, e - i, sc);
    i = e;
  }
}

void ByteBPE::nfc(const uint8_t* s, size_t n, std::string& out, std::vector<uint32_t>& run) const {
  out.clear();
  run.clear();
  // the run so far is one boundary character (its bytes kept as they are: NFC leaves a
  // boundary character that nothing follows unchanged)
  size_t raw_at = 0, raw_len = 0;
  uint32_t raw_cp = 0;
  for (size_t i = 0; i < n;) {
    const size_t at = i;
    const uint32_t cp = s[i] < 0x80 ? s[i++] : next_cp(s, n, i);
    if (cp < 0x80 || (rx(cp) & uni::RX_NFC_BOUNDARY)) {
      if (raw_len) out.append(reinterpret_cast<const char*>(s) + raw_at, raw_len);
      else if (!run.empty()) compose_run(run, out);
      raw_at = at;
      raw_len = i - at;
      raw_cp = cp;
      continue;
    }
    if (raw_len) {
      decompose(raw_cp, run);
      raw_len = 0;
    }
    decompose(cp, run);
  }
  if (raw_len) out.append(reinterpret_cast<const char*>(s) + raw_at, raw_len);
  else if (!run.empty()) compose_run(run, out);
}

std::string ByteBPE::normalize(const std::string& s) const {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(s.data());
  if (!cfg_.nfc || nfc_quick(p, s.size())) return s;
  std::string out;
  std::vector<uint32_t> run;
  nfc(p, s.size(), out, run);
  return out;
}

std::vector<std::string> ByteBPE::pre_tokenize(const std::string& s) const {
  BpeScratch sc;
  std::vector<std::string> pieces;
  sc.collect = &pieces;
  split(0, reinterpret_cast<const uint8_t*>(s.data()), s.size(), sc);
  return pieces;
}

// the added tokens of one set in s (added.h split_added); the text between them is a raw
// segment (normalised, then matched against the normalised set) or, raw = false, already
// normalised text to pre-tokenize
void ByteBPE::take_added(const AddedSet& set, const uint8_t* s, size_t n, bool raw, BpeScratch& sc) const {
  split_added(
      set, s, n, sc, [](uint32_t cp) { return (rx(cp) & uni::RX_WS) != 0; },
      [&](size_t a, size_t b) {
        if (raw) segment(s + a, b - a, sc);
        else split(0, s + a, b - a, sc);
      });
}

// one piece of the raw text between added tokens: normalise, take out the added tokens
// matched in the normalised text, pre-tokenize and BPE the rest
void ByteBPE::segment(const uint8_t* s, size_t n, BpeScratch& sc) const {
  if (cfg_.nfc && !nfc_quick(s, n)) {
    nfc(s, n, sc.norm, sc.run);
    s = reinterpret_cast<const uint8_t*>(sc.norm.data());
    n = sc.norm.size();
  }
  if (norm_added_.empty()) split(0, s, n, sc);
  else take_added(norm_added_, s, n, false, sc);
}

bool ByteBPE::encode(const char* s8, size_t n, bool truncate, std::vector<int32_t>& out, int max_len) const {
  thread_local BpeScratch sc;
  const uint8_t* s = reinterpret_cast<const uint8_t*>(s8);
  sc.collect = nullptr;
  sc.out = &out;
  sc.count = 0;
  sc.limit = std::max(0, (max_len > 0 ? max_len : cfg_.max_len) - num_special());
  sc.truncate = truncate;
  sc.stop = sc.over = false;
  out.insert(out.end(), cfg_.head.begin(), cfg_.head.end());
  if (added_.empty()) segment(s, n, sc);
  else take_added(added_, s, n, true, sc);
  sc.trim();
  if (sc.over) return false;
  out.insert(out.end(), cfg_.tail.begin(), cfg_.tail.end());
  return true;
}

}  // namespace zoi::tok
