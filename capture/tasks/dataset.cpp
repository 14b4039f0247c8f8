#include "capture/tasks/dataset.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "capture/tasks/scorers.h"
#include "capture/tasks/task_common.h"
#include "core/common/input_error.h"

namespace kvscope::tasks {

namespace {

using nlohmann::json;

// One row of the file: its JSON and where it is, for errors ("F:LINE").
struct Row {
  json value;
  std::string where;
  int64_t rows = 0;  // non-empty lines in the file
};

bool blank(const std::string& line) {
  return line.find_first_not_of(" \t\r") == std::string::npos;
}

Row read_row(const std::string& file, int64_t row) {
  std::ifstream in(file);
  if (!in) throw InputError(file, "", std::string("cannot be read: ") + std::strerror(errno));
  Row r;
  std::string line, text;
  int64_t line_no = 0, at = -1;
  while (std::getline(in, line)) {
    ++line_no;
    if (blank(line)) continue;
    if (r.rows == row) text = line, at = line_no;
    ++r.rows;
  }
  if (at < 0)
    throw InputError("--task", "dataset:row",
                     "is " + std::to_string(row) + ", but " + file + " has " +
                         std::to_string(r.rows) + " rows (expected 0.." +
                         std::to_string(r.rows - 1) + ")");
  r.where = file + ":" + std::to_string(at);
  try {
    r.value = json::parse(text);
  } catch (const json::parse_error& e) {
    throw InputError(r.where, "", std::string("not a JSON object (") + e.what() + ")");
  }
  if (!r.value.is_object()) throw InputError(r.where, "", "expected a JSON object per line");
  return r;
}

[[noreturn]] void bad_field(const Row& r, const std::string& field, const std::string& expected) {
  const auto it = r.value.find(field);
  const std::string got = it == r.value.end() ? "missing" : std::string("a ") + it->type_name();
  throw InputError(r.where, field, "expected " + expected + ", got " + got);
}

std::string text_field(const Row& r, const std::string& field, bool required) {
  const auto it = r.value.find(field);
  if (it == r.value.end() && !required) return "";
  if (it == r.value.end() || !it->is_string()) bad_field(r, field, "a string");
  return it->get<std::string>();
}

// A string or a list of strings (acceptable answers).
std::vector<std::string> strings_of(const Row& r, const std::string& field, const json& v) {
  if (v.is_string()) return {v.get<std::string>()};
  std::vector<std::string> out;
  if (v.is_array())
    for (const json& e : v) {
      if (!e.is_string()) bad_field(r, field, "a string or a list of strings");
      out.push_back(e.get<std::string>());
    }
  if (out.empty()) bad_field(r, field, "a string or a non-empty list of strings");
  return out;
}

struct RowContent {
  std::string context, question, answer_prefix;
  std::vector<std::string> answers, choices;
  int64_t max_new = 0;
};

// `question` with `answer`/`answers` (acceptable answers), or `questions`
// with `answers` holding one entry per question.
void read_question(const Row& r, int64_t index, RowContent* c) {
  if (r.value.contains("questions")) {
    const json& qs = r.value["questions"];
    if (!qs.is_array() || qs.empty()) bad_field(r, "questions", "a non-empty list of strings");
    if (index >= int64_t(qs.size()))
      throw InputError("--task", "dataset:question",
                       "is " + std::to_string(index) + ", but " + r.where + " has " +
                           std::to_string(qs.size()) + " questions");
    if (!qs[size_t(index)].is_string()) bad_field(r, "questions", "a list of strings");
    c->question = qs[size_t(index)].get<std::string>();
    const auto a = r.value.find("answers");
    if (a == r.value.end() || !a->is_array() || a->size() != qs.size())
      bad_field(r, "answers",
                "a list with one answer per question (" + std::to_string(qs.size()) + ")");
    c->answers = strings_of(r, "answers", (*a)[size_t(index)]);
    return;
  }
  if (index != 0)
    throw InputError("--task", "dataset:question",
                     "is " + std::to_string(index) + ", but " + r.where + " has one question");
  c->question = text_field(r, "question", true);
  const char* field = r.value.contains("answer") ? "answer" : "answers";
  if (!r.value.contains(field)) bad_field(r, "answer", "a string or a list of strings");
  c->answers = strings_of(r, field, r.value[field]);
}

// Multiple choice: the options follow the question as "A. text" lines; the
// answer is the option's letter or its text, and the scorer gets both
// (the label InfiniteBench's choice scorer reads: letter, text).
void read_choices(const Row& r, RowContent* c) {
  const auto it = r.value.find("choices");
  if (it == r.value.end()) return;
  if (!it->is_array() || it->size() < 2 || it->size() > 26)
    bad_field(r, "choices", "a list of 2 to 26 strings");
  for (const json& e : *it) {
    if (!e.is_string()) bad_field(r, "choices", "a list of strings");
    c->choices.push_back(e.get<std::string>());
  }
  const std::string& a = c->answers.front();
  for (size_t i = 0; i < c->choices.size(); ++i) {
    const std::string letter(1, char('A' + i));
    if (a == letter || a == c->choices[i]) {
      c->answers = {letter, c->choices[i]};
      return;
    }
  }
  throw InputError(r.where, "answer",
                   "expected a choice's letter (A-" +
                       std::string(1, char('A' + c->choices.size() - 1)) + ") or its text, got '" +
                       a + "'");
}

RowContent read_content(const Row& r, int64_t question) {
  RowContent c;
  c.context = text_field(r, "context", true);
  read_question(r, question, &c);
  c.answer_prefix = text_field(r, "answer_prefix", false);
  read_choices(r, &c);
  const auto it = r.value.find("max_new_tokens");
  if (it != r.value.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1)
      bad_field(r, "max_new_tokens", "an integer >= 1");
    c.max_new = it->get<int64_t>();
  }
  return c;
}

std::string question_text(const RowContent& c) {
  std::string q = c.question;
  for (size_t i = 0; i < c.choices.size(); ++i)
    q += "\n" + std::string(1, char('A' + i)) + ". " + c.choices[i];
  return q;
}

// The prompt and the question's byte range in it, kvpress's layout.
struct Layout {
  std::string text;
  size_t question_begin = 0, question_end = 0;
};

Layout lay_out(const tokenizer::Tokenizer& tok, bool chat, const std::string& context,
               const std::string& question, const std::string& answer_prefix) {
  Layout l;
  const std::string user = context + question;
  if (chat) {
    l.text = tok.apply_chat_template({{"user", user}}) + answer_prefix;
    const size_t at = l.text.find(user);
    l.question_begin = at == std::string::npos ? l.text.rfind(question) : at + context.size();
    if (l.question_begin == std::string::npos) l.question_begin = l.text.size();
  } else {
    l.text = user + "\n" + answer_prefix;
    l.question_begin = context.size();
  }
  l.question_end = std::min(l.text.size(), l.question_begin + question.size());
  return l;
}

// LongBench's middle truncation on the context's tokens: its first and last
// halves of `keep` tokens, decoded back to text.
std::string middle_of(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& ids,
                      int64_t keep) {
  const auto mid = ids.begin() + keep / 2;
  return tok.decode(std::vector<int32_t>(ids.begin(), mid), true) +
         tok.decode(std::vector<int32_t>(ids.end() - (keep - keep / 2), ids.end()), true);
}

}  // namespace

