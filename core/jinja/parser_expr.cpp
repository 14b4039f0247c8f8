// Expression parsing, with jinja2's precedence: conditional, or, and, not,
// comparisons, + -, ~, * / // %, **, unary, postfix, filters and tests.
#include <functional>

#include "core/jinja/parser_impl.h"

namespace kvscope::jinja::detail {

ExprPtr Parser::binary(ExprKind kind, const std::string& op, ExprPtr left, ExprPtr right,
                       const Token& at) const {
  auto node = make(kind, at);
  node->name = op;
  node->children.push_back(std::move(left));
  node->children.push_back(std::move(right));
  return node;
}

ExprPtr Parser::parse_tuple(bool with_condexpr, std::initializer_list<const char*> end_names,
                            bool explicit_parens) {
  const Token at = cur();
  auto node = make(ExprKind::Tuple, at);
  bool is_tuple = false;
  auto at_end = [&]() {
    if (cur().type == TokenType::VarEnd || cur().type == TokenType::BlockEnd || is_op(")"))
      return true;
    for (const char* n : end_names)
      if (is_name(n)) return true;
    return false;
  };
  while (true) {
    if (!node->children.empty()) expect_op(",");
    if (at_end()) break;
    node->children.push_back(parse_expression(with_condexpr));
    if (!is_op(",")) break;
    is_tuple = true;
  }
  if (!is_tuple) {
    if (node->children.size() == 1) return std::move(node->children[0]);
    if (!explicit_parens) fail(at, "expected an expression, found " + describe(cur()));
  }
  return node;
}

ExprPtr Parser::parse_expression(bool with_condexpr) {
  DepthGuard guard(depth_, max_depth_);
  ExprPtr expr = parse_or();
  if (!with_condexpr) return expr;
  while (is_name("if")) {
    const Token at = cur();
    advance();
    auto node = make(ExprKind::CondExpr, at);
    node->children.push_back(parse_or());
    node->children.push_back(std::move(expr));
    node->children.push_back(accept_name("else") ? parse_expression() : nullptr);
    expr = std::move(node);
  }
  return expr;
}

// One precedence level: `next (op next)*`, left-associative, the operator
// either a name (`or`, `and`) or an operator token.
ExprPtr Parser::binary_chain(ExprKind kind, const std::function<ExprPtr()>& next,
                             std::initializer_list<const char*> ops, bool names) {
  ExprPtr left = next();
  auto at_op = [&] {
    for (const char* op : ops)
      if (names ? is_name(op) : is_op(op)) return true;
    return false;
  };
  while (at_op()) {
    const Token at = cur();
    advance();
    left = binary(kind, at.text, std::move(left), next(), at);
  }
  return left;
}

ExprPtr Parser::parse_or() {
  return binary_chain(
      ExprKind::Or, [this] { return parse_and(); }, {"or"}, true);
}

ExprPtr Parser::parse_and() {
  return binary_chain(
      ExprKind::And, [this] { return parse_not(); }, {"and"}, true);
}

ExprPtr Parser::parse_not() {
  if (is_name("not")) {
    DepthGuard guard(depth_, max_depth_);
    auto node = make(ExprKind::Unary, cur());
    advance();
    node->name = "not";
    node->children.push_back(parse_not());
    return node;
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
  const Token at = cur();
  ExprPtr first = parse_math1();
  auto node = make(ExprKind::Compare, at);
  node->children.push_back(std::move(first));
  while (true) {
    if (cur().type == TokenType::Operator &&
        (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
         cur().text == "<=" || cur().text == ">=")) {
      node->ops.push_back(cur().text);
      advance();
    } else if (is_name("in")) {
      node->ops.push_back("in");
      advance();
    } else if (is_name("not") && peek().type == TokenType::Name && peek().text == "in") {
      node->ops.push_back("notin");
      advance();
      advance();
    } else {
      break;
    }
    node->children.push_back(parse_math1());
  }
  if (node->ops.empty()) return std::move(node->children[0]);
  return node;
}

ExprPtr Parser::parse_math1() {
  return binary_chain(ExprKind::Binary, [this] { return parse_concat(); }, {"+", "-"});
}

ExprPtr Parser::parse_concat() {
  return binary_chain(ExprKind::Binary, [this] { return parse_math2(); }, {"~"});
}

ExprPtr Parser::parse_math2() {
  return binary_chain(ExprKind::Binary, [this] { return parse_pow(); }, {"*", "/", "//", "%"});
}

ExprPtr Parser::parse_pow() {
  return binary_chain(ExprKind::Binary, [this] { return parse_unary(); }, {"**"});
}

// `callee(args...)`, the current token the opening parenthesis.
ExprPtr Parser::parse_call(ExprPtr callee, const Token& at) {
  auto call = make(ExprKind::Call, at);
  call->children.push_back(std::move(callee));
  parse_call_args(*call);
  return call;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  DepthGuard guard(depth_, max_depth_);
  ExprPtr node;
  if (is_op("-") || is_op("+")) {
    node = make(ExprKind::Unary, cur());
    node->name = cur().text;
    advance();
    node->children.push_back(parse_unary(false));
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  if (with_filter) node = parse_filter_expr(std::move(node));
  return node;
}

ExprPtr Parser::parse_primary() {
  const Token at = cur();
  if (at.type == TokenType::Name) {
    advance();
    auto node = make(ExprKind::Const, at);
    if (at.text == "true" || at.text == "True") {
      node->value = Value(true);
    } else if (at.text == "false" || at.text == "False") {
      node->value = Value(false);
    } else if (at.text == "none" || at.text == "None") {
      node->value = Value(nullptr);
    } else {
      node->kind = ExprKind::Name;
      node->name = at.text;
    }
    return node;
  }
  if (at.type == TokenType::String) {
    std::string text;
    while (cur().type == TokenType::String) {
      text += cur().text;
      advance();
    }
    auto node = make(ExprKind::Const, at);
    node->value = Value(std::move(text));
    return node;
  }
  if (at.type == TokenType::Integer || at.type == TokenType::Float) {
    advance();
    auto node = make(ExprKind::Const, at);
    node->value = at.type == TokenType::Integer ? Value(at.int_value) : Value(at.float_value);
    return node;
  }
  if (accept_op("(")) {
    ExprPtr node = parse_tuple(true, {}, true);
    expect_op(")");
    return node;
  }
  if (is_op("[") || is_op("{")) return parse_list_or_dict(is_op("{"));
  fail(at, "unexpected " + describe(at));
}

ExprPtr Parser::parse_list_or_dict(bool dict) {
  auto node = make(dict ? ExprKind::Dict : ExprKind::List, cur());
  advance();
  const char* close = dict ? "}" : "]";
  size_t count = 0;
  while (!is_op(close)) {
    if (count++ > 0) expect_op(",");
    if (is_op(close)) break;
    node->children.push_back(parse_expression());
    if (dict) {
      expect_op(":");
      node->children.push_back(parse_expression());
    }
  }
  expect_op(close);
  return node;
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
  while (true) {
    const Token at = cur();
    if (accept_op(".")) {
      if (cur().type == TokenType::Name) {
        auto attr = make(ExprKind::GetAttr, at);
        attr->name = cur().text;
        attr->children.push_back(std::move(node));
        node = std::move(attr);
      } else if (cur().type == TokenType::Integer) {
        auto item = make(ExprKind::GetItem, at);
        item->children.push_back(std::move(node));
        auto index = make(ExprKind::Const, cur());
        index->value = Value(cur().int_value);
        item->children.push_back(std::move(index));
        node = std::move(item);
      } else {
        unexpected("an attribute name");
      }
      advance();
    } else if (is_op("[")) {
      node = parse_subscript(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node), at);
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr node) {
  const Token at = cur();
  advance();
  ExprPtr parts[3];
  bool is_slice = false;
  if (!is_op(":")) parts[0] = parse_expression();
  if (accept_op(":")) {
    is_slice = true;
    if (!is_op("]") && !is_op(":")) parts[1] = parse_expression();
    if (accept_op(":") && !is_op("]")) parts[2] = parse_expression();
  }
  expect_op("]");
  auto result = make(is_slice ? ExprKind::Slice : ExprKind::GetItem, at);
  result->children.push_back(std::move(node));
  if (is_slice) {
    for (auto& p : parts) result->children.push_back(std::move(p));
  } else {
    result->children.push_back(std::move(parts[0]));
  }
  return result;
}

// (a, b, name=c): fills children[1..] and kwargs.
void Parser::parse_call_args(Expr& node) {
  expect_op("(");
  size_t count = 0;
  while (!is_op(")")) {
    if (count++ > 0) expect_op(",");
    if (is_op(")")) break;
    if (is_op("*") || is_op("**")) fail(cur(), "unsupported: *args and **kwargs in calls");
    if (cur().type == TokenType::Name && peek().type == TokenType::Operator && peek().text == "=") {
      std::string key = cur().text;
      advance();
      advance();
      node.kwargs.emplace_back(key, parse_expression());
    } else {
      if (!node.kwargs.empty()) fail(cur(), "positional argument follows keyword argument");
      node.children.push_back(parse_expression());
    }
  }
  expect_op(")");
}

ExprPtr Parser::parse_filter(ExprPtr node) {
  const Token at = cur();
  auto filter = make(ExprKind::Filter, at);
  filter->name = expect_identifier();
  while (is_op(".") && peek().type == TokenType::Name) {
    advance();
    filter->name += "." + expect_identifier();
  }
  filter->children.push_back(std::move(node));
  if (is_op("(")) parse_call_args(*filter);
  return filter;
}

ExprPtr Parser::parse_test(ExprPtr node) {
  const Token at = cur();
  advance();  // 'is'
  auto test = make(ExprKind::Test, at);
  test->negated = accept_name("not");
  test->name = expect_identifier();
  while (is_op(".") && peek().type == TokenType::Name) {
    advance();
    test->name += "." + expect_identifier();
  }
  test->children.push_back(std::move(node));
  const Token& t = cur();
  if (is_op("(")) {
    parse_call_args(*test);
  } else if ((t.type == TokenType::Name || t.type == TokenType::String ||
              t.type == TokenType::Integer || t.type == TokenType::Float || is_op("[") ||
              is_op("{")) &&
             !is_name("else") && !is_name("or") && !is_name("and")) {
    if (is_name("is")) fail(t, "you cannot chain multiple tests with is");
    test->children.push_back(parse_postfix(parse_primary()));
  }
  return test;
}

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (accept_op("|")) {
      node = parse_filter(std::move(node));
    } else if (is_name("is")) {
      node = parse_test(std::move(node));
    } else if (is_op("(")) {
      node = parse_call(std::move(node), cur());
    } else {
      return node;
    }
  }
}

}  // namespace kvscope::jinja::detail
