#!/usr/bin/env python3
"""Expected scores of KVScope's answer scorers (capture/tasks/scorers.*) on
hand-made cases, computed by the reference implementations, written to
tests/fixtures/tasks/scorer_cases.json (read by tests/tasks/test_scorers.cpp).

Regenerate (Python 3.11; only `rouge` is a package, the other references are
written out below from their published sources):
    python3 -m venv /tmp/refenv && /tmp/refenv/bin/pip install rouge==1.0.1
    /tmp/refenv/bin/python tests/tasks/scorer_reference.py

Each case is {"scorer", "answers", "output", "score"}. A case goes in only
where the reference defines the score; where KVScope deliberately differs
(scorers.h lists where) the C++ test checks KVScope's own rule directly.
"""
import json
import os
import re
import string
import sys
from collections import Counter

from rouge import Rouge  # pltrdy/rouge, the package LongBench imports

# ---------------------------------------------------------------------------
# RULER, scripts/eval/synthetic/constants.py (NVIDIA/RULER): string_match_all
# and string_match_part. The originals average over samples, scale by 100
# and round to 2 places; this is one sample's term, unscaled.


def ruler_string_match_all(pred, ref):
    return sum([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) / len(ref)


def ruler_string_match_part(pred, ref):
    return max([1.0 if r.lower() in pred.lower() else 0.0 for r in ref])


# KVScope's --expect rule (capture/recorder/capture_run.cpp): an answer occurs
# verbatim, case-sensitive.
def substring(pred, ref):
    return 1.0 if any(r in pred for r in ref) else 0.0


# ---------------------------------------------------------------------------
# SQuAD v1.1, evaluate-v1.1.py (rajpurkar.github.io/SQuAD-explorer):
# normalize_answer, exact_match_score, metric_max_over_ground_truths.
# LongBench metrics.py (THUDM/LongBench) has the same normalize_answer.


def normalize_answer(s):
    """Lower text and remove punctuation, articles and extra whitespace."""

    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def exact_match_score(prediction, ground_truth):
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
    scores_for_ground_truths = []
    for ground_truth in ground_truths:
        score = metric_fn(prediction, ground_truth)
        scores_for_ground_truths.append(score)
    return max(scores_for_ground_truths)


# ---------------------------------------------------------------------------
# LongBench, metrics.py (THUDM/LongBench): f1_score, qa_f1_score,
# rouge_score; eval.py scorer(): the max over ground truths, from 0.


def f1_score(prediction, ground_truth, **kwargs):
    common = Counter(prediction) & Counter(ground_truth)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction)
    recall = 1.0 * num_same / len(ground_truth)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def qa_f1_score(prediction, ground_truth, **kwargs):
    normalized_prediction = normalize_answer(prediction)
    normalized_ground_truth = normalize_answer(ground_truth)

    prediction_tokens = normalized_prediction.split()
    ground_truth_tokens = normalized_ground_truth.split()
    return f1_score(prediction_tokens, ground_truth_tokens)


def rouge_score(prediction, ground_truth, **kwargs):
    rouge = Rouge()
    try:
        scores = rouge.get_scores([prediction], [ground_truth], avg=True)
    except:  # noqa: E722 (LongBench's bare except)
        return 0.0
    return scores["rouge-l"]["f"]


def longbench_max(metric, prediction, ground_truths):
    score = 0.0
    for ground_truth in ground_truths:
        score = max(score, metric(prediction, ground_truth))
    return score


# ---------------------------------------------------------------------------
# InfiniteBench, src/compute_scores.py (OpenBMB/InfiniteBench):
# get_score_one_longbook_choice_eng. Its label is eval_utils.py get_answer's
# [option text, letter]; KVScope passes [letter, text] (order is not used).


