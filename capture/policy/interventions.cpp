#include "capture/policy/interventions.h"

#include <algorithm>
#include <cctype>

#include "core/common/check.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

constexpr const char* kField = "--intervene";

[[noreturn]] void refuse(const std::string& spec, const std::string& part, const std::string& why) {
  throw InputError("", kField, spec + ": " + (part.empty() ? "" : "'" + part + "': ") + why);
}

bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 18) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  *out = std::stoll(s);
  return true;
}

// "A-B" (inclusive) or "A" into [a, b]; false when neither.
bool parse_range(const std::string& s, int64_t* a, int64_t* b) {
  const size_t dash = s.find('-');
  if (dash == std::string::npos) return parse_int(s, a) && (*b = *a, true);
  return parse_int(s.substr(0, dash), a) && parse_int(s.substr(dash + 1), b) && *a <= *b;
}

// key -> values, a value without '=' continuing the previous key's list.
struct SpecParts {
  std::vector<std::pair<std::string, std::vector<std::string>>> keys;
  const std::vector<std::string>* find(const std::string& key) const {
    for (const auto& [k, v] : keys)
      if (k == key) return &v;
    return nullptr;
  }
};

SpecParts split_parts(const std::string& spec, const std::string& body) {
  SpecParts parts;
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    if (comma == std::string::npos) comma = body.size();
    const std::string item = body.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) refuse(spec, "", "an empty part (expected key=value parts joined by ',')");
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      if (item == "all") {
        parts.keys.push_back({"heads", {"all"}});
        continue;
      }
      if (parts.keys.empty())
        refuse(spec, item, "expected key=value (heads=, layers=, tokens=, from=, at=) or all");
      parts.keys.back().second.push_back(item);
      continue;
    }
    const std::string key = item.substr(0, eq);
    if (parts.find(key)) refuse(spec, item, "'" + key + "' given twice");
    parts.keys.push_back({key, {item.substr(eq + 1)}});
  }
  return parts;
}

std::string layer_range_text(const InterventionShape& s) {
  return "the trace's model has " + std::to_string(s.layers) + " layers (0-" +
         std::to_string(s.layers - 1) + ") of " + std::to_string(s.kv_heads) + " kv heads (0-" +
         std::to_string(s.kv_heads - 1) + ")";
}

// heads=... or layers=... into [L * K] flags.
std::vector<uint8_t> parse_heads(const std::string& spec, const std::vector<std::string>& values,
                                 bool layers_only, const InterventionShape& s) {
  std::vector<uint8_t> heads(size_t(s.layers * s.kv_heads), 0);
  for (const std::string& v : values) {
    if (v == "all") {
      std::fill(heads.begin(), heads.end(), 1);
      continue;
    }
    int64_t a = 0, b = 0, h = -1;
    const size_t dot = v.find('.');
    bool ok;
    if (dot != std::string::npos && !layers_only) {
      const std::string head = v.substr(dot + 1);
      ok = parse_int(v.substr(0, dot), &a) && (head == "*" || parse_int(head, &h));
      b = a;
    } else {
      ok = parse_range(v, &a, &b);
    }
    if (!ok)
      refuse(spec, v,
             layers_only ? "expected a layer L or layers A-B"
                         : "expected L.H (one kv head), L or L.* (a layer), A-B (layers) or all");
    if (b >= s.layers || (h >= s.kv_heads)) refuse(spec, v, layer_range_text(s));
    for (int64_t l = a; l <= b; ++l)
      for (int64_t k = 0; k < s.kv_heads; ++k)
        if (h < 0 || k == h) heads[size_t(l * s.kv_heads + k)] = 1;
  }
  return heads;
}

std::vector<uint8_t> parse_tokens(const std::string& spec, const std::vector<std::string>& values,
                                  const InterventionShape& s) {
  std::vector<uint8_t> tokens(size_t(s.tokens), 0);
  for (const std::string& v : values) {
    const std::vector<int32_t>* role = v == "needle"     ? &s.needle
                                       : v == "question" ? &s.question
                                                         : nullptr;
    if (role) {
      if (role->empty())
        refuse(spec, v, "the trace marks no " + v + " tokens (a --task capture marks them)");
      for (int32_t t : *role) tokens[size_t(t)] = 1;
      continue;
    }
    int64_t a = 0, b = 0;
    if (!parse_range(v, &a, &b))
      refuse(spec, v, "expected needle, question, a token index N or A-B");
    if (b >= s.tokens) refuse(spec, v, "the trace has tokens 0-" + std::to_string(s.tokens - 1));
    for (int64_t t = a; t <= b; ++t) tokens[size_t(t)] = 1;
  }
  return tokens;
}

int64_t parse_step(const std::string& spec, const std::string& key,
                   const std::vector<std::string>& values, const InterventionShape& s) {
  int64_t step = 0;
  if (values.size() != 1 || !parse_int(values[0], &step))
    refuse(spec, key + "=" + (values.empty() ? "" : values[0]), "expected a step number");
  if (step >= s.steps)
    refuse(spec, key + "=" + values[0], "the trace has steps 0-" + std::to_string(s.steps - 1));
  return step;
}

}  // namespace

const char* intervention_kind_name(InterventionKind kind) {
  switch (kind) {
    case InterventionKind::Restore: return "restore";
    case InterventionKind::Pin: return "pin";
    case InterventionKind::Drop: return "drop";
    case InterventionKind::Only: return "only";
  }
  return "?";
}

