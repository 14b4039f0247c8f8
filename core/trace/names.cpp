#include "core/trace/error.h"
#include "core/trace/types.h"

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

}  // namespace kvscope::trace
