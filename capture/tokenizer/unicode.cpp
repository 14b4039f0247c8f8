#include "capture/tokenizer/unicode.h"

#include <unicode/uchar.h>

#include "core/common/input_error.h"

namespace kvscope::tokenizer::unicode {

namespace {

// Length of the maximal prefix of s[i..] that is a valid start of a UTF-8
// sequence, and the full length that sequence needs (Unicode table 3-7).
struct Probe {
  int matched = 0;
  int needed = 0;
};

Probe probe(const unsigned char* s, size_t n, size_t i) {
  unsigned char b0 = s[i];
  if (b0 < 0x80) return {1, 1};
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {0, 1};
  }
  int k = 1;
  for (; k < need && i + k < n; ++k) {
    unsigned char b = s[i + k];
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  return {k, need};
}

}  // namespace

int decode(const char* str, size_t n, size_t i, uint32_t* cp) {
  const auto* s = reinterpret_cast<const unsigned char*>(str);
  Probe p = probe(s, n, i);
  if (p.matched != p.needed) return 0;
  uint32_t c;
  switch (p.needed) {
    case 1:
      c = s[i];
      break;
    case 2:
      c = (s[i] & 0x1Fu) << 6 | (s[i + 1] & 0x3Fu);
      break;
    case 3:
      c = (s[i] & 0x0Fu) << 12 | (s[i + 1] & 0x3Fu) << 6 | (s[i + 2] & 0x3Fu);
      break;
    default:
      c = (s[i] & 0x07u) << 18 | (s[i + 1] & 0x3Fu) << 12 | (s[i + 2] & 0x3Fu) << 6 |
          (s[i + 3] & 0x3Fu);
  }
  *cp = c;
  return p.needed;
}

void append(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | cp >> 6));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | cp >> 12));
    out->push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | cp >> 18));
    out->push_back(static_cast<char>(0x80 | (cp >> 12 & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t find_invalid(const std::string& str) {
  const auto* s = reinterpret_cast<const unsigned char*>(str.data());
  size_t n = str.size();
  for (size_t i = 0; i < n;) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    Probe p = probe(s, n, i);
    if (p.matched != p.needed) return i;
    i += p.needed;
  }
  return std::string::npos;
}

void require_valid(const std::string& text) {
  size_t bad = find_invalid(text);
  if (bad != std::string::npos)
    throw InputError("", "text",
                     "invalid UTF-8 at byte " + std::to_string(bad) + " (expected UTF-8 text)");
}

std::string to_valid_lossy(const std::string& str) {
  if (find_invalid(str) == std::string::npos) return str;
  const auto* s = reinterpret_cast<const unsigned char*>(str.data());
  size_t n = str.size();
  std::string out;
  out.reserve(n + 8);
  for (size_t i = 0; i < n;) {
    Probe p = probe(s, n, i);
    if (p.matched == p.needed) {
      out.append(str, i, p.needed);
      i += p.needed;
    } else {
      // One U+FFFD per maximal subpart: the lead byte plus the continuation
      // bytes that were still acceptable (at least one byte).
      out += "\xEF\xBF\xBD";
      i += p.matched > 0 ? p.matched : 1;
    }
  }
  return out;
}

bool ends_with_incomplete(const std::string& str) {
  const auto* s = reinterpret_cast<const unsigned char*>(str.data());
  size_t n = str.size();
  // A character is at most 4 bytes: look at the last three starts.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    size_t i = n - back;
    if (s[i] >= 0x80 && s[i] < 0xC0) continue;  // continuation byte: look further back
    Probe p = probe(s, n, i);
    return p.needed > 1 && p.matched == static_cast<int>(back) && p.matched < p.needed;
  }
  return false;
}

const std::array<std::string, 256>& byte_to_char() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      append(&t[b], printable ? static_cast<uint32_t>(b) : next++);
    }
    return t;
  }();
  return table;
}

int char_to_byte(uint32_t cp) {
  static const std::array<int, 324> inverse = [] {
    std::array<int, 324> t;
    t.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[printable ? b : next++] = b;
    }
    return t;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

bool is_whitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_word(uint32_t c) {
  if (c < 0x80)
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  auto u = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL))
    return true;
  int8_t t = u_charType(u);
  return t == U_NON_SPACING_MARK || t == U_ENCLOSING_MARK || t == U_COMBINING_SPACING_MARK ||
         t == U_DECIMAL_DIGIT_NUMBER || t == U_CONNECTOR_PUNCTUATION;
}

bool is_numeric(uint32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  int8_t t = u_charType(static_cast<UChar32>(c));
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

}  // namespace kvscope::tokenizer::unicode
