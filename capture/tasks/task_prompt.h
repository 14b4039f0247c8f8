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
  std::string kind;  // /run task_kind: "needle", "defer", "niah_single", "niah_multikey"
  std::string prompt_text;
  std::vector<int32_t> ids;
  std::vector<int32_t> forced;  // teacher-forced decode tokens (defer)
  std::string answer;
  std::vector<std::pair<int64_t, int64_t>> needle_spans;
  std::vector<std::pair<int64_t, int64_t>> question_spans;
};

// Checks a spec without building its prompt (throws InputError naming the field).
void parse_task_spec(const std::string& spec);
// needle[:...], defer[:...] or niah[:...] (throws InputError naming the field).
TaskPrompt build_task(const std::string& spec, const tokenizer::Tokenizer& tok, bool chat);

}  // namespace kvscope::tasks
