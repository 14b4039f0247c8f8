#include "core/jinja/json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/jinja/strings.h"

namespace kvscope::jinja {
namespace {

void append_json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  char buf[16];
  for (uint32_t cp : code_points(s)) {
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp > 0x7E)) {
          if (cp >= 0x10000) {
            uint32_t v = cp - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10),
                          0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", cp);
          }
          out += buf;
        } else {
          append_code_point(out, cp);
        }
    }
  }
  out += '"';
}

std::string float_json(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f < 0 ? "-Infinity" : "Infinity";
  return float_repr(f);
}

std::string key_text(const Value& key) {
  switch (key.kind()) {
    case Kind::String: return key.str();
    case Kind::Int: return std::to_string(key.as_int());
    case Kind::Float: return float_json(key.as_double());
    case Kind::Bool: return key.as_bool() ? "true" : "false";
    case Kind::None: return "null";
    default: throw_type_error("keys must be str, int, float, bool or None, not " + key.type_name());
  }
}

class JsonWriter {
 public:
  JsonWriter(const JsonOptions& options, int64_t max_depth) : o_(options), max_depth_(max_depth) {}
  void write(const Value& v, int64_t depth);
  std::string out;

 private:
  void newline(int64_t depth) {
    if (!o_.indent) return;
    out += '\n';
    for (int64_t i = 0; i < depth; ++i) out += o_.indent_text;
  }
  void write_list(const List& items, int64_t depth);
  void write_dict(const Dict& dict, int64_t depth);
  const JsonOptions& o_;
  int64_t max_depth_;
};

void JsonWriter::write(const Value& v, int64_t depth) {
  if (depth > max_depth_) throw TemplateLimitError("recursion depth " + std::to_string(max_depth_));
  switch (v.kind()) {
    case Kind::None: out += "null"; break;
    case Kind::Bool: out += v.as_bool() ? "true" : "false"; break;
    case Kind::Int: out += std::to_string(v.as_int()); break;
    case Kind::Float: out += float_json(v.as_double()); break;
    case Kind::String: append_json_string(out, v.str(), o_.ensure_ascii); break;
    case Kind::List: write_list(v.list(), depth); break;
    case Kind::Dict:
      if (v.is_namespace()) throw_type_error("Object of type Namespace is not JSON serializable");
      write_dict(v.dict_ref(), depth);
      break;
    default: throw_type_error("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

void JsonWriter::write_list(const List& items, int64_t depth) {
  if (items.empty()) {
    out += "[]";
    return;
  }
  out += '[';
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += o_.item_separator;
    newline(depth + 1);
    write(items[i], depth + 1);
  }
  newline(depth);
  out += ']';
}

void JsonWriter::write_dict(const Dict& dict, int64_t depth) {
  if (dict.items.empty()) {
    out += "{}";
    return;
  }
  std::vector<std::pair<std::string, const Value*>> entries;
  for (const auto& kv : dict.items) entries.emplace_back(key_text(kv.first), &kv.second);
  if (o_.sort_keys) {
    for (const auto& kv : dict.items)
      if (!kv.first.is_string() || !dict.items.front().first.is_string())
        compare(kv.first, dict.items.front().first);
    std::stable_sort(entries.begin(), entries.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  out += '{';
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i) out += o_.item_separator;
    newline(depth + 1);
    append_json_string(out, entries[i].first, o_.ensure_ascii);
    out += o_.key_separator;
    write(*entries[i].second, depth + 1);
  }
  newline(depth);
  out += '}';
}

constexpr int kMaxJsonDepth = 1000;

template <typename Json>
Value convert(const Json& j, int depth) {
  if (depth > kMaxJsonDepth)
    throw TemplateLimitError("JSON nested deeper than " + std::to_string(kMaxJsonDepth));
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value(nullptr);
    case nlohmann::json::value_t::boolean: return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value(j.template get<double>());
    case nlohmann::json::value_t::string: return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(convert(e, depth + 1));
      return Value(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::dict();
      for (auto it = j.begin(); it != j.end(); ++it) {
        d.dict_mut().items.emplace_back(Value(it.key()), convert(it.value(), depth + 1));
        d.dict_mut().note(d.dict_ref().items.back().second);
      }
      return d;
    }
    default: return Value(nullptr);
  }
}

}  // namespace

std::string to_json(const Value& value, const JsonOptions& options, int64_t max_depth) {
  JsonWriter writer(options, max_depth);
  writer.write(value, 0);
  return std::move(writer.out);
}

Value from_json(const nlohmann::json& json) {
  return convert(json, 0);
}
Value from_json(const nlohmann::ordered_json& json) {
  return convert(json, 0);
}

}  // namespace kvscope::jinja
