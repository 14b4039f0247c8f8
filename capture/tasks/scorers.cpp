#include "capture/tasks/scorers.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "capture/tasks/task_common.h"
#include "core/common/input_error.h"

namespace kvscope::tasks {

namespace {

// ---- Python's view of a UTF-8 string -------------------------------------
// The references index, split and measure code points, not bytes.

// Bytes in the UTF-8 sequence that `lead` starts; 0 for a byte that starts none.
size_t sequence_length(uint32_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// The code point at s[i] and its byte length; a byte that starts no valid
// sequence is one U+FFFD (what Python's errors="replace" decoding makes of it).
uint32_t decode(const std::string& s, size_t i, size_t* len) {
  const auto byte = [&](size_t k) { return uint32_t(static_cast<unsigned char>(s[k])); };
  const uint32_t b0 = byte(i);
  const size_t n = sequence_length(b0);
  if (n == 1 || n == 0 || i + n > s.size()) {
    *len = 1;
    return n == 1 ? b0 : 0xFFFD;
  }
  uint32_t cp = b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) {
      *len = 1;
      return 0xFFFD;
    }
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  *len = n;
  return cp;
}

size_t char_len(const std::string& s, size_t i) {
  size_t len = 1;
  decode(s, i, &len);
  return len;
}

size_t char_count(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += char_len(s, i)) ++n;
  return n;
}

// Python's str.isspace(): what str.split() splits on.
bool is_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Python re's \w: ASCII letters, digits and '_'; beyond ASCII, a letter
// unless in these blocks of spaces, punctuation, symbols and combining marks
// (the exact rule is Unicode's alphanumerics, a table we do not carry).
bool is_word(uint32_t c) {
  if (c < 0x80)
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
  static const uint32_t not_word[][2] = {
      {0x80, 0xA9},     {0xAB, 0xB1},     {0xB4, 0xB4},      {0xB6, 0xB8},     {0xBB, 0xBB},
      {0xBF, 0xBF},     {0xD7, 0xD7},     {0xF7, 0xF7},      {0x300, 0x36F},   {0x1680, 0x1680},
      {0x2000, 0x206F}, {0x20A0, 0x20FF}, {0x2190, 0x245F},  {0x2500, 0x2775}, {0x2794, 0x2BFF},
      {0x3000, 0x3004}, {0x3008, 0x3020}, {0x3030, 0x3030},  {0xFF01, 0xFF0F}, {0xFF1A, 0xFF20},
      {0xFF3B, 0xFF40}, {0xFF5B, 0xFF65}, {0x1F300, 0x1FAFF}};
  for (const auto& range : not_word)
    if (c >= range[0] && c <= range[1]) return false;
  return true;
}

// Python's s.split(): runs of whitespace separate, none are kept.
std::vector<std::string> split_whitespace(const std::string& s) {
  std::vector<std::string> words;
  std::string word;
  for (size_t i = 0, len = 1; i < s.size(); i += len) {
    if (is_space(decode(s, i, &len))) {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
    } else {
      word.append(s, i, len);
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

std::string join(const std::vector<std::string>& words, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) out += (i ? sep : "") + words[i];
  return out;
}

// Python's s.split(sep): every piece, empty ones included.
std::vector<std::string> split_on(const std::string& s, const std::string& sep) {
  std::vector<std::string> pieces;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(sep, pos)) != std::string::npos; pos = hit + sep.size())
    pieces.push_back(s.substr(pos, hit - pos));
  pieces.push_back(s.substr(pos));
  return pieces;
}

// Python's s.replace(from, to): left to right, not overlapping.
std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  return join(split_on(s, from), to);
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

bool contains(const std::vector<std::string>& items, const std::string& s) {
  return std::find(items.begin(), items.end(), s) != items.end();
}

// ---- RULER and --expect ----------------------------------------------------

double string_match_all(const std::vector<std::string>& answers, const std::string& output) {
  return answers.empty() ? 0.0 : answer_score(answers, output);
}

double string_match_part(const std::vector<std::string>& answers, const std::string& output) {
  return answers_found(answers, output) > 0 ? 1.0 : 0.0;
}

double substring(const std::vector<std::string>& answers, const std::string& output) {
  for (const std::string& a : answers)
    if (output.find(a) != std::string::npos) return 1.0;
  return 0.0;
}

// ---- SQuAD normalization, exact match and token F1 -------------------------

// `\b(a|an|the)\b` -> " ": an article is a whole run of word characters.
std::string remove_articles(const std::string& s) {
  std::string out;
  for (size_t i = 0, len = 1; i < s.size();) {
    if (!is_word(decode(s, i, &len))) {
      out.append(s, i, len);
      i += len;
      continue;
    }
    size_t end = i + len;
    while (end < s.size() && is_word(decode(s, end, &len))) end += len;
    const std::string word = s.substr(i, end - i);
    out += word == "a" || word == "an" || word == "the" ? " " : word;
    i = end;
  }
  return out;
}

// SQuAD's normalize_answer: lower case, no ASCII punctuation (Python's
// string.punctuation), no articles, single spaces.
std::string squad_normalize(const std::string& s) {
  static const std::string punctuation = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
  std::string kept;
  for (char c : s) {
    if (punctuation.find(c) != std::string::npos) continue;
    kept += c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c;
  }
  return join(split_whitespace(remove_articles(kept)), " ");
}

double exact_match(const std::vector<std::string>& answers, const std::string& output) {
  const std::string out = squad_normalize(output);
  for (const std::string& a : answers)
    if (squad_normalize(a) == out) return 1.0;
  return 0.0;
}

// SQuAD's f1_score on token lists: the multiset intersection (Counter &).
double token_f1(std::vector<std::string> pred, std::vector<std::string> truth) {
  std::sort(pred.begin(), pred.end());
  std::sort(truth.begin(), truth.end());
  std::vector<std::string> common;
  std::set_intersection(pred.begin(), pred.end(), truth.begin(), truth.end(),
                        std::back_inserter(common));
  if (common.empty()) return 0.0;
  const double precision = 1.0 * double(common.size()) / double(pred.size());
  const double recall = 1.0 * double(common.size()) / double(truth.size());
  return (2 * precision * recall) / (precision + recall);
}

double f1(const std::vector<std::string>& answers, const std::string& output) {
  const std::vector<std::string> pred = split_whitespace(squad_normalize(output));
  double best = 0.0;
  for (const std::string& a : answers)
    best = std::max(best, token_f1(pred, split_whitespace(squad_normalize(a))));
  return best;
}

// ---- ROUGE-L as the `rouge` package 1.0.1 computes it ----------------------

// Sentences: the text split on '.', empty pieces dropped, each piece's
// whitespace collapsed to single spaces (a blank piece stays, as "").
// Words: each sentence split on ' ', so "" is one empty word. Words become
// ids (`ids` shared by both texts) so the LCS compares integers.
std::vector<std::vector<int>> rouge_sentences(const std::string& text,
                                              std::map<std::string, int>* ids) {
  std::vector<std::vector<int>> sentences;
  for (const std::string& piece : split_on(text, ".")) {
    if (piece.empty()) continue;
    std::vector<int> words;
    for (const std::string& w : split_on(join(split_whitespace(piece), " "), " "))
      words.push_back(ids->emplace(w, int(ids->size())).first->second);
    sentences.push_back(std::move(words));
  }
  return sentences;
}

size_t distinct_words(const std::vector<std::vector<int>>& sentences) {
  std::set<int> words;
  for (const auto& s : sentences) words.insert(s.begin(), s.end());
  return words.size();
}

// rouge's _recon_lcs(x, y): one longest common subsequence, found by
// backtracking the DP table with its tie rule (a match goes diagonally; else
// up only when strictly longer, otherwise left). Its words go into `into`.
void add_lcs_words(const std::vector<int>& x, const std::vector<int>& y, std::set<int>* into) {
  const size_t n = x.size(), m = y.size(), w = m + 1;
  std::vector<int32_t> table((n + 1) * w, 0);
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j)
      table[i * w + j] = x[i - 1] == y[j - 1]
                             ? table[(i - 1) * w + j - 1] + 1
                             : std::max(table[(i - 1) * w + j], table[i * w + j - 1]);
  for (size_t i = n, j = m; i > 0 && j > 0;) {
    if (x[i - 1] == y[j - 1]) {
      into->insert(x[i - 1]);
      --i, --j;
    } else if (table[(i - 1) * w + j] > table[i * w + j - 1]) {
      --i;
    } else {
      --j;
    }
  }
}

