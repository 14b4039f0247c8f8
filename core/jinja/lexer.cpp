#include "core/jinja/lexer.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/jinja/strings.h"
#include "core/jinja/value.h"

namespace kvscope::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

// Python's str.splitlines() + "\n".join, dropping one trailing newline
// (jinja2's keep_trailing_newline=False).
std::string normalize_newlines(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = s[i];
    if (c == '\r') {
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
      out += '\n';
    } else if (c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) {
      out += '\n';
    } else if (c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x85) {
      out += '\n';
      ++i;
    } else if (c == 0xE2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
               (static_cast<unsigned char>(s[i + 2]) == 0xA8 ||
                static_cast<unsigned char>(s[i + 2]) == 0xA9)) {
      out += '\n';
      i += 2;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& name, const LexOptions& options)
      : src_(normalize_newlines(source)), name_(name), options_(options) {}

  std::vector<Token> run();

 private:
  [[noreturn]] void fail(size_t offset, const std::string& message) const;
  void position(size_t offset, int& line, int& column) const;
  void emit(TokenType type, size_t offset, std::string text = "");
  std::string strip_before(std::string text, char modifier, bool lstrip_applies) const;
  bool match_raw_begin(size_t at, size_t& end) const;
  size_t find_raw_end(size_t from, size_t& tag_start, char& modifier, size_t& after) const;
  void lex_comment(size_t at);
  void lex_raw(size_t content_start);
  void lex_tag(size_t at, bool block);
  bool match_tag_end(bool block, size_t& pos);
  void lex_token(size_t& pos);
  void lex_number(size_t& pos);
  void lex_string(size_t& pos);

  std::string src_;
  std::string name_;
  LexOptions options_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  mutable size_t cache_offset_ = 0;
  mutable int cache_line_ = 1;
  mutable int cache_column_ = 1;
};

void Lexer::position(size_t offset, int& line, int& column) const {
  // Tokens arrive in order, so resume from the last position computed.
  if (offset < cache_offset_) {
    cache_offset_ = 0;
    cache_line_ = 1;
    cache_column_ = 1;
  }
  for (size_t i = cache_offset_; i < offset && i < src_.size(); ++i) {
    if (src_[i] == '\n') {
      ++cache_line_;
      cache_column_ = 1;
    } else if ((static_cast<unsigned char>(src_[i]) & 0xC0) != 0x80) {
      ++cache_column_;
    }
  }
  cache_offset_ = offset;
  line = cache_line_;
  column = cache_column_;
}

void Lexer::fail(size_t offset, const std::string& message) const {
  int line, column;
  position(offset, line, column);
  throw TemplateSyntaxError(name_ + ": line " + std::to_string(line) + ", column " +
                            std::to_string(column) + ": " + message);
}

void Lexer::emit(TokenType type, size_t offset, std::string text) {
  Token t;
  t.type = type;
  t.text = std::move(text);
  position(offset, t.line, t.column);
  tokens_.push_back(std::move(t));
}

// Whitespace control for the text before a tag: '-' strips all trailing
// whitespace; otherwise lstrip_blocks strips spaces/tabs back to the line
// start, when the tag starts its line.
std::string Lexer::strip_before(std::string text, char modifier, bool lstrip_applies) const {
  if (modifier == '-') {
    size_t end = text.size();
    while (end > 0 && is_space(text[end - 1])) --end;
    text.resize(end);
  } else if (modifier != '+' && lstrip_applies && options_.lstrip_blocks) {
    size_t nl = text.rfind('\n');
    size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if ((l_pos > 0 || line_starting_) && l_pos < text.size()) {
      bool all_space = true;
      for (size_t i = l_pos; i < text.size(); ++i) all_space = all_space && is_space(text[i]);
      if (all_space) text.resize(l_pos);
    }
  }
  return text;
}

std::vector<Token> Lexer::run() {
  while (pos_ < src_.size()) {
    size_t at = src_.find('{', pos_);
    while (at != std::string::npos && at + 1 < src_.size() && !std::strchr("{%#", src_[at + 1]))
      at = src_.find('{', at + 1);
    if (at == std::string::npos || at + 1 >= src_.size()) {
      emit(TokenType::Data, pos_, src_.substr(pos_));
      break;
    }
    char kind = src_[at + 1];
    char modifier = at + 2 < src_.size() ? src_[at + 2] : '\0';
    size_t raw_end = 0;
    bool raw = kind == '%' && match_raw_begin(at, raw_end);
    std::string text = strip_before(src_.substr(pos_, at - pos_), modifier, kind != '{');
    if (!text.empty()) emit(TokenType::Data, pos_, std::move(text));
    if (kind == '#') {
      lex_comment(at);
    } else if (raw) {
      pos_ = raw_end;
      line_starting_ = src_[raw_end - 1] == '\n';
      lex_raw(raw_end);
    } else {
      lex_tag(at, kind == '%');
    }
  }
  emit(TokenType::Eof, src_.size());
  return std::move(tokens_);
}

