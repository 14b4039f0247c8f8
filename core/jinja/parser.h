// The Jinja2 parser: tokens to a tree of statements and expressions.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/jinja/lexer.h"
#include "core/jinja/value.h"

namespace kvscope::jinja {

enum class ExprKind {
  Const,     // value
  Name,      // name
  List,      // children
  Tuple,     // children
  Dict,      // children: key, value, key, value, ...
  GetAttr,   // children[0].name
  GetItem,   // children[0][children[1]]
  Slice,     // children[0][children[1]:children[2]:children[3]] (null = omitted)
  Call,      // children[0](children[1..], kwargs)
  Filter,    // children[0] | name(children[1..], kwargs); children[0] null in filter blocks
  Test,      // children[0] is [not] name(children[1..], kwargs)
  Unary,     // name ("-", "+", "not") children[0]
  Binary,    // children[0] name children[1]: + - * / // % ** ~
  Compare,   // children[0] ops[0] children[1] ops[1] children[2] ...
  And,       // children[0] and children[1]
  Or,        // children[0] or children[1]
  CondExpr,  // children[1] if children[0] else children[2] (null = undefined)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  int line = 0;
  int column = 0;
  Value value;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

enum class StmtKind {
  Output,       // text
  Print,        // exprs[0]
  If,           // exprs: conditions; bodies: one per condition, then else
  For,          // exprs: target, iterable, filter (or null); bodies: body, else
  Set,          // exprs: target, value
  SetBlock,     // exprs: target, filter chain (or null); bodies[0]
  Macro,        // name; params/exprs: defaults (null = required); bodies[0]
  CallBlock,    // exprs[0]: the call; params/exprs[1..]: caller params; bodies[0]
  FilterBlock,  // exprs[0]: filter chain; bodies[0]
  With,         // params/exprs: assignments; bodies[0]
  Scope,        // bodies[0], rendered unchanged ({% generation %})
  Break,
  Continue,
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  StmtKind kind;
  int line = 0;
  int column = 0;
  std::string text;
  std::string name;
  std::vector<ExprPtr> exprs;
  std::vector<std::string> params;
  std::vector<Body> bodies;
  // Macros: whether the body reads `varargs` / `kwargs` (else extra
  // arguments are an error, as in jinja2).
  bool uses_varargs = false;
  bool uses_kwargs = false;
};

// Parses a whole template. `max_depth` bounds the nesting of statements
// and expressions (TemplateLimitError past it).
Body parse_template(const std::string& source, const std::string& name, int64_t max_depth);

}  // namespace kvscope::jinja
