// Loader dispatch, the chat template and the streaming decoder.
#include "capture/tokenizer/tokenizer.h"

#include <sys/stat.h>
#include <fstream>

#include "capture/formats/gguf.h"
#include "capture/tokenizer/spm_tokenizer.h"
#include "core/common/input_error.h"

namespace kvscope::tokenizer {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool has_gguf_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string(magic, 4) == "GGUF";
}

// SmolLM2-Instruct's default system prompt (its chat template, verbatim).
const char* const kSmolLM2System =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path, int64_t vocab_size) {
  if (is_directory(path)) return from_tokenizer_json(path + "/tokenizer.json");
  if (ends_with(path, ".json")) return from_tokenizer_json(path);
  if (ends_with(path, ".gguf") || has_gguf_magic(path)) {
    formats::GgufFile gguf(path);
    return from_gguf(gguf);
  }
  if (ends_with(path, ".model"))
    throw InputError(path, "",
                     "SentencePiece .model files are not read directly; convert to tokenizer.json "
                     "(transformers LlamaTokenizer(...).save_pretrained) and pass that");
  return from_llama2c(path, vocab_size);
}

std::unique_ptr<Tokenizer> Tokenizer::from_llama2c(const std::string& path, int64_t vocab_size) {
  return std::make_unique<Llama2cTokenizer>(path, vocab_size);
}

std::string Tokenizer::chat_bos_token() const {
  return bos_id_ >= 0 ? token_text(bos_id_) : std::string();
}

std::string Tokenizer::chat_eos_token() const {
  return eos_ids_.empty() ? std::string() : token_text(eos_ids_[0]);
}

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt) const {
  if (chat_template_.empty()) return smollm2_chatml(messages, add_generation_prompt);
  ChatRequest r;
  for (const ChatMessage& m : messages)
    r.messages.push_back({{"role", m.role}, {"content", m.content}});
  r.add_generation_prompt = add_generation_prompt;
  r.vars = chat_vars_;
  r.bos_token = chat_bos_token();
  r.eos_token = chat_eos_token();
  return render_chat(chat_template_with_origin(), r);
}

// A tokenizer file without a template (tokenizer.json alone, an older GGUF):
// ChatML as SmolLM2-Instruct's template writes it, with its default system
// prompt, where the vocabulary has ChatML's tokens.
std::string Tokenizer::smollm2_chatml(const std::vector<ChatMessage>& messages,
                                      bool add_generation_prompt) const {
  if (token_to_id("<|im_start|>") < 0 || token_to_id("<|im_end|>") < 0)
    throw InputError("", "chat_template",
                     "this tokenizer has no chat template and no <|im_start|>/<|im_end|> tokens "
                     "for ChatML (give one with --chat-template FILE)");
  std::string out;
  if (!messages.empty() && messages[0].role != "system")
    out += std::string("<|im_start|>system\n") + kSmolLM2System + "<|im_end|>\n";
  for (const ChatMessage& m : messages)
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

void StreamDecoder::prime(const std::vector<int32_t>& context) {
  for (int32_t id : context) push(id);
}

// The DecodeStream step of `tokenizers`: decode the window; when it grew and
// does not end in U+FFFD (an incomplete character), emit the growth and
// slide the window so it keeps one step of context.
std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  std::string text = tokenizer_.decode(ids_, skip_special_);
  static const std::string kReplacement = "\xEF\xBF\xBD";
  if (text.size() <= prefix_.size() || ends_with(text, kReplacement)) return {};
  std::string fresh =
      text.compare(0, prefix_.size(), prefix_) == 0 ? text.substr(prefix_.size()) : text;
  size_t new_prefix_index = ids_.size() - prefix_index_;
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
  prefix_ = tokenizer_.decode(ids_, skip_special_);
  prefix_index_ = new_prefix_index;
  return fresh;
}

std::string StreamDecoder::finish() {
  std::string text = tokenizer_.decode(ids_, skip_special_);
  std::string rest = text.size() > prefix_.size() && text.compare(0, prefix_.size(), prefix_) == 0
                         ? text.substr(prefix_.size())
                         : std::string();
  ids_.clear();
  prefix_.clear();
  prefix_index_ = 0;
  return rest;
}

}  // namespace kvscope::tokenizer
