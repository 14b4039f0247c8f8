#include "core/trace/error.h"
#include "core/trace/types.h"

#include <map>
#include <sstream>

namespace kvscope::trace {

const char* event_kind_name(EventKind kind) {
  switch (kind) {
    case EventKind::Admit: return "admit";
    case EventKind::Reject: return "reject";
    case EventKind::Select: return "select";
    case EventKind::Evict: return "evict";
    case EventKind::Demote: return "demote";
    case EventKind::Promote: return "promote";
  }
  return "unknown";
}

const char* intervention_action_name(InterventionAction action) {
  switch (action) {
    case InterventionAction::Kept: return "kept";
    case InterventionAction::Dropped: return "dropped";
  }
  return "unknown";
}

const char* token_role_name(TokenRole role) {
  switch (role) {
    case TokenRole::Prompt: return "prompt";
    case TokenRole::Generated: return "generated";
    case TokenRole::Needle: return "needle";
    case TokenRole::Template: return "template";
    case TokenRole::Question: return "question";
  }
  return "unknown";
}

const char* step_kind_name(StepKind kind) {
  switch (kind) {
    case StepKind::Prefill: return "prefill";
    case StepKind::Decode: return "decode";
    case StepKind::Reconstruction: return "reconstruction";
  }
  return "?";
}

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::Io: return "io";
    case ErrorCode::NotATrace: return "not-a-trace";
    case ErrorCode::TooNew: return "too-new";
    case ErrorCode::TooOld: return "too-old";
    case ErrorCode::Schema: return "schema";
    case ErrorCode::TooLarge: return "too-large";
    case ErrorCode::Usage: return "usage";
  }
  return "unknown";
}

// Ranges of layers as "0-3, 7".
std::string layer_ranges(const std::vector<int64_t>& layers) {
  std::ostringstream o;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    o << (i ? ", " : "") << layers[i];
    if (j > i) o << "-" << layers[j];
    i = j + 1;
  }
  return o.str();
}

std::string layer_types_summary(const ModelInfo& m) {
  std::map<int64_t, std::vector<int64_t>> by_window;
  for (size_t l = 0; l < m.layer_window.size(); ++l)
    if (m.layer_window[l] > 0) by_window[m.layer_window[l]].push_back(int64_t(l));
  std::ostringstream o;
  if (by_window.empty()) o << "global attention";
  for (const auto& [w, layers] : by_window)
    o << (o.tellp() ? "; " : "") << "sliding window " << w << " on " << layers.size() << " of "
      << m.n_layers << " layers (" << layer_ranges(layers) << ")";
  int64_t moe = 0;
  for (const std::string& f : m.layer_ffn) moe += f == "moe";
  if (moe > 0) o << "; experts on " << moe << " of " << m.n_layers << " layers";
  return o.str();
}

}  // namespace kvscope::trace
