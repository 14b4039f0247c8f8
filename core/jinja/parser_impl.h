// Internal to the parser: the Parser class, shared by parser.cpp
// (statements) and parser_expr.cpp (expressions).
#pragma once

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/jinja/parser.h"

namespace kvscope::jinja::detail {

class DepthGuard {
 public:
  DepthGuard(int64_t& depth, int64_t max) : depth_(depth) {
    if (++depth_ > max) throw TemplateLimitError("recursion depth " + std::to_string(max));
  }
  ~DepthGuard() { --depth_; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  int64_t& depth_;
};

class Parser {
 public:
  Parser(std::vector<Token> tokens, std::string name, int64_t max_depth)
      : tokens_(std::move(tokens)), name_(std::move(name)), max_depth_(max_depth) {}

  Body parse_all();

 private:
  // Token stream.
  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek(size_t n = 1) const { return tokens_[std::min(pos_ + n, tokens_.size() - 1)]; }
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool is_op(const char* op) const { return cur().type == TokenType::Operator && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == TokenType::Name && cur().text == n; }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool accept_name(const char* n) {
    if (!is_name(n)) return false;
    advance();
    return true;
  }
  void expect_op(const char* op);
  std::string expect_identifier();
  void expect_block_end();
  [[noreturn]] void fail(const Token& at, const std::string& message) const;
  [[noreturn]] void unexpected(const std::string& expected) const;

  // Statements.
  Body parse_body(std::initializer_list<const char*> end_tags, std::string* found);
  StmtPtr parse_statement();
  StmtPtr make_stmt(StmtKind kind, const Token& at) const;
  StmtPtr parse_if(const Token& at);
  StmtPtr parse_for(const Token& at);
  StmtPtr parse_set(const Token& at);
  StmtPtr parse_macro(const Token& at);
  StmtPtr parse_call_block(const Token& at);
  StmtPtr parse_filter_block(const Token& at);
  StmtPtr parse_with(const Token& at);
  StmtPtr parse_simple_block(const Token& at, StmtKind kind, const char* end_tag);
  void parse_signature(Stmt& stmt);
  ExprPtr parse_filter_chain(ExprPtr subject);
  ExprPtr parse_assign_target(bool allow_attr, std::initializer_list<const char*> end_names);

  // Expressions.
  ExprPtr make(ExprKind kind, const Token& at) const;
  ExprPtr parse_expression(bool with_condexpr = true);
  ExprPtr binary_chain(ExprKind kind, const std::function<ExprPtr()>& next,
                       std::initializer_list<const char*> ops, bool names = false);
  ExprPtr parse_call(ExprPtr callee, const Token& at);
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter = true);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_slice_part();
  ExprPtr parse_tuple(bool with_condexpr, std::initializer_list<const char*> end_names,
                      bool explicit_parens = false);
  ExprPtr parse_list_or_dict(bool dict);
  void parse_call_args(Expr& node);
  ExprPtr parse_filter(ExprPtr node);
  ExprPtr parse_test(ExprPtr node);
  ExprPtr binary(ExprKind kind, const std::string& op, ExprPtr left, ExprPtr right,
                 const Token& at) const;

  std::vector<Token> tokens_;
  std::string name_;
  int64_t max_depth_;
  int64_t depth_ = 0;
  size_t pos_ = 0;
};

}  // namespace kvscope::jinja::detail
