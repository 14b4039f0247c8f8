// The haystacks the retrieval tasks hide their facts in (RULER's
// `type_haystack`): `noise`, the repeated sentences of the passkey task
// ("The grass is green. ..."), and `text`, real English prose — by default
// the King James Bible (1611, public domain), which scripts/fetch-haystack
// writes from Debian's bible-kjv package to the cache (docs/tasks.md,
// "Haystacks"). RULER's own "essay" haystack is Paul Graham's essays, which
// no package ships and which are not public domain.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "capture/tokenizer/tokenizer.h"

namespace kvscope::tasks {

class TaskSpec;

enum class HaystackKind { Noise, Text };

struct HaystackOptions {
  HaystackKind kind = HaystackKind::Noise;
  std::string text_path;  // text=PATH; empty: default_haystack_path()
};

// Reads `haystack=noise|text` and `text=PATH` (text=PATH alone means
// haystack=text) from a spec.
HaystackOptions parse_haystack(const TaskSpec& spec);

// Where the text haystack is read from when the spec gives no text=PATH:
// $KVSCOPE_HAYSTACK_TEXT, else $KVSCOPE_CACHE_DIR/haystack/kjv.txt, else
// ${XDG_CACHE_HOME:-$HOME/.cache}/kvscope/haystack/kjv.txt (where
// scripts/fetch-haystack writes it).
std::string default_haystack_path();

// A loaded text: its bytes and the [begin, end) of every whitespace-separated
// word. Loaded once per path and process.
struct HaystackText {
  std::string path;
  std::string bytes;
  std::vector<std::pair<uint32_t, uint32_t>> words;
};
// Throws InputError naming the file and the field (`task`:haystack for the
// default file, whose message says how to install it; `task`:text for a
// text=PATH) when the file is missing, unreadable, empty or not UTF-8.
std::shared_ptr<const HaystackText> load_haystack_text(const HaystackOptions& options,
                                                       const std::string& task);

// The first `words` words of the text (from its start, again from the start
// when it runs out), whitespace collapsed to one space, as sentences — the
// places a fact can be inserted, as RULER inserts at sentence boundaries. A
// sentence ends with a word ending in . ! or ? (a closing quote or bracket
// may follow); the last one may be cut mid-sentence. Each ends with a space.
std::vector<std::string> haystack_sentences(const HaystackText& text, int64_t words);

// The haystack units — noise: repetitions of the passkey filler; text: the
// sentences of the text's first words — whose prompt, render(units) encoded
// with BOS, has about `tokens` tokens (within 0.5 % or 2 tokens where the
// units allow). `fixed` estimates the tokens outside the haystack. Throws
// InputError (field `task`:tokens) when the prompt with the smallest haystack
// (one filler, or 8 words) is already longer than `tokens`.
std::vector<std::string> fit_haystack(
    const tokenizer::Tokenizer& tok, const HaystackOptions& options, const std::string& task,
    int64_t tokens, int64_t fixed,
    const std::function<std::string(const std::vector<std::string>&)>& render);

}  // namespace kvscope::tasks