def get_score_one_longbook_choice_eng(pred, label, model_name: str) -> bool:
    # Just use the first letter as the prediction
    if pred[0] in "ABCD":
        return pred[0] in label
    # Find a answer prefix
    for c in ["\n", '"', "'", ".", ",", "?", "!", "{", "}"]:
        pred = pred.replace(c, " ")
    while "  " in pred:
        pred = pred.replace("  ", " ")
    ans_prefixes = [
        "answer is:",
        "answer:",
        "answer is",
        "option is",
    ]
    for prefix in ans_prefixes:
        idx = pred.find(prefix)
        if idx == -1:
            continue
        # The prediction ends with this prefix
        if len(pred) < idx + len(prefix) + 1:
            return False
        after_prefix = pred[idx + len(prefix) + 1 :]
        for s in label:
            if after_prefix.startswith(s):
                return True
        return False

    # Finally, just find the first occurrence of A, B, C, or D.
    words = pred.split()
    for word in words:
        if word in "ABCD":
            return word in label
    return False


# ---------------------------------------------------------------------------
# Hendrycks MATH (hendrycks/math): modeling/dataset/util.py
# last_boxed_only_string; modeling/eval_math_gpt.py remove_boxed;
# modeling/math_equivalence.py _fix_fracs, _fix_a_slash_b,
# _remove_right_units, _fix_sqrt, _strip_string, is_equiv.


def last_boxed_only_string(string):
    idx = string.rfind("\\boxed")
    if idx < 0:
        idx = string.rfind("\\fbox")
        if idx < 0:
            return None

    i = idx
    right_brace_idx = None
    num_left_braces_open = 0
    while i < len(string):
        if string[i] == "{":
            num_left_braces_open += 1
        if string[i] == "}":
            num_left_braces_open -= 1
            if num_left_braces_open == 0:
                right_brace_idx = i
                break
        i += 1

    if right_brace_idx == None:  # noqa: E711
        retval = None
    else:
        retval = string[idx : right_brace_idx + 1]

    return retval


def remove_boxed(s):
    left = "\\boxed{"
    try:
        assert s[: len(left)] == left
        assert s[-1] == "}"
        return s[len(left) : -1]
    except:  # noqa: E722
        return None


def _fix_fracs(string):
    substrs = string.split("\\frac")
    new_str = substrs[0]
    if len(substrs) > 1:
        substrs = substrs[1:]
        for substr in substrs:
            new_str += "\\frac"
            if substr[0] == "{":
                new_str += substr
            else:
                try:
                    assert len(substr) >= 2
                except:  # noqa: E722
                    return string
                a = substr[0]
                b = substr[1]
                if b != "{":
                    if len(substr) > 2:
                        post_substr = substr[2:]
                        new_str += "{" + a + "}{" + b + "}" + post_substr
                    else:
                        new_str += "{" + a + "}{" + b + "}"
                else:
                    if len(substr) > 2:
                        post_substr = substr[2:]
                        new_str += "{" + a + "}" + b + post_substr
                    else:
                        new_str += "{" + a + "}" + b
    string = new_str
    return string


def _fix_a_slash_b(string):
    if len(string.split("/")) != 2:
        return string
    a = string.split("/")[0]
    b = string.split("/")[1]
    try:
        a = int(a)
        b = int(b)
        assert string == "{}/{}".format(a, b)
        new_string = "\\frac{" + str(a) + "}{" + str(b) + "}"
        return new_string
    except:  # noqa: E722
        return string


def _remove_right_units(string):
    # "\\text{ " only ever occurs (at least in the val set) when describing units
    if "\\text{ " in string:
        splits = string.split("\\text{ ")
        assert len(splits) == 2
        return splits[0]
    else:
        return string


def _fix_sqrt(string):
    if "\\sqrt" not in string:
        return string
    splits = string.split("\\sqrt")
    new_string = splits[0]
    for split in splits[1:]:
        if split[0] != "{":
            a = split[0]
            new_substr = "\\sqrt{" + a + "}" + split[1:]
        else:
            new_substr = "\\sqrt" + split
        new_string += new_substr
    return new_string


