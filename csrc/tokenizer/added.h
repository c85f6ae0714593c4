// Added tokens (special and user tokens matched as whole strings before the model's own
// tokenisation), shared by both BPE families: the token set and HF AddedVocabulary::find_matches
// over one text. One implementation, so the two families cannot drift apart in matching or in
// how lstrip / rstrip take in whitespace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tokenizer/utf8.h"

namespace zoi::tok {

// Added tokens of one kind (matched in the raw text, or in the normalised text).
struct AddedSet {
  enum : uint8_t { kLstrip = 1, kRstrip = 2 };  // take in the whitespace before / after
  std::vector<std::string> toks;
  std::vector<int32_t> ids;
  std::vector<uint8_t> flags;
  bool first[256] = {};  // a token starts with this byte
  bool empty() const { return toks.empty(); }
};

// HF AddedVocabulary::find_matches: leftmost-longest matches; lstrip takes in the whitespace
// before the token (not past the previous token), rstrip the whitespace after it. The text
// between matches goes to text(a, b) (byte offsets into s); each match's id is appended to
// sc.out unless the scratch's token limit is reached (sc.stop / sc.over as the callers'
// truncation rule). is_ws(cp): the family's whitespace class.
template <class Scratch, class IsWs, class Text>
void split_added(const AddedSet& set, const uint8_t* s, size_t n, Scratch& sc, IsWs is_ws, Text text) {
  size_t seg = 0;
  for (size_t i = 0; i < n && !sc.stop;) {
    size_t len = 0, k = 0;
    if (set.first[s[i]]) {
      for (size_t t = 0; t < set.toks.size(); ++t) {
        const std::string& a = set.toks[t];
        if (a.size() > len && a.size() <= n - i && std::memcmp(a.data(), s + i, a.size()) == 0) {
          len = a.size();
          k = t;
        }
      }
    }
    if (!len) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + len;
    if (set.flags[k] & AddedSet::kLstrip) {
      while (start > seg) {
        size_t p = start - 1;
        while (p > seg && (s[p] & 0xC0) == 0x80) --p;
        size_t q = p;
        if (!is_ws(utf8::next_cp(s, n, q))) break;
        start = p;
      }
    }
    if (set.flags[k] & AddedSet::kRstrip) {
      while (stop < n) {
        size_t q = stop;
        if (!is_ws(utf8::next_cp(s, n, q))) break;
        stop = q;
      }
    }
    if (seg < start) text(seg, start);
    if (sc.stop) return;
    if (sc.count == sc.limit) {
      sc.stop = true;
      sc.over = !sc.truncate;
      return;
    }
    sc.out->push_back(set.ids[k]);
    ++sc.count;
    i = seg = stop;
  }
  if (!sc.stop && seg < n) text(seg, n);
}

}  // namespace zoi::tok
