#include "capture/tokenizer/spm_tokenizer.h"

#include <cstdio>
#include <functional>
#include <queue>

#include "capture/tokenizer/unicode.h"

namespace kvscope::tokenizer {

namespace {

const char* const kSpace = "\xE2\x96\x81";  // U+2581

std::string escape_spaces(const std::string& text) {
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  for (char c : text) {
    if (c == ' ')
      out += kSpace;
    else
      out.push_back(c);
  }
  return out;
}

}  // namespace

SpmTokenizer::SpmTokenizer(SpmVocab vocab, std::string kind, std::string chat_template,
                           std::vector<int32_t> eos_ids)
    : v_(std::move(vocab)) {
  kind_ = std::move(kind);
  chat_template_ = std::move(chat_template);
  bos_id_ = v_.bos;
  eos_ids_ = std::move(eos_ids);
  index_.reserve(v_.tokens.size());
  for (size_t i = 0; i < v_.tokens.size(); ++i) index_[v_.tokens[i]] = static_cast<int32_t>(i);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = index_.find(name);
    byte_ids_[b] = it == index_.end() ? v_.unk : it->second;
  }
  // Control, unknown and user-defined tokens are split out of the text first
  // (formats.md 3.10); the first two count as special.
  std::vector<AddedToken> specials;
  for (size_t i = 0; i < v_.tokens.size(); ++i) {
    int32_t t = v_.types[i];
    if (t != kControl && t != kUnknown && t != kUserDefined) continue;
    AddedToken a;
    a.id = static_cast<int32_t>(i);
    a.content = v_.tokens[i];
    a.special = t != kUserDefined;
    specials.push_back(std::move(a));
  }
  specials_ = AddedVocabulary(std::move(specials), nullptr);
  decoder_ = make_sentencepiece_decoder(v_.add_space_prefix);
}

// llama.cpp llm_tokenizer_spm_session::tokenize: start from UTF-8
// characters, repeatedly merge the adjacent pair whose concatenation is the
// highest-scoring token (ties: leftmost), then emit each symbol, splitting
// symbols that are not tokens back along their merge history, and bytes as a
// last resort.
void SpmTokenizer::tokenize_fragment(const std::string& text, std::vector<int32_t>* out) const {
  struct Symbol {
    int prev, next;
    size_t start, n;
  };
  std::vector<Symbol> sym;
  for (size_t offs = 0; offs < text.size();) {
    size_t len = std::min<size_t>(unicode::char_length(static_cast<unsigned char>(text[offs])),
                                  text.size() - offs);
    int index = static_cast<int>(sym.size());
    sym.push_back({index - 1, offs + len == text.size() ? -1 : index + 1, offs, len});
    offs += len;
  }
  struct Bigram {
    int left, right;
    float score;
    size_t size;
    bool operator<(const Bigram& o) const {  // highest score first, then leftmost
      return score < o.score || (score == o.score && left > o.left);
    }
  };
  std::priority_queue<Bigram> queue;
  std::unordered_map<std::string, std::pair<int, int>> rev_merge;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    std::string s = text.substr(sym[left].start, sym[left].n + sym[right].n);
    auto it = index_.find(s);
    if (it == index_.end()) return;
    queue.push({left, right, v_.scores[static_cast<size_t>(it->second)], s.size()});
    rev_merge[s] = {left, right};
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[b.left];
    Symbol& r = sym[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  std::function<void(const Symbol&)> resegment = [&](const Symbol& s) {
    std::string piece = text.substr(s.start, s.n);
    auto it = index_.find(piece);
    if (it != index_.end()) {
      out->push_back(it->second);
      return;
    }
    auto m = rev_merge.find(piece);
    if (m == rev_merge.end()) {
      for (unsigned char c : piece) out->push_back(byte_ids_[c]);
      return;
    }
    resegment(sym[m->second.first]);
    resegment(sym[m->second.second]);
  };
  for (int i = sym.empty() ? -1 : 0; i != -1; i = sym[i].next) resegment(sym[i]);
}

// llama.cpp's SPM path: special tokens split out, a space prefix for the
// first fragment and every fragment after a special token, spaces as U+2581.
std::vector<int32_t> SpmTokenizer::encode(const std::string& text, bool add_special) const {
  unicode::require_valid(text);
  std::vector<int32_t> ids;
  if (add_special && v_.add_bos) ids.push_back(v_.bos);
  bool prev_special = true;
  for (const Piece& p : specials_.split_raw(text)) {
    if (p.token >= 0) {
      ids.push_back(p.token);
      prev_special = true;
      continue;
    }
    std::string fragment = (v_.add_space_prefix && prev_special ? " " : "") + p.text;
    tokenize_fragment(escape_spaces(fragment), &ids);
    prev_special = false;
  }
  if (add_special && v_.add_eos) ids.push_back(v_.eos);
  return ids;
}

// Decoding follows the Hugging Face chain for these vocabularies (U+2581 to
// space, <0xNN> runs to bytes, one leading space stripped) so that a GGUF and
// the matching tokenizer.json give the same text.
std::string SpmTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= v_.tokens.size()) continue;
    if (skip_special && is_special(id)) continue;
    tokens.push_back(v_.tokens[static_cast<size_t>(id)]);
  }
  decoder_->decode_chain(&tokens, false);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string SpmTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= v_.tokens.size()) return {};
  std::vector<std::string> tokens{v_.tokens[static_cast<size_t>(id)]};
  decoder_->decode_chain(&tokens, true);
  return tokens.empty() ? std::string() : tokens[0];
}

std::string SpmTokenizer::token_text(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= v_.tokens.size()) return {};
  return v_.tokens[static_cast<size_t>(id)];
}

int32_t SpmTokenizer::token_to_id(const std::string& text) const {
  auto it = index_.find(text);
  return it == index_.end() ? -1 : it->second;
}

bool SpmTokenizer::is_special(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= v_.types.size()) return false;
  int32_t t = v_.types[static_cast<size_t>(id)];
  return t == kControl || t == kUnknown;
}

}  // namespace kvscope::tokenizer
