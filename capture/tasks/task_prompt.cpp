#include "capture/tasks/task_prompt.h"

#include <algorithm>

#include "capture/tasks/cwe.h"
#include "capture/tasks/dataset.h"
#include "capture/tasks/defer.h"
#include "capture/tasks/needle.h"
#include "capture/tasks/niah.h"
#include "capture/tasks/task_common.h"
#include "capture/tasks/vt.h"
#include "core/common/input_error.h"

namespace kvscope::tasks {

void parse_task_spec(const std::string& spec) {
  if (is_dataset_spec(spec))
    parse_dataset_spec(spec);
  else if (is_defer_spec(spec))
    parse_defer_spec(spec);
  else if (is_niah_spec(spec))
    parse_niah_spec(spec);
  else if (is_vt_spec(spec))
    parse_vt_spec(spec);
  else if (is_cwe_spec(spec))
    parse_cwe_spec(spec);
  else
    parse_needle_spec(spec);
}

namespace {

using Spans = std::vector<std::pair<int64_t, int64_t>>;

TaskPrompt prompt_of(std::string kind, std::string text, std::vector<int32_t> ids, Spans needles,
                     Spans questions, std::vector<std::string> answers) {
  TaskPrompt p;
  p.kind = std::move(kind);
  p.prompt_text = std::move(text);
  p.ids = std::move(ids);
  p.needle_spans = std::move(needles);
  p.question_spans = std::move(questions);
  p.answers = std::move(answers);
  p.answer = join_answers(p.answers);
  return p;
}

}  // namespace

TaskPrompt build_task(const std::string& spec, const tokenizer::Tokenizer& tok, bool chat) {
  if (is_dataset_spec(spec)) {
    DatasetOptions o = parse_dataset_spec(spec);
    o.chat = chat;
    DatasetTask t = make_dataset_task(tok, o);
    TaskPrompt p = prompt_of("dataset", t.prompt_text, t.ids, {}, {t.question_span}, t.answers);
    p.scorer = t.scorer;
    p.max_new = t.max_new;
    p.question_after = true;  // kvpress's protocol for datasets
    return p;
  }
  if (is_defer_spec(spec)) {
    DeferOptions o = parse_defer_spec(spec);
    o.chat = chat;
    DeferTask t = make_defer_task(tok, o);
    TaskPrompt p =
        prompt_of("defer", t.prompt_text, t.ids, {t.needle_span}, {t.question_span}, {t.answer});
    p.forced = t.forced;
    return p;
  }
  if (is_niah_spec(spec)) {
    NiahOptions o = parse_niah_spec(spec);
    o.chat = chat;
    NiahTask t = make_niah_task(tok, o);
    return prompt_of(niah_kind(o), t.prompt_text, t.ids, t.needle_spans, {t.question_span},
                     t.answers);
  }
  if (is_vt_spec(spec)) {
    VtOptions o = parse_vt_spec(spec);
    o.chat = chat;
    VtTask t = make_vt_task(tok, o);
    return prompt_of("vt", t.prompt_text, t.ids, t.needle_spans, {t.question_span}, t.answers);
  }
  if (is_cwe_spec(spec)) {
    CweOptions o = parse_cwe_spec(spec);
    o.chat = chat;
    CweTask t = make_cwe_task(tok, o);
    return prompt_of("cwe", t.prompt_text, t.ids, t.needle_spans, {t.question_span}, t.answers);
  }
  NeedleOptions o = parse_needle_spec(spec);
  o.chat = chat;
  NeedleTask t = make_needle_task(tok, o);
  return prompt_of("needle", t.prompt_text, t.ids, {t.needle_span}, {t.question_span}, {t.answer});
}

namespace {

// The last question's first token inside the prompt, -1 when every question
// is fed after it already (defer's) or the task has none.
int64_t question_in_prompt(const TaskPrompt& p) {
  int64_t cut = -1;
  for (auto [b, e] : p.question_spans)
    if (b > 0 && b < int64_t(p.ids.size()) && e > b) cut = std::max(cut, b);
  return cut;
}

}  // namespace

void apply_query_protocol(TaskPrompt* p, const std::string& query,
                          const tokenizer::Tokenizer& tok) {
  if (query != "auto" && query != "after" && query != "inside")
    throw InputError("", "--query", "expected auto, after or inside, got '" + query + "'");
  const bool after = query == "after" || (query == "auto" && p->question_after);
  const int64_t cut = question_in_prompt(*p);
  p->question_after = cut < 0 && !p->question_spans.empty();  // defer: after by construction
  if (!after || p->question_after) return;
  if (cut < 0)
    throw InputError("", "--query",
                     "after: the " + p->kind + " task has no question in its prompt to move");
  std::vector<int32_t> forced(p->ids.begin() + cut, p->ids.end());
  forced.insert(forced.end(), p->forced.begin(), p->forced.end());
  p->forced = std::move(forced);
  p->ids.resize(size_t(cut));
  const bool bos = !p->ids.empty() && p->ids.front() == tok.bos_id();
  p->prompt_text = tok.decode(std::vector<int32_t>(p->ids.begin() + (bos ? 1 : 0), p->ids.end()),
                              /*skip_special=*/false);
  p->question_after = true;
}

}  // namespace kvscope::tasks
