#include "capture/tasks/niah.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "capture/tasks/cwe.h"
#include "capture/tasks/needle.h"
#include "capture/tasks/task_common.h"
#include "core/common/input_error.h"

namespace kvscope::tasks {

namespace {

// RULER's niah template (synthetic/constants.py): its words for the values,
// one and many ("numbers" or "uuids", its type_needle_v).
struct Nouns {
  std::string one, many;
};
Nouns value_nouns(const NiahOptions& o) {
  return o.uuid_values ? Nouns{"uuid", "uuids"} : Nouns{"number", "numbers"};
}

std::string intro_text(const NiahOptions& o) {
  const std::string many = value_nouns(o).many;
  return "Some special magic " + many +
         " are hidden within the following text. Make sure to memorize it. I will quiz you "
         "about the " +
         many + " afterwards.\n";
}

// Keys: common English nouns, one token or two in most vocabularies.
const char* const kKeys[] = {"apple",  "river",   "candle", "garden",  "pencil", "violin",
                             "harbor", "lantern", "mirror", "orchard", "saddle", "thunder",
                             "meadow", "compass", "ribbon", "falcon"};
constexpr int64_t kMaxKeys = int64_t(sizeof kKeys / sizeof kKeys[0]);
constexpr int64_t kMaxValues = 16;

std::string needle_text(const NiahOptions& o, const std::string& key, const std::string& value) {
  return "One of the special magic " + value_nouns(o).many + " for " + key + " is: " + value + ". ";
}

// A version-4 UUID as Python's str(uuid.uuid4()) writes it, from the seed's stream.
std::string uuid(SplitMix& rng) {
  const uint64_t a = rng.next(), b = rng.next();
  char buf[40];
  std::snprintf(buf, sizeof buf, "%08llx-%04llx-4%03llx-%04llx-%012llx",
                static_cast<unsigned long long>(a >> 32),
                static_cast<unsigned long long>((a >> 16) & 0xffff),
                static_cast<unsigned long long>(a & 0xfff),
                static_cast<unsigned long long>(0x8000 | ((b >> 48) & 0x3fff)),
                static_cast<unsigned long long>(b & 0xffffffffffffull));
  return buf;
}

std::string draw_value(const NiahOptions& o, SplitMix& rng) {
  return o.uuid_values ? uuid(rng) : std::to_string(1000000 + rng.below(9000000));
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
  const TaskSpec s(
      "niah", spec,
      {"tokens", "keys", "values", "queries", "depth", "seed", "haystack", "text", "value", "key"});
  NiahOptions o;
  o.tokens = s.integer("tokens", 64, int64_t(1) << 24, o.tokens);
  o.keys = s.integer("keys", 1, kMaxKeys, o.keys);
  o.values = s.integer("values", 1, kMaxValues, o.values);
  o.queries = s.integer("queries", 1, o.keys, o.queries);
  o.seed = uint64_t(s.integer("seed", 0, int64_t(1) << 62, int64_t(o.seed)));
  o.depth = s.number("depth", 0, 1, o.depth);
  o.uuid_values = s.choice("value", {"number", "uuid"}, "number") == "uuid";
  o.uuid_keys = s.choice("key", {"word", "uuid"}, "word") == "uuid";
  // haystack=needle is niah's own; noise and text are every task's (haystack.h).
  o.needle_haystack = s.has("haystack") && s.text("haystack", "") == "needle";
  if (o.needle_haystack && s.has("text"))
    s.fail("text", "gives the text of haystack=text, not of haystack=needle");
  if (!o.needle_haystack) o.haystack = parse_haystack(s);
  return o;
}

std::string niah_kind(const NiahOptions& o) {
  return o.queries > 1  ? "niah_multiquery"
         : o.values > 1 ? "niah_multivalue"
         : o.keys == 1  ? "niah_single"
                        : "niah_multikey";
}

namespace {

// The keys (distinct: a seeded shuffle of the nouns, or UUIDs) and their
// values (distinct within an asked key), the asked keys first.
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
    kv.keys.push_back(o.uuid_keys ? uuid(rng) : kKeys[order[size_t(i)]]);
    auto& v = kv.values[size_t(i)];
    while (int64_t(v.size()) < o.values) {
      std::string value = draw_value(o, rng);
      if (i >= o.queries || std::find(v.begin(), v.end(), value) == v.end()) v.push_back(value);
    }
  }
  return kv;
}

// RULER's multi-query: "a, b, and c" (its ', '.join(keys[:-1]) + ', and ' + keys[-1]).
std::string query_of(const std::vector<std::string>& keys) {
  if (keys.size() == 1) return keys[0];
  std::string q;
  for (size_t i = 0; i + 1 < keys.size(); ++i) q += (i ? ", " : "") + keys[i];
  return q + ", and " + keys.back();
}

// haystack=needle: `n` needles whose keys are none of the task's (hyphenated
// word pairs, as RULER's adjective-noun keys, or UUIDs), from the seed.
std::vector<std::string> needle_units(const NiahOptions& o, int64_t n) {
  SplitMix rng{o.seed ^ 0x6E65656468617973ull};
  const std::vector<std::string>& words = cwe_builtin_words();
  std::vector<std::string> units;
  for (int64_t i = 0; i < n; ++i) {
    const std::string key = o.uuid_keys ? uuid(rng)
                                        : words[size_t(rng.below(words.size()))] + "-" +
                                              words[size_t(rng.below(words.size()))];
    units.push_back(needle_text(o, key, draw_value(o, rng)));
  }
  return units;
}

// Renders the prompt around a haystack of units: the needles (the asked
// key's values first, then the distractors key by key) at their depths.
class NiahRenderer {
 public:
  NiahRenderer(const tokenizer::Tokenizer& tok, const NiahOptions& o, const KeysAndValues& kv,
               const std::string& key)
      : tok_(tok), o_(o), intro_(intro_text(o)), asked_(o.values * o.queries) {
    const bool multi = asked_ > 1;
    const Nouns n = value_nouns(o);
    const std::string query =
        query_of(std::vector<std::string>(kv.keys.begin(), kv.keys.begin() + o.queries));
    question_ = multi ? "What are all the special magic " + n.many + " for " + query +
                            " mentioned in the provided text?"
                      : "What is the special magic " + n.one + " for " + query +
                            " mentioned in the provided text?";
    answer_prefix_ = multi ? " The special magic " + n.many + " for " + query +
                                 " mentioned in the provided text are"
                           : " The special magic " + n.one + " for " + query +
                                 " mentioned in the provided text is";
    for (size_t i = 0; i < kv.keys.size(); ++i)
      for (const std::string& value : kv.values[i])
        needles_.push_back(needle_text(o, kv.keys[i], value));
  }