// rouge_l_summary_level with exclusive=True: the union over every (reference
// sentence, output sentence) pair of the LCS word sets, against the distinct
// words of each side. 0 where rouge raises (a side with no sentence), as
// LongBench's try/except returns.
double rouge_l_f(const std::string& output, const std::string& answer) {
  std::map<std::string, int> ids;
  const auto hyp = rouge_sentences(output, &ids), ref = rouge_sentences(answer, &ids);
  if (hyp.empty() || ref.empty()) return 0.0;
  std::set<int> lcs_union;
  for (const auto& r : ref)
    for (const auto& h : hyp) add_lcs_words(r, h, &lcs_union);
  const double llcs = double(lcs_union.size());
  const double r_lcs = llcs / double(distinct_words(ref)),
               p_lcs = llcs / double(distinct_words(hyp));
  return 2.0 * ((p_lcs * r_lcs) / (p_lcs + r_lcs + 1e-8));
}

double rouge_l(const std::vector<std::string>& answers, const std::string& output) {
  double best = 0.0;
  for (const std::string& a : answers) best = std::max(best, rouge_l_f(output, a));
  return best;
}

// ---- InfiniteBench's multiple choice ---------------------------------------

// get_score_one_longbook_choice_eng: a leading A-D is the choice; else the
// text after the first "answer is:", "answer:", "answer is" or "option is"
// found (one character skipped) must start with the letter or the option's
// text; else the first word that is a substring of "ABCD" ("A", "BC", ...).
bool choice_correct(const std::vector<std::string>& label, std::string pred) {
  static const std::string letters = "ABCD";
  if (pred.empty()) return false;
  if (letters.find(pred[0]) != std::string::npos) return contains(label, pred.substr(0, 1));
  static const std::string blanked = "\n\"'.,?!{}";
  for (char& c : pred)
    if (blanked.find(c) != std::string::npos) c = ' ';
  while (pred.find("  ") != std::string::npos) pred = replace_all(pred, "  ", " ");
  for (const std::string prefix : {"answer is:", "answer:", "answer is", "option is"}) {
    const size_t idx = pred.find(prefix);
    if (idx == std::string::npos) continue;
    const size_t end = idx + prefix.size();
    if (end >= pred.size()) return false;
    const std::string after = pred.substr(end + char_len(pred, end));
    for (const std::string& s : label)
      if (starts_with(after, s)) return true;
    return false;
  }
  for (const std::string& word : split_whitespace(pred))
    if (letters.find(word) != std::string::npos) return contains(label, word);
  return false;
}

