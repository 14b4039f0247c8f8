// Answer scorers for dataset tasks (`--task dataset:...,scorer=S`): how a
// generated answer is scored against the expected strings, each scorer the
// published rule of one benchmark. tests/tasks/scorer_reference.py computes
// hand-made cases with the reference implementations themselves
// (tests/fixtures/tasks/scorer_cases.json), and the scorers must give the
// same numbers.
//
//   string_match_all   RULER scripts/eval/synthetic/constants.py string_match_all, one sample
//   string_match_part  RULER scripts/eval/synthetic/constants.py string_match_part, one sample
//   substring          an answer occurs verbatim, case-sensitive (what --expect does)
//   exact_match        SQuAD v1.1 evaluate-v1.1.py exact_match_score, max over answers
//   f1                 LongBench metrics.py qa_f1_score (SQuAD's token F1), max over answers
//   rouge_l            LongBench metrics.py rouge_score: the `rouge` package 1.0.1's
//                      Rouge().get_scores(avg=True)["rouge-l"]["f"], max over answers
//   choice             InfiniteBench src/compute_scores.py get_score_one_longbook_choice_eng
//   boxed              Hendrycks MATH: last_boxed_only_string + remove_boxed, then
//                      math_equivalence.py is_equiv against each answer
//
// Where they deliberately differ from the references:
// - Case folding is ASCII only (the references use Python's Unicode
//   str.lower(), so "CAFÉ" matches "café" there and not here). Whitespace is
//   Python's str.split() set, Unicode included.
// - SQuAD's article removal (`\b(a|an|the)\b`) needs Python's Unicode word
//   characters; outside ASCII they are approximated (non-ASCII counts as a
//   letter except common punctuation, symbols, spaces and combining marks).
// - rouge_l: rouge's LCS backtracking recurses, so LongBench scores 0 where a
//   sentence pair has about 1000 words (Python's recursion limit); we score it.
//   Its F has a 1e-8 in the denominator: an exact answer scores 2/(2+1e-8).
// - boxed: the content of \fbox{...} is compared too (Hendrycks' remove_boxed
//   accepts only "\boxed{", so an \fbox answer always scored 0 there).
// - choice: an empty output scores 0 (InfiniteBench raises on pred[0]).
// - With no answers every scorer gives 0 (the references divide by zero or
//   take the max of nothing).
#pragma once

#include <string>
#include <vector>

namespace kvscope::tasks {

// One scorer: how a generated answer is scored against the expected strings.
struct AnswerScorer {
  std::string name;    // spec value, e.g. "f1"
  std::string source;  // the reference it reproduces, e.g. "LongBench metrics.py qa_f1_score"
  double (*score)(const std::vector<std::string>& answers, const std::string& output);  // in [0, 1]
};

// Every scorer, in a fixed order (the order of the table above).
const std::vector<AnswerScorer>& answer_scorers();
std::vector<std::string> scorer_names();
// The scorer named `name`; throws InputError(file, field, "expected one of
// ..., got 'x'"), `field` given by the caller (e.g. "dataset:scorer").
const AnswerScorer& find_scorer(const std::string& name, const std::string& file,
                                const std::string& field);

}  // namespace kvscope::tasks
