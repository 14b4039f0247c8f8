#include "capture/tasks/defer.h"
#include "capture/tasks/task_common.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "capture/tasks/needle.h"
#include "core/common/input_error.h"

namespace kvscope::tasks {

namespace {

const char* kIntro =
    "There is an important piece of information hidden inside a lot of irrelevant text. Find it "
    "and remember it: you will need it at the very end.\n";
const char* kInstruction =
    "\nNow write a long story about something else. When the story is over, tell me the pass key.";
const char* kQuestion = "The story is over. The pass key is";
const char* kStoryStart = "Once upon a time";

constexpr int64_t kMaxTokens = 1000000;

// SplitMix64: the distractor prose is a pure function of the seed.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t x = (state += 0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }
  template <size_t N>
  const char* pick(const char* const (&words)[N]) {
    return words[next() % N];
  }
};

// Plain words (TinyStories' vocabulary, so even a 260K-parameter model reads
// it as prose); none holds a digit.
const char* const kNames[] = {"Lily", "Tom", "Anna", "Ben",  "Mia",  "Sam",
                              "Lucy", "Max", "Sara", "Jack", "Emma", "Leo"};
const char* const kAnimals[] = {"dog",  "cat",  "bird",  "rabbit", "fox",
                                "frog", "duck", "horse", "bear",   "mouse"};
const char* const kThings[] = {"ball", "kite", "box",    "hat",  "cup",  "book",
                               "boat", "tree", "flower", "cake", "lamp", "drum"};
const char* const kPlaces[] = {"garden", "park",  "forest", "river", "kitchen", "hill",
                               "town",   "beach", "farm",   "lake",  "school",  "village"};
const char* const kAdjectives[] = {"big",  "small", "red",    "happy", "quiet", "old",   "shiny",
                                   "soft", "tall",  "bright", "warm",  "green", "little"};
const char* const kFeelings[] = {"happy", "sad", "tired", "excited", "calm", "proud", "curious"};
const char* const kDid[] = {"found",  "saw",    "liked", "carried", "painted",
                            "shared", "washed", "held",  "pushed",  "fixed"};
const char* const kWent[] = {"walked", "jumped",  "sang",   "played", "slept",
                             "danced", "laughed", "waited", "ran",    "smiled"};
const char* const kHow[] = {"slowly", "happily", "quietly", "together", "again", "carefully"};
const char* const kTimes[] = {"morning", "evening", "afternoon", "night", "spring", "summer"};

std::string sentence(Rng& r) {
  const std::string name = r.pick(kNames), other = r.pick(kNames);
  switch (r.next() % 10) {
    case 0:
      return name + " " + r.pick(kDid) + " a " + r.pick(kAdjectives) + " " + r.pick(kThings) +
             " in the " + r.pick(kPlaces) + ".";
    case 1:
      return std::string("The ") + r.pick(kAdjectives) + " " + r.pick(kAnimals) + " " +
             r.pick(kWent) + " " + r.pick(kHow) + " near the " + r.pick(kPlaces) + ".";
    case 2:
      return std::string("One ") + r.pick(kTimes) + ", " + name + " and " + other +
             " went to the " + r.pick(kPlaces) + ".";
    case 3:
      return name + " felt " + r.pick(kFeelings) + " because the " + r.pick(kThings) + " was so " +
             r.pick(kAdjectives) + ".";
    case 4:
      return std::string("In the ") + r.pick(kPlaces) + ", a " + r.pick(kAnimals) + " " +
             r.pick(kWent) + " and a " + r.pick(kAnimals) + " " + r.pick(kWent) + ".";
    case 5:
      return std::string("\"Look at the ") + r.pick(kAdjectives) + " " + r.pick(kThings) +
             "!\" said " + name + ".";
    case 6:
      return name + " gave the " + r.pick(kThings) + " to the " + r.pick(kAdjectives) + " " +
             r.pick(kAnimals) + ".";
    case 7:
      return std::string("They ") + r.pick(kWent) + " " + r.pick(kHow) + " all " + r.pick(kTimes) +
             " long.";
    case 8:
      return name + " asked " + other + " to bring the " + r.pick(kThings) + " to the " +
             r.pick(kPlaces) + ".";
    default:
      return std::string("The ") + r.pick(kThings) + " was " + r.pick(kAdjectives) + ", and the " +
             r.pick(kAnimals) + " was " + r.pick(kFeelings) + ".";
  }
}

// The ids `text` adds after `context`: the tail of encode(context + text)
// past encode(context), so its first word takes the form it has in running
// text (a SentencePiece dummy-prefix space would otherwise appear before it).
// Falls back to encoding `text` alone when the tokenizer merged across the
// boundary and the context's ids are not a prefix.
std::vector<int32_t> ids_after(const tokenizer::Tokenizer& tok, const std::string& context,
                               const std::vector<int32_t>& context_ids, const std::string& text) {
  std::vector<int32_t> all = tok.encode(context + text, true);
  if (all.size() > context_ids.size() &&
      std::equal(context_ids.begin(), context_ids.end(), all.begin()))
    return {all.begin() + std::ptrdiff_t(context_ids.size()), all.end()};
  return tok.encode(text, false);
}

int64_t parse_int(const std::string& key, const std::string& value, int64_t lo, int64_t hi) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end || errno || v < lo || v > hi)
    throw InputError("--task", "defer:" + key,
                     "is '" + value + "' (expected an integer " + std::to_string(lo) + ".." +
                         std::to_string(hi) + ")");
  return v;
}

}  // namespace

