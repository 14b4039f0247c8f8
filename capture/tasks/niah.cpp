#include "capture/tasks/niah.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "capture/tasks/needle.h"
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

// splitmix64: the task's only randomness, from the seed.
uint64_t mix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string needle_text(const std::string& key, const std::string& value) {
  return "One of the special magic numbers for " + key + " is: " + value + ". ";
}

int64_t parse_int(const std::string& field, const std::string& value, int64_t lo, int64_t hi) {
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end || v < lo || v > hi)
    throw InputError("--task", "niah:" + field,
                     "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                         "], got '" + value + "'");
  return v;
}

}  // namespace

bool is_niah_spec(const std::string& spec) {
  return spec == "niah" || spec.rfind("niah:", 0) == 0;
}

NiahOptions parse_niah_spec(const std::string& spec) {
  NiahOptions o;
  const size_t colon = spec.find(':');
  const std::string rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  for (size_t pos = 0; pos < rest.size();) {
    const size_t comma = std::min(rest.find(',', pos), rest.size());
    const std::string item = rest.substr(pos, comma - pos);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq),
                      value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "tokens") {
      o.tokens = parse_int(key, value, 64, int64_t(1) << 24);
    } else if (key == "keys") {
      o.keys = parse_int(key, value, 1, kMaxKeys);
    } else if (key == "seed") {
      o.seed = uint64_t(parse_int(key, value, 0, int64_t(1) << 62));
    } else if (key == "depth") {
      char* end = nullptr;
      o.depth = std::strtod(value.c_str(), &end);
      if (value.empty() || *end || !(o.depth >= 0 && o.depth <= 1))
        throw InputError("--task", "niah:depth",
                         "expected a number in [0, 1], got '" + value + "'");
    } else {
      throw InputError("--task", "niah:" + key, "unknown (expected tokens, keys, depth, seed)");
    }
    pos = comma + 1;
  }
  return o;
}

NiahTask make_niah_task(const tokenizer::Tokenizer& tok, const NiahOptions& o) {
  uint64_t state = o.seed;
  // Distinct keys (a seeded shuffle), 7-digit values, the asked one first.
  std::vector<int64_t> order(static_cast<size_t>(kMaxKeys));
  std::iota(order.begin(), order.end(), 0);
  for (int64_t i = kMaxKeys - 1; i > 0; --i)
    std::swap(order[size_t(i)], order[mix(state) % (i + 1)]);
  std::vector<std::string> keys, values;
  for (int64_t i = 0; i < o.keys; ++i) {
    keys.push_back(kKeys[order[size_t(i)]]);
    values.push_back(std::to_string(1000000 + mix(state) % 9000000));
  }
  NiahTask task;
  task.key = keys[0];
  task.answer = values[0];
  const std::string question =
      "What is the special magic number for " + task.key + " mentioned in the provided text?";

  // Haystack length from the tokenizer, as the passkey task does.
  std::string needles_text;
  for (int64_t i = 0; i < o.keys; ++i)
    needles_text += needle_text(keys[size_t(i)], values[size_t(i)]);
  const int64_t per_filler =
      std::max<int64_t>(1, int64_t(tok.encode(kPasskeyFiller, false).size()));
  const int64_t fixed =
      int64_t(tok.encode(std::string(kIntro) + needles_text + question, false).size()) + 24;
  const int64_t fillers = std::max<int64_t>(2, (o.tokens - fixed) / per_filler);
  // The asked needle at `depth`; distractors at evenly spaced depths
  // (i - 1/2) / (keys - 1), one filler later where one would share the asked
  // needle's slot (one filler earlier at the end).
  std::vector<int64_t> slot(static_cast<size_t>(o.keys));
  slot[0] = int64_t(o.depth * double(fillers) + 0.5);
  for (int64_t i = 1; i < o.keys; ++i) {
    int64_t s = int64_t((double(i) - 0.5) / double(o.keys - 1) * double(fillers) + 0.5);
    if (s == slot[0]) s += s < fillers ? 1 : -1;
    slot[size_t(i)] = s;
  }

  std::string user = kIntro, before_asked, asked_end;
  for (int64_t f = 0; f <= fillers; ++f) {
    for (int64_t i = 0; i < o.keys; ++i) {
      if (slot[size_t(i)] != f) continue;
      if (i == 0) before_asked = user;
      user += needle_text(keys[size_t(i)], values[size_t(i)]);
      if (i == 0) asked_end = user;
    }
    if (f < fillers) user += kPasskeyFiller;
  }
  const std::string before_question = user;
  user += question;
  std::string prefix;
  if (o.chat) {
    task.prompt_text = tok.apply_chat_template({{"user", user}});
    prefix = task.prompt_text.substr(0, task.prompt_text.find(kIntro));
  } else {
    task.prompt_text =
        user + " The special magic number for " + task.key + " mentioned in the provided text is";
  }
  task.ids = tok.encode(task.prompt_text, true);
  // Spans from growing prefixes (one token wider where BPE merges across a boundary).
  auto count = [&](const std::string& text) { return int64_t(tok.encode(text, true).size()); };
  task.needle_span = {std::max<int64_t>(0, count(prefix + before_asked) - 1),
                      count(prefix + asked_end)};
  task.question_span = {std::max<int64_t>(0, count(prefix + before_question) - 1),
                        count(prefix + user)};
  return task;
}

}  // namespace kvscope::tasks
