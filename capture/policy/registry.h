// The one registry of policy parts, by name: whole policies (`--policy
// NAME:key=value,...`), and the wrappers that reshape a scored eviction part
// (`snapkv:budget=0.25+pyramid`). `kvscope policies`, docs/policies/README.md
// and the registry test read it. builtin.cpp lists the entries explicitly (a
// static library would drop self-registering objects nobody references).
// Spec syntax: docs/policies/composition.md
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "capture/policy/params.h"
#include "capture/policy/policy.h"

namespace kvscope::policy {

struct PolicyDescriptor {
  std::string name;
  std::string summary;  // one line
  std::string paper;    // citation of the source paper (or "baseline")
  std::string doc;      // docs/policies/<page>.md
  std::vector<ParamSpec> params;
  std::function<std::unique_ptr<Policy>(const Params&)> make;
  // Learned policies: the gate kinds (a gate file's "policy") they read, in
  // order of preference; with no `gates=`, the shipped gate of such a kind
  // trained for the model is taken (gate_search.cpp).
  std::vector<std::string> gate_kinds = {};
};

const std::vector<PolicyDescriptor>& builtin_policies();
const PolicyDescriptor* find_policy(const std::string& name);

class ScoredPolicy;
// A wrapper reshapes the scored eviction part before it (wrappers.cpp).
struct WrapperDescriptor {
  std::string name;
  std::string summary;
  std::string paper;
  std::string doc;
  std::vector<ParamSpec> params;
  std::function<void(ScoredPolicy&, const Params&)> apply;
};
const std::vector<WrapperDescriptor>& builtin_wrappers();
const WrapperDescriptor* find_wrapper(const std::string& name);

// What a spec is resolved against: `budget=0.25` is a fraction of the
// prompt's tokens.
struct SpecContext {
  int64_t prompt_tokens = 0;  // 0: unknown (a fraction is then refused)
  std::string
      model_file;  // the weight file: learned policies find their shipped gate by its sha256
};

struct PolicyInstance {
  const PolicyDescriptor* descriptor = nullptr;  // the first part's
  Params params;                                 // the first part's
  std::unique_ptr<Policy> policy;
  std::string name;                // "h2o", or the parts joined: "wgkv+quest", "snapkv+pyramid"
  std::string params_json;         // the resolved parameters (of every part, for a composite)
  std::vector<std::string> notes;  // what was chosen for the user (a shipped gate file)
};
// Parses and builds a policy from its spec; throws InputError naming the
// spec, part and parameter (and listing the known parts for an unknown name).
PolicyInstance make_policy(const std::string& spec, const SpecContext& context = {});
// The instance's parameters with what the policy resolved at setup (a gate
// file's tau and window) in place of the placeholders given; call after setup.
std::string params_json_after_setup(const PolicyInstance& instance);

// The composed parts of a spec, in words (kvscope policies --explain).
std::string explain_policy(const PolicyInstance& instance);

// The shipped gate file (resources/gates, or $KVSCOPE_GATES_DIR) of one of
// `kinds` whose metadata names the model by `model_sha256`; "" if none.
std::string find_shipped_gate(const std::vector<std::string>& kinds,
                              const std::string& model_sha256);

}  // namespace kvscope::policy
