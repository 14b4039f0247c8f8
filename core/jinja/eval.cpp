// Expression evaluation (the statement half of the Renderer is render.cpp).
#include "core/jinja/builtins.h"
#include "core/jinja/ops.h"
#include "core/jinja/render.h"

namespace kvscope::jinja {

Value Renderer::eval(const Expr& e, const ScopePtr& scope) {
  Depth depth(*this);
  switch (e.kind) {
    case ExprKind::Const: return e.value;
    case ExprKind::Name: {
      const Value* v = scope->lookup(e.name);
      return v ? *v : Value::undefined("'" + e.name + "' is undefined");
    }
    case ExprKind::List:
    case ExprKind::Tuple:
    case ExprKind::Dict: return eval_literal(e, scope);
    case ExprKind::GetAttr: return get_attr(eval(*e.children[0], scope), e.name);
    case ExprKind::GetItem:
      return get_item(eval(*e.children[0], scope), eval(*e.children[1], scope));
    case ExprKind::Slice: return eval_slice(e, scope);
    case ExprKind::Call: return eval_call(e, scope, nullptr);
    case ExprKind::Filter: return eval_filter(e, scope, nullptr);
    case ExprKind::Test: return eval_test(e, scope);
    case ExprKind::Unary: {
      Value v = eval(*e.children[0], scope);
      if (e.name == "not") return Value(!v.truthy());
      return unary_op(e.name, v);
    }
    case ExprKind::Binary: {
      Value a = eval(*e.children[0], scope);
      Value b = eval(*e.children[1], scope);
      if (e.name == "~") return Value(a.to_str() + b.to_str());
      return binary_op(e.name, a, b);
    }
    case ExprKind::Compare: return eval_compare(e, scope);
    case ExprKind::And: {
      Value a = eval(*e.children[0], scope);
      return a.truthy() ? eval(*e.children[1], scope) : a;
    }
    case ExprKind::Or: {
      Value a = eval(*e.children[0], scope);
      return a.truthy() ? a : eval(*e.children[1], scope);
    }
    case ExprKind::CondExpr: {
      if (eval(*e.children[0], scope).truthy()) return eval(*e.children[1], scope);
      if (e.children[2]) return eval(*e.children[2], scope);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                              " evaluated to false and no else section was defined.");
    }
  }
  return Value();
}

Value Renderer::eval_literal(const Expr& e, const ScopePtr& scope) {
  if (e.kind != ExprKind::Dict) {
    List items;
    for (const auto& c : e.children) items.push_back(eval(*c, scope));
    return Value(std::move(items), e.kind == ExprKind::Tuple);
  }
  Value d = Value::dict();
  for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
    Value key = eval(*e.children[i], scope);
    if (key.is_list() && !key.is_tuple()) throw_type_error("unhashable type: 'list'");
    if (key.is_dict()) throw_type_error("unhashable type: 'dict'");
    d.dict_mut().set(key, eval(*e.children[i + 1], scope));
  }
  return d;
}

Value Renderer::eval_slice(const Expr& e, const ScopePtr& scope) {
  Value obj = eval(*e.children[0], scope);
  Value parts[3];
  for (int i = 0; i < 3; ++i)
    if (e.children[i + 1]) parts[i] = eval(*e.children[i + 1], scope);
  return slice(obj, e.children[1] ? &parts[0] : nullptr, e.children[2] ? &parts[1] : nullptr,
               e.children[3] ? &parts[2] : nullptr);
}

Value Renderer::eval_compare(const Expr& e, const ScopePtr& scope) {
  Value left = eval(*e.children[0], scope);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.children[i + 1], scope);
    const std::string& op = e.ops[i];
    bool ok;
    if (op == "==")
      ok = equals(left, right);
    else if (op == "!=")
      ok = !equals(left, right);
    else if (op == "<")
      ok = compare(left, right, "<") < 0;
    else if (op == ">")
      ok = compare(left, right, ">") > 0;
    else if (op == "<=")
      ok = compare(left, right, "<=") <= 0;
    else if (op == ">=")
      ok = compare(left, right, ">=") >= 0;
    else if (op == "in")
      ok = contains(right, left);
    else
      ok = !contains(right, left);
    if (!ok) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

Args Renderer::eval_args(const Expr& e, const ScopePtr& scope, size_t first) {
  Args args;
  for (size_t i = first; i < e.children.size(); ++i)
    args.positional.push_back(eval(*e.children[i], scope));
  for (const auto& kw : e.kwargs) args.kwargs.emplace_back(kw.first, eval(*kw.second, scope));
  return args;
}

Value Renderer::eval_call(const Expr& e, const ScopePtr& scope, const Value* caller) {
  Value callee = eval(*e.children[0], scope);
  Args args = eval_args(e, scope, 1);
  if (caller) args.kwargs.emplace_back("caller", *caller);
  return call(callee, args);
}

Value Renderer::call(const Value& callee, Args& args) {
  if (callee.is_undefined()) {
    const std::string& hint = callee.undefined_hint();
    if (hint.rfind("access to attribute", 0) == 0) throw TemplateError(hint, "SecurityError");
    throw_undefined(hint);
  }
  if (!callee.is_callable())
    throw_type_error("'" + callee.type_name() + "' object is not callable");
  Depth depth(*this);
  return callee.callable().fn(args);
}

Value Renderer::eval_filter(const Expr& e, const ScopePtr& scope, const Value* subject) {
  Value base;
  if (!e.children[0]) {
    base = *subject;
  } else if (subject && e.children[0]->kind == ExprKind::Filter) {
    base = eval_filter(*e.children[0], scope, subject);
  } else {
    base = eval(*e.children[0], scope);
  }
  Args args = eval_args(e, scope, 1);
  return apply_filter(e.name, base, args);
}

Value Renderer::eval_test(const Expr& e, const ScopePtr& scope) {
  Value subject = eval(*e.children[0], scope);
  Args args = eval_args(e, scope, 1);
  bool result = apply_test(e.name, subject, args);
  return Value(e.negated ? !result : result);
}

Value Renderer::apply_filter(const std::string& name, const Value& subject, Args& args) {
  FilterFn fn = find_filter(name);
  if (!fn) throw TemplateError("No filter named '" + name + "'.", "TemplateAssertionError");
  return fn(*this, subject, args);
}

bool Renderer::apply_test(const std::string& name, const Value& subject, Args& args) {
  TestFn fn = find_test(name);
  if (!fn) throw TemplateError("No test named '" + name + "'.", "TemplateAssertionError");
  return fn(*this, subject, args);
}

}  // namespace kvscope::jinja
