#include "capture/tasks/niah.h"

#include <algorithm>
#include <numeric>

#include "capture/tasks/needle.h"
#include "capture/tasks/task_common.h"
#include "core/common/input_error.h"

namespace kvscope::tasks {

namespace {

// RULER's niah template (synthetic/constants.py), its noise haystack.
const char* kIntro =
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the numbers afterwards.\n";

// Keys: common English nouns, one token or two in most vocabularies.
const char* const kKeys[] = {"apple",  "river",   "candle", "garden",  "pencil", "violin",
                             "harbor", "lantern", "mirror", "orchard", "saddle", "thunder",
                             "meadow", "compass", "ribbon", "falcon"};
constexpr int64_t kMaxKeys = int64_t(sizeof kKeys / sizeof kKeys[0]);
constexpr int64_t kMaxValues = 16;

std::string needle_text(const std::string& key, const std::string& value) {
  return "One of the special magic numbers for " + key + " is: " + value + ". ";
}

// The prompt around a haystack of `units`, the byte ranges of what it marks.
struct Rendered {
  std::string prompt_text;
  std::vector<std::pair<size_t, size_t>> asked;  // asked needles, in value order
  std::pair<size_t, size_t> question;
};

}  // namespace

bool is_niah_spec(const std::string& spec) {
  return spec == "niah" || spec.rfind("niah:", 0) == 0;
}

NiahOptions parse_niah_spec(const std::string& spec) {
  const TaskSpec s("niah", spec, {"tokens", "keys", "values", "depth", "seed", "haystack", "text"});
  NiahOptions o;
  o.tokens = s.integer("tokens", 64, int64_t(1) << 24, o.tokens);
  o.keys = s.integer("keys", 1, kMaxKeys, o.keys);
  o.values = s.integer("values", 1, kMaxValues, o.values);
  o.seed = uint64_t(s.integer("seed", 0, int64_t(1) << 62, int64_t(o.seed)));
  o.depth = s.number("depth", 0, 1, o.depth);
  o.haystack = parse_haystack(s);
  return o;
}

std::string niah_kind(const NiahOptions& o) {
  return o.values > 1 ? "niah_multivalue" : o.keys == 1 ? "niah_single" : "niah_multikey";
}

NiahTask make_niah_task(const tokenizer::Tokenizer& tok, const NiahOptions& o) {
  SplitMix rng{o.seed};
  // Distinct keys (a seeded shuffle), 7-digit values (distinct within the
  // asked key), the asked key first.
  std::vector<int64_t> order(static_cast<size_t>(kMaxKeys));
  std::iota(order.begin(), order.end(), 0);
  rng.shuffle(&order);
  std::vector<std::string> keys;
  std::vector<std::vector<std::string>> values(size_t(o.keys));
  for (int64_t i = 0; i < o.keys; ++i) {
    keys.push_back(kKeys[order[size_t(i)]]);
    auto& v = values[size_t(i)];
    while (int64_t(v.size()) < o.values) {
      std::string value = std::to_string(1000000 + rng.below(9000000));
      if (i > 0 || std::find(v.begin(), v.end(), value) == v.end()) v.push_back(value);
    }
  }
  NiahTask task;
  task.key = keys[0];
  task.answers = values[0];
  task.answer = join_answers(task.answers);
  const bool multi = o.values > 1;
  const std::string question = multi ? "What are all the special magic numbers for " + task.key +
                                           " mentioned in the provided text?"
                                     : "What is the special magic number for " + task.key +
                                           " mentioned in the provided text?";
  const std::string answer_prefix =
      multi ? " The special magic numbers for " + task.key + " mentioned in the provided text are"
            : " The special magic number for " + task.key + " mentioned in the provided text is";

  // The needles: the asked key's values first, then the distractors key by key.
  std::vector<std::string> needles;
  for (size_t i = 0; i < keys.size(); ++i)
    for (const std::string& value : values[i]) needles.push_back(needle_text(keys[i], value));
  std::string needles_text;
  for (const std::string& n : needles) needles_text += n;
  const int64_t fixed =
      int64_t(tok.encode(std::string(kIntro) + needles_text + question, false).size()) + 24;

  // Where they go among n units: the asked needle's first value at `depth`,
  // its others every 1/values further on (round to the start past the end);
  // distractors at evenly spaced depths (m - 1/2) / distractors, one unit
  // later where one would share an asked needle's slot (one earlier at the end).
  auto render = [&](const std::vector<std::string>& units) {
    const int64_t n = int64_t(units.size());
    std::vector<int64_t> slot(needles.size());
    for (int64_t j = 0; j < o.values; ++j) {
      double d = o.depth + double(j) / double(o.values);
      if (d > 1) d -= 1;
      slot[size_t(j)] = int64_t(d * double(n) + 0.5);
    }
    const int64_t distractors = int64_t(needles.size()) - o.values;
    for (int64_t m = 1; m <= distractors; ++m) {
      int64_t s = int64_t((double(m) - 0.5) / double(distractors) * double(n) + 0.5);
      if (std::find(slot.begin(), slot.begin() + o.values, s) != slot.begin() + o.values)
        s += s < n ? 1 : -1;
      slot[size_t(o.values + m - 1)] = s;
    }
    std::string user = kIntro;
    std::vector<std::pair<size_t, size_t>> asked(size_t(o.values));
    for (int64_t f = 0; f <= n; ++f) {
      for (size_t i = 0; i < needles.size(); ++i) {
        if (slot[i] != f) continue;
        if (int64_t(i) < o.values) asked[i] = {user.size(), user.size() + needles[i].size()};
        user += needles[i];
      }
      if (f < n) user += units[size_t(f)];
    }
    if (o.haystack.kind == HaystackKind::Text) {  // RULER's "{context}\nWhat are ..."
      while (user.back() == ' ') user.pop_back();
      user += '\n';
    }
    const size_t question_begin = user.size();
    user += question;
    Rendered r;
    const UserPrompt wrapped = wrap_user_message(tok, o.chat, user, kIntro, answer_prefix);
    r.prompt_text = wrapped.text;
    const size_t offset = wrapped.offset;
    for (auto& [b, e] : asked) r.asked.emplace_back(b + offset, e + offset);
    r.question = {question_begin + offset, user.size() + offset};
    return r;
  };

  Rendered r;
  if (o.haystack.kind == HaystackKind::Noise) {
    // Haystack length from the tokenizer, as the passkey task does.
    const int64_t per_filler =
        std::max<int64_t>(1, int64_t(tok.encode(kPasskeyFiller, false).size()));
    const int64_t fillers = std::max<int64_t>(2, (o.tokens - fixed) / per_filler);
    r = render(std::vector<std::string>(size_t(fillers), kPasskeyFiller));
  } else {
    r = render(fit_haystack(
        tok, o.haystack, "niah", o.tokens, fixed - 24,
        [&](const std::vector<std::string>& units) { return render(units).prompt_text; }));
  }
  task.prompt_text = r.prompt_text;
  task.ids = tok.encode(task.prompt_text, true);
  // Spans from growing prefixes (one token wider where BPE merges across a boundary).
  std::vector<std::pair<size_t, size_t>> ranges = r.asked;
  ranges.push_back(r.question);
  const auto spans = prefix_token_spans(tok, task.prompt_text, ranges);
  task.needle_span = spans[0];
  task.needle_spans.assign(spans.begin(), spans.end() - 1);
  std::sort(task.needle_spans.begin(), task.needle_spans.end());
  task.question_span = spans.back();
  return task;
}

}  // namespace kvscope::tasks
