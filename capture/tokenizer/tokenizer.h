// Tokenizers KVScope loads: Hugging Face tokenizer.json (byte-level BPE and
// SentencePiece-style BPE with byte fallback), GGUF-embedded vocabularies
// (`gpt2` and `llama` models) and llama2.c tokenizer.bin. Format facts:
// ../shared/reference/formats.md §3.8-3.10, §4, §5.2-5.3; what is supported
// and where KVScope follows HF or llama.cpp: docs/tokenizers.md.
//
// Thread safety: a loaded Tokenizer may be used from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "capture/tokenizer/chat_template.h"

namespace kvscope::formats {
class GgufFile;
}

namespace kvscope::tokenizer {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Loaders; each throws InputError naming the file and field on bad input.
  static std::unique_ptr<Tokenizer> from_tokenizer_json(const std::string& path);
  static std::unique_ptr<Tokenizer> from_gguf(const formats::GgufFile& gguf);
  // vocab_size comes from the model header; 0 reads entries to the end of
  // the file (which must then end exactly after the last entry).
  static std::unique_ptr<Tokenizer> from_llama2c(const std::string& path, int64_t vocab_size);
  // Picks by file: a directory or *.json (tokenizer.json), *.gguf (or GGUF
  // magic), otherwise llama2.c tokenizer.bin.
  static std::unique_ptr<Tokenizer> load(const std::string& path, int64_t vocab_size = 0);

  // Text to ids. add_special: BOS/EOS as the tokenizer's own configuration
  // says (post-processor / add_bos_token); special tokens written in the text
  // are matched as special tokens. Throws InputError (field "text") when the
  // text is not valid UTF-8.
  virtual std::vector<int32_t> encode(const std::string& text, bool add_special = true) const = 0;
  // Ids to text (skip_special drops special/control tokens). Ids outside the
  // vocabulary are dropped, as `tokenizers` does; bytes that do not form
  // UTF-8 become U+FFFD.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  // The raw bytes token `id` contributes to decoded text (may be part of a
  // UTF-8 character); used for per-token text in traces.
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual std::string token_text(int32_t id) const = 0;  // vocabulary string as stored
  virtual int64_t vocab_size() const = 0;
  virtual bool is_special(int32_t id) const = 0;
  // Id of the token whose vocabulary string is `text` (added tokens first), or -1.
  virtual int32_t token_to_id(const std::string& text) const = 0;

  int32_t bos_id() const { return bos_id_; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  // e.g. "byte-level BPE (tokenizer.json)", "byte-level BPE (GGUF gpt2, pre=smollm)",
  // "SentencePiece-style BPE (GGUF llama)", "llama2.c tokenizer.bin (...)".
  const std::string& kind() const { return kind_; }

  // The conversation as the model's chat template renders it (transformers'
  // apply_chat_template(..., tokenize=False), core/jinja), ending with the
  // assistant prefix when add_generation_prompt, with the variables of
  // set_chat_vars. A tokenizer without a template falls back to ChatML as
  // SmolLM2-Instruct writes it when it has <|im_start|>/<|im_end|> tokens.
  // Throws InputError when there is no template to apply, or the template
  // does not parse, raises (its own message) or passes a limit.
  std::string apply_chat_template(const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt = true) const;
  const std::string& chat_template() const { return chat_template_; }
  ChatTemplate chat_template_with_origin() const { return {chat_template_, chat_origin_}; }
  // Replaces the file's template (--chat-template); origin names it in messages.
  void set_chat_template(std::string source, std::string origin) {
    chat_template_ = std::move(source);
    chat_origin_ = std::move(origin);
  }
  // Template variables every apply_chat_template passes (--chat-var).
  void set_chat_vars(nlohmann::ordered_json vars) { chat_vars_ = std::move(vars); }
  // The bos_token / eos_token texts a template reads ("" when none).
  std::string chat_bos_token() const;
  std::string chat_eos_token() const;

 protected:
  std::string smollm2_chatml(const std::vector<ChatMessage>& messages,
                             bool add_generation_prompt) const;

  int32_t bos_id_ = -1;
  std::vector<int32_t> eos_ids_;
  std::string kind_;
  std::string chat_template_;  // as found in the file, may be empty
  std::string chat_origin_ = "chat_template";
  nlohmann::ordered_json chat_vars_ = nlohmann::ordered_json::object();
};

// Turns a stream of token ids into text, holding back incomplete UTF-8 so
// every emitted chunk is valid. The chunks concatenate to exactly
// decode(all pushed ids) (the DecodeStream rule of `tokenizers`: decode a
// short window and emit what grew past the previous decode). prime() feeds
// context (e.g. the prompt) without emitting it, so the first generated token
// keeps its leading space.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  void prime(const std::vector<int32_t>& context);
  std::string push(int32_t id);  // text that became complete
  std::string finish();          // what is left (invalid bytes become U+FFFD)

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_ = false;
  std::vector<int32_t> ids_;  // the decode window
  std::string prefix_;        // decode of the window as of the last emission
  size_t prefix_index_ = 0;
};

}  // namespace kvscope::tokenizer
