#include "capture/tasks/task_prompt.h"

#include "capture/tasks/cwe.h"
#include "capture/tasks/defer.h"
#include "capture/tasks/needle.h"
#include "capture/tasks/niah.h"
#include "capture/tasks/vt.h"

namespace kvscope::tasks {

void parse_task_spec(const std::string& spec) {
  if (is_defer_spec(spec))
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

TaskPrompt build_task(const std::string& spec, const tokenizer::Tokenizer& tok, bool chat) {
  TaskPrompt p;
  if (is_defer_spec(spec)) {
    DeferOptions o = parse_defer_spec(spec);
    o.chat = chat;
    DeferTask t = make_defer_task(tok, o);
    p = {"defer",         t.prompt_text,     t.ids,     t.forced, t.answer,
         {t.needle_span}, {t.question_span}, {t.answer}};
  } else if (is_niah_spec(spec)) {
    NiahOptions o = parse_niah_spec(spec);
    o.chat = chat;
    NiahTask t = make_niah_task(tok, o);
    p = {niah_kind(o),   t.prompt_text,     t.ids,    {}, t.answer,
         t.needle_spans, {t.question_span}, t.answers};
  } else if (is_vt_spec(spec)) {
    VtOptions o = parse_vt_spec(spec);
    o.chat = chat;
    VtTask t = make_vt_task(tok, o);
    p = {"vt", t.prompt_text, t.ids, {}, t.answer, t.needle_spans, {t.question_span}, t.answers};
  } else if (is_cwe_spec(spec)) {
    CweOptions o = parse_cwe_spec(spec);
    o.chat = chat;
    CweTask t = make_cwe_task(tok, o);
    p = {"cwe", t.prompt_text, t.ids, {}, t.answer, t.needle_spans, {t.question_span}, t.answers};
  } else {
    NeedleOptions o = parse_needle_spec(spec);
    o.chat = chat;
    NeedleTask t = make_needle_task(tok, o);
    p = {"needle",        t.prompt_text,     t.ids,     {}, t.answer,
         {t.needle_span}, {t.question_span}, {t.answer}};
  }
  return p;
}

}  // namespace kvscope::tasks
