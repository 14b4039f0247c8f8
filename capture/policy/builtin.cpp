// The registry's entries and the spec parser: `PART[+PART...]`, each PART
// `name[:key=value,...]`. A part naming a wrapper reshapes the scored eviction
// part before it; any other part is a policy of its own, and two or more make
// a ComposedPolicy. docs/policies/composition.md
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "capture/gates/gate_set.h"
#include "capture/policy/composed.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

const std::vector<PolicyDescriptor>& builtin_policies() {
  static const std::vector<PolicyDescriptor> all = {
      full_descriptor(),
      window_descriptor(),
      streaming_llm_descriptor(),
      h2o_descriptor(),
      tova_descriptor(),
      snapkv_descriptor(),
      pyramidkv_descriptor(),
      knorm_descriptor(),
      expected_attention_descriptor(),
      adakv_descriptor(),
      duo_attention_descriptor(),
      quest_descriptor(),
      wgkv_descriptor(),
      attention_gate_descriptor(),
      trimkv_descriptor(),
      dbtrimkv_descriptor(),
      kvpop_descriptor(),
      sfc_descriptor(),
      scripted_descriptor(),
      // The kvpress catalogue.
      random_descriptor(),
      observed_attention_descriptor(),
      keydiff_descriptor(),
      lagkv_descriptor(),
      cur_descriptor(),
      leverage_descriptor(),
      non_causal_attention_descriptor(),
      compactor_descriptor(),
      criticalkv_descriptor(),
      simlayerkv_descriptor(),
      qfilter_descriptor(),
      critical_adakv_descriptor(),
      cap_descriptor(),
      expected_attention_stats_descriptor(),
      dms_descriptor(),
      finch_descriptor(),
      kvzip_descriptor(),
      kvcompose_descriptor(),
      cam_descriptor(),
      think_descriptor(),
      lukv_descriptor(),
      kvzap_descriptor(),
      fastkvzip_descriptor(),
      dms_learned_descriptor(),
      kvgrad_descriptor(),
      restorekv_descriptor(),
  };
  return all;
}

const std::vector<ScorerDescriptor>& builtin_scorers() {
  static const std::vector<ScorerDescriptor> all = {
      snapkv_scorer(), tova_scorer(),  knorm_scorer(), expected_attention_scorer(),
      random_scorer(), observed_attention_scorer(), keydiff_scorer(),
      lagkv_scorer(),  cur_scorer(),   leverage_scorer(), cap_scorer(), kvzap_scorer()};
  return all;
}

const PolicyDescriptor* find_policy(const std::string& name) {
  for (const PolicyDescriptor& d : builtin_policies())
    if (d.name == name) return &d;
  return nullptr;
}

const ScorerDescriptor* find_scorer(const std::string& name) {
  for (const ScorerDescriptor& d : builtin_scorers())
    if (d.name == name) return &d;
  return nullptr;
}

namespace {

// Splits a spec at the '+' that start a new part (a '+' inside a value, as in
// a file name, stays when what follows is not `name[:` of a known part).
std::vector<std::string> split_parts(const std::string& spec) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i < spec.size(); ++i) {
    if (spec[i] != '+') continue;
    const size_t colon = spec.find_first_of(":+", i + 1);
    const std::string next = spec.substr(i + 1, colon == std::string::npos ? colon : colon - i - 1);
    if (find_policy(next) || find_wrapper(next)) {
      parts.push_back(spec.substr(start, i - start));
      start = i + 1;
    }
  }
  parts.push_back(spec.substr(start));
  return parts;
}

// `budget=0.25`: a fraction of the prompt's tokens (kvpress's
// compression_ratio 0.75); `budget=64`: entries.
void resolve_budget(const std::string& part, std::map<std::string, std::string>* values,
                    const SpecContext& context) {
  auto it = values->find("budget");
  if (it == values->end() || it->second.find('.') == std::string::npos) return;
  char* end = nullptr;
  const double f = std::strtod(it->second.c_str(), &end);
  if (*end != '\0' || !(f > 0 && f <= 1))
    throw InputError(
        "--policy", part + ":budget",
        "'" + it->second + "': whole entries (64) or a fraction of the prompt in (0, 1] (0.25)");
  if (context.prompt_tokens <= 0)
    throw InputError("--policy", part + ":budget",
                     "a fraction of the prompt needs the prompt's length; give whole entries here");
  it->second =
      std::to_string(std::max<int64_t>(1, std::llround(f * double(context.prompt_tokens))));
}

// A learned policy given no gates=: the shipped gate trained for the model,
// named in a note; refused (naming what to do) when there is none.
void resolve_gates(const PolicyDescriptor& d, std::map<std::string, std::string>* values,
                   const SpecContext& context, std::vector<std::string>* notes) {
  if (d.gate_kinds.empty() || values->count("gates") || context.model_file.empty() ||
      !std::filesystem::is_regular_file(context.model_file))
    return;
  const std::string sha = gates::file_sha256(context.model_file);
  const std::string found = find_shipped_gate(d.gate_kinds, sha);
  if (found.empty())
    throw InputError("--policy", d.name + ":gates",
                     "required: no gates= given and no shipped gate of kind " + d.gate_kinds[0] +
                         " was trained for " + context.model_file + " (sha256 " +
                         sha.substr(0, 12) + "...); train one with `kvscope train --policy " +
                         d.gate_kinds[0] + "` (docs/training.md)");
  (*values)["gates"] = found;
  notes->push_back(d.name + ": no gates= given; using " + found +
                   " (shipped, trained for this model: sha256 " + sha.substr(0, 12) + "...)");
}

