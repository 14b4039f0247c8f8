// Tokenizer::from_gguf: the vocabulary embedded in a GGUF (formats.md
// 3.8-3.10). `gpt2` vocabularies become the Hugging Face byte-level BPE
// pipeline with the pre-tokenizer named by tokenizer.ggml.pre; `llama`
// vocabularies use llama.cpp's SentencePiece-style merge.
#include <algorithm>

#include "capture/formats/gguf.h"
#include "capture/tokenizer/hf_tokenizer.h"
#include "capture/tokenizer/spm_tokenizer.h"
#include "core/common/input_error.h"

namespace kvscope::tokenizer {

namespace {

const char* const kSupportedPre = "gpt-2, default, llama-bpe, llama3, llama-v3, qwen2, smollm";

// Pre-tokenizer (and, for Qwen2, the NFC normalizer of its tokenizer.json)
// for tokenizer.ggml.pre, following llama.cpp's regex choices.
void pre_tokenizer_for(const formats::GgufFile& g, const std::string& pre, HfComponents* parts,
                       bool* ignore_merges, bool* add_bos_default) {
  std::vector<std::unique_ptr<PreTokenizer>> seq;
  if (pre == "gpt-2" || pre == "default") {
    seq.push_back(make_byte_level(false, true));
  } else if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") {
    seq.push_back(make_split_isolated(kLlama3Regex));
    seq.push_back(make_byte_level(false, false));
    *ignore_merges = true;
    *add_bos_default = true;
  } else if (pre == "qwen2") {
    seq.push_back(make_split_isolated(kQwen2Regex));
    seq.push_back(make_byte_level(false, false));
    nlohmann::json nfc = {{"type", "NFC"}};
    parts->normalizer = normalizer_from_json(JsonAt{nfc, g.path(), "tokenizer.ggml.pre"});
  } else if (pre == "smollm") {
    // SmolLM's own tokenizer.json (and llama.cpp) isolate every digit first.
    seq.push_back(make_digits(true));
    seq.push_back(make_byte_level(false, true));
  } else {
    throw InputError(
        g.path(), "tokenizer.ggml.pre",
        "unsupported pre-tokenizer \"" + pre + "\" (supported: " + kSupportedPre + ")");
  }
  parts->pre_tokenizer = make_sequence(std::move(seq));
}

std::vector<int32_t> token_types(const formats::GgufFile& g, size_t n) {
  std::vector<int32_t> types(n, kNormal);
  if (!g.has("tokenizer.ggml.token_type")) return types;
  const auto& raw = g.get_numbers("tokenizer.ggml.token_type");
  if (raw.size() != n)
    throw InputError(g.path(), "tokenizer.ggml.token_type",
                     std::to_string(raw.size()) + " entries for " + std::to_string(n) + " tokens");
  for (size_t i = 0; i < n; ++i) {
    // llama.cpp's token types: 0 undefined .. 6 byte; a double outside int
    // range would not even convert.
    if (!(raw[i] >= 0 && raw[i] <= 6) || raw[i] != static_cast<double>(static_cast<int>(raw[i])))
      throw InputError(g.path(), "tokenizer.ggml.token_type[" + std::to_string(i) + "]",
                       std::to_string(raw[i]) + " is not a token type (0..6)");
    types[i] = static_cast<int32_t>(raw[i]);
  }
  return types;
}

// A special token id: -1 (none) or an id of the vocabulary; anything else
// is refused, never truncated to 32 bits.
int32_t special_id(const formats::GgufFile& g, const std::string& key, int64_t fallback, size_t n) {
  int64_t id = g.get_int_or(key, fallback);
  if (id < -1 || id >= static_cast<int64_t>(n))
    throw InputError(g.path(), key,
                     "id " + std::to_string(id) + " is outside the vocabulary of " +
                         std::to_string(n) + " (expected -1 for none, or 0.." +
                         std::to_string(int64_t(n) - 1) + ")");
  return static_cast<int32_t>(id);
}

std::vector<int32_t> eos_list(const formats::GgufFile& g, int32_t eos, size_t n) {
  std::vector<int32_t> ids;
  if (eos >= 0) ids.push_back(eos);
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    int32_t id = special_id(g, key, -1, n);
    if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

std::unique_ptr<Tokenizer> load_gpt2(const formats::GgufFile& g) {
  const auto& tokens = g.get_strings("tokenizer.ggml.tokens");
  const size_t n = tokens.size();
  std::vector<int32_t> types = token_types(g, n);
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(n);
  for (size_t i = 0; i < n; ++i) vocab[tokens[i]] = static_cast<int32_t>(i);

  std::vector<std::pair<std::string, std::string>> merges;
  const auto& raw = g.get_strings("tokenizer.ggml.merges");
  merges.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    // llama.cpp splits at the first space at index >= 1.
    size_t sp = raw[i].size() > 1 ? raw[i].find(' ', 1) : std::string::npos;
    if (sp == std::string::npos)
      throw InputError(g.path(), "tokenizer.ggml.merges[" + std::to_string(i) + "]",
                       "expected \"left right\", got \"" + raw[i] + "\"");
    merges.emplace_back(raw[i].substr(0, sp), raw[i].substr(sp + 1));
  }

  HfComponents parts;
  const std::string pre = g.get_string_or("tokenizer.ggml.pre", "default");
  bool ignore_merges = false, add_bos_default = false;
  pre_tokenizer_for(g, pre, &parts, &ignore_merges, &add_bos_default);
  BpeOptions opt;
  opt.ignore_merges = ignore_merges;
  parts.model =
      std::make_unique<BpeModel>(std::move(vocab), merges, opt, g.path(), "tokenizer.ggml.merges");
  for (size_t i = 0; i < n; ++i) {
    if (types[i] != kControl && types[i] != kUserDefined) continue;
    AddedToken a;
    a.id = static_cast<int32_t>(i);
    a.content = tokens[i];
    a.special = types[i] == kControl;
    parts.added.push_back(std::move(a));
  }
  parts.decoder = make_byte_level_decoder();
  const int32_t bos = special_id(g, "tokenizer.ggml.bos_token_id", -1, n);
  const int32_t eos = special_id(g, "tokenizer.ggml.eos_token_id", -1, n);
  parts.post_processor = std::make_unique<PostProcessor>();
  if (g.get_bool_or("tokenizer.ggml.add_bos_token", add_bos_default) && bos >= 0)
    parts.post_processor->prefix.push_back(bos);
  if (g.get_bool_or("tokenizer.ggml.add_eos_token", false) && eos >= 0)
    parts.post_processor->suffix.push_back(eos);

  auto tok = std::make_unique<HfTokenizer>(std::move(parts),
                                           "byte-level BPE (GGUF gpt2, pre=" + pre + ")");
  tok->set_bos(bos);
  tok->set_eos(eos_list(g, eos, n));
  tok->set_chat_template(g.get_string_or("tokenizer.chat_template", ""),
                         g.path() + ": tokenizer.chat_template");
  return tok;
}

std::unique_ptr<Tokenizer> load_llama(const formats::GgufFile& g) {
  SpmVocab v;
  v.tokens = g.get_strings("tokenizer.ggml.tokens");
  const size_t n = v.tokens.size();
  v.types = token_types(g, n);
  v.scores.assign(n, 0.0f);
  if (g.has("tokenizer.ggml.scores")) {
    const auto& s = g.get_numbers("tokenizer.ggml.scores");
    if (s.size() != n)
      throw InputError(g.path(), "tokenizer.ggml.scores",
                       std::to_string(s.size()) + " entries for " + std::to_string(n) + " tokens");
    for (size_t i = 0; i < n; ++i) v.scores[i] = static_cast<float>(s[i]);
  }
  v.bos = special_id(g, "tokenizer.ggml.bos_token_id", 1, n);
  v.eos = special_id(g, "tokenizer.ggml.eos_token_id", 2, n);
  v.unk = special_id(g, "tokenizer.ggml.unknown_token_id", 0, n);
  v.add_bos = g.get_bool_or("tokenizer.ggml.add_bos_token", true);
  v.add_eos = g.get_bool_or("tokenizer.ggml.add_eos_token", false);
  v.add_space_prefix = g.get_bool_or("tokenizer.ggml.add_space_prefix", true);
  std::vector<int32_t> eos = eos_list(g, v.eos, n);
  return std::make_unique<SpmTokenizer>(std::move(v), "SentencePiece-style BPE (GGUF llama)",
                                        g.get_string_or("tokenizer.chat_template", ""),
                                        std::move(eos));
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const formats::GgufFile& gguf) {
  if (!gguf.has("tokenizer.ggml.model"))
    throw InputError(gguf.path(), "tokenizer.ggml.model",
                     "missing: this GGUF has no embedded tokenizer (use --tokenizer)");
  const std::string& model = gguf.get_string("tokenizer.ggml.model");
  if (model == "gpt2") return load_gpt2(gguf);
  if (model == "llama") return load_llama(gguf);
  throw InputError(gguf.path(), "tokenizer.ggml.model",
                   "unsupported tokenizer model \"" + model + "\" (supported: gpt2, llama)");
}

}  // namespace kvscope::tokenizer
