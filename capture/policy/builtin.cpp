#include "capture/policy/policies/descriptors.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

const std::vector<PolicyDescriptor>& builtin_policies() {
  static const std::vector<PolicyDescriptor> all = {
      full_descriptor(),      window_descriptor(),         streaming_llm_descriptor(),
      h2o_descriptor(),       tova_descriptor(),           snapkv_descriptor(),
      pyramidkv_descriptor(), knorm_descriptor(),          expected_attention_descriptor(),
      adakv_descriptor(),     duo_attention_descriptor(),  quest_descriptor(),
      wgkv_descriptor(),      attention_gate_descriptor(), trimkv_descriptor(),
      dbtrimkv_descriptor(),
  };
  return all;
}

const PolicyDescriptor* find_policy(const std::string& name) {
  for (const PolicyDescriptor& d : builtin_policies())
    if (d.name == name) return &d;
  return nullptr;
}

PolicyInstance make_policy(const std::string& spec) {
  std::string name;
  std::map<std::string, std::string> values;
  parse_policy_spec(spec, &name, &values);
  PolicyInstance out;
  out.descriptor = find_policy(name);
  if (!out.descriptor) {
    std::string known;
    for (const PolicyDescriptor& d : builtin_policies())
      known += (known.empty() ? "" : ", ") + d.name;
    throw InputError("--policy", name,
                     "unknown policy (known: " + known + "; see `kvscope policies`)");
  }
  out.params = Params(name, out.descriptor->params, values);
  out.policy = out.descriptor->make(out.params);
  return out;
}

}  // namespace kvscope::policy
