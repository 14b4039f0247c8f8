// The policies KVScope knows, by name: `--policy NAME:key=value,...` and
// `kvscope policies`. builtin.cpp lists them explicitly (a static library
// would drop self-registering objects nobody references).
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
};

const std::vector<PolicyDescriptor>& builtin_policies();
const PolicyDescriptor* find_policy(const std::string& name);

struct PolicyInstance {
  const PolicyDescriptor* descriptor = nullptr;
  Params params;
  std::unique_ptr<Policy> policy;
};
// Parses and builds a policy from its spec; throws InputError naming the
// policy and parameter (and listing the known policies for an unknown name).
PolicyInstance make_policy(const std::string& spec);

}  // namespace kvscope::policy