std::string known_names() {
  std::string known;
  for (const PolicyDescriptor& d : builtin_policies())
    known += (known.empty() ? "" : ", ") + d.name;
  std::string wrappers;
  for (const WrapperDescriptor& d : builtin_wrappers())
    wrappers += (wrappers.empty() ? "" : ", ") + d.name;
  return known + "; wrappers: " + wrappers;
}

}  // namespace

PolicyInstance make_policy(const std::string& spec, const SpecContext& context) {
  std::vector<ComposedPolicy::Part> parts;
  nlohmann::json parts_json = nlohmann::json::array();
  PolicyInstance out;
  ScoredPolicy* last_scored = nullptr;
  for (const std::string& text : split_parts(spec)) {
    std::string name;
    std::map<std::string, std::string> values;
    parse_policy_spec(text, &name, &values);
    resolve_budget(name, &values, context);
    const WrapperDescriptor* w = parts.empty() ? nullptr : find_wrapper(name);
    if (w) {
      if (!last_scored)
        throw InputError("--policy", spec,
                         "wrapper '" + name + "' follows " + parts.back().name +
                             ", which has no scores to reshape (wrappers apply to scored "
                             "eviction parts: snapkv, tova, knorm, expected_attention, scripted)");
      const Params p(name, w->params, values);
      w->apply(*last_scored, p);
      parts.back().name += "+" + name;
      parts_json.push_back({{"wrapper", name}, {"params", nlohmann::json::parse(p.to_json())}});
      continue;
    }
    const PolicyDescriptor* d = find_policy(name);
    if (!d)
      throw InputError(
          "--policy", name,
          std::string(find_wrapper(name) ? "a wrapper cannot come first" : "unknown policy") +
              " (known: " + known_names() + "; see `kvscope policies`)");
    resolve_gates(*d, &values, context, &out.notes);
    Params params(name, d->params, values);
    std::unique_ptr<Policy> policy = d->make(params);
    last_scored = dynamic_cast<ScoredPolicy*>(policy.get());
    if (last_scored && last_scored->scorer_name().empty()) last_scored->set_scorer_name(name);
    parts_json.push_back({{"policy", name}, {"params", nlohmann::json::parse(params.to_json())}});
    if (!out.descriptor) {
      out.descriptor = d;
      out.params = params;
    }
    parts.push_back({name, std::move(policy)});
  }
  for (const ComposedPolicy::Part& p : parts) out.name += (out.name.empty() ? "" : "+") + p.name;
  if (parts.size() == 1) {
    out.policy = std::move(parts[0].policy);
    out.params_json = parts_json.size() == 1 ? out.params.to_json()
                                             : nlohmann::json({{"parts", parts_json}}).dump();
  } else {
    out.policy = std::make_unique<ComposedPolicy>(spec, std::move(parts));
    out.params_json = nlohmann::json({{"parts", parts_json}}).dump();
  }
  return out;
}

std::string params_json_after_setup(const PolicyInstance& instance) {
  nlohmann::json j = nlohmann::json::parse(instance.params_json);
  for (const auto& [name, number] : instance.policy->resolved_params()) {
    // Whole numbers (a window) as integers, like the parameters given.
    const nlohmann::json value = std::floor(number) == number && std::abs(number) < 1e15
                                     ? nlohmann::json(int64_t(number))
                                     : nlohmann::json(number);
    const size_t dot = name.find('.');
    if (dot == std::string::npos || !j.contains("parts")) {
      j[name] = value;
      continue;
    }
    for (nlohmann::json& part : j["parts"])  // "part.name" of a composite
      if (part.value("policy", "") == name.substr(0, dot))
        part["params"][name.substr(dot + 1)] = value;
  }
  return j.dump();
}

std::string explain_policy(const PolicyInstance& instance) {
  std::string out = "policy " + instance.name + "\n";
  if (auto* c = dynamic_cast<const ComposedPolicy*>(instance.policy.get())) {
    out += "parts:\n" + c->describe();
  } else {
    out += "parts:\n" + describe_part(instance.name, *instance.policy);
  }
  std::string tiers;
  for (const cache::TierSpec& t : instance.policy->tiers())
    tiers += (tiers.empty() ? "" : ", ") + t.name + (t.attended ? "" : " (not attended)");
  out += "tiers: " + tiers + "\n";
  std::string gates;
  for (const trace::GateSpec& g : instance.policy->gates())
    gates += (gates.empty() ? "" : ", ") + g.name;
  out += "gates: " + (gates.empty() ? std::string("none") : gates) + "\n";
  const cache::StatsNeeds n = instance.policy->stats_needs();
  out += std::string("statistics: ") + (n.received ? "received mass " : "") +
         (n.last_query ? "last query " : "") +
         (n.observation_window > 0 ? "observation window of " + std::to_string(n.observation_window)
                                   : "") +
         (n.any() ? "" : "none") + "\n";
  out += std::string("reads besides k and v: ") + (n.query ? "queries " : "") +
         (n.reads_hidden() ? "layer input " : "") + (n.key_pre_rope ? "keys before RoPE " : "") +
         (n.query || n.reads_hidden() || n.key_pre_rope ? "" : "nothing") + "\n";
  std::string reasons;
  for (const std::string& r : instance.policy->reason_names())
    reasons += (reasons.empty() ? "" : "; ") + r;
  out += "reasons: " + reasons + "\n";
  out +=
      "budget: " + instance.policy->budget_kind() +
      (instance.policy->budget_kind() == "none" ? ""
                                                : " " + std::to_string(instance.policy->budget())) +
      "\n";
  out += "parameters: " + instance.params_json + "\n";
  return out;
}

}  // namespace kvscope::policy
