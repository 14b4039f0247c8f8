#include "core/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace kvscope::jinja {
namespace {

// repr(), == and < recurse into lists and dicts; a namespace that holds
// itself would recurse forever, so they stop at this depth.
constexpr int kMaxValueNesting = 1000;
thread_local int g_nesting = 0;

class NestingGuard {
 public:
  NestingGuard() {
    if (++g_nesting > kMaxValueNesting) {
      --g_nesting;
      throw TemplateLimitError("value nesting depth " + std::to_string(kMaxValueNesting));
    }
  }
  ~NestingGuard() { --g_nesting; }
  NestingGuard(const NestingGuard&) = delete;
  NestingGuard& operator=(const NestingGuard&) = delete;
};

}  // namespace

const Value* Args::get(size_t index, const std::string& name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& kw : kwargs)
    if (kw.first == name) return &kw.second;
  return nullptr;
}

Value::Value(std::string s)
    : kind_(Kind::String), str_(std::make_shared<const std::string>(std::move(s))) {}

Value::Value(List items, bool tuple)
    : kind_(Kind::List), tuple_(tuple), list_(std::make_shared<List>(std::move(items))) {
  uint32_t deepest = 0;
  for (const Value& v : *list_) deepest = std::max(deepest, v.nesting());
  depth_ = deepest + 1;
}

uint32_t Value::nesting() const {
  if (kind_ == Kind::List) return depth_;
  if (kind_ == Kind::Dict) return dict_->depth;
  return 0;
}

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.str_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::dict() {
  Value v;
  v.kind_ = Kind::Dict;
  v.dict_ = std::make_shared<Dict>();
  return v;
}

Value Value::namespace_object() {
  Value v = dict();
  v.dict_->is_namespace = true;
  return v;
}

Value Value::function(std::string name, NativeFn fn) {
  Value v;
  v.kind_ = Kind::Callable;
  v.fn_ = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

bool Value::is_namespace() const {
  return is_dict() && dict_->is_namespace;
}

const std::string& Value::undefined_hint() const {
  static const std::string kDefault = "value is undefined";
  return str_ ? *str_ : kDefault;
}

void Value::require_defined() const {
  if (is_undefined()) throw_undefined(undefined_hint());
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool:
    case Kind::Int: return int_ != 0;
    case Kind::Float: return float_ != 0.0;
    case Kind::String: return !str_->empty();
    case Kind::List: return !list_->empty();
    case Kind::Dict: return !dict_->items.empty() || dict_->is_namespace;
    case Kind::Callable: return true;
  }
  return false;
}

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  char buf[64];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision - 1, f);
    if (std::strtod(buf, nullptr) == f) break;
  }
  // buf is [-]d.ddde[+-]xx: split digits and exponent.
  std::string s(buf);
  bool negative = s[0] == '-';
  if (negative) s.erase(0, 1);
  size_t e = s.find('e');
  int exponent = std::atoi(s.c_str() + e + 1);
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (s[i] != '.') digits += s[i];
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out = digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp;
  }
  return negative ? "-" + out : out;
}

namespace {

// Decodes one code point at s[i], advancing i; invalid bytes decode as themselves.
uint32_t decode_utf8(const std::string& s, size_t& i) {
  unsigned char c = s[i];
  int extra = c >= 0xF8 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
  if (extra == 0 || i + extra >= s.size()) {
    ++i;
    return c;
  }
  uint32_t cp = c & (0x3F >> extra);
  for (int k = 1; k <= extra; ++k) {
    unsigned char cc = s[i + k];
    if ((cc & 0xC0) != 0x80) {
      ++i;
      return c;
    }
    cp = (cp << 6) | (cc & 0x3F);
  }
  i += extra + 1;
  return cp;
}

std::string string_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    uint32_t cp = decode_utf8(s, i);
    char buf[16];
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) {
      std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      out += buf;
    } else if (cp == 0x2028 || cp == 0x2029) {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      out += buf;
    } else {
      out.append(s, start, i - start);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    decode_utf8(s, i);
    out.emplace_back(s, start, i - start);
  }
  return out;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) decode_utf8(s, i);
  return n;
}

std::string Value::to_str() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::String: return *str_;
    case Kind::Callable: return "<function " + fn_->name + ">";
    default: return repr();
  }
}

std::string Value::repr() const {
  NestingGuard guard;
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "None";
    case Kind::Bool: return int_ ? "True" : "False";
    case Kind::Int: return std::to_string(int_);
    case Kind::Float: return float_repr(float_);
    case Kind::String: return string_repr(*str_);
    case Kind::Callable: return "<function " + fn_->name + ">";
    case Kind::List: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].repr();
      if (tuple_ && list_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::Dict: {
      std::string out = dict_->is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& kv : dict_->items) {
        out += (first ? "" : ", ") + kv.first.repr() + ": " + kv.second.repr();
        first = false;
      }
      return out + (dict_->is_namespace ? "}>" : "}");
    }
  }
  return "";
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return tuple_ ? "tuple" : "list";
    case Kind::Dict: return dict_->is_namespace ? "Namespace" : "dict";
    case Kind::Callable: return "function";
  }
  return "object";
}

std::string Value::type_repr() const {
  if (is_none()) return "None";
  return type_name() + " object";
}

const Value* Dict::find(const Value& key) const {
  for (const auto& kv : items)
    if (equals(kv.first, key)) return &kv.second;
  return nullptr;
}

const Value* Dict::find(const std::string& key) const {
  for (const auto& kv : items)
    if (kv.first.is_string() && kv.first.str() == key) return &kv.second;
  return nullptr;
}

void Dict::note(const Value& value) {
  depth = std::max(depth, value.nesting() + 1);
}

void Dict::set(const Value& key, Value value) {
  note(value);
  for (auto& kv : items)
    if (equals(kv.first, key)) {
      kv.second = std::move(value);
      return;
    }
  items.emplace_back(key, std::move(value));
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  NestingGuard guard;
  switch (a.kind()) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String: return a.str() == b.str();
    case Kind::List: {
      if (a.is_tuple() != b.is_tuple() || a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i)
        if (!equals(a.list()[i], b.list()[i])) return false;
      return true;
    }
    case Kind::Dict: {
      const Dict& da = a.dict_ref();
      const Dict& db = b.dict_ref();
      if (da.items.size() != db.items.size()) return false;
      for (const auto& kv : da.items) {
        const Value* other = db.find(kv.first);
        if (!other || !equals(kv.second, *other)) return false;
      }
      return true;
    }
    case Kind::Callable: return &a.callable() == &b.callable();
    default: return false;
  }
}

int compare(const Value& a, const Value& b, const char* op) {
  if (a.is_undefined()) a.require_defined();
  if (b.is_undefined()) b.require_defined();
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    NestingGuard guard;
    const List& x = a.list();
    const List& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equals(x[i], y[i])) return compare(x[i], y[i], op);
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  throw_type_error(std::string("'") + op + "' not supported between instances of '" +
                   a.type_name() + "' and '" + b.type_name() + "'");
}

void throw_type_error(const std::string& message) {
  throw TemplateError(message, "TypeError");
}

void throw_undefined(const std::string& message) {
  throw TemplateError(message, "UndefinedError");
}

}  // namespace kvscope::jinja
