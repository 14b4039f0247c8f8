// The Jinja2 lexer: template source to tokens, with trim_blocks and
// lstrip_blocks applied as jinja2 applies them (transformers turns both on).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope::jinja {

enum class TokenType {
  Data,        // literal template text (whitespace control already applied)
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,
  Integer,
  Float,
  Operator,
  Eof,
};

struct Token {
  TokenType type;
  std::string text;  // data, name, operator, or the unescaped string
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int column = 1;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Raises TemplateSyntaxError ("<name>: line L, column C: ...") on bad input.
std::vector<Token> tokenize(const std::string& source, const std::string& name,
                            const LexOptions& options = {});

// A readable name for a token in error messages ("'endif'", "end of template").
std::string describe(const Token& token);

}  // namespace kvscope::jinja