void Lexer::lex_comment(size_t at) {
  size_t end = src_.find("#}", at + 2);
  if (end == std::string::npos) fail(at, "missing end of comment tag");
  char modifier = end > at + 2 ? src_[end - 1] : '\0';
  pos_ = end + 2;
  if (modifier == '-') {
    while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
  } else if (modifier != '+' && options_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
    ++pos_;
  }
  line_starting_ = src_[pos_ - 1] == '\n';
}

// {%[-+]?\s*raw\s*(-%}\s*|%}) at `at`; sets `end` past it.
bool Lexer::match_raw_begin(size_t at, size_t& end) const {
  size_t p = at + 2;
  if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
  while (p < src_.size() && is_space(src_[p])) ++p;
  if (src_.compare(p, 3, "raw") != 0) return false;
  p += 3;
  if (p < src_.size() && is_name_char(src_[p])) return false;
  while (p < src_.size() && is_space(src_[p])) ++p;
  if (src_.compare(p, 3, "-%}") == 0) {
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
  } else if (src_.compare(p, 2, "%}") == 0) {
    p += 2;
  } else {
    return false;
  }
  end = p;
  return true;
}

// Finds {%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?) from `from`.
size_t Lexer::find_raw_end(size_t from, size_t& tag_start, char& modifier, size_t& after) const {
  for (size_t at = src_.find("{%", from); at != std::string::npos; at = src_.find("{%", at + 1)) {
    size_t p = at + 2;
    modifier = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p++] : '\0';
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 6, "endraw") != 0) continue;
    p += 6;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "+%}") == 0) {
      p += 3;
    } else if (src_.compare(p, 3, "-%}") == 0) {
      for (p += 3; p < src_.size() && is_space(src_[p]);) ++p;
    } else if (src_.compare(p, 2, "%}") == 0) {
      p += 2;
      if (options_.trim_blocks && p < src_.size() && src_[p] == '\n') ++p;
    } else {
      continue;
    }
    tag_start = at;
    after = p;
    return at;
  }
  return std::string::npos;
}

void Lexer::lex_raw(size_t content_start) {
  size_t tag_start = 0, after = 0;
  char modifier = '\0';
  if (find_raw_end(content_start, tag_start, modifier, after) == std::string::npos)
    fail(content_start, "missing end of raw directive");
  std::string text =
      strip_before(src_.substr(content_start, tag_start - content_start), modifier, true);
  if (!text.empty()) emit(TokenType::Data, content_start, std::move(text));
  pos_ = after;
  line_starting_ = src_[after - 1] == '\n';
}

void Lexer::lex_tag(size_t at, bool block) {
  emit(block ? TokenType::BlockBegin : TokenType::VarBegin, at);
  size_t pos = at + 2;
  if (pos < src_.size() && (src_[pos] == '-' || (block && src_[pos] == '+'))) ++pos;
  int depth = 0;
  while (true) {
    if (pos >= src_.size())
      fail(at, block ? "unexpected end of template, expected '%}'"
                     : "unexpected end of template, expected '}}'");
    if (depth == 0 && match_tag_end(block, pos)) return;
    if (is_space(src_[pos])) {
      ++pos;
      continue;
    }
    char c = src_[pos];
    lex_token(pos);
    if (c == '(' || c == '[' || c == '{') ++depth;
    if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
  }
}

bool Lexer::match_tag_end(bool block, size_t& pos) {
  const char* close = block ? "%}" : "}}";
  size_t p = pos;
  char modifier = '\0';
  if (src_[p] == '-' || (block && src_[p] == '+')) modifier = src_[p++];
  if (src_.compare(p, 2, close) != 0) return false;
  emit(block ? TokenType::BlockEnd : TokenType::VarEnd, pos);
  p += 2;
  if (modifier == '-') {
    while (p < src_.size() && is_space(src_[p])) ++p;
  } else if (block && modifier != '+' && options_.trim_blocks && p < src_.size() &&
             src_[p] == '\n') {
    ++p;
  }
  pos = p;
  pos_ = p;
  line_starting_ = src_[p - 1] == '\n';
  return true;
}

void Lexer::lex_token(size_t& pos) {
  char c = src_[pos];
  if (is_digit(c)) return lex_number(pos);
  if (c == '\'' || c == '"') return lex_string(pos);
  if (is_name_start(c)) {
    size_t start = pos;
    while (pos < src_.size() && is_name_char(src_[pos])) ++pos;
    emit(TokenType::Name, start, src_.substr(start, pos - start));
    return;
  }
  static const char* const kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
  for (const char* op : kTwo) {
    if (src_.compare(pos, 2, op) == 0) {
      emit(TokenType::Operator, pos, op);
      pos += 2;
      return;
    }
  }
  if (std::strchr("+-/*%~[](){}><=.:|,;", c)) {
    emit(TokenType::Operator, pos, std::string(1, c));
    ++pos;
    return;
  }
  fail(pos, std::string("unexpected char '") + c + "'");
}