def _strip_string(string):
    string = string.replace("\n", "")
    string = string.replace("\\!", "")
    string = string.replace("\\\\", "\\")
    string = string.replace("tfrac", "frac")
    string = string.replace("dfrac", "frac")
    string = string.replace("\\left", "")
    string = string.replace("\\right", "")
    string = string.replace("^{\\circ}", "")
    string = string.replace("^\\circ", "")
    string = string.replace("\\$", "")
    string = _remove_right_units(string)
    string = string.replace("\\%", "")
    string = string.replace("%", "")
    string = string.replace(" .", " 0.")
    string = string.replace("{.", "{0.")
    if len(string) == 0:
        return string
    if string[0] == ".":
        string = "0" + string
    if len(string.split("=")) == 2:
        if len(string.split("=")[0]) <= 2:
            string = string.split("=")[1]
    string = _fix_sqrt(string)
    string = string.replace(" ", "")
    string = _fix_fracs(string)
    if string == "0.5":
        string = "\\frac{1}{2}"
    string = _fix_a_slash_b(string)
    return string


def is_equiv(str1, str2, verbose=False):
    if str1 is None and str2 is None:
        print("WARNING: Both None")
        return True
    if str1 is None or str2 is None:
        return False

    try:
        ss1 = _strip_string(str1)
        ss2 = _strip_string(str2)
        if verbose:
            print(ss1, ss2)
        return ss1 == ss2
    except:  # noqa: E722
        return str1 == str2


# eval_math_gpt.py run_eval: is_equiv(remove_boxed(last_boxed_only_string(output)),
# answer), here against each answer (any). remove_boxed(None) is None.
def boxed(pred, ref):
    model_output = remove_boxed(last_boxed_only_string(pred))
    return 1.0 if any(is_equiv(model_output, r) for r in ref) else 0.0


# ---------------------------------------------------------------------------
# What each KVScope scorer is, in the references' terms.

REFERENCES = {
    "string_match_all": ruler_string_match_all,
    "string_match_part": ruler_string_match_part,
    "substring": substring,
    "exact_match": lambda p, r: float(metric_max_over_ground_truths(exact_match_score, p, r)),
    "f1": lambda p, r: float(longbench_max(qa_f1_score, p, r)),
    "rouge_l": lambda p, r: float(longbench_max(rouge_score, p, r)),
    "choice": lambda p, r: float(get_score_one_longbook_choice_eng(p, r, "kvscope")),
    "boxed": boxed,
}

NBSP, EM_DASH = "\u00a0", "\u2014"

