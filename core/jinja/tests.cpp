// jinja2's built-in tests (`x is defined`, ...) and global functions.
#include <unordered_map>

#include "core/jinja/builtins.h"
#include "core/jinja/ops.h"
#include "core/jinja/strings.h"

namespace kvscope::jinja {
namespace {

const Value& operand(const Args& a, const char* test) {
  const Value* v = a.get(0, "other");
  if (!v) v = a.get(0, "value");
  if (!v) throw_type_error(std::string("test '") + test + "' requires an argument");
  return *v;
}

bool t_defined(Renderer&, const Value& v, Args&) {
  return !v.is_undefined();
}
bool t_undefined(Renderer&, const Value& v, Args&) {
  return v.is_undefined();
}
bool t_none(Renderer&, const Value& v, Args&) {
  return v.is_none();
}
bool t_boolean(Renderer&, const Value& v, Args&) {
  return v.is_bool();
}
bool t_true(Renderer&, const Value& v, Args&) {
  return v.is_bool() && v.as_bool();
}
bool t_false(Renderer&, const Value& v, Args&) {
  return v.is_bool() && !v.as_bool();
}
bool t_integer(Renderer&, const Value& v, Args&) {
  return v.is_int();
}
bool t_float(Renderer&, const Value& v, Args&) {
  return v.is_float();
}
bool t_number(Renderer&, const Value& v, Args&) {
  return v.is_number();
}
bool t_string(Renderer&, const Value& v, Args&) {
  return v.is_string();
}
bool t_mapping(Renderer&, const Value& v, Args&) {
  return v.is_dict() && !v.is_namespace();
}
bool t_iterable(Renderer&, const Value& v, Args&) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool t_sequence(Renderer&, const Value& v, Args&) {
  return v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace());
}
bool t_callable(Renderer&, const Value& v, Args&) {
  return v.is_callable();
}
bool t_escaped(Renderer&, const Value&, Args&) {
  return false;
}
bool t_lower(Renderer&, const Value& v, Args&) {
  std::string s = v.to_str();
  return s != to_upper(s) && s == to_lower(s);
}
bool t_upper(Renderer&, const Value& v, Args&) {
  std::string s = v.to_str();
  return s != to_lower(s) && s == to_upper(s);
}

int64_t require_int(const Value& v) {
  v.require_defined();
  if (v.is_float()) return static_cast<int64_t>(v.as_double());
  if (!v.is_number()) throw_type_error("not all arguments converted during string formatting");
  return v.as_int();
}

bool t_odd(Renderer&, const Value& v, Args&) {
  if (v.is_float()) return binary_op("%", v, Value(2)).as_double() == 1.0;
  return binary_op("%", Value(require_int(v)), Value(2)).as_int() == 1;
}
bool t_even(Renderer&, const Value& v, Args&) {
  if (v.is_float()) return binary_op("%", v, Value(2)).as_double() == 0.0;
  return binary_op("%", Value(require_int(v)), Value(2)).as_int() == 0;
}
bool t_divisibleby(Renderer&, const Value& v, Args& a) {
  Value m = binary_op("%", v, operand(a, "divisibleby"));
  return m.as_double() == 0.0;
}
bool t_in(Renderer&, const Value& v, Args& a) {
  return contains(operand(a, "in"), v);
}
bool t_eq(Renderer&, const Value& v, Args& a) {
  return equals(v, operand(a, "eq"));
}
bool t_ne(Renderer&, const Value& v, Args& a) {
  return !equals(v, operand(a, "ne"));
}
bool t_lt(Renderer&, const Value& v, Args& a) {
  return compare(v, operand(a, "lt"), "<") < 0;
}
bool t_gt(Renderer&, const Value& v, Args& a) {
  return compare(v, operand(a, "gt"), ">") > 0;
}
bool t_le(Renderer&, const Value& v, Args& a) {
  return compare(v, operand(a, "le"), "<=") <= 0;
}
bool t_ge(Renderer&, const Value& v, Args& a) {
  return compare(v, operand(a, "ge"), ">=") >= 0;
}
bool t_sameas(Renderer&, const Value& v, Args& a) {
  const Value& o = operand(a, "sameas");
  if (v.kind() != o.kind()) return false;
  if (v.is_none() || v.is_undefined()) return true;
  if (v.is_bool()) return v.as_bool() == o.as_bool();
  return false;
}
bool t_filter(Renderer&, const Value& v, Args&) {
  return find_filter(v.to_str()) != nullptr;
}
bool t_test(Renderer&, const Value& v, Args&) {
  return find_test(v.to_str()) != nullptr;
}

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> table = {
      {"defined", t_defined},
      {"undefined", t_undefined},
      {"none", t_none},
      {"boolean", t_boolean},
      {"true", t_true},
      {"false", t_false},
      {"integer", t_integer},
      {"float", t_float},
      {"number", t_number},
      {"string", t_string},
      {"mapping", t_mapping},
      {"iterable", t_iterable},
      {"sequence", t_sequence},
      {"callable", t_callable},
      {"escaped", t_escaped},
      {"lower", t_lower},
      {"upper", t_upper},
      {"odd", t_odd},
      {"even", t_even},
      {"divisibleby", t_divisibleby},
      {"in", t_in},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"==", t_eq},
      {"ne", t_ne},
      {"!=", t_ne},
      {"lt", t_lt},
      {"lessthan", t_lt},
      {"<", t_lt},
      {"gt", t_gt},
      {"greaterthan", t_gt},
      {">", t_gt},
      {"le", t_le},
      {"<=", t_le},
      {"ge", t_ge},
      {">=", t_ge},
      {"sameas", t_sameas},
      {"filter", t_filter},
      {"test", t_test},
  };
  return table;
}

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

