// JSON in and out: Python json.dumps semantics for the tojson filter, and
// values built from nlohmann::json documents.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/jinja/value.h"

namespace kvscope::jinja {

struct JsonOptions {
  bool indent = false;         // indent=None when false
  std::string indent_text;     // one level of indentation
  std::string item_separator;  // ", " (or "," with indent) unless given
  std::string key_separator;   // ": "
  bool sort_keys = false;
  bool ensure_ascii = false;
};

// json.dumps(value, ...) exactly; TypeError for undefined and callables.
std::string to_json(const Value& value, const JsonOptions& options, int64_t max_depth = 256);

// Objects keep their key order with ordered_json (use it: json sorts keys).
Value from_json(const nlohmann::json& json);
Value from_json(const nlohmann::ordered_json& json);

}  // namespace kvscope::jinja
