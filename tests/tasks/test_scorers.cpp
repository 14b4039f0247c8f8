// Answer scorers (capture/tasks/scorers.*): every hand-made case of
// tests/fixtures/tasks/scorer_cases.json, whose scores the reference
// implementations computed (tests/tasks/scorer_reference.py), scores the same
// here; the scorers are listed and found by name, an unknown name is refused
// naming the field, scores stay in [0, 1], and the deliberate differences
// from the references (scorers.h) hold.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "capture/tasks/scorers.h"
#include "core/common/input_error.h"
#include "tests/support/paths.h"

using namespace kvscope;

namespace {

double score(const std::string& scorer, const std::vector<std::string>& answers,
             const std::string& output) {
  return tasks::find_scorer(scorer, "", "scorer").score(answers, output);
}

nlohmann::json reference_cases() {
  const std::string path = test::source_dir() + "/tests/fixtures/tasks/scorer_cases.json";
  std::ifstream in(path);
  if (!in) FAIL(path + " is missing: run tests/tasks/scorer_reference.py");
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("scorers: every reference case scores as its reference does") {
  const nlohmann::json cases = reference_cases();
  REQUIRE(cases.size() >= 60);
  std::map<std::string, int> per_scorer;
  for (const nlohmann::json& c : cases) {
    const std::string name = c.at("scorer").get<std::string>();
    const double got = score(name, c.at("answers").get<std::vector<std::string>>(),
                             c.at("output").get<std::string>());
    INFO(c.dump() << "\n  got " << nlohmann::json(got).dump());
    CHECK(std::abs(got - c.at("score").get<double>()) <= 1e-9);
    ++per_scorer[name];
  }
  // Several cases for every scorer, none for a scorer that does not exist.
  for (const std::string& name : tasks::scorer_names()) {
    INFO(name);
    CHECK(per_scorer[name] >= 5);
  }
  CHECK(per_scorer.size() == tasks::scorer_names().size());
}

TEST_CASE("scorers: listed in a fixed order, each found by its name") {
  CHECK(tasks::scorer_names() == std::vector<std::string>{"string_match_all", "string_match_part",
                                                          "substring", "exact_match", "f1",
                                                          "rouge_l", "choice", "boxed"});
  for (const tasks::AnswerScorer& s : tasks::answer_scorers()) {
    INFO(s.name);
    CHECK(&tasks::find_scorer(s.name, "--task", "dataset:scorer") == &s);
    CHECK_FALSE(s.source.empty());
    CHECK(s.score != nullptr);
  }
}

TEST_CASE("scorers: an unknown name is an InputError naming the field") {
  try {
    tasks::find_scorer("bleu", "--task", "dataset:scorer");
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(e.file() == "--task");
    CHECK(e.field() == "dataset:scorer");
    CHECK(std::string(e.what()) ==
          "--task: dataset:scorer: expected one of string_match_all, string_match_part, "
          "substring, exact_match, f1, rouge_l, choice, boxed, got 'bleu'");
  }
}

TEST_CASE("scorers: every score is in [0, 1]") {
  const std::string long_text = [] {
    std::string t;
    for (int i = 0; i < 400; ++i) t += "word" + std::to_string(i % 37) + (i % 50 ? " " : ". ");
    return t;
  }();
  const std::vector<std::vector<std::string>> answer_sets = {
      {}, {""}, {"B", "an option"}, {"\\frac{1}{2}", "0.5"}, {long_text}, {"a a a", "the"}};
  const std::vector<std::string> outputs = {"",
                                            " ",
                                            ".",
                                            "\xff\xfe invalid \xc3",
                                            "The answer is B.",
                                            "\\boxed{\\frac12}",
                                            "\\boxed{",
                                            "}}}{{{",
                                            long_text,
                                            "a. a. a. the. an.",
                                            "\\fbox{\\sqrt}"};
  for (const tasks::AnswerScorer& s : tasks::answer_scorers())
    for (const auto& answers : answer_sets)
      for (const std::string& output : outputs) {
        const double v = s.score(answers, output);
        INFO(s.name << " on '" << output.substr(0, 40) << "' with " << answers.size()
                    << " answers");
        CHECK(v >= 0.0);
        CHECK(v <= 1.0);
      }
}

TEST_CASE("scorers: where KVScope deliberately differs from the references") {
  // No answers: 0 from every scorer (RULER divides by zero, SQuAD's max has nothing).
  for (const std::string& name : tasks::scorer_names()) {
    INFO(name);
    CHECK(score(name, {}, "anything \\boxed{1}") == 0.0);
  }
  // ASCII case folding: Python's lower() would match "CAFÉ" with "café".
  CHECK(score("string_match_all", {"café"}, "CAFÉ") == 0.0);
  CHECK(score("string_match_all", {"café"}, "CAFé") == 1.0);
  CHECK(score("exact_match", {"Éclair"}, "éclair") == 0.0);
  // \fbox{...} is read (Hendrycks' remove_boxed accepts only \boxed{...}).
  CHECK(score("boxed", {"5"}, "so \\fbox{5}") == 1.0);
  CHECK(score("boxed", {"5"}, "\\fbox{5} and \\boxed{6}") == 0.0);  // \boxed first, as there
  // An empty output is no choice (InfiniteBench raises IndexError on pred[0]).
  CHECK(score("choice", {"A", "text"}, "") == 0.0);
  // A sentence pair longer than Python's recursion limit is scored (LongBench gives 0).
  std::string long_sentence;
  for (int i = 0; i < 1200; ++i) long_sentence += "w" + std::to_string(i) + " ";
  CHECK(score("rouge_l", {long_sentence}, long_sentence) == Approx(2.0 / (2.0 + 1e-8)));
  // ROUGE-L's F never reaches 1: an exact answer is 2 / (2 + 1e-8).
  CHECK(score("rouge_l", {"the cat sat"}, "the cat sat") == 2.0 * (1.0 / (2.0 + 1e-8)));
}
