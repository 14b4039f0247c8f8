#include "core/jinja/parser.h"

#include <algorithm>

#include "core/jinja/parser_impl.h"

namespace kvscope::jinja {
namespace {

bool is_closing_tag(const std::string& tag) {
  static const char* const kTags[] = {"endif",   "endfor",    "endmacro", "endset",
                                      "endcall", "endfilter", "endwith",  "endgeneration",
                                      "endraw",  "elif",      "else"};
  for (const char* t : kTags)
    if (tag == t) return true;
  return false;
}

bool expr_reads(const Expr* e, const std::string& name) {
  if (!e) return false;
  if (e->kind == ExprKind::Name && e->name == name) return true;
  for (const auto& c : e->children)
    if (expr_reads(c.get(), name)) return true;
  for (const auto& kw : e->kwargs)
    if (expr_reads(kw.second.get(), name)) return true;
  return false;
}

bool body_reads(const Body& body, const std::string& name) {
  for (const auto& s : body) {
    for (const auto& e : s->exprs)
      if (expr_reads(e.get(), name)) return true;
    for (const auto& b : s->bodies)
      if (body_reads(b, name)) return true;
  }
  return false;
}

}  // namespace

namespace detail {

void Parser::fail(const Token& at, const std::string& message) const {
  throw TemplateSyntaxError(name_ + ": line " + std::to_string(at.line) + ", column " +
                            std::to_string(at.column) + ": " + message);
}

void Parser::unexpected(const std::string& expected) const {
  fail(cur(), "expected " + expected + ", found " + describe(cur()));
}

void Parser::expect_op(const char* op) {
  if (!accept_op(op)) unexpected(std::string("'") + op + "'");
}

std::string Parser::expect_identifier() {
  if (cur().type != TokenType::Name) unexpected("a name");
  std::string n = cur().text;
  advance();
  return n;
}

void Parser::expect_block_end() {
  if (cur().type != TokenType::BlockEnd) unexpected("end of statement block");
  advance();
}

StmtPtr Parser::make_stmt(StmtKind kind, const Token& at) const {
  auto s = std::make_unique<Stmt>();
  s->kind = kind;
  s->line = at.line;
  s->column = at.column;
  return s;
}

ExprPtr Parser::make(ExprKind kind, const Token& at) const {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = at.line;
  e->column = at.column;
  return e;
}

Body Parser::parse_all() {
  std::string found;
  Body body = parse_body({}, &found);
  if (cur().type != TokenType::Eof) unexpected("end of template");
  return body;
}

// Parses statements until `{% <end tag>` (left positioned after the tag
// name, which goes to *found) or end of template.
Body Parser::parse_body(std::initializer_list<const char*> end_tags, std::string* found) {
  DepthGuard guard(depth_, max_depth_);
  Body body;
  while (true) {
    const Token& t = cur();
    if (t.type == TokenType::Eof) {
      if (end_tags.size() == 0) return body;
      std::string expected;
      for (const char* tag : end_tags)
        expected += (expected.empty() ? "'" : " or '") + std::string(tag) + "'";
      fail(t, "unexpected end of template, expected " + expected);
    }
    if (t.type == TokenType::Data) {
      auto s = make_stmt(StmtKind::Output, t);
      s->text = t.text;
      body.push_back(std::move(s));
      advance();
    } else if (t.type == TokenType::VarBegin) {
      auto s = make_stmt(StmtKind::Print, t);
      advance();
      s->exprs.push_back(parse_tuple(true, {}));
      if (cur().type != TokenType::VarEnd) unexpected("'}}'");
      advance();
      body.push_back(std::move(s));
    } else if (t.type == TokenType::BlockBegin) {
      const Token& tag = peek();
      if (tag.type == TokenType::Name) {
        for (const char* end : end_tags) {
          if (tag.text == end) {
            advance();
            advance();
            *found = end;
            return body;
          }
        }
      }
      if (tag.type == TokenType::Name && is_closing_tag(tag.text)) {
        std::string expected;
        for (const char* end : end_tags)
          expected += (expected.empty() ? "'" : " or '") + std::string(end) + "'";
        if (expected.empty()) fail(tag, "unexpected '" + tag.text + "'");
        fail(tag, "expected " + expected + ", found '" + tag.text + "'");
      }
      advance();
      body.push_back(parse_statement());
    } else {
      unexpected("template data or a tag");
    }
  }
}

StmtPtr Parser::parse_statement() {
  const Token at = cur();
  if (at.type != TokenType::Name) unexpected("a statement name");
  const std::string& tag = at.text;
  advance();
  if (tag == "if") return parse_if(at);
  if (tag == "for") return parse_for(at);
  if (tag == "set") return parse_set(at);
  if (tag == "macro") return parse_macro(at);
  if (tag == "call") return parse_call_block(at);
  if (tag == "filter") return parse_filter_block(at);
  if (tag == "with") return parse_with(at);
  if (tag == "generation") return parse_simple_block(at, StmtKind::Scope, "endgeneration");
  if (tag == "break" || tag == "continue") {
    auto s = make_stmt(tag == "break" ? StmtKind::Break : StmtKind::Continue, at);
    expect_block_end();
    return s;
  }
  static const char* const kUnsupported[] = {"include", "import", "from",       "extends",
                                             "block",   "do",     "autoescape", "trans"};
  for (const char* u : kUnsupported)
    if (tag == u) fail(at, "unsupported: {% " + tag + " %}");
  fail(at, "unknown tag '" + tag + "'");
}

StmtPtr Parser::parse_simple_block(const Token& at, StmtKind kind, const char* end_tag) {
  auto s = make_stmt(kind, at);
  expect_block_end();
  std::string found;
  s->bodies.push_back(parse_body({end_tag}, &found));
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_if(const Token& at) {
  auto s = make_stmt(StmtKind::If, at);
  s->exprs.push_back(parse_tuple(true, {}));
  expect_block_end();
  while (true) {
    std::string found;
    s->bodies.push_back(parse_body({"elif", "else", "endif"}, &found));
    if (found == "elif") {
      s->exprs.push_back(parse_tuple(true, {}));
      expect_block_end();
    } else if (found == "else") {
      expect_block_end();
      s->bodies.push_back(parse_body({"endif"}, &found));
      expect_block_end();
      return s;
    } else {
      expect_block_end();
      return s;
    }
  }
}

StmtPtr Parser::parse_for(const Token& at) {
  auto s = make_stmt(StmtKind::For, at);
  s->exprs.push_back(parse_assign_target(false, {"in"}));
  if (!accept_name("in")) unexpected("'in'");
  s->exprs.push_back(parse_tuple(false, {"recursive"}));
  s->exprs.push_back(accept_name("if") ? parse_expression() : nullptr);
  if (is_name("recursive")) fail(cur(), "unsupported: recursive for loops");
  expect_block_end();
  std::string found;
  s->bodies.push_back(parse_body({"endfor", "else"}, &found));
  if (found == "else") {
    expect_block_end();
    s->bodies.push_back(parse_body({"endfor"}, &found));
  } else {
    s->bodies.emplace_back();
  }
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_set(const Token& at) {
  ExprPtr target = parse_assign_target(true, {});
  if (accept_op("=")) {
    auto s = make_stmt(StmtKind::Set, at);
    s->exprs.push_back(std::move(target));
    s->exprs.push_back(parse_tuple(true, {}));
    expect_block_end();
    return s;
  }
  auto s = make_stmt(StmtKind::SetBlock, at);
  s->exprs.push_back(std::move(target));
  s->exprs.push_back(is_op("|") ? parse_filter_chain(nullptr) : nullptr);
  expect_block_end();
  std::string found;
  s->bodies.push_back(parse_body({"endset"}, &found));
  expect_block_end();
  return s;
}

ExprPtr Parser::parse_filter_chain(ExprPtr subject) {
  ExprPtr node = std::move(subject);
  while (accept_op("|")) node = parse_filter(std::move(node));
  return node;
}

// Parameters of a macro or call block: (a, b=default, ...).
void Parser::parse_signature(Stmt& stmt) {
  expect_op("(");
  while (!is_op(")")) {
    if (!stmt.params.empty()) expect_op(",");
    if (is_op(")")) break;
    stmt.params.push_back(expect_identifier());
    stmt.exprs.push_back(accept_op("=") ? parse_expression() : nullptr);
  }
  expect_op(")");
}

StmtPtr Parser::parse_macro(const Token& at) {
  auto s = make_stmt(StmtKind::Macro, at);
  s->name = expect_identifier();
  parse_signature(*s);
  expect_block_end();
  std::string found;
  s->bodies.push_back(parse_body({"endmacro"}, &found));
  s->uses_varargs = body_reads(s->bodies[0], "varargs");
  s->uses_kwargs = body_reads(s->bodies[0], "kwargs");
  if (cur().type == TokenType::Name && cur().text == s->name) advance();
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_call_block(const Token& at) {
  auto s = make_stmt(StmtKind::CallBlock, at);
  Stmt params;
  if (is_op("(")) parse_signature(params);
  ExprPtr call = parse_expression();
  if (call->kind != ExprKind::Call) fail(at, "expected call");
  s->exprs.push_back(std::move(call));
  s->params = std::move(params.params);
  for (auto& e : params.exprs) s->exprs.push_back(std::move(e));
  expect_block_end();
  std::string found;
  s->bodies.push_back(parse_body({"endcall"}, &found));
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_filter_block(const Token& at) {
  auto s = make_stmt(StmtKind::FilterBlock, at);
  ExprPtr chain = parse_filter(nullptr);
  s->exprs.push_back(parse_filter_chain(std::move(chain)));
  expect_block_end();
  std::string found;
  s->bodies.push_back(parse_body({"endfilter"}, &found));
  expect_block_end();
  return s;
}

StmtPtr Parser::parse_with(const Token& at) {
  auto s = make_stmt(StmtKind::With, at);
  while (cur().type != TokenType::BlockEnd) {
    if (!s->params.empty()) expect_op(",");
    s->params.push_back(expect_identifier());
    expect_op("=");
    s->exprs.push_back(parse_expression());
  }
  expect_block_end();
  std::string found;
  s->bodies.push_back(parse_body({"endwith"}, &found));
  expect_block_end();
  return s;
}

// A name, `ns.attr` (set only), or a tuple of names.
ExprPtr Parser::parse_assign_target(bool allow_attr, std::initializer_list<const char*>) {
  const Token at = cur();
  auto name_node = [&]() {
    auto n = make(ExprKind::Name, cur());
    n->name = expect_identifier();
    return n;
  };
  if (allow_attr && at.type == TokenType::Name && peek().type == TokenType::Operator &&
      peek().text == ".") {
    auto node = make(ExprKind::GetAttr, at);
    node->children.push_back(name_node());
    advance();
    node->name = expect_identifier();
    return node;
  }
  bool parens = accept_op("(");
  ExprPtr first = name_node();
  if (!parens && !is_op(",")) return first;
  auto tuple = make(ExprKind::Tuple, at);
  tuple->children.push_back(std::move(first));
  while (accept_op(",")) {
    if (cur().type != TokenType::Name) break;
    tuple->children.push_back(name_node());
  }
  if (parens) expect_op(")");
  return tuple;
}

}  // namespace detail

Body parse_template(const std::string& source, const std::string& name, int64_t max_depth) {
  return detail::Parser(tokenize(source, name), name, max_depth).parse_all();
}

}  // namespace kvscope::jinja
