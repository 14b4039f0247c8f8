#include "capture/tasks/task_prompt.h"

#include "capture/tasks/defer.h"
#include "capture/tasks/needle.h"
#include "capture/tasks/niah.h"

namespace kvscope::tasks {

void parse_task_spec(const std::string& spec) {
  if (is_defer_spec(spec))
    parse_defer_spec(spec);
  else if (is_niah_spec(spec))
    parse_niah_spec(spec);
  else
    parse_needle_spec(spec);
}

TaskPrompt build_task(const std::string& spec, const tokenizer::Tokenizer& tok, bool chat) {
  TaskPrompt p;
  if (is_defer_spec(spec)) {
    DeferOptions o = parse_defer_spec(spec);
    o.chat = chat;
    DeferTask t = make_defer_task(tok, o);
    p = {"defer", t.prompt_text, t.ids, t.forced, t.answer, {t.needle_span}, {t.question_span}};
  } else if (is_niah_spec(spec)) {
    NiahOptions o = parse_niah_spec(spec);
    o.chat = chat;
    NiahTask t = make_niah_task(tok, o);
    p = {o.keys == 1 ? "niah_single" : "niah_multikey",
         t.prompt_text,
         t.ids,
         {},
         t.answer,
         {t.needle_span},
         {t.question_span}};
  } else {
    NeedleOptions o = parse_needle_spec(spec);
    o.chat = chat;
    NeedleTask t = make_needle_task(tok, o);
    p = {"needle", t.prompt_text, t.ids, {}, t.answer, {t.needle_span}, {t.question_span}};
  }
  return p;
}

}  // namespace kvscope::tasks
