// RULER's multi-value NIAH, variable tracking and common words extraction,
// and the text haystack (capture/tasks/{niah,vt,cwe,haystack}.*), on the two
// tokenizers KVScope's tests run (stories260K's llama2.c tok512 and SmolLM2's
// GGUF byte-level BPE): every planted fact is in the prompt and its marked
// span decodes back to it, the answers score as RULER's string_match_all,
// the same spec gives the same tokens and another seed others, the prompt
// length follows tokens=N, bad specs are refused naming the field; a real
// capture on stories260K records the spans as needle tokens and `kvscope
// why` explains it.
#include "capture/generate/engine.h"  // LibTorch first: its CHECK gives way to Catch2's
#undef CHECK
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "capture/tasks/cwe.h"
#include "capture/tasks/haystack.h"
#include "capture/tasks/niah.h"
#include "capture/tasks/task_common.h"
#include "capture/tasks/task_prompt.h"
#include "capture/tasks/vt.h"
#include "core/analysis/why.h"
#include "core/common/input_error.h"
#include "core/trace/reader.h"
#include "tests/support/paths.h"
#include "tests/tasks/task_test_util.h"

using namespace kvscope;
namespace fs = std::filesystem;

namespace {

using test::smol_tok;
using test::stories_dir;
using test::stories_tok;

// The text haystack (scripts/fetch-haystack writes it; scripts/test runs that).
void require_haystack() {
  const std::string path = tasks::default_haystack_path();
  if (!fs::exists(path))
    FAIL(path + " is missing: run scripts/fetch-haystack (Debian package bible-kjv)");
}

std::string decode(const tokenizer::Tokenizer& tok, const std::vector<int32_t>& ids,
                   std::pair<int64_t, int64_t> span) {
  return tok.decode(std::vector<int32_t>(ids.begin() + span.first, ids.begin() + span.second));
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// The message of the InputError `f` throws ("" when none).
template <class F>
std::string input_error(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Spans in prompt order, each within the prompt, none overlapping the next
// by more than the one token BPE may merge across a boundary.
void check_spans(const std::vector<std::pair<int64_t, int64_t>>& spans, size_t n_ids) {
  for (size_t i = 0; i < spans.size(); ++i) {
    CHECK(spans[i].first < spans[i].second);
    CHECK(spans[i].second <= int64_t(n_ids));
    if (i > 0) CHECK(spans[i].first + 1 >= spans[i - 1].second);
  }
}

struct Tok {
  const char* name;
  const tokenizer::Tokenizer& (*get)();
};
const Tok kTokenizers[] = {{"stories260K tok512", stories_tok}, {"SmolLM2 GGUF", smol_tok}};

}  // namespace

TEST_CASE("answers score as RULER's string_match_all", "[tasks][score]") {
  const std::vector<std::string> expected = {"QXKZB", "MRTLA", "48213"};
  CHECK(tasks::answers_found(expected, "they are: QXKZB, MRTLA and 48213") == 3);
  CHECK(tasks::answer_score(expected, "they are: QXKZB, MRTLA and 48213") == 1.0);
  // Case does not matter (RULER lowercases both sides); a part scores its share.
  CHECK(tasks::answers_found(expected, "qxkzb and mrtla") == 2);
  CHECK(tasks::answer_score(expected, "qxkzb and mrtla") == Approx(2.0 / 3.0));
  CHECK(tasks::answer_score(expected, "I do not know") == 0.0);
  CHECK(tasks::answer_score({}, "anything") == 1.0);
  CHECK(tasks::join_answers(expected) == "QXKZB, MRTLA, 48213");
  // The task entry point gives every task its list of answers.
  const tasks::TaskPrompt needle = tasks::build_task("needle:tokens=200", stories_tok(), false);
  CHECK(needle.answers == std::vector<std::string>{needle.answer});
  const tasks::TaskPrompt vt = tasks::build_task("vt:tokens=450,hops=2", stories_tok(), false);
  CHECK(vt.answers.size() == 3);
  CHECK(vt.answer == tasks::join_answers(vt.answers));
  CHECK(tasks::answer_score(vt.answers, vt.answer) == 1.0);
  // How every front end words a task found in part (and only then).
  CHECK(analysis::partial_answers(0, 0.75) == "75 % of the answers found");
  CHECK(analysis::partial_answers(0, 0.0).empty());
  CHECK(analysis::partial_answers(1, 1.0).empty());
  CHECK(analysis::partial_answers(-1, NAN).empty());
}

TEST_CASE("vt: the asked chain is planted in order and every statement is marked", "[tasks][vt]") {
  for (const Tok& tk : kTokenizers) {
    const tokenizer::Tokenizer& tok = tk.get();
    for (int64_t chains : {1, 2})
      for (int64_t hops : {1, 3})
        for (double depth : {-1.0, 0.0, 1.0}) {
          tasks::VtOptions o;
          o.tokens = 480;
          o.chains = chains;
          o.hops = hops;
          o.depth = depth;
          o.seed = 3;
          const tasks::VtTask t = tasks::make_vt_task(tok, o);
          INFO(tk.name << ", chains " << chains << ", hops " << hops << ", depth " << depth);
          const std::string& p = t.prompt_text;
          REQUIRE(t.answers.size() == size_t(hops + 1));
          CHECK(t.value.size() == 5);
          std::set<std::string> names(t.answers.begin(), t.answers.end());
          CHECK(names.size() == t.answers.size());
          for (const std::string& n : t.answers) {
            CHECK(n.size() == 5);
            CHECK(n.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ") == std::string::npos);
          }
          // Every chain's statements, each once; the asked chain in order.
          CHECK(count(p, "VAR ") == size_t(chains * (2 * hops + 1)));
          CHECK(count(p, " = " + t.value) == 1);
          size_t at = 0;
          REQUIRE(t.needle_spans.size() == size_t(hops + 1));
          check_spans(t.needle_spans, t.ids.size());
          for (int64_t k = 0; k <= hops; ++k) {
            const std::string statement = "VAR " + t.answers[size_t(k)] + " = " +
                                          (k == 0 ? t.value : "VAR " + t.answers[size_t(k - 1)]);
            INFO("statement " << statement);
            CHECK(count(p, statement) == 1);
            const size_t pos = p.find(statement);
            CHECK(pos >= at);
            at = pos;
            const std::string span = decode(tok, t.ids, t.needle_spans[size_t(k)]);
            CHECK_THAT(span, Catch::Contains(statement));
            CHECK(count(span, "VAR ") <= size_t(k == 0 ? 2 : 3));  // and a neighbour's start
          }
          // depth 0: the value before any filler; depth 1: nothing but chains after it.
          const size_t first = p.find("VAR " + t.answers[0] + " = " + t.value);
          if (depth == 0.0)
            CHECK(p.substr(0, first).find("The grass is green") == std::string::npos);
          if (depth == 1.0) CHECK(p.substr(first).find("The grass is green") == std::string::npos);
          CHECK_THAT(decode(tok, t.ids, t.question_span),
                     Catch::Contains("assigned the value " + t.value));
          CHECK(t.question_span.first + 1 >= t.needle_spans.back().second);
          CHECK(p.find("they are:") == p.size() - 9);
        }
  }
}

TEST_CASE("vt: deterministic in the seed, distractor chains hold other values", "[tasks][vt]") {
  const tokenizer::Tokenizer& tok = smol_tok();
  tasks::VtOptions o = tasks::parse_vt_spec("vt:tokens=600,chains=4,hops=3,seed=9");
  CHECK(o.chains == 4);
  CHECK(o.hops == 3);
  CHECK(o.depth < 0);
  const tasks::VtTask a = tasks::make_vt_task(tok, o), b = tasks::make_vt_task(tok, o);
  CHECK(a.ids == b.ids);
  CHECK(a.answers == b.answers);
  CHECK(a.needle_spans == b.needle_spans);
  std::set<std::string> values, first_names;
  std::set<std::vector<int32_t>> prompts;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    o.seed = seed;
    const tasks::VtTask t = tasks::make_vt_task(tok, o);
    values.insert(t.value);
    first_names.insert(t.answers[0]);
    prompts.insert(t.ids);
    // The other chains' values are not the asked one.
    size_t eq = 0;
    for (size_t p = t.prompt_text.find(" = "); p != std::string::npos;
         p = t.prompt_text.find(" = ", p + 1))
      eq += std::isdigit(static_cast<unsigned char>(t.prompt_text[p + 3])) ? 1 : 0;
    CHECK(eq == 4);
    CHECK(count(t.prompt_text, " = " + t.value) == 1);
  }
  CHECK(values.size() == 12);
  CHECK(first_names.size() == 12);
  CHECK(prompts.size() == 12);
}

TEST_CASE("cwe: common words occur freq times, the others rare times, each occurrence marked",
          "[tasks][cwe]") {
  for (const Tok& tk : kTokenizers) {
    const tokenizer::Tokenizer& tok = tk.get();
    // stories260K's 512-token context holds fewer common words than RULER's 10 x 6.
    const bool stories = &tk.get() == &stories_tok();
    for (const char* spec : {stories ? "cwe:tokens=480,top=4,freq=4" : "cwe:tokens=1000",
                             stories ? "cwe:tokens=480,top=3,freq=5,rare=2,seed=5"
                                     : "cwe:tokens=1000,top=4,freq=9,rare=2,seed=5"}) {
      INFO(tk.name << ", " << spec);
      const tasks::CweOptions o = tasks::resolve_cwe_defaults(tasks::parse_cwe_spec(spec));
      const tasks::CweTask t = tasks::make_cwe_task(tok, o);
      REQUIRE(t.answers.size() == size_t(o.top));
      // Parse the numbered list back: "1. word 2. word ...".
      const size_t begin = t.prompt_text.find("\n1. ") + 1;
      const size_t end = t.prompt_text.find("\nQuestion: ");
      std::istringstream list(t.prompt_text.substr(begin, end - begin));
      std::map<std::string, int64_t> freq;
      std::vector<std::string> order;
      std::string number, word;
      int64_t expect_number = 1;
      while (list >> number >> word) {
        CHECK(number == std::to_string(expect_number++) + ".");
        ++freq[word];
        order.push_back(word);
      }
      CHECK(int64_t(order.size()) == t.list_entries);
      CHECK(int64_t(freq.size()) == t.distinct_words);
      CHECK(t.distinct_words > o.top);
      for (const auto& [w, n] : freq) {
        const bool common = std::find(t.answers.begin(), t.answers.end(), w) != t.answers.end();
        INFO(w);
        CHECK(n == (common ? o.freq : o.rare));
      }
      // One span for each occurrence of a common word, decoding back to it.
      REQUIRE(t.needle_spans.size() == size_t(o.top * o.freq));
      check_spans(t.needle_spans, t.ids.size());
      size_t s = 0;
      for (const std::string& w : order) {
        if (std::find(t.answers.begin(), t.answers.end(), w) == t.answers.end()) continue;
        CHECK_THAT(decode(tok, t.ids, t.needle_spans[s]), Catch::Contains(w));
        ++s;
      }
      CHECK_THAT(decode(tok, t.ids, t.question_span),
                 Catch::Contains("What are the " + std::to_string(o.top) + " most common words"));
      // No common word hides inside another word of the list (so containment
      // in the answer means the word was named).
      for (const auto& [w, n] : freq)
        for (const std::string& c : t.answers)
          if (w != c) CHECK(w.find(c) == std::string::npos);
      // Deterministic; another seed draws other words.
      CHECK(tasks::make_cwe_task(tok, o).ids == t.ids);
      tasks::CweOptions other = o;
      other.seed += 1;
      CHECK(tasks::make_cwe_task(tok, other).answers != t.answers);
    }
  }
  // RULER's repeats: 6 and 1 below 4096 tokens, 30 and 3 from there on.
  CHECK(tasks::resolve_cwe_defaults(tasks::parse_cwe_spec("cwe")).freq == 6);
  CHECK(tasks::resolve_cwe_defaults(tasks::parse_cwe_spec("cwe")).rare == 1);
  CHECK(tasks::resolve_cwe_defaults(tasks::parse_cwe_spec("cwe:tokens=4096")).freq == 30);
  CHECK(tasks::resolve_cwe_defaults(tasks::parse_cwe_spec("cwe:tokens=4096")).rare == 3);
  // The built-in words: distinct, none inside another.
  const std::vector<std::string>& words = tasks::cwe_builtin_words();
  CHECK(words.size() >= 600);
  CHECK(std::set<std::string>(words.begin(), words.end()).size() == words.size());
  for (const std::string& a : words)
    for (const std::string& b : words)
      if (a != b && b.find(a) != std::string::npos) FAIL(a << " is inside " << b);
}

TEST_CASE("cwe: a long list goes past the built-in words with generated ones", "[tasks][cwe]") {
  const tokenizer::Tokenizer& tok = smol_tok();
  tasks::CweOptions o = tasks::parse_cwe_spec("cwe:tokens=6000,freq=3,rare=1,top=5");
  const tasks::CweTask t = tasks::make_cwe_task(tok, o);
  CHECK(t.distinct_words > int64_t(tasks::cwe_builtin_words().size()));
  CHECK(std::abs(int64_t(t.ids.size()) - 6000) <= 60);
  CHECK(t.needle_spans.size() == 15);
}

TEST_CASE("niah values=V: the asked key's V values at V places, all marked, all asked for",
          "[tasks][niah]") {
  for (const Tok& tk : kTokenizers) {
    const tokenizer::Tokenizer& tok = tk.get();
    for (int64_t keys : {1, 3})
      for (int64_t values : {2, 4}) {
        tasks::NiahOptions o = tasks::parse_niah_spec("niah:tokens=480,depth=0.25,seed=4");
        o.keys = keys;
        o.values = values;
        INFO(tk.name << ", keys " << keys << ", values " << values);
        const tasks::NiahTask t = tasks::make_niah_task(tok, o);
        CHECK(tasks::niah_kind(o) == "niah_multivalue");
        REQUIRE(t.answers.size() == size_t(values));
        CHECK(std::set<std::string>(t.answers.begin(), t.answers.end()).size() == t.answers.size());
        CHECK(t.answer == tasks::join_answers(t.answers));
        CHECK(count(t.prompt_text, "One of the special magic numbers for ") ==
              size_t(keys * values));
        CHECK(count(t.prompt_text, "numbers for " + t.key + " is: ") == size_t(values));
        REQUIRE(t.needle_spans.size() == size_t(values));
        check_spans(t.needle_spans, t.ids.size());
        std::set<std::string> found;
        for (const auto& span : t.needle_spans) {
          const std::string text = decode(tok, t.ids, span);
          CHECK(count(text, " is: ") == 1);
          for (const std::string& v : t.answers)
            if (text.find(t.key + " is: " + v + ".") != std::string::npos) found.insert(v);
        }
        CHECK(found.size() == size_t(values));  // each span holds one asked value
        CHECK(std::find(t.needle_spans.begin(), t.needle_spans.end(), t.needle_span) !=
              t.needle_spans.end());
        CHECK_THAT(t.prompt_text,
                   Catch::Contains("What are all the special magic numbers for " + t.key));
        CHECK_THAT(t.prompt_text, Catch::EndsWith("mentioned in the provided text are"));
        // Spread out: filler between every two asked needles (SmolLM2's 480
        // tokens hold 20 fillers; tok512's only a few, so needles may meet).
        if (&tok == &smol_tok())
          for (size_t i = 1; i < t.needle_spans.size(); ++i)
            CHECK_THAT(decode(tok, t.ids, {t.needle_spans[i - 1].second, t.needle_spans[i].first}),
                       Catch::Contains("grass is green"));
      }
  }
  // values=1 is the task as before (the default): one answer, one span.
  const tasks::NiahOptions d = tasks::parse_niah_spec("niah:tokens=480,seed=4");
  const tasks::NiahTask t = tasks::make_niah_task(stories_tok(), d);
  CHECK(t.answers == std::vector<std::string>{t.answer});
  CHECK(t.needle_spans == std::vector<std::pair<int64_t, int64_t>>{t.needle_span});
  CHECK(tasks::niah_kind(d) == "niah_multikey");
}

TEST_CASE("haystack=text: real prose around the facts, from the installed text or text=PATH",
          "[tasks][haystack]") {
  require_haystack();
  for (const Tok& tk : kTokenizers) {
    const tokenizer::Tokenizer& tok = tk.get();
    INFO(tk.name);
    const tasks::NiahTask n = tasks::make_niah_task(
        tok,
        tasks::parse_niah_spec("niah:tokens=480,keys=2,values=2,depth=0.3,haystack=text,seed=2"));
    CHECK_THAT(n.prompt_text, Catch::Contains("In the beginning God created the heaven"));
    CHECK(n.prompt_text.find("The grass is green") == std::string::npos);
    for (const auto& span : n.needle_spans)
      CHECK_THAT(decode(tok, n.ids, span), Catch::Contains("numbers for " + n.key + " is: "));
    CHECK_THAT(n.prompt_text, Catch::Contains("\nWhat are all the special magic numbers"));
    // Facts sit between sentences: each needle follows ". " or the intro
    // (SmolLM2's haystack is long enough that none sits after the last, cut
    // sentence).
    for (size_t p = n.prompt_text.find("One of the special"); p != std::string::npos;
         p = n.prompt_text.find("One of the special", p + 1)) {
      const char before = n.prompt_text[p - 2];
      if (&tok == &smol_tok())
        CHECK((before == '.' || before == '?' || before == '!' || n.prompt_text[p - 1] == '\n'));
    }
    const tasks::VtTask v =
        tasks::make_vt_task(tok, tasks::parse_vt_spec("vt:tokens=480,haystack=text,seed=2"));
    CHECK_THAT(v.prompt_text, Catch::Contains("In the beginning God created the heaven"));
    for (size_t k = 0; k < v.answers.size(); ++k)
      CHECK_THAT(decode(tok, v.ids, v.needle_spans[k]), Catch::Contains("VAR " + v.answers[k]));
  }
  // text=PATH: any UTF-8 text; repeated from its start when too short.
  const std::string path = test::temp_dir() + "/own.txt";
  std::ofstream(path) << "Call me Ishmael. Some years ago, never mind how long precisely, I went "
                         "to sea.\nIt is a way I have of driving off the spleen.\n";
  const tasks::NiahTask own = tasks::make_niah_task(
      stories_tok(), tasks::parse_niah_spec("niah:tokens=300,keys=1,text=" + path));
  CHECK(count(own.prompt_text, "Call me Ishmael.") >= 2);
  CHECK(own.prompt_text.find("The grass is green") == std::string::npos);
  CHECK(std::abs(int64_t(own.ids.size()) - 300) <= 6);
}

TEST_CASE("a missing or bad text haystack is refused naming the file and the fix",
          "[tasks][haystack]") {
  const std::string dir = test::temp_dir();
  CHECK(input_error([&] {
          tasks::make_niah_task(stories_tok(),
                                tasks::parse_niah_spec("niah:text=" + dir + "/none.txt"));
        }) == dir + "/none.txt: niah:text: cannot be read (expected a UTF-8 text file)");
  std::ofstream(dir + "/latin1.txt") << "caf\xe9 au lait. ";
  CHECK(input_error([&] {
          tasks::make_vt_task(stories_tok(),
                              tasks::parse_vt_spec("vt:tokens=300,text=" + dir + "/latin1.txt"));
        }) == dir + "/latin1.txt: vt:text: is not UTF-8 text (byte 3 is not well-formed)");
  // The default file: the message says how to install it.
  const char* old = std::getenv("KVSCOPE_HAYSTACK_TEXT");
  const std::string saved = old ? old : "";
  setenv("KVSCOPE_HAYSTACK_TEXT", (dir + "/not-installed/kjv.txt").c_str(), 1);
  CHECK(tasks::default_haystack_path() == dir + "/not-installed/kjv.txt");
  const std::string message =
      input_error([] { tasks::build_task("niah:haystack=text", stories_tok(), false); });
  if (old)
    setenv("KVSCOPE_HAYSTACK_TEXT", saved.c_str(), 1);
  else
    unsetenv("KVSCOPE_HAYSTACK_TEXT");
  CHECK(message == dir +
                       "/not-installed/kjv.txt: niah:haystack: the text haystack is not "
                       "installed: run scripts/fetch-haystack (it writes the King James Bible "
                       "from Debian's bible-kjv package there), or set KVSCOPE_HAYSTACK_TEXT or "
                       "give text=PATH");
}

TEST_CASE("tokens=N: the new tasks' prompts are within a few % of N on both tokenizers",
          "[tasks][length]") {
  require_haystack();
  struct Case {
    const char* spec;
    int64_t tokens;
  };
  for (const Tok& tk : kTokenizers) {
    const bool stories = std::string(tk.name).find("stories") != std::string::npos;
    // stories260K's context is 512 tokens; SmolLM2's 8192.
    // tok512 spends a token on each digit and capital: smaller tasks fit it.
    const std::vector<int64_t> lengths =
        stories ? std::vector<int64_t>{450, 500} : std::vector<int64_t>{1000, 6000};
    const std::vector<std::string> specs =
        stories ? std::vector<std::string>{"vt:hops=2",
                                           "vt:chains=2,hops=2,haystack=text",
                                           "cwe:top=4,freq=4",
                                           "cwe:top=3,freq=4,rare=2",
                                           "niah:keys=1,haystack=text",
                                           "niah:keys=1,values=3,haystack=text"}
                : std::vector<std::string>{"vt",
                                           "vt:chains=3,hops=4,haystack=text",
                                           "cwe",
                                           "cwe:top=5,freq=4,rare=2",
                                           "niah:keys=1,haystack=text",
                                           "niah:keys=2,values=3,haystack=text"};
    for (int64_t n : lengths)
      for (const std::string& spec : specs)
        for (bool chat : {false, true}) {
          if (chat && stories) continue;  // tok512 has no chat template
          const std::string full = spec + (spec.find(':') == std::string::npos ? ":" : ",") +
                                   "tokens=" + std::to_string(n);
          const tasks::TaskPrompt p = tasks::build_task(full, tk.get(), chat);
          INFO(tk.name << ", " << full << (chat ? ", chat" : "") << ": " << p.ids.size()
                       << " tokens");
          CHECK(std::abs(double(p.ids.size()) - double(n)) <= std::max(4.0, 0.02 * double(n)));
        }
  }
}

TEST_CASE("new task specs: bad values name the field, the range and the value", "[tasks][spec]") {
  auto message = [](const std::string& spec) {
    return input_error([&] { tasks::parse_task_spec(spec); });
  };
  CHECK(tasks::is_vt_spec("vt"));
  CHECK_FALSE(tasks::is_vt_spec("vtx"));
  CHECK(tasks::is_cwe_spec("cwe:top=3"));
  CHECK(message("vt:hops=0") == "--task: vt:hops: expected an integer in [1, 32], got '0'");
  CHECK(message("vt:chains=17") == "--task: vt:chains: expected an integer in [1, 16], got '17'");
  CHECK(message("vt:depth=1.5") == "--task: vt:depth: expected a number in [0, 1], got '1.5'");
  CHECK(message("vt:tokens=12") ==
        "--task: vt:tokens: expected an integer in [64, 16777216], got '12'");
  CHECK(message("vt:haystack=essay") == "--task: vt:haystack: expected noise or text, got 'essay'");
  CHECK(message("vt:keys=2") ==
        "--task: vt:keys: unknown (expected tokens, chains, hops, depth, seed, haystack, text)");
  CHECK(message("cwe:top=0") == "--task: cwe:top: expected an integer in [1, 50], got '0'");
  CHECK(message("cwe:freq=1") == "--task: cwe:freq: expected an integer in [2, 1000], got '1'");
  CHECK(message("cwe:rare=6") == "--task: cwe:rare: expected an integer in [1, 5], got '6'");
  CHECK(message("cwe:freq=10,rare=10") ==
        "--task: cwe:rare: expected an integer in [1, 9], got '10'");
  CHECK(message("cwe:haystack=text") ==
        "--task: cwe:haystack: unknown (expected tokens, top, freq, rare, depth, seed)");
  CHECK(message("niah:values=17") ==
        "--task: niah:values: expected an integer in [1, 16], got '17'");
  CHECK(message("niah:text=") == "--task: niah:text: expected a value, got ''");
  CHECK(message("niah:haystack=noise,text=/x.txt") ==
        "--task: niah:text: gives the text of haystack=text, not of haystack=noise");
  CHECK(message("ruler") ==
        "--task: ruler: unknown task (expected needle[:tokens=N,depth=D,seed=S], "
        "defer[:tokens=N,distract=D,seed=S,depth=X], "
        "niah[:tokens=N,keys=K,values=V,depth=D,seed=S,haystack=noise|text], "
        "vt[:tokens=N,chains=C,hops=H,depth=D,seed=S,haystack=noise|text] or "
        "cwe[:tokens=N,top=K,freq=F,rare=R,seed=S])");
  // depth= is accepted by cwe (sweep plans give every task one) and changes nothing.
  CHECK(message("cwe:depth=0.3") == "");
  CHECK(tasks::build_task("cwe:tokens=450,top=4,freq=4,depth=0.9", stories_tok(), false).ids ==
        tasks::build_task("cwe:tokens=450,top=4,freq=4,depth=0.1", stories_tok(), false).ids);
  // Prompts too short for the facts say how long they must be.
  CHECK_THAT(input_error([] { tasks::build_task("vt:tokens=64,hops=8", stories_tok(), false); }),
             Catch::Matches("--task: vt:tokens: is 64, too small for the facts and the question "
                            "\\(expected >= [0-9]+ with this tokenizer\\)"));
  CHECK_THAT(input_error([] { tasks::build_task("cwe:tokens=64", stories_tok(), false); }),
             Catch::Matches("--task: cwe:tokens: is 64, too small for 10 common words x 6 and "
                            "the question \\(expected >= [0-9]+ with this tokenizer\\)"));
}

TEST_CASE("niah queries=Q: RULER's multi-query, every queried key's values asked and marked",
          "[tasks][niah]") {
  for (const bool chat : {false, true}) {
    INFO("chat " << chat);
    const tasks::TaskPrompt p =
        tasks::build_task("niah:tokens=600,keys=4,queries=3,values=2,seed=3", smol_tok(), chat);
    CHECK(p.kind == "niah_multiquery");
    REQUIRE(p.answers.size() == 6);  // 3 keys x 2 values
    REQUIRE(p.needle_spans.size() == 6);
    for (const std::string& a : p.answers) CHECK(count(p.prompt_text, a) == 1);
    for (auto [b, e] : p.needle_spans) {
      const std::string piece = decode(smol_tok(), p.ids, {b, e});
      CHECK(std::count_if(p.answers.begin(), p.answers.end(), [&](const std::string& a) {
              return piece.find(a) != std::string::npos;
            }) == 1);
    }
    // RULER's query: "a, b, and c", plural nouns.
    const std::string q = decode(smol_tok(), p.ids, p.question_spans[0]);
    CHECK_THAT(q, Catch::Contains("What are all the special magic numbers for "));
    CHECK(count(q, ", ") == 2);
    CHECK_THAT(q, Catch::Contains(", and "));
    // The 4th key's needles are distractors: in the prompt, not marked, not asked.
    CHECK(count(p.prompt_text, "One of the special magic numbers for ") == 8);
  }
  CHECK_THROWS_WITH(tasks::parse_task_spec("niah:keys=2,queries=3"),
                    Catch::Contains("niah:queries: expected an integer in [1, 2]"));
}

TEST_CASE("niah value=uuid, key=uuid: RULER's UUID needles", "[tasks][niah]") {
  const tasks::TaskPrompt p =
      tasks::build_task("niah:tokens=800,keys=3,value=uuid,key=uuid,seed=5", smol_tok(), false);
  CHECK(p.kind == "niah_multikey");
  REQUIRE(p.answers.size() == 1);
  auto is_uuid4 = [](const std::string& u) {
    if (u.size() != 36 || u[14] != '4' || std::string("89ab").find(u[19]) == std::string::npos)
      return false;
    for (size_t i = 0; i < u.size(); ++i)
      if ((i == 8 || i == 13 || i == 18 || i == 23) ? u[i] != '-'
                                                    : !std::isxdigit(u[i]) || std::isupper(u[i]))
        return false;
    return true;
  };
  CHECK(is_uuid4(p.answers[0]));
  CHECK(count(p.prompt_text, p.answers[0]) == 1);
  CHECK_THAT(p.prompt_text, Catch::StartsWith("Some special magic uuids are hidden"));
  CHECK_THAT(p.prompt_text, Catch::Contains("What is the special magic uuid for "));
  CHECK(count(p.prompt_text, "One of the special magic uuids for ") == 3);
  // The asked key is a UUID too, and the same spec gives the same UUIDs.
  const size_t at = p.prompt_text.find("What is the special magic uuid for ") + 35;
  CHECK(is_uuid4(p.prompt_text.substr(at, 36)));
  CHECK(tasks::build_task("niah:tokens=800,keys=3,value=uuid,key=uuid,seed=5", smol_tok(), false)
            .ids == p.ids);
  CHECK(tasks::build_task("niah:tokens=800,keys=3,value=uuid,key=uuid,seed=6", smol_tok(), false)
            .answers != p.answers);
  CHECK_THROWS_WITH(tasks::parse_task_spec("niah:value=word"),
                    Catch::Contains("niah:value: expected number or uuid, got 'word'"));
}

TEST_CASE("niah haystack=needle: RULER's multikey_2, a haystack made of other keys' needles",
          "[tasks][niah]") {
  for (const int64_t tokens : {int64_t(500), int64_t(1500)}) {
    INFO("tokens " << tokens);
    const tasks::TaskPrompt p = tasks::build_task(
        "niah:tokens=" + std::to_string(tokens) + ",keys=1,haystack=needle,seed=2", smol_tok(),
        false);
    const size_t needles = count(p.prompt_text, "One of the special magic numbers for ");
    CHECK(needles > size_t(tokens / 30));  // the haystack is needles (about 20 tokens each)
    CHECK(count(p.prompt_text, "The grass is green") == 0);
    CHECK(std::abs(double(p.ids.size()) - double(tokens)) <= 0.03 * double(tokens));
    REQUIRE(p.needle_spans.size() == 1);
    const std::string asked = decode(smol_tok(), p.ids, p.needle_spans[0]);
    CHECK_THAT(asked, Catch::Contains(p.answers[0]));
    CHECK(count(p.prompt_text, p.answers[0]) == 1);
  }
  CHECK_THROWS_WITH(tasks::parse_task_spec("niah:haystack=needle,text=/tmp/x.txt"),
                    Catch::Contains("niah:text: gives the text of haystack=text"));
}

TEST_CASE("kvscope capture --task vt|cwe|niah:values on stories260K: needle roles, answers, why",
          "[tasks][cli]") {
  require_haystack();
  const std::string dir = test::temp_dir();
  const std::string model =
      " --model " + stories_dir() + "/stories260K.bin --tokenizer " + stories_dir() + "/tok512.bin";
  for (const std::string spec :
       {"vt:tokens=450,chains=2,hops=2,seed=2", "cwe:tokens=450,top=4,freq=4,seed=2",
        "niah:tokens=450,keys=1,values=3,seed=2", "vt:tokens=450,hops=3,haystack=text,depth=0.2"}) {
    INFO(spec);
    const std::string trace = dir + "/t.kvtrace.h5";
    std::string out;
    REQUIRE(test::run_command(test::kvscope_exe() + " capture" + model + " --task " + spec +
                                  " --policy h2o:heavy=32,recent=32 --capture received --max-new "
                                  "12 -q -o " +
                                  trace,
                              &out) == 0);
    INFO(out);
    // The trace marks exactly the task's spans as needle tokens, and not trivially.
    const tasks::TaskPrompt p = tasks::build_task(spec, stories_tok(), false);
    auto r = trace::TraceReader::open(trace);
    const std::vector<uint8_t> roles = r->token_roles(0, int64_t(p.ids.size()));
    std::vector<uint8_t> expected(p.ids.size(), 0);
    for (auto [b, e] : p.needle_spans)
      for (int64_t i = b; i < e; ++i) expected[size_t(i)] = 1;
    for (auto [b, e] : p.question_spans)  // the question's role wins a shared boundary token
      for (int64_t i = b; i < e; ++i) expected[size_t(i)] = 0;
    for (size_t i = 0; i < p.ids.size(); ++i) {
      INFO("token " << i);
      CHECK((roles[i] == uint8_t(trace::TokenRole::Needle)) == (expected[i] == 1));
    }
    CHECK(std::count(expected.begin(), expected.end(), 1) >= int64_t(4 * p.answers.size()));
    CHECK(r->run().task_kind == p.kind);
    CHECK(r->run().expected_answer == p.answer);
    // Success is RULER's string_match_all over the generated text.
    const bool all =
        tasks::answers_found(p.answers, r->generated_text()) == int64_t(p.answers.size());
    CHECK(r->task_success() == (all ? 1 : 0));
    CHECK(r->task_score() == tasks::answer_score(p.answers, r->generated_text()));
    const size_t n_answers = p.answers.size();
    CHECK_THAT(out, Catch::Contains("expected answers: ") || Catch::Contains("expected answer "));
    if (n_answers > 1) CHECK_THAT(out, Catch::Contains(" of " + std::to_string(n_answers)));

    std::string why;
    REQUIRE(test::run_command(test::kvscope_exe() + " why " + trace, &why) == 0);
    INFO(why);
    CHECK_THAT(why, Catch::Contains("task     " + p.kind + ", expected \"" + p.answer + "\""));
    CHECK_THAT(why, Catch::Contains("verdict  "));
  }
}
