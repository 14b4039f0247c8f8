// One entry point for every task (`--task SPEC`): the prompt, its marked
// token spans, the expected answer and any teacher-forced tokens, for
// `kvscope capture` and `kvscope sweep` alike.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "capture/tokenizer/tokenizer.h"

namespace kvscope::tasks {

struct TaskPrompt {
  // /run task_kind: "needle", "defer", "niah_single", "niah_multikey",
  // "niah_multivalue", "vt", "cwe", "dataset"
  std::string kind;
  std::string prompt_text;
  std::vector<int32_t> ids;
  std::vector<int32_t> forced;  // teacher-forced decode tokens (defer)
  std::string answer;           // /run expected_answer: the expected strings joined by ", "
  std::vector<std::pair<int64_t, int64_t>> needle_spans;
  std::vector<std::pair<int64_t, int64_t>> question_spans;
  // Every string a correct answer contains (one for needle, defer and
  // single-value niah); success = all of them (RULER's string_match_all,
  // capture/tasks/task_common.h).
  std::vector<std::string> answers;
  // How the answer is scored (capture/tasks/scorers.h); empty: RULER's
  // string_match_all over `answers`, what the synthetic tasks use.
  std::string scorer;
  int64_t max_new = 0;  // the task's own generation length (a dataset row's), 0: none
  // The protocol: false, the question ends the prompt the policy compresses
  // (query-aware, the synthetic tasks' default); true, it is fed after the
  // compression as teacher-forced decode steps (kvpress's default, query_aware
  // false; a dataset's default). apply_query_protocol sets it.
  bool question_after = false;
};

// Checks a spec without building its prompt (throws InputError naming the field).
void parse_task_spec(const std::string& spec);
// needle[:...], defer[:...], niah[:...], vt[:...], cwe[:...] or
// dataset:... (throws InputError naming the field).
TaskPrompt build_task(const std::string& spec, const tokenizer::Tokenizer& tok, bool chat);

// --query: "inside" (the question in the compressed prompt), "after" (the
// prompt stops where its last question begins; that question and what
// follows it, the template's end of turn and the answer prefix, become
// teacher-forced decode steps ahead of the task's own) or "auto" (the task's
// default). The tokens stay the same; only where the prefill ends moves.
// Throws InputError (field --query) for "after" on a task without a question
// in its prompt.
void apply_query_protocol(TaskPrompt* task, const std::string& query,
                          const tokenizer::Tokenizer& tok);

}  // namespace kvscope::tasks