int64_t Intervention::n_heads() const {
  return std::count(heads.begin(), heads.end(), uint8_t(1));
}

Intervention parse_intervention(const std::string& spec, const InterventionShape& shape) {
  KVSCOPE_CHECK(shape.layers > 0 && shape.kv_heads > 0, "parse_intervention: no model shape");
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  Intervention iv;
  iv.text = spec;
  if (kind == "restore")
    iv.kind = InterventionKind::Restore;
  else if (kind == "pin")
    iv.kind = InterventionKind::Pin;
  else if (kind == "drop")
    iv.kind = InterventionKind::Drop;
  else if (kind == "only")
    iv.kind = InterventionKind::Only;
  else
    refuse(spec, kind, "expected restore:, pin:, drop: or only:");
  if (colon == std::string::npos || colon + 1 == spec.size())
    refuse(spec, "", std::string("needs its parts after '") + kind + ":'");
  const SpecParts parts = split_parts(spec, spec.substr(colon + 1));

  const bool wants_tokens = iv.kind == InterventionKind::Pin || iv.kind == InterventionKind::Drop;
  std::vector<std::string> allowed = {"heads", "layers"};
  allowed.push_back(wants_tokens ? "tokens" : "");
  allowed.push_back(iv.kind == InterventionKind::Drop      ? "at"
                    : iv.kind == InterventionKind::Restore ? "from"
                                                           : "");
  for (const auto& [key, values] : parts.keys)
    if (key.empty() || std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      refuse(spec, key,
             std::string("not a part of ") + kind + ": (it takes " +
                 (iv.kind == InterventionKind::Restore ? "heads= or layers=, from="
                  : iv.kind == InterventionKind::Only  ? "heads= or layers="
                  : iv.kind == InterventionKind::Pin   ? "tokens=, heads= or layers="
                                                       : "tokens=, heads= or layers=, at=") +
                 ")");
  const auto* heads = parts.find("heads");
  const auto* layers = parts.find("layers");
  if (heads && layers) refuse(spec, "layers", "give heads= or layers=, not both");
  if (!heads && !layers && !wants_tokens)
    refuse(spec, "", "names no heads (heads=L.H,..., layers=A-B or all)");
  if (heads || layers)
    iv.heads = parse_heads(spec, heads ? *heads : *layers, layers != nullptr, shape);
  else
    iv.heads.assign(size_t(shape.layers * shape.kv_heads), 1);
  if (wants_tokens) {
    const auto* tokens = parts.find("tokens");
    if (!tokens) refuse(spec, "", "names no tokens (tokens=needle|question|A-B)");
    iv.tokens = parse_tokens(spec, *tokens, shape);
    for (size_t t = 0; t < iv.tokens.size(); ++t)
      if (iv.tokens[t]) iv.token_list.push_back(int32_t(t));
  }
  if (const auto* from = parts.find("from")) iv.from_step = parse_step(spec, "from", *from, shape);
  if (const auto* at = parts.find("at")) iv.from_step = parse_step(spec, "at", *at, shape);
  return iv;
}

std::string head_list_text(const std::vector<uint8_t>& heads, int64_t kv_heads) {
  if (std::all_of(heads.begin(), heads.end(), [](uint8_t h) { return h != 0; })) return "all";
  std::string out;
  auto item = [&out](const std::string& text) {
    if (!out.empty()) out += ',';
    out += text;
  };
  const int64_t layers = int64_t(heads.size()) / kv_heads;
  for (int64_t l = 0; l < layers; ++l) {
    int64_t n = 0;
    for (int64_t k = 0; k < kv_heads; ++k) n += heads[size_t(l * kv_heads + k)];
    if (n == kv_heads) {
      item(std::to_string(l));
      continue;
    }
    for (int64_t k = 0; k < kv_heads && n > 0; ++k)
      if (heads[size_t(l * kv_heads + k)]) item(std::to_string(l) + "." + std::to_string(k));
  }
  return out;
}

Interventions::Interventions(std::vector<Intervention> list, int64_t layers, int64_t kv_heads)
    : list_(std::move(list)), L_(layers), K_(kv_heads) {
  for (const Intervention& iv : list_)
    KVSCOPE_CHECK(int64_t(iv.heads.size()) == L_ * K_,
                  "Interventions: '" + iv.text + "' was resolved for another model shape");
}

bool Interventions::keeps(int64_t step, int64_t layer, int64_t kv_head, int64_t token,
                          int* which) const {
  for (size_t i = 0; i < list_.size(); ++i) {
    const Intervention& iv = list_[i];
    if (iv.kind == InterventionKind::Drop || step < iv.from_step) continue;
    const bool in_heads = iv.covers(layer, kv_head, K_);
    // only: the policy acts inside its heads; everything outside stays.
    const bool applies = iv.kind == InterventionKind::Only ? !in_heads : in_heads;
    if (applies && iv.covers_token(token)) {
      if (which) *which = int(i);
      return true;
    }
  }
  return false;
}

bool Interventions::keeps_any() const {
  return std::any_of(list_.begin(), list_.end(),
                     [](const Intervention& iv) { return iv.kind != InterventionKind::Drop; });
}

bool Interventions::drops_at(int64_t step, int64_t layer, int64_t kv_head) const {
  return std::any_of(list_.begin(), list_.end(), [&](const Intervention& iv) {
    return iv.kind == InterventionKind::Drop && step >= iv.from_step &&
           iv.covers(layer, kv_head, K_);
  });
}

}  // namespace kvscope::policy
