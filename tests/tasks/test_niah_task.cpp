// RULER's needle-in-a-haystack (capture/tasks/niah.*) on stories260K's
// tokenizer: distinct keys, the asked needle's tokens are exactly its
// sentence (one token wider where BPE merges), distractors elsewhere and
// outside the span, deterministic in the seed; a real capture marks the
// asked needle as role 2 and scores success on the asked value.
#include "capture/generate/engine.h"  // LibTorch first: its CHECK gives way to Catch2's
#undef CHECK
#include <catch2/catch.hpp>

#include <set>

#include "capture/tasks/niah.h"
#include "core/common/input_error.h"
#include "tests/support/paths.h"

using namespace kvscope;

namespace {

generate::Engine stories_engine() {
  generate::ModelOptions o;
  o.model = test::shared_dir() + "/models/stories260K/stories260K.bin";
  o.tokenizer = test::shared_dir() + "/models/stories260K/tok512.bin";
  return generate::open_engine(o);
}

std::string decode(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& ids, int64_t b,
                   int64_t e) {
  return tok.decode(std::vector<int32_t>(ids.begin() + b, ids.begin() + e));
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("niah: the asked needle is marked, the distractors are elsewhere", "[tasks][niah]") {
  generate::Engine engine = stories_engine();
  const tokenizer::Tokenizer& tok = *engine.tokenizer;
  for (int64_t keys : {1, 4, 8}) {
    int64_t last_start = -1;  // the needle moves back as the depth grows
    for (double depth : {0.0, 0.5, 1.0}) {
      tasks::NiahOptions o;
      o.tokens = 480;
      o.keys = keys;
      o.depth = depth;
      o.seed = 11;
      const tasks::NiahTask t = tasks::make_niah_task(tok, o);
      INFO("keys " << keys << ", depth " << depth);
      const std::string prompt = decode(tok, t.ids, 0, int64_t(t.ids.size()));
      CHECK(t.answer.size() == 7);
      // Every needle sentence appears once, with a distinct key.
      CHECK(count(prompt, "One of the special magic numbers for ") == size_t(keys));
      CHECK(count(prompt, "special magic numbers for " + t.key + " is: " + t.answer) == 1);
      // The span holds the asked needle whole, and no other needle's value.
      const auto [nb, ne] = t.needle_span;
      const std::string span = decode(tok, t.ids, nb, ne);
      CHECK_THAT(span, Catch::Contains(t.key + " is: " + t.answer + "."));
      CHECK(count(span, " is: ") == 1);
      CHECK(nb > last_start);
      last_start = nb;
      // At depth 0 no filler precedes the asked needle; at depth 1 none follows it.
      const std::string before = decode(tok, t.ids, 0, nb),
                        after = decode(tok, t.ids, ne, int64_t(t.ids.size()));
      if (depth == 0.0) CHECK(before.find("The grass is green") == std::string::npos);
      if (depth == 1.0) CHECK(after.find("The grass is green") == std::string::npos);
      // The question asks for the key, after every needle (the spans may share
      // the one boundary token BPE merges).
      const auto [qb, qe] = t.question_span;
      CHECK(qb + 1 >= ne);
      CHECK_THAT(decode(tok, t.ids, qb, qe), Catch::Contains("magic number for " + t.key));
      CHECK(prompt.rfind("One of the special") < prompt.find("What is the special"));
    }
  }
}

TEST_CASE("niah: deterministic in the seed, keys distinct", "[tasks][niah]") {
  generate::Engine engine = stories_engine();
  const tokenizer::Tokenizer& tok = *engine.tokenizer;
  tasks::NiahOptions o = tasks::parse_niah_spec("niah:tokens=400,keys=16,depth=0.3,seed=5");
  CHECK(o.keys == 16);
  const tasks::NiahTask a = tasks::make_niah_task(tok, o), b = tasks::make_niah_task(tok, o);
  CHECK(a.ids == b.ids);
  CHECK(a.answer == b.answer);
  std::set<std::string> answers, keys;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    o.seed = seed;
    const tasks::NiahTask t = tasks::make_niah_task(tok, o);
    answers.insert(t.answer);
    keys.insert(t.key);
  }
  CHECK(answers.size() >= 18);  // 7-digit values from the seed
  CHECK(keys.size() >= 6);      // the asked key varies too
}

TEST_CASE("niah specs: bad keys and values name the field", "[tasks][niah]") {
  auto message = [](const std::string& spec) {
    try {
      tasks::parse_niah_spec(spec);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(tasks::is_niah_spec("niah"));
  CHECK_FALSE(tasks::is_niah_spec("niahx"));
  CHECK_THAT(message("niah:keys=17"), Catch::Contains("niah:keys: expected an integer in [1, 16]"));
  CHECK_THAT(message("niah:depth=2"), Catch::Contains("niah:depth: expected a number in [0, 1]"));
  CHECK_THAT(message("niah:tokens=abc"), Catch::Contains("niah:tokens"));
  CHECK_THAT(message("niah:colour=red"),
             Catch::Contains("niah:colour: unknown (expected tokens, keys, values, queries, depth, "
                             "seed, haystack, text, value, key)"));
}
