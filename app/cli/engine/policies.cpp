// kvscope policies [--json] [--explain SPEC]: every registered policy and
// wrapper with its parameters, defaults and source paper; --explain prints
// the parts a spec composes.
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "app/cli/cli_main.h"
#include "app/cli/command.h"
#include "app/cli/policies_options.h"
#include "capture/policy/registry.h"

namespace kvscope::cli {

namespace {

const char* type_name(policy::ParamType t) {
  switch (t) {
    case policy::ParamType::Int: return "int";
    case policy::ParamType::Float: return "float";
    case policy::ParamType::Bool: return "bool";
    case policy::ParamType::String: return "string";
  }
  return "?";
}

// Parses SPEC and prints its composed parts (exit 2 naming what is wrong).
int run_explain(const std::string& spec, int64_t prompt_tokens) {
  policy::PolicyInstance instance = policy::make_policy(spec, {prompt_tokens, ""});
  std::cout << policy::explain_policy(instance);
  return kExitOk;
}

nlohmann::json params_json(const std::vector<policy::ParamSpec>& specs) {
  nlohmann::json params = nlohmann::json::array();
  for (const policy::ParamSpec& p : specs) {
    nlohmann::json j = {{"name", p.name},
                        {"type", type_name(p.type)},
                        {"default", p.default_value},
                        {"help", p.help}};
    if (p.type == policy::ParamType::Int || p.type == policy::ParamType::Float)
      j["range"] = {p.min, p.max};
    params.push_back(j);
  }
  return params;
}

void print_params(const std::vector<policy::ParamSpec>& specs) {
  for (const policy::ParamSpec& p : specs) {
    const bool number = p.type == policy::ParamType::Int || p.type == policy::ParamType::Float;
    std::cout << "    " << p.name << " (" << type_name(p.type) << ", default "
              << (p.default_value.empty() && number ? "unset" : p.default_value)
              << (number ? ", " + policy::range_text(p) : "") << "): " << p.help << "\n";
  }
}

// The index tables of docs/policies/README.md, from the registry.
int run_markdown() {
  auto page = [](const std::string& doc) {
    const std::string name = doc.substr(doc.rfind('/') + 1);
    return "[" + name + "](" + name + ")";
  };
  // A '|' in a summary (a norm, ||v||) would end the table cell.
  auto cell = [](const std::string& text) {
    std::string out;
    for (char ch : text) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return out;
  };
  std::cout << "| policy | what | page |\n| --- | --- | --- |\n";
  for (const policy::PolicyDescriptor& d : policy::builtin_policies())
    std::cout << "| `" << d.name << "` | " << cell(d.summary) << " | " << page(d.doc) << " |\n";
  std::cout
      << "\nWrappers reshape the scored eviction part before them "
         "(`snapkv:budget=0.25+pyramid`):\n\n| wrapper | what | page |\n| --- | --- | --- |\n";
  for (const policy::WrapperDescriptor& d : policy::builtin_wrappers())
    std::cout << "| `" << d.name << "` | " << cell(d.summary) << " | " << page(d.doc) << " |\n";
  return kExitOk;
}

int run_policies(bool json) {
  if (json) {
    nlohmann::json all = nlohmann::json::array();
    for (const policy::PolicyDescriptor& d : policy::builtin_policies())
      all.push_back({{"name", d.name},
                     {"kind", "policy"},
                     {"summary", d.summary},
                     {"paper", d.paper},
                     {"doc", d.doc},
                     {"params", params_json(d.params)}});
    for (const policy::WrapperDescriptor& d : policy::builtin_wrappers())
      all.push_back({{"name", d.name},
                     {"kind", "wrapper"},
                     {"summary", d.summary},
                     {"paper", d.paper},
                     {"doc", d.doc},
                     {"params", params_json(d.params)}});
    std::cout << all.dump(2) << "\n";
    return kExitOk;
  }
  for (const policy::PolicyDescriptor& d : policy::builtin_policies()) {
    std::cout << d.name << " — " << d.summary << "\n    paper: " << d.paper
              << "\n    doc:   " << d.doc << "\n";
    print_params(d.params);
    std::cout << "\n";
  }
  std::cout
      << "Wrappers (after a scored part: snapkv, tova, knorm, expected_attention, scripted):\n\n";
  for (const policy::WrapperDescriptor& d : policy::builtin_wrappers()) {
    std::cout << "+" << d.name << " — " << d.summary << "\n    paper: " << d.paper
              << "\n    doc:   " << d.doc << "\n";
    print_params(d.params);
    std::cout << "\n";
  }
  std::cout
      << "usage: --policy NAME:key=value,...[+PART...]  e.g. --policy h2o:heavy=64,recent=64,\n"
         "       --policy snapkv:budget=0.25+pyramid:beta=20, --policy wgkv+quest:budget=64\n"
         "       (kvscope policies --explain SPEC prints the composed parts; "
         "docs/policies/composition.md)\n";
  return kExitOk;
}

Command add_policies_command(CLI::App& app) {
  auto o = std::make_shared<PoliciesOptions>();
  CLI::App* sub = add_policies_subcommand(app, *o);
  return {sub, [o] {
            if (!o->explain.empty()) return run_explain(o->explain, o->prompt_tokens);
            return o->markdown ? run_markdown() : run_policies(o->json);
          }};
}

}  // namespace

KVSCOPE_REGISTER_COMMAND("policies", add_policies_command);

}  // namespace kvscope::cli
