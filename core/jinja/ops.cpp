#include "core/jinja/ops.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace kvscope::jinja {
namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  throw_type_error("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" +
                   b.type_name() + "'");
}

[[noreturn]] void zero_division(const std::string& message) {
  throw TemplateError(message, "ZeroDivisionError");
}

[[noreturn]] void overflow() {
  throw TemplateError("integer overflow", "OverflowError");
}

Value repeat(const Value& seq, int64_t times) {
  if (times > 0 && seq.is_string() && seq.str().size() * static_cast<size_t>(times) > (1u << 30))
    throw TemplateError("repeated string too large", "MemoryError");
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.str();
    return Value(out);
  }
  if (times > 0 && seq.list().size() * static_cast<size_t>(times) > (1u << 24))
    throw TemplateError("repeated list too large", "MemoryError");
  List out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value(std::move(out), seq.is_tuple());
}

Value int_op(const std::string& op, int64_t x, int64_t y) {
  int64_t r = 0;
  if (op == "+") {
    if (__builtin_add_overflow(x, y, &r)) overflow();
  } else if (op == "-") {
    if (__builtin_sub_overflow(x, y, &r)) overflow();
  } else if (op == "*") {
    if (__builtin_mul_overflow(x, y, &r)) overflow();
  } else if (op == "/") {
    if (y == 0) zero_division("division by zero");
    return Value(static_cast<double>(x) / static_cast<double>(y));
  } else if (op == "//" || op == "%") {
    if (y == 0)
      zero_division(op == "%" ? "integer modulo by zero" : "integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) overflow();
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {
      --q;
      m += y;
    }
    r = op == "//" ? q : m;
  } else if (op == "**") {
    if (y < 0) {
      if (x == 0) zero_division("0.0 cannot be raised to a negative power");
      return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
    }
    r = 1;
    for (int64_t i = 0; i < y; ++i) {
      if (__builtin_mul_overflow(r, x, &r)) overflow();
      if (r == 0 || r == 1) break;
    }
    if (r == -1 && y % 2 == 0) r = 1;
  }
  return Value(r);
}

Value float_op(const std::string& op, double x, double y) {
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "/") {
    if (y == 0) zero_division("float division by zero");
    return Value(x / y);
  }
  if (op == "//") {
    if (y == 0) zero_division("float floor division by zero");
    return Value(std::floor(x / y));
  }
  if (op == "%") {
    if (y == 0) zero_division("float modulo");
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value(m);
  }
  if (x == 0 && y < 0) zero_division("0.0 cannot be raised to a negative power");
  return Value(std::pow(x, y));
}

int64_t normalize_index(int64_t i, int64_t size) {
  return i < 0 ? i + size : i;
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  a.require_defined();
  b.require_defined();
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return float_op(op, a.as_double(), b.as_double());
    return int_op(op, a.as_int(), b.as_int());
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.str() + b.str());
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      List out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return Value(std::move(out), a.is_tuple());
    }
    if (a.is_string() || a.is_list())
      throw_type_error("can only concatenate " + a.type_name() + " (not \"" + b.type_name() +
                       "\") to " + a.type_name());
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
  }
  if (op == "%" && a.is_string()) return Value(percent_format(a.str(), b));
  unsupported(op == "**" ? "** or pow()" : op, a, b);
}

Value unary_op(const std::string& op, const Value& a) {
  a.require_defined();
  if (!a.is_number())
    throw_type_error("bad operand type for unary " + op + ": '" + a.type_name() + "'");
  if (op == "+") return a.is_bool() ? Value(a.as_int()) : a;
  if (a.is_float()) return Value(-a.as_double());
  if (a.as_int() == INT64_MIN) overflow();
  return Value(-a.as_int());
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::Undefined: return false;
    case Kind::String:
      if (!item.is_string())
        throw_type_error("'in <string>' requires string as left operand, not " + item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    case Kind::List:
      for (const Value& v : container.list())
        if (equals(v, item)) return true;
      return false;
    case Kind::Dict: return container.dict_ref().find(item) != nullptr;
    default: throw_type_error("argument of type '" + container.type_name() + "' is not iterable");
  }
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return {};
    case Kind::List: return v.list();
    case Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict_ref().items) keys.push_back(kv.first);
      return keys;
    }
    case Kind::String: {
      std::vector<Value> chars;
      for (auto& c : utf8_chars(v.str())) chars.emplace_back(std::move(c));
      return chars;
    }
    default: throw_type_error("'" + v.type_name() + "' object is not iterable");
  }
}

namespace {

Value missing(const Value& obj, const Value& name) {
  std::string type = obj.is_none() ? "None" : obj.type_repr();
  if (!name.is_string()) return Value::undefined(type + " has no element " + name.repr());
  return Value::undefined("'" + type + "' has no attribute " + name.repr());
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  obj.require_defined();
  bool found = false;
  Value method = bound_method(obj, name, &found);
  if (found) return method;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict_ref().find(name)) return *v;
  }
  // groupby's (grouper, list) pairs are namedtuples in jinja2.
  if (obj.is_tuple() && obj.list().size() == 2 && (name == "grouper" || name == "list"))
    return obj.list()[name == "list" ? 1 : 0];
  return missing(obj, Value(name));
}

