#include "capture/tasks/haystack.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "capture/tasks/needle.h"
#include "capture/tasks/task_common.h"
#include "capture/tokenizer/unicode.h"
#include "core/common/input_error.h"

namespace kvscope::tasks {

HaystackOptions parse_haystack(const TaskSpec& spec) {
  HaystackOptions o;
  o.text_path = spec.text("text", "");
  const std::string kind =
      spec.choice("haystack", {"noise", "text"}, o.text_path.empty() ? "noise" : "text");
  if (kind == "noise" && !o.text_path.empty())
    spec.fail("text", "gives the text of haystack=text, not of haystack=noise");
  o.kind = kind == "text" ? HaystackKind::Text : HaystackKind::Noise;
  return o;
}

std::string default_haystack_path() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v && *v ? v : "";
  };
  if (std::string p = env("KVSCOPE_HAYSTACK_TEXT"); !p.empty()) return p;
  std::string cache = env("KVSCOPE_CACHE_DIR");
  if (cache.empty()) {
    const std::string xdg = env("XDG_CACHE_HOME");
    cache =
        (xdg.empty() ? (env("HOME").empty() ? "/tmp" : env("HOME")) + "/.cache" : xdg) + "/kvscope";
  }
  return cache + "/haystack/kjv.txt";
}

std::shared_ptr<const HaystackText> load_haystack_text(const HaystackOptions& o,
                                                       const std::string& task) {
  const bool own = !o.text_path.empty();
  const std::string path = own ? o.text_path : default_haystack_path();
  const std::string field = task + (own ? ":text" : ":haystack");
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const HaystackText>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = loaded.find(path); it != loaded.end()) return it->second;

  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (own) throw InputError(path, field, "cannot be read (expected a UTF-8 text file)");
    throw InputError(path, field,
                     "the text haystack is not installed: run scripts/fetch-haystack (it writes "
                     "the King James Bible from Debian's bible-kjv package there), or set "
                     "KVSCOPE_HAYSTACK_TEXT or give text=PATH");
  }
  auto text = std::make_shared<HaystackText>();
  text->path = path;
  std::ostringstream buf;
  buf << in.rdbuf();
  text->bytes = buf.str();
  if (text->bytes.size() >= (size_t(1) << 32))
    throw InputError(path, field, "is larger than 4 GiB (expected a text of at most 4 GiB)");
  if (const size_t bad = tokenizer::unicode::find_invalid(text->bytes); bad != std::string::npos)
    throw InputError(path, field,
                     "is not UTF-8 text (byte " + std::to_string(bad) + " is not well-formed)");
  const std::string& b = text->bytes;
  auto space = [](char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
  };
  for (size_t i = 0; i < b.size();) {
    while (i < b.size() && space(b[i])) ++i;
    const size_t start = i;
    while (i < b.size() && !space(b[i])) ++i;
    if (i > start) text->words.emplace_back(uint32_t(start), uint32_t(i));
  }
  if (text->words.empty()) throw InputError(path, field, "holds no words (expected English text)");
  loaded[path] = text;
  return text;
}

std::vector<std::string> haystack_sentences(const HaystackText& text, int64_t words) {
  std::vector<std::string> sentences;
  std::string current;
  const size_t n = text.words.size();
  for (int64_t w = 0; w < words; ++w) {
    const auto [b, e] = text.words[size_t(w) % n];
    current.append(text.bytes, b, e - b);
    current += ' ';
    // A sentence ends at . ! or ?, perhaps followed by closing quotes or brackets.
    size_t k = e;
    while (k > b && (text.bytes[k - 1] == '"' || text.bytes[k - 1] == '\'' ||
                     text.bytes[k - 1] == ')' || text.bytes[k - 1] == ']'))
      --k;
    const char last = k > b ? text.bytes[k - 1] : 0;
    if (last == '.' || last == '!' || last == '?')
      sentences.push_back(std::move(current)), current.clear();
  }
  if (!current.empty()) sentences.push_back(std::move(current));
  return sentences;
}

std::vector<std::string> fit_haystack(
    const tokenizer::Tokenizer& tok, const HaystackOptions& o, const std::string& task,
    int64_t tokens, int64_t fixed,
    const std::function<std::string(const std::vector<std::string>&)>& render) {
  std::function<std::vector<std::string>(int64_t)> units;
  double per_unit = 1;
  int64_t min_units = 1;
  if (o.kind == HaystackKind::Noise) {
    units = [](int64_t n) { return std::vector<std::string>(size_t(n), kPasskeyFiller); };
    per_unit = double(std::max<size_t>(1, tok.encode(kPasskeyFiller, false).size()));
  } else {
    const std::shared_ptr<const HaystackText> text = load_haystack_text(o, task);
    units = [text](int64_t n) { return haystack_sentences(*text, n); };
    const int64_t sample = std::min<int64_t>(2000, int64_t(text->words.size()));
    std::string start;
    for (const std::string& s : units(sample)) start += s;
    per_unit = std::max(0.1, double(tok.encode(start, false).size()) / double(sample));
    min_units = 8;
  }
  auto tokens_of = [&](int64_t n) { return int64_t(tok.encode(render(units(n)), true).size()); };
  const int64_t smallest = tokens_of(min_units);
  if (smallest > tokens)
    throw InputError("--task", task + ":tokens",
                     "is " + std::to_string(tokens) +
                         ", too small for the facts and the question (expected >= " +
                         std::to_string(smallest) + " with this tokenizer)");
  const int64_t n0 = std::max<int64_t>(min_units, int64_t(double(tokens - fixed) / per_unit));
  return units(fit_units(tokens, n0, per_unit, min_units, tokens_of));
}

}  // namespace kvscope::tasks