Value g_range(Args& a) {
  std::vector<int64_t> n;
  for (const Value& v : a.positional) {
    if (!v.is_int() && !v.is_bool())
      throw_type_error("'" + v.type_name() + "' object cannot be interpreted as an integer");
    n.push_back(v.as_int());
  }
  if (n.empty() || n.size() > 3)
    throw_type_error("range expected at most 3 arguments, got " + std::to_string(n.size()));
  int64_t start = n.size() == 1 ? 0 : n[0], stop = n.size() == 1 ? n[0] : n[1];
  int64_t step = n.size() == 3 ? n[2] : 1;
  if (step == 0) throw TemplateError("range() arg 3 must not be zero", "ValueError");
  long double count = (static_cast<long double>(stop) - start) / step;
  if (count > kMaxRange)
    throw TemplateError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).",
                        "OverflowError");
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
  return Value(std::move(out));
}

Value g_namespace(Args& a) {
  Value ns = Value::namespace_object();
  for (const Value& v : a.positional)
    if (v.is_dict())
      for (const auto& kv : v.dict_ref().items) ns.dict_mut().set(kv.first, kv.second);
  for (const auto& kw : a.kwargs) ns.dict_mut().set(Value(kw.first), kw.second);
  return ns;
}

Value g_dict(Args& a) {
  Value d = Value::dict();
  for (const Value& v : a.positional)
    if (v.is_dict())
      for (const auto& kv : v.dict_ref().items) d.dict_mut().set(kv.first, kv.second);
  for (const auto& kw : a.kwargs) d.dict_mut().set(Value(kw.first), kw.second);
  return d;
}

}  // namespace

TestFn find_test(const std::string& name) {
  auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

void add_builtin_globals(Scope& scope) {
  scope.vars["range"] = Value::function("range", g_range);
  scope.vars["namespace"] = Value::function("namespace", g_namespace);
  scope.vars["dict"] = Value::function("dict", g_dict);
}

}  // namespace kvscope::jinja