bool is_dataset_spec(const std::string& spec) {
  return spec.rfind("dataset:", 0) == 0;
}

DatasetOptions parse_dataset_spec(const std::string& spec) {
  const TaskSpec s("dataset", spec,
                   {"file", "row", "question", "scorer", "tokens", "depth", "seed"});
  DatasetOptions o;
  if (!s.has("file")) s.fail("file", "required (a JSONL file, one row per line)");
  o.file = s.text("file", "");
  o.row = s.integer("row", 0, int64_t(1) << 40, 0);
  o.question = s.integer("question", 0, 1 << 20, 0);
  o.max_tokens = s.integer("tokens", 16, int64_t(1) << 24, 0);
  s.number("depth", 0, 1, 0);
  s.integer("seed", 0, std::numeric_limits<int64_t>::max(), 0);
  o.scorer = s.text("scorer", "");
  if (!o.scorer.empty()) find_scorer(o.scorer, "--task", "dataset:scorer");
  return o;
}

DatasetTask make_dataset_task(const tokenizer::Tokenizer& tok, const DatasetOptions& o) {
  const Row r = read_row(o.file, o.row);
  const RowContent c = read_content(r, o.question);
  DatasetTask t;
  t.rows = r.rows;
  t.answers = c.answers;
  t.max_new = c.max_new;
  t.scorer = !o.scorer.empty() ? o.scorer : c.choices.empty() ? "string_match_all" : "choice";
  const std::string question = question_text(c);
  std::string context = c.context;
  const std::vector<int32_t> context_ids = tok.encode(context, false);
  t.context_tokens = int64_t(context_ids.size());
  Layout l = lay_out(tok, o.chat, context, question, c.answer_prefix);
  t.ids = tok.encode(l.text, true);
  // Cut the context until the prompt fits: a cut's halves may tokenize a
  // little differently joined, so it can take a second round.
  int64_t keep = t.context_tokens;
  for (int round = 0; o.max_tokens > 0 && int64_t(t.ids.size()) > o.max_tokens; ++round) {
    keep -= int64_t(t.ids.size()) - o.max_tokens;
    if (keep < 2 || round == 8)
      throw InputError("--task", "dataset:tokens",
                       "is " + std::to_string(o.max_tokens) + ", too small for " + r.where +
                           "'s question and answer prefix (expected >= " +
                           std::to_string(int64_t(t.ids.size()) - keep + 2) + ")");
    context = middle_of(tok, context_ids, keep);
    l = lay_out(tok, o.chat, context, question, c.answer_prefix);
    t.ids = tok.encode(l.text, true);
    t.context_tokens = keep;
  }
  t.context_tokens_dropped = int64_t(context_ids.size()) - t.context_tokens;
  t.prompt_text = l.text;
  t.question_span = token_spans(tok, l.text, t.ids, {{l.question_begin, l.question_end}}).at(0);
  return t;
}

}  // namespace kvscope::tasks
