#include "capture/tasks/vt.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "capture/tasks/task_common.h"
#include "core/common/input_error.h"

namespace kvscope::tasks {

namespace {

// RULER's variable_tracking template (synthetic/constants.py).
const char* kIntro =
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";

constexpr int64_t kMaxChains = 16;
constexpr int64_t kMaxHops = 32;

// k sorted gaps in [lo, hi]: distinct (Floyd's sampling) when the range
// holds k, else drawn with repeats.
std::vector<int64_t> sorted_gaps(SplitMix& rng, int64_t lo, int64_t hi, int64_t k) {
  const int64_t range = hi - lo + 1;
  std::vector<int64_t> out;
  if (range >= k) {
    std::set<int64_t> chosen;
    for (int64_t j = range - k; j < range; ++j) {
      const int64_t t = int64_t(rng.below(uint64_t(j + 1)));
      chosen.insert(chosen.count(t) ? j : t);
    }
    out.assign(chosen.begin(), chosen.end());
  } else {
    for (int64_t i = 0; i < k; ++i) out.push_back(int64_t(rng.below(uint64_t(range))));
    std::sort(out.begin(), out.end());
  }
  for (int64_t& g : out) g += lo;
  return out;
}

struct Rendered {
  std::string prompt_text;
  std::vector<std::pair<size_t, size_t>> statements;  // the asked chain's, in chain order
  std::pair<size_t, size_t> question;
};

}  // namespace

bool is_vt_spec(const std::string& spec) {
  return spec == "vt" || spec.rfind("vt:", 0) == 0;
}

VtOptions parse_vt_spec(const std::string& spec) {
  const TaskSpec s("vt", spec, {"tokens", "chains", "hops", "depth", "seed", "haystack", "text"});
  VtOptions o;
  o.tokens = s.integer("tokens", 64, int64_t(1) << 24, o.tokens);
  o.chains = s.integer("chains", 1, kMaxChains, o.chains);
  o.hops = s.integer("hops", 1, kMaxHops, o.hops);
  o.depth = s.number("depth", 0, 1, o.depth);
  o.seed = uint64_t(s.integer("seed", 0, int64_t(1) << 62, int64_t(o.seed)));
  o.haystack = parse_haystack(s);
  return o;
}

VtTask make_vt_task(const tokenizer::Tokenizer& tok, const VtOptions& o) {
  SplitMix rng{o.seed ^ 0x7654A3B2C1D0E9F8ull};
  // Distinct 5-letter names, a distinct 5-digit value per chain.
  std::set<std::string> used;
  std::vector<std::vector<std::string>> names(size_t(o.chains));
  std::vector<std::string> values;
  for (auto& chain : names) {
    while (int64_t(chain.size()) < o.hops + 1) {
      std::string name(5, 'A');
      for (char& c : name) c = char('A' + rng.below(26));
      if (used.insert(name).second) chain.push_back(name);
    }
    std::string value;
    do value = std::to_string(10000 + rng.below(90000));
    while (std::find(values.begin(), values.end(), value) != values.end());
    values.push_back(value);
  }
  // Statements: "VAR X0 = value", then "VAR Xk = VAR Xk-1".
  std::vector<std::vector<std::string>> statements(size_t(o.chains));
  std::string statements_text;
  for (size_t c = 0; c < names.size(); ++c)
    for (size_t k = 0; k < names[c].size(); ++k) {
      statements[c].push_back("VAR " + names[c][k] + " = " +
                              (k == 0 ? values[c] : "VAR " + names[c][k - 1]));
      statements_text += statements[c].back() + " ";
    }
  VtTask task;
  task.value = values[0];
  task.answers = names[0];
  task.answer = join_answers(task.answers);
  const std::string question = "Question: Find all variables that are assigned the value " +
                               task.value + " in the text above.";
  const std::string answer_prefix =
      " Answer: According to the chain(s) of variable assignment in the text above, " +
      std::to_string(o.hops + 1) + " variables are assigned the value " + task.value +
      ", they are:";

  // The asked chain from `depth` on (anywhere when no depth is given), the
  // others anywhere; each chain in order. Drawn afresh for each haystack size.
  auto render = [&](const std::vector<std::string>& units) {
    const int64_t n = int64_t(units.size());
    SplitMix places{o.seed ^ 0x5851F42D4C957F2Dull};
    std::vector<std::tuple<int64_t, size_t, size_t>> at;  // (gap, chain, hop)
    for (size_t c = 0; c < statements.size(); ++c) {
      std::vector<int64_t> gaps;
      if (c == 0 && o.depth >= 0) {
        gaps.push_back(int64_t(o.depth * double(n) + 0.5));
        for (int64_t g : sorted_gaps(places, gaps[0], n, o.hops)) gaps.push_back(g);
      } else {
        gaps = sorted_gaps(places, 0, n, o.hops + 1);
      }
      for (size_t k = 0; k < gaps.size(); ++k) at.emplace_back(gaps[k], c, k);
    }
    std::sort(at.begin(), at.end());
    Rendered r;
    std::string user = kIntro;
    r.statements.resize(size_t(o.hops + 1));
    size_t next = 0;
    for (int64_t f = 0; f <= n; ++f) {
      for (; next < at.size() && std::get<0>(at[next]) == f; ++next) {
        const auto [gap, c, k] = at[next];
        const std::string& s = statements[c][k];
        if (c == 0) r.statements[k] = {user.size(), user.size() + s.size()};
        user += s + " ";
      }
      if (f < n) user += units[size_t(f)];
    }
    while (!user.empty() && user.back() == ' ') user.pop_back();
    user += "\n";
    const size_t question_begin = user.size();
    user += question;
    const UserPrompt wrapped = wrap_user_message(tok, o.chat, user, kIntro, answer_prefix);
    r.prompt_text = wrapped.text;
    const size_t offset = wrapped.offset;
    for (auto& [b, e] : r.statements) b += offset, e += offset;
    r.question = {question_begin + offset, user.size() + offset};
    return r;
  };

  const int64_t fixed =
      int64_t(
          tok.encode(std::string(kIntro) + statements_text + "\n" + question + answer_prefix, false)
              .size()) +
      (o.chat ? 40 : 1);
  const Rendered r = render(fit_haystack(
      tok, o.haystack, "vt", o.tokens, fixed,
      [&](const std::vector<std::string>& units) { return render(units).prompt_text; }));
  task.prompt_text = r.prompt_text;
  task.ids = tok.encode(task.prompt_text, true);
  std::vector<std::pair<size_t, size_t>> ranges = r.statements;
  ranges.push_back(r.question);
  const auto spans = token_spans(tok, task.prompt_text, task.ids, ranges);
  task.needle_spans.assign(spans.begin(), spans.end() - 1);
  task.question_span = spans.back();
  return task;
}

}  // namespace kvscope::tasks