double choice(const std::vector<std::string>& answers, const std::string& output) {
  return !answers.empty() && choice_correct(answers, output) ? 1.0 : 0.0;
}

// ---- Hendrycks MATH's boxed answers ----------------------------------------

// last_boxed_only_string: from the last "\boxed" (else the last "\fbox") to
// the brace closing the first one opened after it; none if it never closes.
std::optional<std::string> last_boxed(const std::string& s) {
  size_t idx = s.rfind("\\boxed");
  if (idx == std::string::npos) idx = s.rfind("\\fbox");
  if (idx == std::string::npos) return std::nullopt;
  int open = 0;
  for (size_t i = idx; i < s.size(); ++i) {
    if (s[i] == '{') ++open;
    if (s[i] == '}' && --open == 0) return s.substr(idx, i + 1 - idx);
  }
  return std::nullopt;
}

// remove_boxed, and the same for \fbox{...} (our one extension).
std::optional<std::string> unbox(const std::string& boxed) {
  for (const std::string left : {"\\boxed{", "\\fbox{"})
    if (starts_with(boxed, left) && boxed.size() > left.size() && boxed.back() == '}')
      return boxed.substr(left.size(), boxed.size() - left.size() - 1);
  return std::nullopt;
}

// The steps of Hendrycks' _strip_string; std::nullopt where Python raises
// (is_equiv then compares the raw strings).

// _fix_fracs: \frac12 -> \frac{1}{2}, \frac1{2} -> \frac{1}{2}.
std::optional<std::string> fix_fracs(const std::string& s) {
  const std::vector<std::string> pieces = split_on(s, "\\frac");
  std::string out = pieces[0];
  for (size_t k = 1; k < pieces.size(); ++k) {
    const std::string& p = pieces[k];
    out += "\\frac";
    if (p.empty()) return std::nullopt;  // substr[0] of "": IndexError
    if (p[0] == '{') {
      out += p;
      continue;
    }
    if (char_count(p) < 2) return s;  // the reference gives up, unchanged
    const size_t a_len = char_len(p, 0), b_len = char_len(p, a_len);
    const std::string a = p.substr(0, a_len), b = p.substr(a_len, b_len);
    const std::string rest = p.substr(a_len + b_len);
    out += b != "{" ? "{" + a + "}{" + b + "}" + rest : "{" + a + "}" + b + rest;
  }
  return out;
}