void Lexer::lex_number(size_t& pos) {
  size_t start = pos;
  auto digits = [&](auto accept) {
    size_t begin = pos;
    while (pos < src_.size() &&
           (accept(src_[pos]) ||
            (src_[pos] == '_' && pos > begin && pos + 1 < src_.size() && accept(src_[pos + 1]))))
      ++pos;
    return pos > begin;
  };
  auto strip = [](std::string s) {
    std::string out;
    for (char ch : s)
      if (ch != '_') out += ch;
    return out;
  };
  if (src_[pos] == '0' && pos + 1 < src_.size() && std::strchr("xXoObB", src_[pos + 1])) {
    const char base_char = static_cast<char>(src_[pos + 1] | 0x20);
    const int base = base_char == 'x' ? 16 : base_char == 'o' ? 8 : 2;
    pos += 2;
    const size_t begin = pos;
    // Without a digit of its base after the prefix, jinja2 lexes a plain 0
    // (and the prefix letter starts a name).
    if (!digits([&](char ch) {
          if (base == 16) return std::isxdigit(static_cast<unsigned char>(ch)) != 0;
          return ch >= '0' && ch < char('0' + base);
        })) {
      pos = start + 1;
      emit(TokenType::Integer, start, "0");
      tokens_.back().int_value = 0;
      return;
    }
    const std::string text = strip(src_.substr(begin, pos - begin));
    emit(TokenType::Integer, start);
    errno = 0;
    tokens_.back().int_value = std::strtoll(text.c_str(), nullptr, base);
    if (errno == ERANGE)
      fail(start, "integer literal too large: " + src_.substr(start, pos - start));
    return;
  }
  digits(is_digit);
  bool is_float = false;
  bool after_dot = start > 0 && src_[start - 1] == '.';
  if (!after_dot && pos + 1 < src_.size() && src_[pos] == '.' && is_digit(src_[pos + 1])) {
    ++pos;
    digits(is_digit);
    is_float = true;
  }
  if (!after_dot && pos < src_.size() && (src_[pos] == 'e' || src_[pos] == 'E')) {
    size_t save = pos++;
    if (pos < src_.size() && (src_[pos] == '+' || src_[pos] == '-')) ++pos;
    if (digits(is_digit)) {
      is_float = true;
    } else {
      pos = save;
    }
  }
  std::string text = strip(src_.substr(start, pos - start));
  if (is_float) {
    emit(TokenType::Float, start, text);
    tokens_.back().float_value = std::strtod(text.c_str(), nullptr);
  } else {
    emit(TokenType::Integer, start, text);
    errno = 0;
    tokens_.back().int_value = std::strtoll(text.c_str(), nullptr, 10);
    if (errno == ERANGE) fail(start, "integer literal too large: " + text);
  }
}

// A quoted string, unescaped as Python's "unicode-escape" codec does.
void Lexer::lex_string(size_t& pos) {
  size_t start = pos;
  char quote = src_[pos++];
  std::string out;
  while (true) {
    if (pos >= src_.size()) fail(start, "unexpected end of string");
    char c = src_[pos++];
    if (c == quote) break;
    if (c != '\\') {
      out += c;
      continue;
    }
    if (pos >= src_.size()) fail(start, "unexpected end of string");
    char e = src_[pos++];
    auto hex = [&](int count) {
      if (pos + count > src_.size()) fail(start, "truncated \\x escape in string");
      uint32_t cp = 0;
      for (int k = 0; k < count; ++k) {
        char h = src_[pos++];
        if (!std::isxdigit(static_cast<unsigned char>(h))) fail(start, "bad escape in string");
        cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                 ? h - '0'
                                                 : (h | 0x20) - 'a' + 10);
      }
      append_code_point(out, cp);
    };
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '\n': break;
      case 'x': hex(2); break;
      case 'u': hex(4); break;
      case 'U': hex(8); break;
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && pos < src_.size() && src_[pos] >= '0' && src_[pos] <= '7'; ++k)
            cp = cp * 8 + static_cast<uint32_t>(src_[pos++] - '0');
          append_code_point(out, cp);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  emit(TokenType::String, start, std::move(out));
}

}  // namespace

std::vector<Token> tokenize(const std::string& source, const std::string& name,
                            const LexOptions& options) {
  return Lexer(source, name, options).run();
}

std::string describe(const Token& token) {
  switch (token.type) {
    case TokenType::Eof: return "end of template";
    case TokenType::Data: return "template data";
    case TokenType::VarBegin: return "'{{'";
    case TokenType::VarEnd: return "'}}'";
    case TokenType::BlockBegin: return "'{%'";
    case TokenType::BlockEnd: return "'%}'";
    case TokenType::String: return "string";
    case TokenType::Integer:
    case TokenType::Float: return "number";
    default: return "'" + token.text + "'";
  }
}

}  // namespace kvscope::jinja
