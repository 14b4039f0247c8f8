// `kvscope capture` = generate + record: runs the model under a policy on the
// ragged cache, records every step into a trace, optionally beside a
// full-cache oracle shadow. Shared by the command line, the GUI's capture
// dialog and the tests.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "capture/generate/engine.h"
#include "capture/generate/generator.h"
#include "capture/policy/interventions.h"
#include "capture/policy/policy.h"
#include "capture/recorder/capture_levels.h"
#include "capture/tasks/task_prompt.h"
#include "core/trace/types.h"

namespace kvscope::recorder {

struct CaptureProgress {
  int64_t tokens_done = 0;   // positions fed so far
  int64_t tokens_total = 0;  // prompt + max new tokens
  int64_t steps = 0;
};

struct CaptureRequest {
  std::vector<int32_t> prompt_ids;
  std::string prompt_text;  // the text the ids encode (chat template included)
  generate::GenerationOptions generation;
  std::string policy = "full";    // NAME[:key=value,...]
  std::string levels = "events";  // see capture_levels.h
  bool oracle = false;
  int64_t oracle_recall_k = 16;
  std::string output;          // trace path (ignored with --capture none)
  std::string model_path;      // as given, for /run model_path
  std::string tokenizer_path;  // --tokenizer as given ("" : the model's own), for replays
  int64_t page_rows = 16;
  // --device cuda: how prefill chunks are attended (cache::DevicePrefill).
  std::string device_prefill = "kernel";
  std::string command_line;
  std::string run_json = "{}";  // extra run description (sampling, task, ...)
  std::string task_kind;        // e.g. "needle"
  std::string expected_answer;  // /run expected_answer
  // What a correct generation contains, every one (RULER's string_match_all,
  // ASCII case-insensitive); empty: it contains expected_answer as given.
  std::vector<std::string> expected_answers;
  // The scorer of expected_answers (capture/tasks/scorers.h), recorded in
  // /run run_json; empty: string_match_all.
  std::string scorer;
  // Where a task's question went (TaskPrompt::question_after): "after" or
  // "inside", recorded in /run run_json; empty: no task.
  std::string query;
  // [begin, end) token ranges; they may cover teacher-forced decode tokens
  // (generation.forced_tokens, recorded with prompt roles).
  std::vector<std::pair<int64_t, int64_t>> needle_spans;
  std::vector<std::pair<int64_t, int64_t>> question_spans;
  std::function<void(const CaptureProgress&)> progress;
  // A replay's interventions (policy/interventions.h), applied by the step
  // driver to the policy's decisions and recorded in /run run_json
  // "interventions" and /interventions.
  std::vector<policy::Intervention> interventions;
  // What /run run_json "replay_of" records: the trace a replay re-runs.
  std::string replay_of;
  // Measure the expected answer's teacher-forced log-probability at the
  // answer step (the answer probe; /generation/answer_logprob, answer_rank).
  bool answer_probe = true;
};

// A task's prompt, answer, marked spans and forced tokens into a request.
void set_task(const tasks::TaskPrompt& task, CaptureRequest* request);

struct CaptureResult {
  generate::GenerationResult generation;
  int64_t steps = 0;
  int64_t final_entries = 0;
  int64_t peak_kv_bytes = 0;
  int64_t final_kv_bytes = 0;
  double policy_seconds = 0;         // inside the policy's hooks
  double decode_policy_seconds = 0;  // of which during decode steps
  bool success = false;              // generation contains every expected answer (task given)
  int64_t answers_found = 0;         // of expected_answers, how many the generation contains
  double score = 0;                  // the scorer's, 0..1 (default: answers_found / their number)
  std::vector<std::string> notes;    // choices made for the user (e.g. the shipped gate taken)
  double answer_logprob = std::numeric_limits<double>::quiet_NaN();  // the answer probe's
  int64_t answer_rank = -1;
  std::vector<int32_t> answer_tokens;  // what the probe fed (empty: no probe)
};

// The tokens the answer probe feeds for `answer` after `context_text`: the
// answer as the model would write it next (a space first unless the context
// ends in whitespace or the answer starts with it), no special tokens.
std::vector<int32_t> answer_probe_tokens(const tokenizer::Tokenizer& tokenizer,
                                         const std::string& context_text,
                                         const std::string& answer);

// The trace layout of a capture: the groups the levels ask for, and the
// gates and series the policy declares (the trace fixes them at creation).
trace::CaptureLayout capture_layout(const CaptureLevels& levels, const policy::Policy& policy,
                                    int64_t max_tokens, bool oracle, int64_t recall_k);

// Throws InputError for a bad policy, capture level or prompt.
CaptureResult run_capture(generate::Engine& engine, const CaptureRequest& request);

}  // namespace kvscope::recorder
