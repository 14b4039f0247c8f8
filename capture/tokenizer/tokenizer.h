// Tokenizers KVScope loads: Hugging Face tokenizer.json (byte-level BPE and
// SentencePiece-style BPE with byte fallback), GGUF-embedded vocabularies
// (`gpt2` and `llama` models) and llama2.c tokenizer.bin. Format facts:
// ../shared/reference/formats.md §3.8-3.10, §4, §5.2-5.3.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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
  static std::unique_ptr<Tokenizer> from_llama2c(const std::string& path, int64_t vocab_size);
  // Picks by file: tokenizer.json, *.gguf, or llama2.c .bin (needs vocab_size).
  static std::unique_ptr<Tokenizer> load(const std::string& path, int64_t vocab_size = 0);

  // Text to ids. add_special: BOS/EOS as the tokenizer's own configuration
  // says (post-processor / add_bos_token); special tokens written in the text
  // are matched as special tokens.
  virtual std::vector<int32_t> encode(const std::string& text, bool add_special = true) const = 0;
  // Ids to text (skip_special drops special/control tokens).
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  // The raw bytes token `id` contributes to decoded text (may be part of a
  // UTF-8 character); used for per-token text in traces.
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual std::string token_text(int32_t id) const = 0;  // vocabulary string as stored
  virtual int64_t vocab_size() const = 0;
  virtual bool is_special(int32_t id) const = 0;

  int32_t bos_id() const { return bos_id_; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  const std::string& kind() const { return kind_; }  // e.g. "byte-level BPE (gpt2)"

  // ChatML as SmolLM2-Instruct uses it (with its default system prompt when
  // none is given), ending with the assistant prefix.
  virtual std::string apply_chat_template(const std::vector<ChatMessage>& messages) const;

 protected:
  int32_t bos_id_ = -1;
  std::vector<int32_t> eos_ids_;
  std::string kind_;
  std::string chat_template_;  // as found in the file, may be empty
};

// Turns a stream of token ids into text, holding back incomplete UTF-8 so
// every emitted chunk is valid.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::string push(int32_t id);  // text that became complete
  std::string finish();          // what is left (invalid bytes become U+FFFD)

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
  int32_t previous_ = -1;
};

}  // namespace kvscope::tokenizer