Value get_item(const Value& obj, const Value& key) {
  obj.require_defined();
  if (obj.is_dict()) {
    if (const Value* v = obj.dict_ref().find(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    if (obj.is_list()) {
      int64_t size = static_cast<int64_t>(obj.list().size());
      int64_t i = normalize_index(key.as_int(), size);
      if (i >= 0 && i < size) return obj.list()[static_cast<size_t>(i)];
    } else {
      auto chars = utf8_chars(obj.str());
      int64_t size = static_cast<int64_t>(chars.size());
      int64_t i = normalize_index(key.as_int(), size);
      if (i >= 0 && i < size) return Value(chars[static_cast<size_t>(i)]);
    }
  }
  if (key.is_string()) {
    bool found = false;
    Value method = bound_method(obj, key.str(), &found);
    if (found) return method;
  }
  return missing(obj, key);
}

Value slice(const Value& obj, const Value* start, const Value* stop, const Value* step) {
  obj.require_defined();
  auto bound = [](const Value* v) -> const Value* {
    if (v && !v->is_none() && !v->is_undefined() && !v->is_int() && !v->is_bool())
      throw_type_error("slice indices must be integers or None or have an __index__ method");
    return v && (v->is_int() || v->is_bool()) ? v : nullptr;
  };
  start = bound(start);
  stop = bound(stop);
  step = bound(step);
  int64_t st = step ? step->as_int() : 1;
  if (st == 0) throw TemplateError("slice step cannot be zero", "ValueError");
  std::vector<Value> items;
  if (obj.is_string()) {
    for (auto& c : utf8_chars(obj.str())) items.emplace_back(std::move(c));
  } else if (obj.is_list()) {
    items = obj.list();
  } else {
    throw_type_error("'" + obj.type_name() + "' object is not subscriptable");
  }
  int64_t n = static_cast<int64_t>(items.size());
  auto clamp = [&](const Value* v, int64_t dflt) {
    if (!v) return dflt;
    int64_t i = v->as_int();
    if (i < 0) i += n;
    if (st > 0) return std::max<int64_t>(0, std::min(i, n));
    return std::max<int64_t>(-1, std::min(i, n - 1));
  };
  int64_t lo = clamp(start, st > 0 ? 0 : n - 1);
  int64_t hi = clamp(stop, st > 0 ? n : -1);
  List out;
  for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st)
    out.push_back(items[static_cast<size_t>(i)]);
  if (!obj.is_string()) return Value(std::move(out), obj.is_tuple());
  std::string s;
  for (const Value& c : out) s += c.str();
  return Value(std::move(s));
}

namespace {

// One %-conversion: spec is "%[flags][width][.precision]", type its letter.
std::string format_one(const std::string& spec, char type, const Value& v) {
  char buf[512];
  if (type == 's' || type == 'r' || type == 'a') {
    std::string text = type == 's' ? v.to_str() : v.repr();
    if (spec == "%") return text;
    std::string fmt = spec + "s";
    std::vector<char> out(text.size() + 512);
    std::snprintf(out.data(), out.size(), fmt.c_str(), text.c_str());
    return out.data();
  }
  if (!v.is_number()) {
    v.require_defined();
    if (type == 'd' || type == 'i' || type == 'x' || type == 'X' || type == 'o')
      throw_type_error(std::string("%") + type + " format: a real number is required, not " +
                       v.type_name());
    throw_type_error("must be real number, not " + v.type_name());
  }
  if (type == 'd' || type == 'i' || type == 'x' || type == 'X' || type == 'o') {
    auto n = static_cast<long long>(v.is_float() ? v.as_double() : v.as_int());
    std::string fmt = spec + "ll" + (type == 'i' ? 'd' : type);
    std::snprintf(buf, sizeof buf, fmt.c_str(), n);
    return buf;
  }
  std::string fmt = spec + type;
  std::snprintf(buf, sizeof buf, fmt.c_str(), v.as_double());
  return buf;
}

}  // namespace

std::string percent_format(const std::string& format, const Value& args) {
  std::vector<Value> values = args.is_tuple() ? args.list() : std::vector<Value>{args};
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    std::string spec = "%";
    ++i;
    while (i < format.size() && std::strchr("-+ #0", format[i])) spec += format[i++];
    while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i])) &&
           spec.size() < 12)
      spec += format[i++];
    if (i < format.size() && format[i] == '.') {
      spec += format[i++];
      while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i])) &&
             spec.size() < 16)
        spec += format[i++];
    }
    if (i >= format.size()) throw TemplateError("incomplete format", "ValueError");
    char type = format[i];
    if (type == '%' && spec == "%") {
      out += '%';
      continue;
    }
    if (!std::strchr("sradixXoeEfFgG", type))
      throw TemplateError(std::string("unsupported format character '") + type + "'", "ValueError");
    if (next >= values.size()) throw_type_error("not enough arguments for format string");
    out += format_one(spec, type, values[next++]);
  }
  if (next < values.size())
    throw_type_error("not all arguments converted during string formatting");
  return out;
}

}  // namespace kvscope::jinja
