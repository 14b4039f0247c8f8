#include "capture/tokenizer/added_tokens.h"

#include <algorithm>

#include "capture/tokenizer/normalizers.h"
#include "capture/tokenizer/unicode.h"

namespace kvscope::tokenizer {

namespace {

// The last / first character of a string, for the word and space tests.
uint32_t last_char(const std::string& s, size_t end, size_t* start_out) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  uint32_t cp = 0;
  if (!unicode::decode(s.data(), end, i, &cp)) cp = 0xFFFD;
  *start_out = i;
  return cp;
}

uint32_t first_char(const std::string& s, size_t begin, size_t* len_out) {
  uint32_t cp = 0;
  int len = unicode::decode(s.data(), s.size(), begin, &cp);
  if (!len) cp = 0xFFFD, len = 1;
  *len_out = static_cast<size_t>(len);
  return cp;
}

}  // namespace

void AddedVocabulary::Matcher::add(const std::string& pattern, size_t index) {
  if (pattern.empty()) return;
  by_first_byte[static_cast<unsigned char>(pattern[0])].push_back(patterns.size());
  patterns.push_back(pattern);
  token_index.push_back(index);
}

std::pair<size_t, size_t> AddedVocabulary::Matcher::next(const std::string& s, size_t from) const {
  if (patterns.empty()) return {std::string::npos, 0};
  for (size_t i = from; i < s.size(); ++i) {
    const auto& bucket = by_first_byte[static_cast<unsigned char>(s[i])];
    size_t best = std::string::npos, best_len = 0;
    for (size_t k : bucket) {
      const std::string& p = patterns[k];
      // Longest wins; among equal contents the first registered.
      if (p.size() > best_len && s.compare(i, p.size(), p) == 0) best = k, best_len = p.size();
    }
    if (best != std::string::npos) return {i, best};
  }
  return {std::string::npos, 0};
}

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens, const Normalizer* normalizer)
    : tokens_(std::move(tokens)) {
  // `tokenizers` registers special tokens first, then the others; with
  // leftmost-longest matching the order only matters for identical contents.
  std::vector<size_t> order(tokens_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_partition(order.begin(), order.end(), [&](size_t i) { return tokens_[i].special; });
  for (size_t i : order) {
    AddedToken& t = tokens_[i];
    by_id_.emplace(t.id, i);
    t.decode_text = t.content;
    if (t.normalized) {
      if (normalizer) normalizer->normalize(&t.decode_text);
      normalized_.add(t.decode_text, i);
    } else {
      raw_.add(t.content, i);
    }
  }
}

const AddedToken* AddedVocabulary::find(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::vector<Piece> AddedVocabulary::split_raw(const std::string& text) const {
  std::vector<Piece> out;
  split(text, true, raw_, &out);
  return out;
}

void AddedVocabulary::split_normalized(const Piece& piece, std::vector<Piece>* out) const {
  split(piece.text, piece.at_origin, normalized_, out);
}

// `tokenizers` AddedVocabulary::find_matches, including its quirks: a match
// discarded by single_word still consumes its span, scanning resumes at the
// end of the match itself (not of its rstrip), and lstrip never reaches back
// past the previous match.
void AddedVocabulary::split(const std::string& s, bool at_origin, const Matcher& m,
                            std::vector<Piece>* out) const {
  size_t start_offset = 0;
  auto emit_text = [&](size_t a, size_t b) {
    if (b > a) out->push_back(Piece{s.substr(a, b - a), at_origin && a == 0, -1});
  };
  for (size_t pos = 0;;) {
    auto [found, k] = m.next(s, pos);
    if (found == std::string::npos) break;
    size_t start = found, stop = found + m.patterns[k].size();
    pos = stop;
    const AddedToken& t = tokens_[m.token_index[k]];
    if (t.single_word) {
      size_t ignored = 0;
      bool word_before = start > 0 && unicode::is_word(last_char(s, start, &ignored));
      bool word_after = stop < s.size() && unicode::is_word(first_char(s, stop, &ignored));
      if (word_before || word_after) continue;
    }
    if (t.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t char_start = 0;
        if (!unicode::is_whitespace(last_char(s, new_start, &char_start))) break;
        new_start = char_start;
      }
      start = std::max(new_start, start_offset);
    }
    if (t.rstrip) {
      while (stop < s.size()) {
        size_t len = 0;
        if (!unicode::is_whitespace(first_char(s, stop, &len))) break;
        stop += len;
      }
    }
    if (start_offset < start) emit_text(start_offset, start);
    out->push_back(Piece{s.substr(start, stop - start), false, t.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) emit_text(start_offset, s.size());
}

}  // namespace kvscope::tokenizer
