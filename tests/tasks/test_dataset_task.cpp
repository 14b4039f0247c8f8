// Dataset tasks (capture/tasks/dataset.*): a row of a JSONL file in kvpress's
// schema becomes kvpress's prompt layout (context and question in one user
// message, the generation prompt, the answer prefix), the question's tokens
// are marked, several questions and multiple choice are read as the schema
// says, a long context is cut in the middle to fit tokens=, a bad row is
// refused naming the file, line and field; a real capture on stories260K
// records the scorer and scores the generation with it.
#include "capture/generate/engine.h"  // LibTorch first: its CHECK gives way to Catch2's
#undef CHECK
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "capture/tasks/dataset.h"
#include "capture/tasks/scorers.h"
#include "capture/tasks/task_prompt.h"
#include "core/common/input_error.h"
#include "core/trace/reader.h"
#include "tests/support/paths.h"
#include "tests/tasks/task_test_util.h"

using namespace kvscope;
namespace fs = std::filesystem;

namespace {

using test::smol_tok;
using test::stories_dir;
using test::stories_tok;

std::string examples() {
  return test::source_dir() + "/resources/datasets/examples.jsonl";
}

nlohmann::json example_row(int row) {
  std::ifstream in(examples());
  std::string line;
  for (int i = 0; i <= row; ++i) std::getline(in, line);
  return nlohmann::json::parse(line);
}

tasks::DatasetTask make(const std::string& spec, const tokenizer::Tokenizer& tok, bool chat) {
  tasks::DatasetOptions o = tasks::parse_dataset_spec(spec);
  o.chat = chat;
  return tasks::make_dataset_task(tok, o);
}

std::string span_text(const tokenizer::Tokenizer& tok, const tasks::DatasetTask& t) {
  return tok.decode(std::vector<int32_t>(t.ids.begin() + t.question_span.first,
                                         t.ids.begin() + t.question_span.second));
}

// The InputError's message of `spec` on a one-line file holding `row`.
std::string refusal(const std::string& row, const std::string& keys = "") {
  const std::string path = test::temp_dir() + "/bad.jsonl";
  std::ofstream(path) << row << "\n";
  try {
    make("dataset:file=" + path + keys, stories_tok(), false);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("dataset: kvpress's layout, the question marked, the row's answers and length",
          "[tasks][dataset]") {
  const nlohmann::json row = example_row(0);
  const std::string context = row["context"], question = row["question"];
  const std::string file = "dataset:file=" + examples();

  SECTION("plain: context + question + newline + answer prefix") {
    const tasks::DatasetTask t = make(file, stories_tok(), false);
    CHECK(t.prompt_text == context + question + "\nAnswer:");
    CHECK(t.ids == stories_tok().encode(t.prompt_text, true));
    CHECK(t.rows == 5);
    CHECK(t.max_new == 12);
    CHECK(t.scorer == "string_match_all");
    CHECK(t.answers == std::vector<std::string>{"Margaret Ellery"});
    CHECK(t.context_tokens_dropped == 0);
    CHECK_THAT(span_text(stories_tok(), t), Catch::Contains("Who kept the lamp"));
  }
  SECTION("chat: one user message, the generation prompt, then the answer prefix") {
    const std::string templated = smol_tok().apply_chat_template({{"user", context + question}});
    const tasks::DatasetTask t = make(file, smol_tok(), true);
    CHECK(t.prompt_text == templated + "Answer:");
    CHECK(t.question_span.second > t.question_span.first);
    CHECK(t.question_span.second < int64_t(t.ids.size()));
    const std::string q = span_text(smol_tok(), t);
    CHECK_THAT(q, Catch::Contains("Question: Who kept the lamp of the Gannet Point lighthouse?"));
    CHECK_THAT(q, !Catch::Contains("museum"));  // the context is not part of it
  }
}

TEST_CASE("query protocol: the same tokens, the prefill ending before or after the question",
          "[tasks][dataset][query]") {
  const std::string file = "dataset:file=" + examples();
  for (const bool chat : {false, true}) {
    const tokenizer::Tokenizer& tok = chat ? smol_tok() : stories_tok();
    INFO("chat " << chat);
    const tasks::TaskPrompt whole = tasks::build_task(file, tok, chat);
    CHECK(whole.question_after);  // a dataset's own protocol: kvpress's default
    tasks::TaskPrompt inside = whole, after = whole, automatic = whole;
    tasks::apply_query_protocol(&inside, "inside", tok);
    tasks::apply_query_protocol(&after, "after", tok);
    tasks::apply_query_protocol(&automatic, "auto", tok);
    CHECK(!inside.question_after);
    CHECK(inside.ids == whole.ids);
    CHECK(inside.forced.empty());
    CHECK(after.question_after);
    CHECK(automatic.ids == after.ids);
    // The prefill stops where the question begins; the question onwards is forced.
    const int64_t cut = whole.question_spans[0].first;
    CHECK(int64_t(after.ids.size()) == cut);
    std::vector<int32_t> joined = after.ids;
    joined.insert(joined.end(), after.forced.begin(), after.forced.end());
    CHECK(joined == whole.ids);
    CHECK(after.question_spans == whole.question_spans);  // positions, forced ones included
    CHECK_THAT(tok.decode(after.forced), Catch::Contains("Who kept the lamp"));
    CHECK_THAT(tok.decode(after.forced), Catch::EndsWith("Answer:"));
    CHECK_THAT(after.prompt_text, Catch::Contains("county museum in Harlow."));
    CHECK_THAT(after.prompt_text, !Catch::Contains("Who kept"));
  }
  // A synthetic task keeps its question inside unless asked; after moves it.
  tasks::TaskPrompt needle = tasks::build_task("needle:tokens=200", stories_tok(), false);
  const std::vector<int32_t> ids = needle.ids;
  tasks::apply_query_protocol(&needle, "auto", stories_tok());
  CHECK(!needle.question_after);
  CHECK(needle.ids == ids);
  tasks::apply_query_protocol(&needle, "after", stories_tok());
  CHECK(needle.question_after);
  CHECK(int64_t(needle.ids.size()) == needle.question_spans[0].first);
  CHECK(needle.ids.size() + needle.forced.size() == ids.size());
  tasks::TaskPrompt bad = tasks::build_task("needle:tokens=200", stories_tok(), false);
  CHECK_THROWS_WITH(tasks::apply_query_protocol(&bad, "later", stories_tok()),
                    Catch::Contains("--query: expected auto, after or inside, got 'later'"));
}

TEST_CASE("dataset: several questions, multiple choice and a boxed answer", "[tasks][dataset]") {
  const std::string file = "dataset:file=" + examples();
  const tasks::DatasetTask first = make(file + ",row=1", stories_tok(), false);
  const tasks::DatasetTask second = make(file + ",row=1,question=1", stories_tok(), false);
  CHECK(first.answers == std::vector<std::string>{"honey cake"});
  CHECK(second.answers == std::vector<std::string>{"Sunday", "Sundays"});
  CHECK_THAT(second.prompt_text, Catch::EndsWith("On which day is the bakery closed?\nAnswer:"));
  CHECK_THROWS_WITH(make(file + ",row=1,question=2", stories_tok(), false),
                    Catch::Contains("dataset:question") && Catch::Contains("has 2 questions"));

  const tasks::DatasetTask choice = make(file + ",row=2", stories_tok(), false);
  CHECK(choice.scorer == "choice");
  CHECK(choice.answers == std::vector<std::string>{"B", "15:20"});
  CHECK_THAT(choice.prompt_text,
             Catch::Contains("Cedar?\nA. 15:15\nB. 15:20\nC. 15:10\nD. 14:55\nAnswer:"));

  const tasks::DatasetTask boxed = make(file + ",row=3,scorer=boxed", stories_tok(), false);
  CHECK(boxed.scorer == "boxed");
  CHECK(boxed.max_new == 64);
  const tasks::AnswerScorer& s = tasks::find_scorer("boxed", "", "scorer");
  CHECK(s.score(boxed.answers, "so it is \\boxed{\\dfrac{1}{6}}.") == 1.0);
  CHECK(s.score(boxed.answers, "so it is \\boxed{\\frac{1}{5}}.") == 0.0);

  // build_task, the one entry point, carries the scorer and the length.
  const tasks::TaskPrompt p = tasks::build_task(file + ",row=2", stories_tok(), false);
  CHECK(p.kind == "dataset");
  CHECK(p.scorer == "choice");
  CHECK(p.max_new == 4);
  CHECK(p.answer == "B, 15:20");
  CHECK(p.needle_spans.empty());
  REQUIRE(p.question_spans.size() == 1);
}

TEST_CASE("dataset tokens=T: the context is cut in the middle, question and prefix whole",
          "[tasks][dataset]") {
  const std::string file = "dataset:file=" + examples();
  const tasks::DatasetTask whole = make(file, smol_tok(), true);
  for (int64_t tokens : {int64_t(whole.ids.size()), int64_t(whole.ids.size()) - 20,
                         int64_t(whole.ids.size()) - 45}) {
    INFO("tokens=" << tokens);
    const tasks::DatasetTask t = make(file + ",tokens=" + std::to_string(tokens), smol_tok(), true);
    CHECK(int64_t(t.ids.size()) <= tokens);
    CHECK(int64_t(t.ids.size()) >= tokens - 3);  // no more is cut than the fit needs
    CHECK(t.context_tokens + t.context_tokens_dropped == whole.context_tokens);
    CHECK((t.context_tokens_dropped > 0) == (tokens < int64_t(whole.ids.size())));
    // The context's first and last words stay; the question and the prefix are whole.
    CHECK_THAT(t.prompt_text, Catch::Contains("The lighthouse on Gannet Point"));
    CHECK_THAT(t.prompt_text, Catch::Contains("county museum in Harlow."));
    CHECK_THAT(t.prompt_text, Catch::Contains("Question: Who kept the lamp"));
    CHECK_THAT(t.prompt_text, Catch::EndsWith("Answer:"));
  }
  CHECK_THROWS_WITH(make(file + ",tokens=30", smol_tok(), true),
                    Catch::Contains("dataset:tokens") && Catch::Contains("too small"));
}

TEST_CASE("dataset: a bad row or spec is refused naming the file, line and field",
          "[tasks][dataset][errors]") {
  CHECK_THAT(refusal(R"({"question": "q", "answer": "a"})"),
             Catch::Contains("bad.jsonl:1: context: expected a string, got missing"));
  CHECK_THAT(
      refusal(R"({"context": "c", "question": "q", "answer": 7})"),
      Catch::Contains("answer: expected a string or a non-empty list of strings, got a number"));
  CHECK_THAT(refusal(R"({"context": "c", "answer": "a"})"),
             Catch::Contains("question: expected a string, got missing"));
  CHECK_THAT(refusal(R"({"context": "c", "questions": ["a", "b"], "answers": ["x"]})"),
             Catch::Contains("answers: expected a list with one answer per question (2)"));
  CHECK_THAT(refusal(R"({"context": "c", "question": "q", "answer": "E", "choices": ["x", "y"]})"),
             Catch::Contains("answer: expected a choice's letter (A-B) or its text, got 'E'"));
  CHECK_THAT(refusal(R"({"context": "c", "question": "q", "answer": "a", "max_new_tokens": 0})"),
             Catch::Contains("max_new_tokens: expected an integer >= 1"));
  CHECK_THAT(refusal("{\"context\": \"c\", "), Catch::Contains("bad.jsonl:1: not a JSON object"));
  CHECK_THAT(refusal("[1, 2]"), Catch::Contains("expected a JSON object per line"));
  CHECK_THAT(refusal(R"({"context": "c", "question": "q", "answer": "a"})", ",row=3"),
             Catch::Contains("dataset:row: is 3, but") && Catch::Contains("has 1 rows"));
  CHECK_THROWS_WITH(tasks::parse_dataset_spec("dataset:file=x.jsonl,scorer=bleu"),
                    Catch::Contains("dataset:scorer") && Catch::Contains("got 'bleu'"));
  CHECK_THROWS_WITH(tasks::parse_dataset_spec("dataset:row=2"),
                    Catch::Contains("dataset:file: required"));
  CHECK_THROWS_WITH(make("dataset:file=/nonexistent/rows.jsonl", stories_tok(), false),
                    Catch::Contains("/nonexistent/rows.jsonl: cannot be read"));
}

TEST_CASE("kvscope capture --task dataset on stories260K: the scorer is recorded and applied",
          "[tasks][dataset][cli]") {
  const std::string dir = test::temp_dir();
  const std::string trace = dir + "/d.kvtrace.h5";
  std::string out;
  REQUIRE(test::run_command(
              test::kvscope_exe() + " capture --model " + stories_dir() +
                  "/stories260K.bin --tokenizer " + stories_dir() +
                  "/tok512.bin --task dataset:file=" + examples() +
                  ",row=4,scorer=rouge_l --policy streaming_llm:sinks=4,window=48 -q -o " + trace,
              &out) == 0);
  INFO(out);
  auto r = trace::TraceReader::open(trace);
  const nlohmann::json run = nlohmann::json::parse(r->run().run_json);
  CHECK(run.at("scorer") == "rouge_l");
  CHECK_THAT(out, Catch::Contains("| rouge_l score "));
  std::string info;
  REQUIRE(test::run_command(test::kvscope_exe() + " info --json " + trace + " 2>/dev/null",
                            &info) == 0);
  const nlohmann::json task = nlohmann::json::parse(info).at("task");
  CHECK(task.at("scorer") == "rouge_l");
  CHECK(task.at("query") == "after");
  CHECK(r->run().task_kind == "dataset");
  // The row's max_new_tokens is the generation's length when --max-new is not given.
  CHECK(run.at("max_new") == 40);
  const std::vector<std::string> answers = example_row(4)["answer"].is_string()
                                               ? std::vector<std::string>{example_row(4)["answer"]}
                                               : std::vector<std::string>{};
  const double expected =
      tasks::find_scorer("rouge_l", "", "scorer").score(answers, r->generated_text());
  CHECK(r->task_score() == Approx(expected).margin(1e-12));
  CHECK(r->task_success() == (expected >= 1.0 - 1e-6 ? 1 : 0));
  // A question span, no needle.
  const tasks::TaskPrompt p =
      tasks::build_task("dataset:file=" + examples() + ",row=4", stories_tok(), false);
  const std::vector<uint8_t> roles = r->token_roles(0, int64_t(p.ids.size()));
  CHECK(std::count(roles.begin(), roles.end(), uint8_t(trace::TokenRole::Needle)) == 0);
  CHECK(std::count(roles.begin(), roles.end(), uint8_t(trace::TokenRole::Question)) ==
        p.question_spans[0].second - p.question_spans[0].first);
}

TEST_CASE("query protocol after: the policy compresses the context alone, the question comes after",
          "[tasks][dataset][cli]") {
  // Two rows with the same context and different questions: under SnapKV
  // (the paper's, no decode-time eviction) both keep the same entries at the
  // end of the prefill, and nothing leaves while the questions are fed.
  const std::string dir = test::temp_dir();
  const std::string file = dir + "/same-context.jsonl";
  const std::string context = example_row(0)["context"];
  {
    std::ofstream out(file);
    for (const char* q :
         {"\n\nQuestion: Who kept the lamp?", "\n\nQuestion: Where is the logbook?"})
      out << nlohmann::json{{"context", context}, {"question", q}, {"answer", "x"}}.dump() << "\n";
  }
  auto kept_after_prefill = [&](int row) {
    const std::string trace = dir + "/q" + std::to_string(row) + ".kvtrace.h5";
    std::string out;
    REQUIRE(test::run_command(
                test::kvscope_exe() + " capture --model " + stories_dir() +
                    "/stories260K.bin --tokenizer " + stories_dir() +
                    "/tok512.bin --task dataset:file=" + file + ",row=" + std::to_string(row) +
                    " --policy snapkv:budget=40,window=8,decode=false --max-new 4 --ignore-eos "
                    "--capture events -q -o " +
                    trace,
                &out) == 0);
    INFO(out);
    auto r = trace::TraceReader::open(trace);
    tasks::TaskPrompt p = tasks::build_task("dataset:file=" + file + ",row=" + std::to_string(row),
                                            stories_tok(), false);
    tasks::apply_query_protocol(&p, "auto", stories_tok());
    CHECK(r->n_steps() == 1 + int64_t(p.forced.size()) + 3);  // prefill, forced, sampled
    CHECK(nlohmann::json::parse(r->run().run_json).at("query") == "after");
    std::set<std::tuple<int, int, int>> kept;
    int64_t evictions = 0;
    for (const trace::Event& e : r->events(0, r->n_events())) {
      if (e.kind == trace::EventKind::Evict) {
        ++evictions;
        CHECK(e.step == 0);  // the one compression: at the end of the prefill
      }
      if (e.step != 0) continue;
      const auto key = std::make_tuple(int(e.layer), int(e.kv_head), int(e.token));
      if (e.kind == trace::EventKind::Admit) kept.insert(key);
      if (e.kind == trace::EventKind::Evict) kept.erase(key);
    }
    CHECK(evictions > 0);
    return kept;
  };
  const auto first = kept_after_prefill(0), second = kept_after_prefill(1);
  CHECK(!first.empty());
  CHECK(first.size() == second.size());
  CHECK((first == second));
}