bool is_defer_spec(const std::string& spec) {
  return spec == "defer" || spec.rfind("defer:", 0) == 0;
}

DeferOptions parse_defer_spec(const std::string& spec) {
  if (!is_defer_spec(spec))
    throw InputError("--task", spec, "not a defer task (expected defer[:key=value,...])");
  DeferOptions o;
  const std::string rest = spec.size() > 6 ? spec.substr(6) : "";
  size_t pos = 0;
  while (pos < rest.size()) {
    const size_t comma = rest.find(',', pos);
    const std::string item =
        rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "tokens") {
      o.tokens = parse_int(key, value, 1, kMaxTokens);
    } else if (key == "distract") {
      o.distract = parse_int(key, value, 0, kMaxTokens);
    } else if (key == "seed") {
      o.seed = static_cast<uint64_t>(parse_int(key, value, 0, INT64_MAX));
    } else if (key == "depth") {
      char* end = nullptr;
      o.depth = std::strtod(value.c_str(), &end);
      if (value.empty() || *end || !(o.depth >= 0 && o.depth <= 1))
        throw InputError("--task", "defer:depth", "is '" + value + "' (expected 0..1)");
    } else {
      throw InputError("--task", "defer:" + key,
                       "unknown key (expected tokens, distract, seed, depth)");
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return o;
}

std::string defer_distractor_text(uint64_t seed, size_t min_chars) {
  Rng r{seed ^ 0xD1B54A32D192ED03ull};
  std::string text = std::string(kStoryStart) + ", in a " + r.pick(kAdjectives) + " " +
                     r.pick(kPlaces) + ", there was a " + r.pick(kAnimals) + " named " +
                     r.pick(kNames) + ".";
  while (text.size() < min_chars) {
    text += ' ';
    text += sentence(r);
  }
  return text;
}

DeferTask make_defer_task(const tokenizer::Tokenizer& tok, const DeferOptions& o) {
  DeferTask task;
  task.answer = passkey(o.seed);
  const std::string fact =
      "The pass key is " + task.answer + ". Remember it. " + task.answer + " is the pass key. ";
  const int64_t per_filler =
      std::max<int64_t>(1, int64_t(tok.encode(kPasskeyFiller, false).size()));
  const int64_t fixed =
      int64_t(tok.encode(std::string(kIntro) + fact + kInstruction, false).size()) + 24;
  if (o.tokens < fixed + per_filler)
    throw InputError("--task", "defer:tokens",
                     "is " + std::to_string(o.tokens) +
                         ", too small for the fact and the instructions (expected >= " +
                         std::to_string(fixed + per_filler) + " with this tokenizer)");
  const int64_t fillers = (o.tokens - fixed) / per_filler;
  const int64_t before = static_cast<int64_t>(o.depth * double(fillers) + 0.5);
  std::string head = kIntro, tail;
  for (int64_t i = 0; i < before; ++i) head += kPasskeyFiller;
  for (int64_t i = before; i < fillers; ++i) tail += kPasskeyFiller;

  const std::string user = head + fact + tail + kInstruction;
  const UserPrompt wrapped = wrap_user_message(tok, o.chat, user, kIntro, "");
  task.prompt_text = wrapped.text;
  const std::string prefix = task.prompt_text.substr(0, wrapped.offset);  // the chat template's
  task.ids = tok.encode(task.prompt_text, true);
  auto count = [&](const std::string& text) { return int64_t(tok.encode(text, true).size()); };
  const int64_t needle_begin = count(prefix + head);
  const int64_t needle_end = count(prefix + head + fact);
  task.needle_span = {std::max<int64_t>(0, needle_begin - 1), needle_end};

  // The story the model "writes": exactly `distract` tokens of it (cut where
  // the count ends, mid-word if so), then the question on a new paragraph.
  // A chat prompt ends with the assistant prefix, so the story starts there.
  const std::string story_lead = o.chat ? "" : "\n\n";
  std::vector<int32_t> story;
  for (size_t chars = size_t(4 * o.distract) + 64; int64_t(story.size()) < o.distract; chars *= 2)
    story = ids_after(tok, task.prompt_text, task.ids,
                      story_lead + defer_distractor_text(o.seed, chars));
  story.resize(size_t(o.distract));
  const std::string question_lead = (o.distract > 0 || !o.chat) ? "\n\n" : "";
  // The question follows prose: tokenize it after a sentence of it.
  const std::string context = task.prompt_text + story_lead + kStoryStart + ".";
  const std::vector<int32_t> question =
      ids_after(tok, context, tok.encode(context, true), question_lead + kQuestion);

  task.distractor_tokens = o.distract;
  task.forced = story;
  task.forced.insert(task.forced.end(), question.begin(), question.end());
  const int64_t q0 = int64_t(task.ids.size()) + o.distract;
  task.question_span = {q0, q0 + int64_t(question.size())};
  return task;
}

}  // namespace kvscope::tasks
