// The value model of the Jinja2 engine: what a template computes with, and
// how each value prints, compares and converts the way Python does.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kvscope::jinja {

// An error raised while rendering. `kind` names the Python/Jinja2 exception
// a real jinja2 would raise ("TemplateError" for raise_exception,
// "UndefinedError", "TypeError", ...); what() is its message exactly.
class TemplateError : public std::runtime_error {
 public:
  explicit TemplateError(const std::string& message, std::string kind = "TemplateError")
      : std::runtime_error(message), kind_(std::move(kind)) {}
  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;
};

// A template that cannot be parsed, or uses a construct this engine lacks.
class TemplateSyntaxError : public TemplateError {
 public:
  explicit TemplateSyntaxError(const std::string& message)
      : TemplateError(message, "TemplateSyntaxError") {}
};

// A render that ran past one of its Limits (the message names the limit).
class TemplateLimitError : public TemplateError {
 public:
  explicit TemplateLimitError(const std::string& message)
      : TemplateError(message, "TemplateLimitError") {}
};

class Value;
using List = std::vector<Value>;
struct Dict;

// Arguments of a call: positional then keyword, in call order.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> kwargs;
  // The argument at `index` or named `name`, or nullptr.
  const Value* get(size_t index, const std::string& name) const;
};

using NativeFn = std::function<Value(Args&)>;

struct Callable {
  std::string name;
  NativeFn fn;
};

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Callable };

class Value {
 public:
  Value() = default;  // undefined
  Value(std::nullptr_t) : kind_(Kind::None) {}
  Value(bool b) : kind_(Kind::Bool), int_(b) {}
  Value(int i) : kind_(Kind::Int), int_(i) {}
  Value(int64_t i) : kind_(Kind::Int), int_(i) {}
  Value(double f) : kind_(Kind::Float), float_(f) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(std::string s);
  Value(List items, bool tuple = false);

  static Value undefined(std::string hint = "");
  static Value dict();
  static Value namespace_object();
  static Value function(std::string name, NativeFn fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_tuple() const { return kind_ == Kind::List && tuple_; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_namespace() const;
  bool is_callable() const { return kind_ == Kind::Callable; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }
  double as_double() const { return is_float() ? float_ : static_cast<double>(int_); }
  const std::string& str() const { return *str_; }
  const List& list() const { return *list_; }
  const Dict& dict_ref() const { return *dict_; }
  Dict& dict_mut() { return *dict_; }
  const Callable& callable() const { return *fn_; }
  // Why an undefined value is undefined, as jinja2 words it.
  const std::string& undefined_hint() const;

  // How deeply lists and dicts nest inside this value (a scalar is 0).
  uint32_t nesting() const;

  // Python's truthiness.
  bool truthy() const;
  // Python's str() (undefined prints as "").
  std::string to_str() const;
  // Python's repr().
  std::string repr() const;
  // jinja2's object_type_repr: "dict object", "None", ...
  std::string type_repr() const;
  // Python's type name: "int", "str", "list", "dict", "NoneType", ...
  std::string type_name() const;

  // Raises jinja2's UndefinedError if this is undefined.
  void require_defined() const;

 private:
  Kind kind_ = Kind::Undefined;
  bool tuple_ = false;
  uint32_t depth_ = 0;  // lists: nesting()
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<const std::string> str_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<Callable> fn_;
};

// A dict that keeps insertion order, as Python's does.
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  bool is_namespace = false;
  uint32_t depth = 1;  // nesting(), kept up to date by set() and note()
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
  const Value* find(const char* key) const { return find(std::string(key)); }
  void set(const Value& key, Value value);
  // Records that `value` was added to items directly.
  void note(const Value& value);
};

// Python ==.
bool equals(const Value& a, const Value& b);
// Python <, raising TypeError for unorderable operands. Returns -1, 0, 1.
int compare(const Value& a, const Value& b, const char* op = "<");
// Python's repr() of a float ("1.0", "1e-05", "inf").
std::string float_repr(double f);
// Code points of a UTF-8 string (invalid bytes count one each).
std::vector<std::string> utf8_chars(const std::string& s);
size_t utf8_length(const std::string& s);

// Shorthands for the errors jinja2 and Python raise.
[[noreturn]] void throw_type_error(const std::string& message);
[[noreturn]] void throw_undefined(const std::string& message);

}  // namespace kvscope::jinja
