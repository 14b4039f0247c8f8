#include "capture/tasks/needle.h"
#include "capture/tasks/task_common.h"

#include <algorithm>
#include <cstdlib>
#include <map>

#include "core/common/input_error.h"

namespace kvscope::tasks {

namespace {

const char* kIntro =
    "There is an important piece of information hidden inside a lot of irrelevant text. Find it "
    "and remember it. I will ask you about it.\n";

}  // namespace

const char* const kPasskeyFiller =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";

std::string passkey(uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return std::to_string(10000 + x % 90000);  // five digits
}

NeedleOptions parse_needle_spec(const std::string& spec) {
  NeedleOptions o;
  if (spec.rfind("needle", 0) != 0)
    throw InputError("--task", spec,
                     "unknown task (expected needle[:tokens=N,depth=D,seed=S], "
                     "defer[:tokens=N,distract=D,seed=S,depth=X], "
                     "niah[:tokens=N,keys=K,values=V,depth=D,seed=S,haystack=noise|text], "
                     "vt[:tokens=N,chains=C,hops=H,depth=D,seed=S,haystack=noise|text] or "
                     "cwe[:tokens=N,top=K,freq=F,rare=R,seed=S])");
  size_t colon = spec.find(':');
  std::string rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  size_t pos = 0;
  while (pos < rest.size()) {
    size_t comma = rest.find(',', pos);
    std::string item =
        rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t eq = item.find('=');
    std::string key = item.substr(0, eq),
                value = eq == std::string::npos ? "" : item.substr(eq + 1);
    char* end = nullptr;
    if (key == "tokens") {
      o.tokens = std::strtoll(value.c_str(), &end, 10);
      if (*end || o.tokens < 32)
        throw InputError("--task", "needle:tokens", "expected an integer >= 32");
    } else if (key == "depth") {
      o.depth = std::strtod(value.c_str(), &end);
      if (*end || o.depth < 0 || o.depth > 1)
        throw InputError("--task", "needle:depth", "expected 0..1");
    } else if (key == "seed") {
      o.seed = std::strtoull(value.c_str(), &end, 10);
      if (*end) throw InputError("--task", "needle:seed", "expected an integer");
    } else {
      throw InputError("--task", "needle:" + key, "unknown (expected tokens, depth, seed)");
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return o;
}

NeedleTask make_needle_task(const tokenizer::Tokenizer& tok, const NeedleOptions& o) {
  NeedleTask task;
  task.answer = passkey(o.seed);
  const std::string needle =
      "The pass key is " + task.answer + ". Remember it. " + task.answer + " is the pass key. ";
  const std::string question = "What is the pass key?";
  // Filler repetitions to reach the requested length.
  const int64_t per_filler =
      std::max<int64_t>(1, int64_t(tok.encode(kPasskeyFiller, false).size()));
  const int64_t fixed =
      int64_t(tok.encode(std::string(kIntro) + needle + question, false).size()) + 24;
  const int64_t fillers = std::max<int64_t>(2, (o.tokens - fixed) / per_filler);
  const int64_t before = static_cast<int64_t>(o.depth * double(fillers) + 0.5);
  std::string head = kIntro, tail;
  for (int64_t i = 0; i < before; ++i) head += kPasskeyFiller;
  for (int64_t i = before; i < fillers; ++i) tail += kPasskeyFiller;

  std::string user = head + needle + tail + question;
  const UserPrompt wrapped = wrap_user_message(tok, o.chat, user, kIntro, " The pass key is");
  task.prompt_text = wrapped.text;
  const std::string prefix = task.prompt_text.substr(0, wrapped.offset);  // the chat template's
  task.ids = tok.encode(task.prompt_text, true);
  // Token spans from the encodings of growing prefixes (BPE may merge across
  // a boundary by a token; the spans are then one token wider).
  auto count = [&](const std::string& text) { return int64_t(tok.encode(text, true).size()); };
  const int64_t needle_begin = count(prefix + head);
  const int64_t needle_end = count(prefix + head + needle);
  const int64_t question_begin = count(prefix + head + needle + tail);
  const int64_t question_end = count(prefix + user);
  task.needle_span = {std::max<int64_t>(0, needle_begin - 1), needle_end};
  task.question_span = {std::max<int64_t>(0, question_begin - 1), question_end};
  return task;
}

}  // namespace kvscope::tasks
