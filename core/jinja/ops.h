// Python's operators, iteration and attribute lookup as jinja2's sandbox
// applies them to values.
#pragma once

#include <string>
#include <vector>

#include "core/jinja/value.h"

namespace kvscope::jinja {

// a <op> b for + - * / // % ** (Python semantics; TypeError/ZeroDivisionError).
Value binary_op(const std::string& op, const Value& a, const Value& b);
// -a, +a.
Value unary_op(const std::string& op, const Value& a);
// item in container.
bool contains(const Value& container, const Value& item);
// Python iteration: list items, dict keys, string characters; undefined is
// empty; anything else is a TypeError.
std::vector<Value> iterate(const Value& v);
// jinja2's sandboxed getattr (attribute, then item) and getitem (item, then attribute).
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] on strings and lists (null pointers = omitted).
Value slice(const Value& obj, const Value* start, const Value* stop, const Value* step);
// The bound method `obj.name`, or an undefined value (with a SecurityError
// hint for the mutating methods the immutable sandbox blocks).
Value bound_method(const Value& obj, const std::string& name, bool* found);
// Python str % args (printf-style), as the format filter and `%` use it.
std::string percent_format(const std::string& format, const Value& args);

}  // namespace kvscope::jinja
