// Replays (`kvscope replay`, `kvscope why --causal`): the capture a trace
// records, rebuilt from the trace itself — the model and its dtypes from
// /run, the prompt and forced tokens from /tokens (ids as fed, not
// re-tokenised), the task's roles, answers and scorer, the policy spec as
// given, the generation and capture settings from /run run_json "replay" —
// so that a replay without interventions reproduces its original exactly,
// and a replay with them differs only by what they changed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "capture/generate/engine.h"
#include "capture/policy/interventions.h"
#include "capture/recorder/capture_run.h"
#include "core/trace/reader.h"

namespace kvscope::recorder {

struct ReplaySource {
  generate::ModelOptions model;
  CaptureRequest request;  // no output, no interventions yet
  // The tokens fed by prefill steps as recorded (a policy's inserted tokens
  // included: finish_replay_request drops them, the policy inserts them again).
  std::vector<int32_t> prefill_ids;
  std::vector<trace::TokenRole> prefill_roles;
  // The interventions the trace itself was replayed with (a replay of a
  // replay applies them again, before its own).
  std::vector<std::string> recorded_interventions;
};

struct ReplayOverrides {
  std::string model;   // a model path instead of /run model_path ("" : the recorded one)
  std::string device;  // "" : cpu
  int threads = 0;
  bool any_version = false;  // replay a trace of another KVScope version
};

// Throws InputError naming the trace and the field when the capture cannot
// be found again: an incomplete trace, one without /run run_json "replay"
// (made before replays, minor version 10), a model path that does not
// exist, another KVScope version (unless overridden).
ReplaySource replay_source(const trace::TraceReader& original, const ReplayOverrides& overrides);

// The request for `engine` (the prompt without inserted tokens, the spans
// of the needle and question in it).
void finish_replay_request(const generate::Engine& engine, ReplaySource* source);

// What interventions on a replay of `original` resolve against.
policy::InterventionShape intervention_shape(const trace::TraceReader& original);

// Throws InputError (field --intervene) for a restore or only whose heads
// lost nothing in `original` from its step on: there is nothing to restore.
void check_restores_something(const trace::TraceReader& original,
                              const policy::Intervention& intervention);

// The first difference between a replay and its original, in words (tokens,
// then steps, then events, then the outcome); "" when they agree.
std::string first_difference(const trace::TraceReader& original, const trace::TraceReader& replay);

}  // namespace kvscope::recorder
