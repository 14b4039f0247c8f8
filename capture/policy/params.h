// Policy parameters: each policy declares its parameters (name, type, default,
// meaning); `--policy NAME:key=value,...` is parsed against the declaration,
// and a wrong key or value is an InputError naming the key and what it takes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvscope::policy {

enum class ParamType { Int, Float, Bool, String };

struct ParamSpec {
  std::string name;
  ParamType type;
  std::string default_value;  // "" for a number: unset, the policy decides (was_given)
  std::string help;
  // Values an Int or Float parameter accepts, both ends included, checked
  // for every policy by Params (a Float must also be finite: NaN and inf
  // compare false with any bound a policy might test). The default suits
  // sizes and counts, with -1 for the "automatic" of a few.
  double min = -1;
  double max = double(int64_t(1) << 30);
};

class Params {
 public:
  Params() = default;
  Params(std::string policy, const std::vector<ParamSpec>& specs,
         const std::map<std::string, std::string>& given);

  int64_t get_int(const std::string& name) const;
  double get_float(const std::string& name) const;  // NaN for an unset Float (default "")
  bool get_bool(const std::string& name) const;
  const std::string& get_string(const std::string& name) const;
  bool was_given(const std::string& name) const { return given_.count(name) != 0; }
  // Every parameter with its resolved value, as JSON (for /run policy_params).
  std::string to_json() const;

 private:
  const std::string& raw(const std::string& name) const;
  std::string policy_;
  std::vector<ParamSpec> specs_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::string> given_;
};

// "[min, max]" as the messages write a parameter's range.
std::string range_text(const ParamSpec& spec);

// "name:key=value,key=value" -> (name, {key: value}). Throws InputError.
void parse_policy_spec(const std::string& spec, std::string* name,
                       std::map<std::string, std::string>* values);

}  // namespace kvscope::policy
