// Reading tokenizer.json with errors that name the file and the field
// ("pre_tokenizer.pretokenizers[1].pattern") and say what was expected.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "core/common/input_error.h"

namespace kvscope::tokenizer {

struct JsonAt {
  const nlohmann::json& value;
  std::string file;
  std::string field;

  JsonAt child(const std::string& key) const {
    if (!value.is_object()) fail("an object");
    auto it = value.find(key);
    static const nlohmann::json kNull;
    return JsonAt{it == value.end() ? kNull : *it, file, join(key)};
  }
  JsonAt at(size_t i) const {
    if (!value.is_array() || value.size() <= i)
      fail("an array with at least " + std::to_string(i + 1) + " elements");
    return JsonAt{value[i], file, field + "[" + std::to_string(i) + "]"};
  }
  bool has(const std::string& key) const {
    return value.is_object() && value.contains(key) && !value.at(key).is_null();
  }
  bool is_null() const { return value.is_null(); }

  [[noreturn]] void fail(const std::string& expected) const {
    std::string got = value.is_null() ? "missing or null" : "got " + std::string(value.type_name());
    throw InputError(file, field, "expected " + expected + " (" + got + ")");
  }
  [[noreturn]] void fail_value(const std::string& what) const {
    throw InputError(file, field, what);
  }

  std::string str() const {
    if (!value.is_string()) fail("a string");
    return value.get<std::string>();
  }
  std::string str_or(const std::string& key, const std::string& fallback) const {
    return has(key) ? child(key).str() : fallback;
  }
  bool boolean() const {
    if (!value.is_boolean()) fail("true or false");
    return value.get<bool>();
  }
  bool bool_or(const std::string& key, bool fallback) const {
    return has(key) ? child(key).boolean() : fallback;
  }
  // An integer that fits int64 (a JSON integer above 2^63 - 1 is refused
  // rather than wrapped to a negative value).
  int64_t integer() const {
    if (!value.is_number_integer()) fail("an integer");
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail_value(value.dump() + " is outside the 64-bit integer range");
    return value.get<int64_t>();
  }
  // A token id: an integer in [0, 2^31 - 1], never truncated to 32 bits.
  int32_t token_id() const {
    const int64_t id = integer();
    if (id < 0 || id > INT32_MAX)
      fail_value(std::to_string(id) + " is outside [0, " + std::to_string(INT32_MAX) +
                 "] (a token id)");
    return static_cast<int32_t>(id);
  }
  int64_t int_or(const std::string& key, int64_t fallback) const {
    return has(key) ? child(key).integer() : fallback;
  }
  const nlohmann::json& array() const {
    if (!value.is_array()) fail("an array");
    return value;
  }
  std::string type() const { return child("type").str(); }

 private:
  std::string join(const std::string& key) const { return field.empty() ? key : field + "." + key; }
};

}  // namespace kvscope::tokenizer
