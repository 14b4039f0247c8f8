#include "capture/policy/params.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "core/common/check.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

const char* type_name(ParamType t) {
  switch (t) {
    case ParamType::Int: return "an integer";
    case ParamType::Float: return "a number";
    case ParamType::Bool: return "true or false";
    case ParamType::String: return "a string";
  }
  return "?";
}

bool valid(ParamType t, const std::string& v) {
  if (v.empty()) return t == ParamType::String;
  char* end = nullptr;
  errno = 0;
  switch (t) {
    case ParamType::Int: std::strtoll(v.c_str(), &end, 10); return errno == 0 && *end == 0;
    case ParamType::Float: std::strtod(v.c_str(), &end); return errno == 0 && *end == 0;
    case ParamType::Bool: return v == "true" || v == "false" || v == "1" || v == "0";
    case ParamType::String: return true;
  }
  return false;
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

}  // namespace

std::string range_text(const ParamSpec& spec) {
  return "[" + number_text(spec.min) + ", " + number_text(spec.max) + "]";
}

namespace {

// A number parameter's value against its declared range; NaN and inf are
// refused whatever the range (strtod accepts "nan" and "inf").
void check_range(const std::string& policy, const ParamSpec& spec, const std::string& value) {
  const double v = std::strtod(value.c_str(), nullptr);
  const std::string field = policy + ":" + spec.name;
  if (!std::isfinite(v))
    throw InputError("--policy", field,
                     "'" + value + "' is not a finite number (expected " +
                         (spec.type == ParamType::Int ? "an integer" : "a number") + " in " +
                         range_text(spec) + ")");
  // An Int beyond what a double holds exactly is beyond any range too.
  const bool out = spec.type == ParamType::Int
                       ? (std::strtoll(value.c_str(), nullptr, 10) < spec.min ||
                          std::strtoll(value.c_str(), nullptr, 10) > spec.max)
                       : (v < spec.min || v > spec.max);
  if (out)
    throw InputError("--policy", field,
                     "'" + value + "' is outside " + range_text(spec) + " (the values " +
                         spec.name + " accepts)");
}

}  // namespace

Params::Params(std::string policy, const std::vector<ParamSpec>& specs,
               const std::map<std::string, std::string>& given)
    : policy_(std::move(policy)), specs_(specs), given_(given) {
  for (const ParamSpec& s : specs_) values_[s.name] = s.default_value;
  for (const auto& [key, value] : given) {
    const ParamSpec* spec = nullptr;
    for (const ParamSpec& s : specs_)
      if (s.name == key) spec = &s;
    if (!spec) {
      std::string known;
      for (const ParamSpec& s : specs_) known += (known.empty() ? "" : ", ") + s.name;
      throw InputError(
          "--policy", policy_ + ":" + key,
          "unknown parameter (" + policy_ + " takes: " + (known.empty() ? "none" : known) + ")");
    }
    if (!valid(spec->type, value))
      throw InputError("--policy", policy_ + ":" + key,
                       "'" + value + "' is not " + type_name(spec->type));
    if (spec->type == ParamType::Int || spec->type == ParamType::Float)
      check_range(policy_, *spec, value);
    values_[key] = value;
  }
}

const std::string& Params::raw(const std::string& name) const {
  auto it = values_.find(name);
  KVSCOPE_CHECK(it != values_.end(), "policy " + policy_ + " has no parameter " + name);
  return it->second;
}

int64_t Params::get_int(const std::string& name) const {
  return std::strtoll(raw(name).c_str(), nullptr, 10);
}
double Params::get_float(const std::string& name) const {
  const std::string& v = raw(name);
  return v.empty() ? std::numeric_limits<double>::quiet_NaN() : std::strtod(v.c_str(), nullptr);
}
bool Params::get_bool(const std::string& name) const {
  const std::string& v = raw(name);
  return v == "true" || v == "1";
}
const std::string& Params::get_string(const std::string& name) const {
  return raw(name);
}

std::string Params::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const ParamSpec& s : specs_) {
    const std::string& v = raw(s.name);
    switch (s.type) {
      case ParamType::Int: j[s.name] = get_int(s.name); break;
      case ParamType::Float:
        if (v.empty())
          j[s.name] = nullptr;  // unset: the policy's own choice
        else
          j[s.name] = get_float(s.name);
        break;
      case ParamType::Bool: j[s.name] = get_bool(s.name); break;
      case ParamType::String: j[s.name] = v; break;
    }
  }
  // String values are bytes as given (paths need not be UTF-8): dump()
  // would throw on them, so invalid sequences become U+FFFD here.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void parse_policy_spec(const std::string& spec, std::string* name,
                       std::map<std::string, std::string>* values) {
  size_t colon = spec.find(':');
  *name = spec.substr(0, colon);
  values->clear();
  if (name->empty())
    throw InputError("--policy", "", "empty policy name (expected NAME[:key=value,...])");
  if (colon == std::string::npos) return;
  std::string rest = spec.substr(colon + 1);
  size_t pos = 0;
  while (pos <= rest.size()) {
    size_t comma = rest.find(',', pos);
    std::string item =
        rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t eq = item.find('=');
    if (item.empty() || eq == std::string::npos || eq == 0)
      throw InputError("--policy", *name, "'" + item + "' is not key=value");
    (*values)[item.substr(0, eq)] = item.substr(eq + 1);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
}

}  // namespace kvscope::policy
