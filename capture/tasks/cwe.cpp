#include "capture/tasks/cwe.h"

#include <algorithm>
#include <set>

#include "capture/tasks/task_common.h"
#include "core/common/input_error.h"

namespace kvscope::tasks {

namespace {

// RULER's common_words_extraction template (synthetic/constants.py).
const char* kIntro =
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n";

constexpr int64_t kMaxTop = 50;

// Generated words past the built-in list: consonant-vowel syllables, three
// (70^3 words) then four (70^4), in an order scrambled by a multiplier
// coprime to the block sizes.
std::string generated_word(uint64_t i, uint64_t offset) {
  static const char kConsonants[] = "bdfgklmnprstvz";
  static const char kVowels[] = "aeiou";
  const uint64_t b3 = 70ull * 70 * 70, b4 = b3 * 70;
  int syllables = 3;
  uint64_t block = b3;
  if (i >= b3) i -= b3, syllables = 4, block = b4;
  uint64_t j = (i * 104729ull + offset) % block;
  std::string w;
  for (int s = 0; s < syllables; ++s, j /= 70) {
    w += kConsonants[(j % 70) / 5];
    w += kVowels[(j % 70) % 5];
  }
  return w;
}

// The words of a seed: the built-in ones shuffled, then generated ones that
// neither hold nor sit inside a common word (the first `top`) — so that a
// common word is contained in an answer only when the answer names it.
class WordPool {
 public:
  WordPool(uint64_t seed, int64_t top) : top_(top) {
    words_ = cwe_builtin_words();
    SplitMix rng{seed ^ 0x3C6EF372FE94F82Bull};
    rng.shuffle(&words_);
    offset_ = rng.next();
    builtin_.insert(words_.begin(), words_.end());
  }
  const std::string& at(size_t i) {
    while (words_.size() <= i) {
      std::string w = generated_word(next_++, offset_);
      bool clash = builtin_.count(w) > 0;
      for (int64_t c = 0; c < top_ && !clash; ++c)
        clash = w.find(words_[size_t(c)]) != std::string::npos ||
                words_[size_t(c)].find(w) != std::string::npos;
      if (!clash) words_.push_back(std::move(w));
    }
    return words_[i];
  }

