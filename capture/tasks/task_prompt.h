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
  // "niah_multivalue", "vt", "cwe"
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
};

// Checks a spec without building its prompt (throws InputError naming the field).
void parse_task_spec(const std::string& spec);
// needle[:...], defer[:...], niah[:...], vt[:...] or cwe[:...] (throws
// InputError naming the field).
TaskPrompt build_task(const std::string& spec, const tokenizer::Tokenizer& tok, bool chat);

}  // namespace kvscope::tasks
