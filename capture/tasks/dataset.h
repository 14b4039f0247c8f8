// Dataset tasks (`--task dataset:file=F,row=N,...`): one row of a JSONL file
// a user brings, in kvpress's dataset schema (kvpress/pipeline.py and its
// evaluation/benchmarks): `context`, `question` or `questions`,
// `answer_prefix`, `answer` or `answers`, `max_new_tokens`, and optional
// `choices`. The prompt is laid out as kvpress's pipeline lays it out: the
// context and the question in one user message of the model's chat template
// (with --chat), the template's generation prompt, then the answer prefix;
// without a template, context + question + "\n" + answer prefix. The
// question's tokens are marked (role 4); a dataset has no needle. The answer
// is scored by a named scorer (capture/tasks/scorers.h). A context too long
// for `tokens=` is cut in the middle, LongBench's way (its first and last
// halves kept), so the question and the answer prefix stay whole.
// Its protocol is kvpress's default, the question after the compressed
// context (TaskPrompt::question_after, --query).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "capture/tokenizer/tokenizer.h"

namespace kvscope::tasks {

struct DatasetOptions {
  std::string file;        // JSONL, one row per line
  int64_t row = 0;         // 0-based line of a non-empty row
  int64_t question = 0;    // which of the row's `questions`
  std::string scorer;      // empty: `choice` for rows with choices, else string_match_all
  int64_t max_tokens = 0;  // the prompt's most tokens (0: the row as it is)
  bool chat = false;
};

struct DatasetTask {
  std::string prompt_text;
  std::vector<int32_t> ids;
  std::vector<std::string> answers;    // what the scorer compares the generation with
  std::string scorer;                  // the scorer's name
  int64_t max_new = 0;                 // the row's max_new_tokens (0: not given)
  int64_t rows = 0;                    // rows in the file
  int64_t context_tokens = 0;          // the context's tokens in the prompt
  int64_t context_tokens_dropped = 0;  // cut from its middle to fit max_tokens
  std::pair<int64_t, int64_t> question_span;
};

bool is_dataset_spec(const std::string& spec);
// "dataset:file=F,row=N,question=Q,scorer=S,tokens=T" -> options (throws
// InputError naming the field). depth= and seed= are accepted and have no
// effect (sweep plans give every task one).
DatasetOptions parse_dataset_spec(const std::string& spec);
// Reads the row and builds its prompt; throws InputError naming the file, the
// row (its line) and the field for a row that does not fit the schema.
DatasetTask make_dataset_task(const tokenizer::Tokenizer& tok, const DatasetOptions& options);

}  // namespace kvscope::tasks
