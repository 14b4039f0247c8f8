#include "capture/tokenizer/hf_tokenizer.h"

#include <algorithm>

#include "capture/tokenizer/unicode.h"
#include "core/common/input_error.h"

namespace kvscope::tokenizer {

HfTokenizer::HfTokenizer(HfComponents parts, std::string kind) : parts_(std::move(parts)) {
  kind_ = std::move(kind);
  // Added tokens that are already in the model keep the model's id, as in
  // `tokenizers` (their content is looked up first).
  for (AddedToken& t : parts_.added) {
    int32_t model_id = parts_.model->token_to_id(t.content);
    if (model_id >= 0) t.id = model_id;
  }
  added_ = AddedVocabulary(parts_.added, parts_.normalizer.get());
  vocab_size_ = parts_.model->max_id() + 1;
  for (const AddedToken& t : parts_.added) vocab_size_ = std::max<int64_t>(vocab_size_, t.id + 1);
  if (parts_.post_processor && !parts_.post_processor->prefix.empty())
    bos_id_ = parts_.post_processor->prefix[0];
}

std::vector<int32_t> HfTokenizer::encode(const std::string& text, bool add_special) const {
  unicode::require_valid(text);
  // 1. Non-normalized added tokens on the raw text; 2. normalize each piece
  // on its own, then the normalized added tokens (formats.md 4.2).
  std::vector<Piece> pieces = added_.split_raw(text);
  std::vector<Piece> normalized;
  normalized.reserve(pieces.size());
  for (Piece& p : pieces) {
    if (p.token >= 0) {
      normalized.push_back(std::move(p));
      continue;
    }
    if (parts_.normalizer) parts_.normalizer->normalize(&p.text);
    if (p.text.empty()) continue;
    added_.split_normalized(p, &normalized);
  }
  if (parts_.pre_tokenizer) parts_.pre_tokenizer->pre_tokenize(&normalized);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const Piece& p : normalized) {
    if (p.token >= 0)
      ids.push_back(p.token);
    else
      parts_.model->tokenize(p.text, &ids);
  }
  if (add_special && parts_.post_processor) parts_.post_processor->apply(&ids);
  return ids;
}

const std::string* HfTokenizer::token_string(int32_t id) const {
  if (const AddedToken* t = added_.find(id)) return &t->decode_text;
  return parts_.model->id_to_token(id);
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    // Unknown ids are dropped, as `tokenizers` does.
    const std::string* s = token_string(id);
    if (!s || (skip_special && is_special(id))) continue;
    tokens.push_back(*s);
  }
  if (!parts_.decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  parts_.decoder->decode_chain(&tokens, false);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string HfTokenizer::token_bytes(int32_t id) const {
  const std::string* s = token_string(id);
  if (!s) return {};
  std::vector<std::string> tokens{*s};
  if (parts_.decoder) parts_.decoder->decode_chain(&tokens, true);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string HfTokenizer::token_text(int32_t id) const {
  if (const AddedToken* t = added_.find(id)) return t->content;
  const std::string* s = parts_.model->id_to_token(id);
  return s ? *s : std::string();
}

int32_t HfTokenizer::token_to_id(const std::string& text) const {
  for (const AddedToken& t : added_.tokens())
    if (t.content == text) return t.id;
  return parts_.model->token_to_id(text);
}

bool HfTokenizer::is_special(int32_t id) const {
  const AddedToken* t = added_.find(id);
  return t && t->special;
}

}  // namespace kvscope::tokenizer
