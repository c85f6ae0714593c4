// UTF-8 and the Unicode property table, shared by the native tokenizers (WordPiece, byte-level
// BPE): one decoder and one encoder, so both read malformed input the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tokenizer/unicode_tables.h"

namespace zoi::tok::utf8 {

inline uint16_t props(uint32_t cp) {
  return uni::kStage2[static_cast<size_t>(uni::kStage1[cp >> 8]) * 256 + (cp & 255)];
}

// valid UTF-8 is guaranteed by the caller (Python's UTF-8 of a str); a malformed byte still
// advances by one and reads as U+FFFD, never past the end
inline uint32_t next_cp(const uint8_t* s, size_t n, size_t& i) {
  const uint8_t c = s[i];
  if (c < 0x80) {
    ++i;
    return c;
  }
  int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
  if (len == 0 || i + len > n) {
    ++i;
    return 0xFFFD;
  }
  uint32_t cp = c & (0x7F >> len);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
  i += len;
  return cp < 0x110000 ? cp : 0xFFFD;
}

inline void put_utf8(std::string& w, uint32_t cp) {
  if (cp < 0x80) {
    w.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    w.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    w.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    w.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    w.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    w.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    w.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    w.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    w.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    w.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace zoi::tok::utf8