# (scorer, answers, output)
CASES = [
    # RULER string_match_all: the share found, case-insensitive.
    ("string_match_all", ["Paris"], "The capital is paris."),
    ("string_match_all", ["apple", "banana", "cherry"], "I saw an Apple and a BANANA"),
    ("string_match_all", ["x1", "y2"], "nothing here"),
    ("string_match_all", ["abc"], ""),
    ("string_match_all", ["VAR ABCDE", "VAR FGHIJ"], "var abcde, VAR fghij"),
    ("string_match_all", ["42", "42"], "the answer is 42"),
    ("string_match_all", ["a b"], "a  b"),
    ("string_match_all", ["naïve", "ok"], "So Naïve"),
    ("string_match_all", ["7", "3", "9", "5"], "numbers: 7 3 9 1"),
    # RULER string_match_part: any answer, case-insensitive.
    ("string_match_part", ["Paris", "Lyon"], "I think LYON"),
    ("string_match_part", ["Paris", "Lyon"], "Marseille"),
    ("string_match_part", ["the Eiffel Tower"], "It's THE EIFFEL TOWER!"),
    ("string_match_part", [""], "anything"),
    ("string_match_part", ["abc"], ""),
    ("string_match_part", ["New York", "NYC"], "nyc"),
    ("string_match_part", ["ab"], "a b"),
    # substring: verbatim.
    ("substring", ["Paris"], "The capital is Paris."),
    ("substring", ["Paris"], "the capital is paris"),
    ("substring", ["Paris", "paris"], "paris"),
    ("substring", ["42"], ""),
    ("substring", ["a.b"], "xa.by"),
    ("substring", ["  "], "a  b"),
    # SQuAD exact match: lower, no punctuation, no articles, single spaces.
    ("exact_match", ["Paris"], "paris"),
    ("exact_match", ["Paris"], "Paris."),
    ("exact_match", ["the Eiffel Tower"], "Eiffel tower"),
    ("exact_match", ["Eiffel Tower"], "an Eiffel Tower!"),
    ("exact_match", ["Theater"], "ater"),
    ("exact_match", ["Theater"], "THEATER"),
    ("exact_match", ["New York"], "New  York\n"),
    ("exact_match", ["don't"], "dont"),
    ("exact_match", ["U.S.A."], "USA"),
    ("exact_match", ["a"], ""),
    ("exact_match", ["the"], "An"),
    ("exact_match", ["Paris", "City of Light"], "the city of light"),
    ("exact_match", ["Paris"], "Paris France"),
    ("exact_match", ["rock-and-roll"], "rockandroll"),
    ("exact_match", ["a_b"], "ab"),
    ("exact_match", ["new york"], "New" + NBSP + "York"),
    ("exact_match", ["end"], "the" + NBSP + "end"),
    ("exact_match", [EM_DASH + "answer"], "the" + EM_DASH + "answer"),
    ("exact_match", ["aé"], "é"),
    ("exact_match", ["a1"], "1"),
    # LongBench qa_f1_score: SQuAD token F1, max over answers.
    ("f1", ["Barack Obama"], "Obama"),
    ("f1", ["the cat sat on the mat"], "a cat sat on a mat"),
    ("f1", ["cat cat dog"], "cat dog dog"),
    ("f1", ["Paris"], ""),
    ("f1", ["Paris", "Paris France"], "Paris, France!"),
    ("f1", ["1,000"], "1000"),
    ("f1", ["New York City"], "york new"),
    ("f1", ["x"], "the"),
    ("f1", ["Obama"], "Barack" + NBSP + "Obama"),
    ("f1", ["a b c d"], "b b b b"),
    ("f1", ["answer"], "the" + EM_DASH + "answer answer"),
    ("f1", ["alpha beta gamma", "delta"], "gamma delta epsilon"),
    ("f1", ["x y"], "x\x1cy"),
    # LongBench rouge_score: rouge 1.0.1 ROUGE-L F on raw strings.
    ("rouge_l", ["the cat sat on the mat"], "the cat sat on the mat"),
    ("rouge_l", ["the cat sat on the mat"], "the cat is on the mat"),
    ("rouge_l", ["a a a b"], "a b b b"),
    ("rouge_l", ["the cat sat. the dog ran."], "the dog ran. the cat sat."),
    ("rouge_l", ["something"], ""),
    ("rouge_l", ["x"], "..."),
    ("rouge_l", ["a b"], "a b. . c"),
    ("rouge_l", [""], "abc"),
    ("rouge_l", ["..."], "abc"),
    ("rouge_l", ["The Cat"], "the cat"),
    ("rouge_l", ["Hello, world"], "Hello world"),
    ("rouge_l", ["completely different", "the cat sat"], "the cat sat down"),
    ("rouge_l", ["a b"], "b a. a"),
    ("rouge_l", ["a b c"], "c b a. b c"),
    ("rouge_l", ["x y. y x"], "x y"),
    ("rouge_l", ["the cat"], "the\n\tcat"),
    ("rouge_l", ["a b"], "a" + NBSP + "b"),
    ("rouge_l", ["a b"], "a\x1cb"),
    ("rouge_l", ["a b"], "   "),
    (
        "rouge_l",
        ["Police arrested a man on Friday. He was charged with theft."],
        "A man was arrested by police on Friday and charged with theft.",
    ),
    # InfiniteBench longbook_choice_eng; answers are [letter, option text].
    ("choice", ["B", "Walking Georgie"], "B"),
    ("choice", ["B", "Walking Georgie"], "B. Walking Georgie"),
    ("choice", ["A", "Walking Georgie"], "B. Walking Georgie"),
    ("choice", ["C", "a ship"], "The answer is (C)"),
    ("choice", ["C", "a ship"], "The answer is C."),
    ("choice", ["D", "x"], "answer: D"),
    ("choice", ["D", "x"], "Answer: D"),
    ("choice", ["D", "x"], "My answer: D"),
    ("choice", ["B", "x"], "b"),
    ("choice", ["B", "Walking Georgie"], "I think the answer is Walking Georgie"),
    ("choice", ["C", "x"], "I pick C because"),
    ("choice", ["A", "x"], "I would say BC"),
    ("choice", ["A", "x"], "Because A"),
    ("choice", ["A", "x"], "the answer is"),
    ("choice", ["A", "x"], "the option is A"),
    ("choice", ["C", "x"], "\nC"),
    ("choice", ["D", "x"], "the answer is: D"),
    ("choice", ["D", "x"], 'the answer is "D"'),
    ("choice", ["D", "x"], "none of them"),
    # Hendrycks MATH: the last \boxed{}, is_equiv.
    ("boxed", ["\\frac{1}{2}"], "so \\boxed{\\frac12}"),
    ("boxed", ["\\frac{1}{2}"], "\\boxed{\\dfrac{1}{2}}"),
    ("boxed", ["\\frac{1}{2}"], "\\boxed{\\tfrac{1}{2}}"),
    ("boxed", ["5"], "\\boxed{x = 5}"),
    ("boxed", ["5"], "\\boxed{abc = 5}"),
    ("boxed", ["5"], "\\boxed{é = 5}"),
    ("boxed", ["5"], "\\boxed{5 \\text{ cm}}"),
    ("boxed", ["0.5"], "\\boxed{.5}"),
    ("boxed", ["\\frac{1}{2}"], "\\boxed{0.5}"),
    ("boxed", ["0.5"], "\\boxed{1/2}"),
    ("boxed", ["1/2"], "\\boxed{\\frac{1}{2}}"),
    ("boxed", ["-1/2"], "\\boxed{-\\frac{1}{2}}"),
    ("boxed", ["3"], "\\boxed{2} then \\boxed{3}"),
    ("boxed", ["2"], "\\boxed{2} then \\boxed{3}"),
    ("boxed", ["\\sqrt{2}"], "\\boxed{\\sqrt2}"),
    ("boxed", ["\\{1,2\\}"], "\\boxed{\\{1,2\\}}"),
    ("boxed", ["\\frac{\\sqrt{3}}{2}"], "$\\boxed{\\frac{\\sqrt{3}}{2}}$"),
    ("boxed", ["5"], "the answer is 5"),
    ("boxed", ["5"], "\\boxed{5"),
    ("boxed", ["5"], ""),
    ("boxed", ["5"], "\\boxed 5"),
    ("boxed", ["10\\%"], "\\boxed{10}"),
    ("boxed", ["90^\\circ"], "\\boxed{90}"),
    ("boxed", ["\\left( 1, 2 \\right)"], "\\boxed{(1,2)}"),
    ("boxed", ["\\sqrt"], "\\boxed{\\sqrt}"),
    ("boxed", ["\\sqrt "], "\\boxed{\\sqrt}"),
    ("boxed", ["\\frac1"], "\\boxed{\\frac1}"),
    ("boxed", ["1 \\text{ m} \\text{ s}"], "\\boxed{1 \\text{ m} \\text{ s}}"),
    ("boxed", ["1"], "\\boxed{1 \\text{ m} \\text{ s}}"),
    ("boxed", ["7", "\\frac{1}{2}"], "\\boxed{1/2}"),
    ("boxed", ["2"], "\\boxed{02}"),
    ("boxed", ["\\$5"], "\\boxed{5}"),
    ("boxed", ["5"], "\\boxed}{5}"),
]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out_path = os.path.join(here, "..", "fixtures", "tasks", "scorer_cases.json")
    cases = []
    for scorer, answers, output in CASES:
        score = float(REFERENCES[scorer](output, answers))
        assert 0.0 <= score <= 1.0, (scorer, answers, output, score)
        cases.append({"scorer": scorer, "answers": answers, "output": output, "score": score})
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("[\n")
        f.write(",\n".join(json.dumps(c) for c in cases))
        f.write("\n]\n")
    counts = Counter(c["scorer"] for c in cases)
    print(f"{len(cases)} cases -> {os.path.normpath(out_path)}: " +
          ", ".join(f"{k} {v}" for k, v in counts.items()), file=sys.stderr)


if __name__ == "__main__":
    main()
