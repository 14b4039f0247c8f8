// UTF-8 and Unicode helpers the tokenizers share: strict decoding, lossy
// conversion with the replacement rules of Rust's String::from_utf8_lossy
// (what Hugging Face `tokenizers` uses when decoding), the GPT-2 byte<->unicode
// table, and the character classes the pipelines test (White_Space, \w, N*).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvscope::tokenizer::unicode {

// Decodes the code point at s[i]. Returns its byte length (1-4), or 0 when the
// bytes there are not well-formed UTF-8 (overlongs, surrogates, > U+10FFFF and
// truncated sequences are all rejected).
int decode(const char* s, size_t n, size_t i, uint32_t* cp);
// Byte length of the character starting at lead byte `b` of valid UTF-8.
inline int char_length(unsigned char b) {
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}
void append(std::string* out, uint32_t cp);
// Offset of the first byte that is not part of well-formed UTF-8, or npos.
size_t find_invalid(const std::string& s);
// Throws InputError (field "text") naming the offset of the first bad byte.
void require_valid(const std::string& text);
// Replaces every maximal ill-formed subsequence by one U+FFFD.
std::string to_valid_lossy(const std::string& bytes);
// True when the last bytes of `s` are the start of a character that more
// bytes could still complete (so a streaming decoder should wait).
bool ends_with_incomplete(const std::string& s);

// GPT-2 byte-level table (formats.md 4.5): UTF-8 text of the character byte b maps to.
const std::array<std::string, 256>& byte_to_char();
// The byte a code point stands for in the table, or -1.
int char_to_byte(uint32_t cp);

bool is_whitespace(uint32_t cp);  // Unicode White_Space (Rust char::is_whitespace, regex \s)
bool is_word(uint32_t cp);        // Rust regex \w: Alphabetic, M, Nd, Pc, Join_Control
bool is_numeric(uint32_t cp);     // Rust char::is_numeric: Nd, Nl, No

}  // namespace kvscope::tokenizer::unicode
