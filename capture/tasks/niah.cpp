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

namespace {

// The keys (distinct, a seeded shuffle) and their 7-digit values (distinct
// within the asked key), the asked key first.
struct KeysAndValues {
  std::vector<std::string> keys;
  std::vector<std::vector<std::string>> values;
};

KeysAndValues draw_keys(const NiahOptions& o) {
  SplitMix rng{o.seed};
  std::vector<int64_t> order(static_cast<size_t>(kMaxKeys));
  std::iota(order.begin(), order.end(), 0);
  rng.shuffle(&order);
  KeysAndValues kv;
  kv.values.resize(size_t(o.keys));
  for (int64_t i = 0; i < o.keys; ++i) {
    kv.keys.push_back(kKeys[order[size_t(i)]]);
    auto& v = kv.values[size_t(i)];
    while (int64_t(v.size()) < o.values) {
      std::string value = std::to_string(1000000 + rng.below(9000000));
      if (i > 0 || std::find(v.begin(), v.end(), value) == v.end()) v.push_back(value);
    }
  }
  return kv;
}

// Renders the prompt around a haystack of units: the needles (the asked
// key's values first, then the distractors key by key) at their depths.
class NiahRenderer {
 public:
  NiahRenderer(const tokenizer::Tokenizer& tok, const NiahOptions& o, const KeysAndValues& kv,
               const std::string& key)
      : tok_(tok), o_(o) {
    const bool multi = o.values > 1;
    question_ =
        multi ? "What are all the special magic numbers for " + key +
                    " mentioned in the provided text?"
              : "What is the special magic number for " + key + " mentioned in the provided text?";
    answer_prefix_ =
        multi ? " The special magic numbers for " + key + " mentioned in the provided text are"
              : " The special magic number for " + key + " mentioned in the provided text is";
    for (size_t i = 0; i < kv.keys.size(); ++i)
      for (const std::string& value : kv.values[i])
        needles_.push_back(needle_text(kv.keys[i], value));
  }

  // Tokens of everything but the haystack, with a margin for the template.
  int64_t fixed_tokens() const {
    std::string text = kIntro;
    for (const std::string& n : needles_) text += n;
    return int64_t(tok_.encode(text + question_, false).size()) + 24;
  }

  Rendered render(const std::vector<std::string>& units) const {
    const std::vector<int64_t> slot = slots(int64_t(units.size()));
    std::string user = kIntro;
    std::vector<std::pair<size_t, size_t>> asked(size_t(o_.values));
    for (int64_t f = 0; f <= int64_t(units.size()); ++f) {
      for (size_t i = 0; i < needles_.size(); ++i) {
        if (slot[i] != f) continue;
        if (int64_t(i) < o_.values) asked[i] = {user.size(), user.size() + needles_[i].size()};
        user += needles_[i];
      }
      if (f < int64_t(units.size())) user += units[size_t(f)];
    }
    if (o_.haystack.kind == HaystackKind::Text) {  // RULER's "{context}\nWhat are ..."
      while (user.back() == ' ') user.pop_back();
      user += '\n';
    }
    const size_t question_begin = user.size();
    user += question_;
    Rendered r;
    const UserPrompt wrapped = wrap_user_message(tok_, o_.chat, user, kIntro, answer_prefix_);
    r.prompt_text = wrapped.text;
    const size_t offset = wrapped.offset;
    for (auto& [b, e] : asked) r.asked.emplace_back(b + offset, e + offset);
    r.question = {question_begin + offset, user.size() + offset};
    return r;
  }

 private:
  // Where the needles go among n units: the asked needle's first value at
  // `depth`, its others every 1/values further on (round to the start past
  // the end); distractors at evenly spaced depths (m - 1/2) / distractors,
  // one unit later where one would share an asked needle's slot (one earlier
  // at the end).
  std::vector<int64_t> slots(int64_t n) const {
    std::vector<int64_t> slot(needles_.size());
    for (int64_t j = 0; j < o_.values; ++j) {
      double d = o_.depth + double(j) / double(o_.values);
      if (d > 1) d -= 1;
      slot[size_t(j)] = int64_t(d * double(n) + 0.5);
    }
    const int64_t distractors = int64_t(needles_.size()) - o_.values;
    for (int64_t m = 1; m <= distractors; ++m) {
      int64_t s = int64_t((double(m) - 0.5) / double(distractors) * double(n) + 0.5);
      if (std::find(slot.begin(), slot.begin() + o_.values, s) != slot.begin() + o_.values)
        s += s < n ? 1 : -1;
      slot[size_t(o_.values + m - 1)] = s;
    }
    return slot;
  }

  const tokenizer::Tokenizer& tok_;
  const NiahOptions& o_;
  std::string question_, answer_prefix_;
  std::vector<std::string> needles_;
};

}  // namespace

NiahTask make_niah_task(const tokenizer::Tokenizer& tok, const NiahOptions& o) {
  const KeysAndValues kv = draw_keys(o);
  NiahTask task;
  task.key = kv.keys[0];
  task.answers = kv.values[0];
  task.answer = join_answers(task.answers);
  const NiahRenderer renderer(tok, o, kv, task.key);
  const int64_t fixed = renderer.fixed_tokens();
  Rendered r;
  if (o.haystack.kind == HaystackKind::Noise) {
    // Haystack length from the tokenizer, as the passkey task does.
    const int64_t per_filler =
        std::max<int64_t>(1, int64_t(tok.encode(kPasskeyFiller, false).size()));
    const int64_t fillers = std::max<int64_t>(2, (o.tokens - fixed) / per_filler);
    r = renderer.render(std::vector<std::string>(size_t(fillers), kPasskeyFiller));
  } else {
    r = renderer.render(fit_haystack(
        tok, o.haystack, "niah", o.tokens, fixed - 24,
        [&](const std::vector<std::string>& units) { return renderer.render(units).prompt_text; }));
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