  // Tokens of everything but the haystack, with a margin for the template.
  int64_t fixed_tokens() const {
    std::string text = intro_;
    for (const std::string& n : needles_) text += n;
    return int64_t(tok_.encode(text + question_, false).size()) + 24;
  }

  Rendered render(const std::vector<std::string>& units) const {
    const std::vector<int64_t> slot = slots(int64_t(units.size()));
    std::string user = intro_;
    std::vector<std::pair<size_t, size_t>> asked(static_cast<size_t>(asked_));
    for (int64_t f = 0; f <= int64_t(units.size()); ++f) {
      for (size_t i = 0; i < needles_.size(); ++i) {
        if (slot[i] != f) continue;
        if (int64_t(i) < asked_) asked[i] = {user.size(), user.size() + needles_[i].size()};
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
    const UserPrompt wrapped = wrap_user_message(tok_, o_.chat, user, intro_, answer_prefix_);
    r.prompt_text = wrapped.text;
    const size_t offset = wrapped.offset;
    for (auto& [b, e] : asked) r.asked.emplace_back(b + offset, e + offset);
    r.question = {question_begin + offset, user.size() + offset};
    return r;
  }

 private:
  // Where the needles go among n units: the first asked needle at `depth`,
  // the other asked ones (values, then queried keys) every 1/asked further on
  // (round to the start past the end); distractors at evenly spaced depths
  // (m - 1/2) / distractors, one unit later where one would share an asked
  // needle's slot (one earlier at the end).
  std::vector<int64_t> slots(int64_t n) const {
    std::vector<int64_t> slot(needles_.size());
    for (int64_t j = 0; j < asked_; ++j) {
      double d = o_.depth + double(j) / double(asked_);
      if (d > 1) d -= 1;
      slot[size_t(j)] = int64_t(d * double(n) + 0.5);
    }
    const int64_t distractors = int64_t(needles_.size()) - asked_;
    for (int64_t m = 1; m <= distractors; ++m) {
      int64_t s = int64_t((double(m) - 0.5) / double(distractors) * double(n) + 0.5);
      if (std::find(slot.begin(), slot.begin() + asked_, s) != slot.begin() + asked_)
        s += s < n ? 1 : -1;
      slot[size_t(asked_ + m - 1)] = s;
    }
    return slot;
  }

  const tokenizer::Tokenizer& tok_;
  const NiahOptions& o_;
  std::string intro_;
  int64_t asked_;  // needles the question asks for: values x queried keys
  std::string question_, answer_prefix_;
  std::vector<std::string> needles_;
};

}  // namespace

NiahTask make_niah_task(const tokenizer::Tokenizer& tok, const NiahOptions& o) {
  const KeysAndValues kv = draw_keys(o);
  NiahTask task;
  task.key = kv.keys[0];
  for (int64_t q = 0; q < o.queries; ++q)
    task.answers.insert(task.answers.end(), kv.values[size_t(q)].begin(),
                        kv.values[size_t(q)].end());
  task.answer = join_answers(task.answers);
  const NiahRenderer renderer(tok, o, kv, task.key);
  const int64_t fixed = renderer.fixed_tokens();
  Rendered r;
  if (o.needle_haystack) {
    // As many needles as fill the prompt, from a sample's tokens per needle.
    const std::vector<std::string> sample = needle_units(o, 16);
    std::string text;
    for (const std::string& u : sample) text += u;
    const double per_unit = double(tok.encode(text, false).size()) / double(sample.size());
    const int64_t n = fit_units(
        o.tokens, int64_t(double(o.tokens - fixed) / per_unit), per_unit, 2, [&](int64_t k) {
          return int64_t(tok.encode(renderer.render(needle_units(o, k)).prompt_text, true).size());
        });
    r = renderer.render(needle_units(o, n));
  } else if (o.haystack.kind == HaystackKind::Noise) {
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
