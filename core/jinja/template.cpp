#include "core/jinja/template.h"

#include "core/jinja/builtins.h"

namespace kvscope::jinja {
namespace {

// Checks filter and test names (jinja2 rejects unknown ones when it parses).
void check_expr(const Expr* e, const std::string& template_name) {
  if (!e) return;
  auto fail = [&](const char* what) {
    throw TemplateSyntaxError(template_name + ": line " + std::to_string(e->line) + ", column " +
                              std::to_string(e->column) + ": no " + what + " named '" + e->name +
                              "'");
  };
  if (e->kind == ExprKind::Filter && !find_filter(e->name)) fail("filter");
  if (e->kind == ExprKind::Test && !find_test(e->name)) fail("test");
  for (const auto& c : e->children) check_expr(c.get(), template_name);
  for (const auto& kw : e->kwargs) check_expr(kw.second.get(), template_name);
}

void check_body(const Body& body, const std::string& template_name) {
  for (const auto& s : body) {
    for (const auto& e : s->exprs) check_expr(e.get(), template_name);
    for (const auto& b : s->bodies) check_body(b, template_name);
  }
}

// Which names a template reads before (or without) assigning them, walking
// it in order as jinja2's find_undeclared_variables does: a loop or macro
// body sees its own names; after an if, only what every branch assigned.
class FreeNames {
 public:
  std::set<std::string> free;

  void body(const Body& b, std::set<std::string>& bound) {
    for (const auto& s : b) stmt(*s, bound);
  }

 private:
  void expr(const Expr* e, const std::set<std::string>& bound) {
    if (!e) return;
    if (e->kind == ExprKind::Name && !bound.count(e->name)) free.insert(e->name);
    for (const auto& c : e->children) expr(c.get(), bound);
    for (const auto& kw : e->kwargs) expr(kw.second.get(), bound);
  }
  static void bind(const Expr& target, std::set<std::string>& bound) {
    if (target.kind == ExprKind::Name) bound.insert(target.name);
    for (const auto& c : target.children)
      if (target.kind == ExprKind::Tuple) bind(*c, bound);
  }
  void branches(const Stmt& s, std::set<std::string>& bound) {
    for (const auto& e : s.exprs) expr(e.get(), bound);
    std::set<std::string> common;
    bool first = true;
    for (const auto& b : s.bodies) {
      std::set<std::string> inner = bound;
      body(b, inner);
      if (first) {
        common = inner;
      } else {
        std::set<std::string> both;
        for (const auto& n : inner)
          if (common.count(n)) both.insert(n);
        common = both;
      }
      first = false;
    }
    if (s.bodies.size() > s.exprs.size()) bound = common;  // there is an else
  }
  void stmt(const Stmt& s, std::set<std::string>& bound);
};

void FreeNames::stmt(const Stmt& s, std::set<std::string>& bound) {
  switch (s.kind) {
    case StmtKind::If: return branches(s, bound);
    case StmtKind::Set:
    case StmtKind::SetBlock: {
      for (size_t i = 1; i < s.exprs.size(); ++i) expr(s.exprs[i].get(), bound);
      std::set<std::string> inner = bound;
      for (const auto& b : s.bodies) body(b, inner);
      const Expr& target = *s.exprs[0];
      if (target.kind == ExprKind::GetAttr) {
        expr(target.children[0].get(), bound);
      } else {
        bind(target, bound);
      }
      return;
    }
    case StmtKind::For: {
      expr(s.exprs[1].get(), bound);
      std::set<std::string> inner = bound;
      bind(*s.exprs[0], inner);
      inner.insert("loop");
      expr(s.exprs[2].get(), inner);
      body(s.bodies[0], inner);
      std::set<std::string> else_scope = bound;
      body(s.bodies[1], else_scope);
      return;
    }
    case StmtKind::Macro:
    case StmtKind::CallBlock:
    case StmtKind::With: {
      std::set<std::string> inner = bound;
      if (s.kind == StmtKind::Macro) inner.insert(s.name);
      inner.insert({"varargs", "kwargs", "caller"});
      for (const auto& p : s.params) inner.insert(p);
      for (const auto& e : s.exprs) expr(e.get(), s.kind == StmtKind::Macro ? inner : bound);
      body(s.bodies[0], inner);
      if (s.kind == StmtKind::Macro) bound.insert(s.name);
      return;
    }
    default:
      for (const auto& e : s.exprs) expr(e.get(), bound);
      for (const auto& b : s.bodies) body(b, bound);
  }
}

}  // namespace

Template Template::parse(const std::string& source, const std::string& name, const Limits& limits) {
  Template t;
  t.name_ = name;
  auto body = std::make_shared<Body>(parse_template(source, name, limits.max_depth));
  check_body(*body, name);
  t.body_ = std::move(body);
  return t;
}

std::string Template::render(const Value& globals, const Limits& limits) const {
  Renderer renderer(limits, name_);
  return renderer.render(*body_, globals);
}

std::set<std::string> Template::free_variables() const {
  FreeNames names;
  std::set<std::string> bound = {"range", "namespace", "dict"};
  names.body(*body_, bound);
  return names.free;
}

Value raise_exception_function() {
  return Value::function("raise_exception", [](Args& args) -> Value {
    const Value* message = args.get(0, "message");
    throw TemplateError(message ? message->to_str() : "");
  });
}

}  // namespace kvscope::jinja
