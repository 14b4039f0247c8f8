#include "core/jinja/render.h"

#include "core/jinja/builtins.h"
#include "core/jinja/ops.h"

namespace kvscope::jinja {

const Value* Scope::lookup(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

namespace {

ScopePtr child_of(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

}  // namespace

Renderer::~Renderer() {
  for (Value& ns : namespaces_) ns.dict_mut().items.clear();
}

std::string Renderer::render(const Body& body, const Value& globals) {
  auto root = std::make_shared<Scope>();
  add_builtin_globals(*root);
  Value make_namespace = root->vars["namespace"];
  root->vars["namespace"] = Value::function("namespace", [this, make_namespace](Args& args) {
    Value ns = make_namespace.callable().fn(args);
    namespaces_.push_back(ns);
    return ns;
  });
  if (globals.is_dict()) {
    for (const auto& kv : globals.dict_ref().items)
      if (kv.first.is_string()) root->vars[kv.first.str()] = kv.second;
  }
  std::string out;
  exec_body(body, child_of(root), out);
  return out;
}

void Renderer::append(std::string& out, const std::string& text) {
  if (static_cast<int64_t>(out.size() + text.size()) > limits_.max_output_bytes)
    throw TemplateLimitError("output " + std::to_string(limits_.max_output_bytes) + " bytes");
  out += text;
}

void Renderer::count_iterations(int64_t n) {
  iterations_ += n;
  if (iterations_ > limits_.max_loop_iterations)
    throw TemplateLimitError("loop iterations " + std::to_string(limits_.max_loop_iterations));
}

Renderer::Flow Renderer::exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const auto& stmt : body) {
    Flow flow = exec(*stmt, scope, out);
    if (flow != Flow::Normal) return flow;
  }
  return Flow::Normal;
}

Renderer::Flow Renderer::exec(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
  Depth depth(*this);
  switch (stmt.kind) {
    case StmtKind::Output: append(out, stmt.text); break;
    case StmtKind::Print: append(out, eval(*stmt.exprs[0], scope).to_str()); break;
    case StmtKind::If: return exec_if(stmt, scope, out);
    case StmtKind::For: exec_for(stmt, scope, out); break;
    case StmtKind::Set:
    case StmtKind::SetBlock: exec_set(stmt, scope, out); break;
    case StmtKind::Macro: exec_macro(stmt, scope); break;
    case StmtKind::CallBlock: exec_call_block(stmt, scope, out); break;
    case StmtKind::With: exec_with(stmt, scope, out); break;
    case StmtKind::Scope: return exec_body(stmt.bodies[0], scope, out);
    case StmtKind::FilterBlock: {
      std::string inner;
      exec_body(stmt.bodies[0], child_of(scope), inner);
      Value text(inner);
      append(out, eval_filter(*stmt.exprs[0], scope, &text).to_str());
      break;
    }
    case StmtKind::Break: return Flow::Break;
    case StmtKind::Continue: return Flow::Continue;
  }
  return Flow::Normal;
}

Renderer::Flow Renderer::exec_if(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
  for (size_t i = 0; i < stmt.exprs.size(); ++i)
    if (eval(*stmt.exprs[i], scope).truthy()) return exec_body(stmt.bodies[i], scope, out);
  if (stmt.bodies.size() > stmt.exprs.size()) return exec_body(stmt.bodies.back(), scope, out);
  return Flow::Normal;
}

Value Renderer::make_loop(const std::vector<Value>& items, size_t i,
                          const std::shared_ptr<Value>& last_changed) {
  Value loop = Value::dict();
  Dict& d = loop.dict_mut();
  auto n = static_cast<int64_t>(items.size());
  auto index = static_cast<int64_t>(i);
  d.set(Value("index"), Value(index + 1));
  d.set(Value("index0"), Value(index));
  d.set(Value("revindex"), Value(n - index));
  d.set(Value("revindex0"), Value(n - index - 1));
  d.set(Value("first"), Value(i == 0));
  d.set(Value("last"), Value(index == n - 1));
  d.set(Value("length"), Value(n));
  d.set(Value("depth"), Value(1));
  d.set(Value("depth0"), Value(0));
  d.set(Value("previtem"), i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
  d.set(Value("nextitem"),
        index + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
  d.set(Value("cycle"), Value::function("loop.cycle", [i](Args& args) {
          if (args.positional.empty())
            throw TemplateError("no items for cycling given", "TypeError");
          return args.positional[i % args.positional.size()];
        }));
  d.set(Value("changed"), Value::function("loop.changed", [last_changed](Args& args) {
          Value now(args.positional, true);
          if (!last_changed->is_undefined() && equals(*last_changed, now)) return Value(false);
          *last_changed = now;
          return Value(true);
        }));
  return loop;
}

void Renderer::exec_for(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
  const Expr& target = *stmt.exprs[0];
  std::vector<Value> items = iterate(eval(*stmt.exprs[1], scope));
  if (stmt.exprs[2]) {
    std::vector<Value> kept;
    for (Value& item : items) {
      count_iterations(1);
      ScopePtr s = child_of(scope);
      assign(target, item, *s);
      if (eval(*stmt.exprs[2], s).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    exec_body(stmt.bodies[1], child_of(scope), out);
    return;
  }
  auto last_changed = std::make_shared<Value>();
  for (size_t i = 0; i < items.size(); ++i) {
    count_iterations(1);
    ScopePtr s = child_of(scope);
    s->vars["loop"] = make_loop(items, i, last_changed);
    assign(target, items[i], *s);
    if (exec_body(stmt.bodies[0], s, out) == Flow::Break) break;
  }
}

void Renderer::assign(const Expr& target, const Value& value, Scope& scope) {
  if (target.kind == ExprKind::Name) {
    scope.vars[target.name] = value;
    return;
  }
  if (!value.is_list() && !value.is_string() && !value.is_dict() && !value.is_undefined())
    throw_type_error("cannot unpack non-iterable " + value.type_name() + " object");
  std::vector<Value> parts = iterate(value);
  size_t want = target.children.size();
  if (parts.size() < want)
    throw TemplateError("not enough values to unpack (expected " + std::to_string(want) + ", got " +
                            std::to_string(parts.size()) + ")",
                        "ValueError");
  if (parts.size() > want)
    throw TemplateError("too many values to unpack (expected " + std::to_string(want) + ")",
                        "ValueError");
  for (size_t i = 0; i < want; ++i) scope.vars[target.children[i]->name] = parts[i];
}

void Renderer::exec_set(const Stmt& stmt, const ScopePtr& scope, std::string&) {
  const Expr& target = *stmt.exprs[0];
  Value value;
  if (stmt.kind == StmtKind::Set) {
    value = eval(*stmt.exprs[1], scope);
  } else {
    std::string inner;
    exec_body(stmt.bodies[0], child_of(scope), inner);
    value = Value(inner);
    if (stmt.exprs[1]) value = eval_filter(*stmt.exprs[1], scope, &value);
  }
  if (target.kind != ExprKind::GetAttr) {
    assign(target, value, *scope);
    return;
  }
  const Value* ns = scope->lookup(target.children[0]->name);
  if (!ns || !ns->is_namespace())
    throw TemplateError("cannot assign attribute on non-namespace object", "TemplateRuntimeError");
  // Namespaces are the only state that outlives a loop iteration, so the only
  // way to build an ever deeper value: bound it here.
  if (static_cast<int64_t>(value.nesting()) >= limits_.max_depth)
    throw TemplateLimitError("recursion depth " + std::to_string(limits_.max_depth));
  const_cast<Value*>(ns)->dict_mut().set(Value(target.name), value);
}

void Renderer::exec_with(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
  ScopePtr s = child_of(scope);
  for (size_t i = 0; i < stmt.params.size(); ++i)
    s->vars[stmt.params[i]] = eval(*stmt.exprs[i], scope);
  exec_body(stmt.bodies[0], s, out);
}

void Renderer::exec_macro(const Stmt& stmt, const ScopePtr& scope) {
  std::weak_ptr<Scope> closure = scope;
  const Stmt* macro = &stmt;
  scope->vars[stmt.name] = Value::function(stmt.name, [this, macro, closure](Args& args) {
    ScopePtr s = closure.lock();
    if (!s) throw TemplateError("macro '" + macro->name + "' called outside its scope");
    return call_macro(*macro, s, args, nullptr);
  });
}

Value Renderer::call_macro(const Stmt& macro, const ScopePtr& closure, Args& args,
                           const Value* caller) {
  Depth depth(*this);
  ScopePtr s = child_of(closure);
  const size_t n = macro.params.size();
  if (args.positional.size() > n && !macro.uses_varargs)
    throw_type_error("macro '" + macro.name + "' takes not more than " + std::to_string(n) +
                     " argument(s)");
  List varargs;
  for (size_t i = n; i < args.positional.size(); ++i) varargs.push_back(args.positional[i]);
  Value kwargs = Value::dict();
  for (auto& kw : args.kwargs) {
    size_t index = n;
    for (size_t i = 0; i < n; ++i)
      if (macro.params[i] == kw.first) index = i;
    if (kw.first == "caller") {
      s->vars["caller"] = kw.second;
    } else if (index == n || index < args.positional.size()) {
      if (!macro.uses_kwargs)
        throw_type_error("macro '" + macro.name + "' takes no keyword argument '" + kw.first + "'");
      kwargs.dict_mut().set(Value(kw.first), kw.second);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const std::string& p = macro.params[i];
    const Value* given = args.get(i, p);
    if (given) {
      s->vars[p] = *given;
    } else if (macro.exprs[i]) {
      s->vars[p] = eval(*macro.exprs[i], s);
    } else {
      s->vars[p] = Value::undefined("parameter '" + p + "' was not provided");
    }
  }
  s->vars["varargs"] = Value(std::move(varargs), true);
  s->vars["kwargs"] = kwargs;
  if (caller) s->vars["caller"] = *caller;
  std::string out;
  exec_body(macro.bodies[0], s, out);
  return Value(out);
}

void Renderer::exec_call_block(const Stmt& stmt, const ScopePtr& scope, std::string& out) {
  std::weak_ptr<Scope> weak = scope;
  const Stmt* block = &stmt;
  Value caller = Value::function("caller", [this, block, weak](Args& args) {
    ScopePtr s = weak.lock();
    if (!s) throw TemplateError("caller called outside its scope");
    ScopePtr inner = child_of(s);
    for (size_t i = 0; i < block->params.size(); ++i) {
      const Value* given = args.get(i, block->params[i]);
      inner->vars[block->params[i]] = given                 ? *given
                                      : block->exprs[i + 1] ? eval(*block->exprs[i + 1], s)
                                                            : Value();
    }
    std::string text;
    exec_body(block->bodies[0], inner, text);
    return Value(text);
  });
  append(out, eval_call(*stmt.exprs[0], scope, &caller).to_str());
}

}  // namespace kvscope::jinja