// A string that int() reads and str() writes back unchanged: -?(0|[1-9][0-9]*),
// at most 4300 digits (Python's int() refuses longer ones).
bool is_canonical_int(const std::string& s) {
  const size_t start = !s.empty() && s[0] == '-' ? 1 : 0;
  const std::string digits = s.substr(start);
  if (digits.empty() || digits.size() > 4300 ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    return false;
  return digits == "0" ? start == 0 : digits[0] != '0';
}

// _fix_a_slash_b: "3/4" -> \frac{3}{4} for two integers written plainly.
std::string fix_a_slash_b(const std::string& s) {
  const std::vector<std::string> parts = split_on(s, "/");
  if (parts.size() != 2 || !is_canonical_int(parts[0]) || !is_canonical_int(parts[1])) return s;
  return "\\frac{" + parts[0] + "}{" + parts[1] + "}";
}

// _remove_right_units: drop "\text{ ..." units; two of them fail its assert.
std::optional<std::string> remove_right_units(const std::string& s) {
  const std::vector<std::string> splits = split_on(s, "\\text{ ");
  if (splits.size() > 2) return std::nullopt;
  return splits[0];
}

// _fix_sqrt: \sqrt3 -> \sqrt{3}.
std::optional<std::string> fix_sqrt(const std::string& s) {
  if (s.find("\\sqrt") == std::string::npos) return s;
  const std::vector<std::string> splits = split_on(s, "\\sqrt");
  std::string out = splits[0];
  for (size_t k = 1; k < splits.size(); ++k) {
    const std::string& p = splits[k];
    if (p.empty()) return std::nullopt;  // split[0] of "": IndexError
    const size_t a_len = char_len(p, 0);
    out += p[0] != '{' ? "\\sqrt{" + p.substr(0, a_len) + "}" + p.substr(a_len) : "\\sqrt" + p;
  }
  return out;
}

// _strip_string's plain rewrites, in its order: line breaks, inverse spaces,
// "\\" -> "\", \tfrac and \dfrac -> \frac, \left and \right, degrees, dollars.
const std::pair<const char*, const char*> latex_rewrites[] = {
    {"\n", ""},     {"\\!", ""},     {"\\\\", "\\"},    {"tfrac", "frac"}, {"dfrac", "frac"},
    {"\\left", ""}, {"\\right", ""}, {"^{\\circ}", ""}, {"^\\circ", ""},   {"\\$", ""}};

std::optional<std::string> strip_string(std::string s) {
  for (const auto& [from, to] : latex_rewrites) s = replace_all(s, from, to);
  const auto no_units = remove_right_units(s);
  if (!no_units) return std::nullopt;
  s = replace_all(replace_all(*no_units, "\\%", ""), "%", "");
  s = replace_all(replace_all(s, " .", " 0."), "{.", "{0.");
  if (s.empty()) return s;
  if (s[0] == '.') s = "0" + s;
  // "k = 5" -> "5": a short name before a lone "=".
  const std::vector<std::string> sides = split_on(s, "=");
  if (sides.size() == 2 && char_count(sides[0]) <= 2) s = sides[1];
  const auto sqrt_fixed = fix_sqrt(s);
  if (!sqrt_fixed) return std::nullopt;
  const auto fracs_fixed = fix_fracs(replace_all(*sqrt_fixed, " ", ""));
  if (!fracs_fixed) return std::nullopt;
  s = *fracs_fixed == "0.5" ? "\\frac{1}{2}" : *fracs_fixed;
  return fix_a_slash_b(s);
}

// is_equiv: the stripped strings are equal, or, where stripping raises, the raw ones.
bool is_equiv(const std::string& a, const std::string& b) {
  const auto sa = strip_string(a), sb = strip_string(b);
  return sa && sb ? *sa == *sb : a == b;
}

double boxed(const std::vector<std::string>& answers, const std::string& output) {
  const auto box = last_boxed(output);
  const auto content = box ? unbox(*box) : std::nullopt;
  if (!content) return 0.0;
  for (const std::string& a : answers)
    if (is_equiv(*content, a)) return 1.0;
  return 0.0;
}

}  // namespace

const std::vector<AnswerScorer>& answer_scorers() {
  static const std::vector<AnswerScorer> scorers = {
      {"string_match_all", "RULER scripts/eval/synthetic/constants.py string_match_all",
       string_match_all},
      {"string_match_part", "RULER scripts/eval/synthetic/constants.py string_match_part",
       string_match_part},
      {"substring", "an answer occurs verbatim (--expect)", substring},
      {"exact_match", "SQuAD v1.1 evaluate-v1.1.py exact_match_score", exact_match},
      {"f1", "LongBench metrics.py qa_f1_score", f1},
      {"rouge_l", "LongBench metrics.py rouge_score (rouge 1.0.1 ROUGE-L F)", rouge_l},
      {"choice", "InfiniteBench src/compute_scores.py get_score_one_longbook_choice_eng", choice},
      {"boxed", "Hendrycks MATH last_boxed_only_string + math_equivalence.py is_equiv", boxed},
  };
  return scorers;
}

std::vector<std::string> scorer_names() {
  std::vector<std::string> names;
  for (const AnswerScorer& s : answer_scorers()) names.push_back(s.name);
  return names;
}

const AnswerScorer& find_scorer(const std::string& name, const std::string& file,
                                const std::string& field) {
  for (const AnswerScorer& s : answer_scorers())
    if (s.name == name) return s;
  throw InputError(file, field,
                   "expected one of " + join(scorer_names(), ", ") + ", got '" + name + "'");
}

}  // namespace kvscope::tasks
