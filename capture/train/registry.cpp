#include "capture/train/registry.h"

#include <algorithm>
#include <sstream>

#include "capture/train/trainers.h"
#include "core/common/check.h"
#include "core/common/input_error.h"

namespace kvscope::gates {

namespace {

// Two trainers sharing an option name share its meaning on the command line.
void check_shared_options(const std::vector<TrainerDescriptor>& all) {
  for (size_t a = 0; a < all.size(); ++a)
    for (size_t b = a + 1; b < all.size(); ++b) {
      KVSCOPE_CHECK(all[a].name != all[b].name, "trainer registry: " + all[a].name + " twice");
      for (const ParamSpec& x : all[a].options)
        for (const ParamSpec& y : all[b].options)
          KVSCOPE_CHECK(x.name != y.name || (x.type == y.type && x.min == y.min && x.max == y.max),
                        "trainer registry: --" + x.name + " of " + all[a].name + " and " +
                            all[b].name + " differ in type or range");
    }
}

const char* type_word(ParamType t) {
  switch (t) {
    case ParamType::Int: return "INT";
    case ParamType::Float: return "FLOAT";
    case ParamType::Bool: return "";
    case ParamType::String: return "TEXT";
  }
  return "";
}

}  // namespace

const std::vector<TrainerDescriptor>& builtin_trainers() {
  static const std::vector<TrainerDescriptor> all = [] {
    std::vector<TrainerDescriptor> v = {
        wgkv_trainer(),        attention_gate_trainer(),
        retention_trainer(),   retention_global_trainer(),
        kvpop_trainer(),       streaming_plus_trainer(),
        sfc_trainer(),         qfilter_trainer(),
        query_stats_trainer(), kvzap_trainer(),
        fastkvzip_trainer(),   dms_trainer(),
        restorekv_trainer(),   duo_attention_trainer(),
        lukv_trainer(),
    };
    check_shared_options(v);
    return v;
  }();
  return all;
}

const TrainerDescriptor* find_trainer(const std::string& name) {
  for (const TrainerDescriptor& d : builtin_trainers())
    if (d.name == name) return &d;
  return nullptr;
}

TrainResult run_trainer(const std::string& name, const TrainOptions& o,
                        const std::map<std::string, std::string>& options) {
  const TrainerDescriptor* d = find_trainer(name);
  if (!d)
    throw InputError("", "--policy",
                     "'" + name + "' is not a trainer (known: " + trainer_names() + ")");
  return d->run(o, trainer_params(*d, options));
}

namespace {

// A trainer's options, in words.
std::string options_of(const TrainerDescriptor& d) {
  std::string out;
  for (const ParamSpec& p : d.options) out += (out.empty() ? "" : ", ") + option_flag(p);
  return out.empty() ? "none of its own" : out;
}

}  // namespace

std::string trainers_taking(const std::string& option) {
  std::string out;
  for (const TrainerDescriptor& d : builtin_trainers())
    for (const ParamSpec& p : d.options)
      if (p.name == option) out += (out.empty() ? "" : ", ") + d.name;
  return out.empty() ? "no trainer" : out;
}

Params trainer_params(const TrainerDescriptor& d, const std::map<std::string, std::string>& given) {
  for (const auto& [name, value] : given) {
    bool own = false;
    for (const ParamSpec& p : d.options) own = own || p.name == name;
    if (!own)
      throw InputError("", option_flag({name, ParamType::String, "", ""}),
                       "is an option of " + trainers_taking(name) + ", not of " + d.name + " (" +
                           d.name + "'s options: " + options_of(d) + ")");
  }
  return Params(d.name, d.options, given);
}

std::string trainer_names() {
  std::string out;
  for (const TrainerDescriptor& d : builtin_trainers()) out += (out.empty() ? "" : ", ") + d.name;
  return out;
}

std::string hyper_keys(const std::vector<GateKind>& kinds) {
  std::vector<std::string> keys;
  for (GateKind k : kinds) {
    const nlohmann::json defaults = default_hyperparameters(k, GateShape{});
    for (const auto& [key, value] : defaults.items())
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  }
  std::string out;
  for (const std::string& k : keys) out += (out.empty() ? "" : ", ") + k;
  return out;
}

std::string option_flag(const ParamSpec& spec) {
  std::string flag = "--" + spec.name;
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag;
}

std::string explain_trainer(const TrainerDescriptor& d) {
  std::ostringstream s;
  s << d.name << ": " << d.summary << "\n";
  s << "  paper:       " << d.paper << "\n";
  s << "  doc:         " << d.doc << "\n";
  s << "  learns from: "
    << (d.input == TrainInput::Traces ? "full-cache traces (--traces; --model optional)"
                                      : "text under --model (--data, --generate)")
    << "\n";
  s << "  writes:      " << d.writes << "\n";
  s << "  --gate keys: " << (d.gate_keys.empty() ? "(none)" : d.gate_keys) << "\n";
  if (d.options.empty()) return s.str() + "  options:     (the shared ones only)\n";
  s << "  options:\n";
  for (const ParamSpec& p : d.options) {
    std::string head = option_flag(p);
    if (p.type != ParamType::Bool) head += std::string(" ") + type_word(p.type);
    s << "    " << head << std::string(head.size() < 24 ? 24 - head.size() : 1, ' ') << p.help;
    if (p.type != ParamType::Bool && !p.default_value.empty())
      s << " (default " << p.default_value << ")";
    s << "\n";
  }
  return s.str();
}

}  // namespace kvscope::gates
