// kvscope policies [--json]: every built-in policy with its parameters,
// defaults and source paper.
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "app/cli/command.h"
#include "capture/policy/registry.h"

namespace kvscope::cli {

namespace {

const char* type_name(policy::ParamType t) {
  switch (t) {
    case policy::ParamType::Int:
      return "int";
    case policy::ParamType::Float:
      return "float";
    case policy::ParamType::Bool:
      return "bool";
    case policy::ParamType::String:
      return "string";
  }
  return "?";
}

int run_policies(bool json) {
  if (json) {
    nlohmann::json all = nlohmann::json::array();
    for (const policy::PolicyDescriptor& d : policy::builtin_policies()) {
      nlohmann::json params = nlohmann::json::array();
      for (const policy::ParamSpec& p : d.params) {
        nlohmann::json j = {{"name", p.name},
                            {"type", type_name(p.type)},
                            {"default", p.default_value},
                            {"help", p.help}};
        if (p.type == policy::ParamType::Int || p.type == policy::ParamType::Float)
          j["range"] = {p.min, p.max};
        params.push_back(j);
      }
      all.push_back({{"name", d.name},
                     {"summary", d.summary},
                     {"paper", d.paper},
                     {"doc", d.doc},
                     {"params", params}});
    }
    std::cout << all.dump(2) << "\n";
    return kExitOk;
  }
  for (const policy::PolicyDescriptor& d : policy::builtin_policies()) {
    std::cout << d.name << " — " << d.summary << "\n    paper: " << d.paper
              << "\n    doc:   " << d.doc << "\n";
    for (const policy::ParamSpec& p : d.params) {
      const bool number = p.type == policy::ParamType::Int || p.type == policy::ParamType::Float;
      std::cout << "    " << p.name << " (" << type_name(p.type) << ", default "
                << (p.default_value.empty() && number ? "unset" : p.default_value)
                << (number ? ", " + policy::range_text(p) : "") << "): " << p.help << "\n";
    }
    std::cout << "\n";
  }
  std::cout << "usage: --policy NAME:key=value,...  e.g. --policy h2o:heavy=64,recent=64\n";
  return kExitOk;
}

Command add_policies_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* sub =
      app.add_subcommand("policies", "List the KV-cache policies, their parameters and papers");
  sub->add_flag("--json", *json, "print JSON");
  return {sub, [json] { return run_policies(*json); }};
}

}  // namespace

KVSCOPE_REGISTER_COMMAND("policies", add_policies_command);

}  // namespace kvscope::cli
