// What the batch / stream bindings (csrc/tokenizer/bind.cc) ask of a native tokenizer: one
// UTF-8 text -> its ids (specials included), thread-safe and read-only after construction.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace zoi::tok {

class TextEncoder {
 public:
  virtual ~TextEncoder() = default;
  // Appends the ids of one text (head + content + tail) to out. truncate: content cut to
  // max_len - specials (max_len <= 0: the tokenizer's own). Else a text over the limit
  // returns false (out then holds a partial sequence; the caller drops it).
  virtual bool encode(const char* s, size_t n, bool truncate, std::vector<int32_t>& out, int max_len = 0) const = 0;
  virtual int num_special() const = 0;
};

}  // namespace zoi::tok