 private:
  std::vector<std::string> words_;
  std::set<std::string> builtin_;
  int64_t top_ = 0;
  uint64_t next_ = 0, offset_ = 0;
};

struct Rendered {
  std::string prompt_text;
  std::vector<std::pair<size_t, size_t>> common;  // every occurrence of a common word
  std::pair<size_t, size_t> question;
  int64_t entries = 0;
};

}  // namespace

const std::vector<std::string>& cwe_builtin_words() {
  static const std::vector<std::string> words = {
      "anchor",    "apron",    "attic",     "autumn",     "badge",    "bakery",   "balcony",
      "ballad",    "bamboo",   "bandage",   "banjo",      "banner",   "barley",   "barrel",
      "basket",    "beacon",   "beaver",    "bellows",    "berry",    "biscuit",  "blanket",
      "blossom",   "bonnet",   "border",    "bottle",     "boulder",  "bracelet", "branch",
      "breeze",    "brick",    "bridge",    "brook",      "broom",    "bubble",   "bucket",
      "buckle",    "budget",   "buffalo",   "bundle",     "burrow",   "butter",   "button",
      "cabbage",   "cabin",    "cactus",    "camera",     "canal",    "canoe",    "canvas",
      "canyon",    "captain",  "carpet",    "carrot",     "castle",   "cattle",   "cavern",
      "cedar",     "cellar",   "chalk",     "chapel",     "cherry",   "chimney",  "circus",
      "clover",    "cobble",   "coconut",   "collar",     "comet",    "copper",   "cottage",
      "cotton",    "country",  "coyote",    "cradle",     "crayon",   "creek",    "cricket",
      "crystal",   "cupboard", "curtain",   "cushion",    "daisy",    "dancer",   "desert",
      "diamond",   "dinner",   "doctor",    "dolphin",    "donkey",   "dragon",   "drawer",
      "dresser",   "eagle",    "elbow",     "engine",     "fabric",   "feather",  "fence",
      "ferry",     "fiddle",   "finger",    "flannel",    "flute",    "forest",   "fossil",
      "fountain",  "fridge",   "furnace",   "gadget",     "galaxy",   "gallery",  "garlic",
      "gazelle",   "ginger",   "glacier",   "glove",      "goblet",   "goose",    "granite",
      "grape",     "gravel",   "griddle",   "guitar",     "gutter",   "hammer",   "hamster",
      "harvest",   "hatchet",  "hazel",     "helmet",     "hermit",   "hickory",  "highway",
      "hollow",    "honey",    "hornet",    "hostel",     "hunter",   "iceberg",  "igloo",
      "island",    "jacket",   "jasmine",   "jelly",      "jewel",    "jigsaw",   "journal",
      "jungle",    "kennel",   "kettle",    "kitchen",    "kitten",   "ladder",   "lagoon",
      "lantern",   "laptop",   "laundry",   "lava",       "leather",  "lemon",    "letter",
      "library",   "lizard",   "lobster",   "locket",     "lumber",   "magnet",   "mailbox",
      "mammoth",   "mango",    "mantle",    "maple",      "marble",   "market",   "meadow",
      "medal",     "melody",   "mitten",    "monkey",     "mosaic",   "mountain", "muffin",
      "museum",    "mustard",  "napkin",    "needle",     "nephew",   "noodle",   "notebook",
      "nutmeg",    "oatmeal",  "ocean",     "olive",      "onion",    "oyster",   "paddle",
      "palace",    "pancake",  "panther",   "parcel",     "parrot",   "pasture",  "peanut",
      "pebble",    "pelican",  "pepper",    "piano",      "pickle",   "pigeon",   "pillow",
      "pilot",     "pirate",   "planet",    "plaster",    "plum",     "pocket",   "poet",
      "pony",      "poppy",    "porch",     "potato",     "pottery",  "prairie",  "pretzel",
      "puddle",    "pumpkin",  "puppet",    "quarry",     "quilt",    "rabbit",   "radish",
      "raft",      "railway",  "raisin",    "raven",      "recipe",   "reef",     "rhubarb",
      "robin",     "rocket",   "rooster",   "rudder",     "saddle",   "sailor",   "salmon",
      "sandal",    "satchel",  "saucer",    "scarf",      "scissors", "sheriff",  "shovel",
      "shrimp",    "silver",   "skillet",   "sled",       "snail",    "socket",   "sparrow",
      "spider",    "spinach",  "sponge",    "spruce",     "squirrel", "stable",   "statue",
      "stencil",   "stove",    "straw",     "stream",     "sugar",    "summit",   "sunset",
      "swamp",     "sweater",  "syrup",     "tablet",     "tailor",   "teapot",   "temple",
      "tennis",    "thimble",  "thistle",   "thunder",    "ticket",   "tiger",    "timber",
      "toaster",   "tomato",   "tractor",   "trumpet",    "tulip",    "tunnel",   "turkey",
      "turnip",    "turtle",   "umbrella",  "valley",     "velvet",   "village",  "violet",
      "volcano",   "wagon",    "walnut",    "walrus",     "wardrobe", "weasel",   "whistle",
      "willow",    "window",   "winter",    "wizard",     "wombat",   "yogurt",   "zebra",
      "absorb",    "adjust",   "admire",    "advise",     "applaud",  "arrange",  "attach",
      "balance",   "battle",   "beckon",    "bicker",     "blink",    "boast",    "borrow",
      "bounce",    "breathe",  "bristle",   "browse",     "build",    "bury",     "calculate",
      "capture",   "carry",    "carve",     "celebrate",  "chatter",  "cherish",  "chuckle",
      "clap",      "climb",    "collect",   "comfort",    "compare",  "complain", "confess",
      "construct", "cough",    "crawl",     "create",     "crouch",   "dangle",   "decide",
      "deliver",   "depart",   "describe",  "dig",        "discover", "divide",   "drift",
      "drizzle",   "educate",  "embrace",   "emerge",     "enjoy",    "erase",    "escape",
      "examine",   "explain",  "explore",   "fasten",     "fetch",    "fidget",   "flicker",
      "float",     "flourish", "forgive",   "gallop",     "gather",   "giggle",   "glide",
      "glisten",   "gobble",   "grumble",   "guard",      "guess",    "handle",   "hesitate",
      "hover",     "hurry",    "imagine",   "improve",    "inform",   "inspect",  "invent",
      "invite",    "juggle",   "kneel",     "knit",       "laugh",    "launch",   "linger",
      "march",     "measure",  "melt",      "memorize",   "mingle",   "mumble",   "murmur",
      "navigate",  "nibble",   "notice",    "observe",    "obtain",   "organize", "paint",
      "perform",   "persuade", "plunge",    "polish",     "ponder",   "pounce",   "practice",
      "prepare",   "preserve", "protect",   "punish",     "purchase", "question", "quiver",
      "rattle",    "realize",  "recall",    "recite",     "record",   "reflect",  "rejoice",
      "relax",     "remember", "repair",    "rescue",     "retreat",  "ripple",   "roam",
      "rustle",    "scatter",  "scramble",  "scribble",   "search",   "settle",   "shiver",
      "shuffle",   "simmer",   "sketch",    "slither",    "smile",    "sneeze",   "soothe",
      "sparkle",   "splash",   "sprinkle",  "squeeze",    "stagger",  "stitch",   "stroll",
      "stumble",   "suggest",  "surrender", "swallow",    "swerve",   "tremble",  "trickle",
      "twinkle",   "unfold",   "vanish",    "wander",     "warble",   "whisper",  "whittle",
      "wiggle",    "wobble",   "wonder",    "worry",      "wrestle",  "yawn",     "abundant",
      "ancient",   "anxious",  "bashful",   "bitter",     "blissful", "bold",     "brave",
      "breezy",    "brief",    "bright",    "brittle",    "bumpy",    "calm",     "careful",
      "cheerful",  "chilly",   "clever",    "clumsy",     "cozy",     "crisp",    "cruel",
      "curious",   "damp",     "dapper",    "dazzling",   "delicate", "dizzy",    "drowsy",
      "dusty",     "eager",    "elegant",   "empty",      "famous",   "fancy",    "fierce",
      "fluffy",    "foggy",    "fragile",   "frantic",    "friendly", "frosty",   "fuzzy",
      "gentle",    "giant",    "gigantic",  "glossy",     "golden",   "graceful", "grumpy",
      "handsome",  "happy",    "harsh",     "hasty",      "heavy",    "helpful",  "honest",
      "humble",    "hungry",   "jolly",     "joyful",     "kind",     "lazy",     "lively",
      "lonely",    "loyal",    "lucky",     "majestic",   "merry",    "messy",    "mighty",
      "modern",    "modest",   "muddy",     "mysterious", "narrow",   "nervous",  "nimble",
      "noble",     "noisy",    "odd",       "orange",     "patient",  "peaceful", "playful",
      "polite",    "precious", "proud",     "purple",     "quaint",   "quick",    "quiet",
      "rapid",     "rare",     "rigid",     "rocky",      "rough",    "royal",    "rusty",
      "sandy",     "scarce",   "shaggy",    "shallow",    "sharp",    "shiny",    "shy",
      "silent",    "silky",    "simple",    "sleepy",     "slender",  "slippery", "sloppy",
      "smooth",    "sneaky",   "soggy",     "solid",      "sour",     "spicy",    "splendid",
      "steady",    "sticky",   "stormy",    "sturdy",     "sunny",    "swift",    "tame",
      "tender",    "thirsty",  "tidy",      "timid",      "tiny",     "tough",    "tranquil",
      "tricky",    "unusual",  "vast",      "vivid",      "warm",     "wealthy",  "weary",
      "wicked",    "wild",     "wise",      "witty",      "wooden",   "worried",  "young",
      "zealous"};
  return words;
}

bool is_cwe_spec(const std::string& spec) {
  return spec == "cwe" || spec.rfind("cwe:", 0) == 0;
}

CweOptions resolve_cwe_defaults(CweOptions o) {
  const bool short_context = o.tokens < 4096;  // RULER's switch to fewer repeats
  if (o.freq <= 0) o.freq = short_context ? 6 : 30;
  if (o.rare <= 0) o.rare = std::min<int64_t>(short_context ? 1 : 3, o.freq - 1);
  return o;
}

CweOptions parse_cwe_spec(const std::string& spec) {
  const TaskSpec s("cwe", spec, {"tokens", "top", "freq", "rare", "depth", "seed"});
  CweOptions o;
  o.tokens = s.integer("tokens", 64, int64_t(1) << 24, o.tokens);
  o.top = s.integer("top", 1, kMaxTop, o.top);
  o.freq = s.integer("freq", 2, 1000, 0);
  o.seed = uint64_t(s.integer("seed", 0, int64_t(1) << 62, int64_t(o.seed)));
  s.number("depth", 0, 1, 0);  // accepted for sweep plans; the list has no depth
  const int64_t freq = resolve_cwe_defaults(o).freq;
  o.rare = s.integer("rare", 1, freq - 1, 0);
  return o;
}

CweTask make_cwe_task(const tokenizer::Tokenizer& tok, const CweOptions& options) {
  const CweOptions o = resolve_cwe_defaults(options);
  if (o.rare >= o.freq)
    throw InputError("--task", "cwe:rare",
                     "expected an integer in [1, " + std::to_string(o.freq - 1) + "], got '" +
                         std::to_string(o.rare) + "'");
  WordPool pool(o.seed, o.top);
  CweTask task;
  for (int64_t c = 0; c < o.top; ++c) task.answers.push_back(pool.at(size_t(c)));
  task.answer = join_answers(task.answers);
  const std::string n = std::to_string(o.top);
  const std::string question =
      "Question: What are the " + n + " most common words in the above list?";
  const std::string answer_prefix =
      " Answer: The top " + n + " words that appear most often in the list are:";

  // The list with `rare_words` other words: entries shuffled, numbered from 1.
  auto render = [&](int64_t rare_words) {
    std::vector<int64_t> entries;
    for (int64_t c = 0; c < o.top; ++c) entries.insert(entries.end(), size_t(o.freq), c);
    for (int64_t w = 0; w < rare_words; ++w)
      entries.insert(entries.end(), size_t(o.rare), o.top + w);
    SplitMix order{o.seed ^ 0xA54FF53A5F1D36F1ull};
    order.shuffle(&entries);
    Rendered r;
    std::string user = kIntro;
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i) user += ' ';
      user += std::to_string(i + 1);
      user += ". ";
      const std::string& word = pool.at(size_t(entries[i]));
      if (entries[i] < o.top) r.common.emplace_back(user.size(), user.size() + word.size());
      user += word;
    }
    user += "\n";
    const size_t question_begin = user.size();
    user += question;
    const UserPrompt wrapped = wrap_user_message(tok, o.chat, user, kIntro, answer_prefix);
    r.prompt_text = wrapped.text;
    const size_t offset = wrapped.offset;
    for (auto& [b, e] : r.common) b += offset, e += offset;
    r.question = {question_begin + offset, user.size() + offset};
    r.entries = int64_t(entries.size());
    return r;
  };
  auto tokens_of = [&](int64_t rare_words) {
    return int64_t(tok.encode(render(rare_words).prompt_text, true).size());
  };
  const int64_t smallest = tokens_of(0);
  if (smallest > o.tokens)
    throw InputError("--task", "cwe:tokens",
                     "is " + std::to_string(o.tokens) + ", too small for " + n +
                         " common words x " + std::to_string(o.freq) +
                         " and the question (expected >= " + std::to_string(smallest) +
                         " with this tokenizer)");
  // Tokens an entry takes, from a sample of the list.
  std::string sample;
  for (size_t i = 0; i < 200; ++i) sample += std::to_string(i + 1) + ". " + pool.at(i) + " ";
  const double per_entry = double(tok.encode(sample, false).size()) / 200.0;
  const double per_word = per_entry * double(o.rare);
  const int64_t rare_words =
      fit_units(o.tokens, int64_t(double(o.tokens - smallest) / per_word), per_word, 0, tokens_of);

  const Rendered r = render(rare_words);
  task.prompt_text = r.prompt_text;
  task.ids = tok.encode(task.prompt_text, true);
  task.list_entries = r.entries;
  task.distinct_words = o.top + rare_words;
  std::vector<std::pair<size_t, size_t>> ranges = r.common;
  ranges.push_back(r.question);
  const auto spans = token_spans(tok, task.prompt_text, task.ids, ranges);
  task.needle_spans.assign(spans.begin(), spans.end() - 1);
  task.question_span = spans.back();
  return task;
}

}  // namespace kvscope::tasks
