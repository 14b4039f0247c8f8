#include "capture/policy/params.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdlib>

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
      throw InputError("--policy", policy_ + ":" + key,
                       "unknown parameter (" + policy_ + " takes: " + (known.empty() ? "none" : known) + ")");
    }
    if (!valid(spec->type, value))
      throw InputError("--policy", policy_ + ":" + key,
                       "'" + value + "' is not " + type_name(spec->type));
    values_[key] = value;
  }
}

const std::string& Params::raw(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw std::logic_error("policy " + policy_ + " has no parameter " + name);
  return it->second;
}

int64_t Params::get_int(const std::string& name) const { return std::strtoll(raw(name).c_str(), nullptr, 10); }
double Params::get_float(const std::string& name) const { return std::strtod(raw(name).c_str(), nullptr); }
bool Params::get_bool(const std::string& name) const {
  const std::string& v = raw(name);
  return v == "true" || v == "1";
}
const std::string& Params::get_string(const std::string& name) const { return raw(name); }

std::string Params::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const ParamSpec& s : specs_) {
    const std::string& v = raw(s.name);
    switch (s.type) {
      case ParamType::Int: j[s.name] = get_int(s.name); break;
      case ParamType::Float: j[s.name] = get_float(s.name); break;
      case ParamType::Bool: j[s.name] = get_bool(s.name); break;
      case ParamType::String: j[s.name] = v; break;
    }
  }
  return j.dump();
}

void parse_policy_spec(const std::string& spec, std::string* name,
                       std::map<std::string, std::string>* values) {
  size_t colon = spec.find(':');
  *name = spec.substr(0, colon);
  values->clear();
  if (name->empty()) throw InputError("--policy", "", "empty policy name (expected NAME[:key=value,...])");
  if (colon == std::string::npos) return;
  std::string rest = spec.substr(colon + 1);
  size_t pos = 0;
  while (pos <= rest.size()) {
    size_t comma = rest.find(',', pos);
    std::string item = rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t eq = item.find('=');
    if (item.empty() || eq == std::string::npos || eq == 0)
      throw InputError("--policy", *name, "'" + item + "' is not key=value");
    (*values)[item.substr(0, eq)] = item.substr(eq + 1);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
}

}  // namespace kvscope::policy
