// llama2.c tokenizer.bin (formats.md 5.2) with run.c's encode and decode
// (5.3): a dummy-prefix space, one symbol per UTF-8 character (bytes + 3
// when the character is not a token), then greedy highest-score merges.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <queue>
#include <sstream>

#include "capture/tokenizer/spm_tokenizer.h"
#include "capture/tokenizer/unicode.h"
#include "core/common/input_error.h"

namespace kvscope::tokenizer {

namespace {

// run.c's sscanf(piece, "<0x%02hhX>"): the byte a piece stands for, or -1.
int byte_piece(const std::string& p) {
  if (p.size() != 6 || p.compare(0, 3, "<0x") != 0 || p[5] != '>') return -1;
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  int hi = hex(p[3]), lo = hex(p[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

Llama2cTokenizer::Llama2cTokenizer(const std::string& path, int64_t vocab_size) {
  kind_ = "llama2.c tokenizer.bin (SentencePiece-style, score merges)";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "", "cannot open the file");
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  if (vocab_size < 0) throw InputError(path, "vocab_size", "must not be negative");
  size_t pos = 0;
  auto need = [&](size_t n, const std::string& field) {
    if (data.size() - pos < n)
      throw InputError(path, field,
                       "the file ends inside this field (needs " + std::to_string(n) +
                           " bytes at offset " + std::to_string(pos) + ", the file has " +
                           std::to_string(data.size()) + " bytes); truncated tokenizer.bin?");
  };
  need(4, "max_token_length");
  std::memcpy(&max_token_length_, data.data(), 4);
  pos = 4;
  if (max_token_length_ <= 0)
    throw InputError(path, "max_token_length",
                     "must be positive, got " + std::to_string(max_token_length_));
  for (int64_t i = 0; vocab_size == 0 ? pos < data.size() : i < vocab_size; ++i) {
    const std::string field = "token " + std::to_string(i);
    float score = 0;
    int32_t len = 0;
    need(4, field + " score");
    std::memcpy(&score, data.data() + pos, 4);
    pos += 4;
    need(4, field + " length");
    std::memcpy(&len, data.data() + pos, 4);
    pos += 4;
    if (len < 0 || len > max_token_length_)
      throw InputError(path, field + " length",
                       std::to_string(len) + " is outside [0, max_token_length=" +
                           std::to_string(max_token_length_) + "]");
    need(static_cast<size_t>(len), field + " bytes");
    pieces_.emplace_back(data, pos, static_cast<size_t>(len));
    scores_.push_back(score);
    pos += static_cast<size_t>(len);
  }
  if (pieces_.size() < 3)
    throw InputError(path, "vocab_size", "needs at least <unk>, <s> and </s>");
  for (size_t i = pieces_.size(); i-- > 0;)
    index_[pieces_[i]] = static_cast<int32_t>(i);  // first id wins
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = index_.find(name);
    byte_ids_[b] = it != index_.end() ? it->second : b + 3;  // run.c assumes ids 3..258
    // Without the piece, run.c's fallback id must at least exist: encode
    // emits it for any character that has no token.
    if (static_cast<size_t>(byte_ids_[b]) >= pieces_.size())
      throw InputError(path, "vocab_size",
                       std::to_string(pieces_.size()) + " entries and no piece " + name +
                           ": the byte fallback needs the byte tokens at ids 3..258 (expected at "
                           "least 259 entries, or <0xNN> pieces)");
  }
  bos_id_ = 1;
  eos_ids_ = {2};
}

std::vector<int32_t> Llama2cTokenizer::encode(const std::string& text, bool add_special) const {
  unicode::require_valid(text);
  std::vector<int32_t> ids;
  if (add_special) ids.push_back(1);
  if (!text.empty()) {
    auto space = index_.find(" ");
    if (space != index_.end()) ids.push_back(space->second);
  }
  for (size_t i = 0; i < text.size();) {
    size_t len = std::min<size_t>(unicode::char_length(static_cast<unsigned char>(text[i])),
                                  text.size() - i);
    auto it = index_.find(text.substr(i, len));
    if (it != index_.end()) {
      ids.push_back(it->second);
    } else {
      for (size_t k = 0; k < len; ++k)
        ids.push_back(byte_ids_[static_cast<unsigned char>(text[i + k])]);
    }
    i += len;
  }
  merge(&ids);
  return ids;
}

// run.c merges the highest-scoring adjacent pair (the leftmost on ties, and
// only scores above -1e10) until none is a piece, rescanning all pairs each
// time: O(n^2). The same choices come out of a max-heap keyed by (score,
// leftmost position) with stale entries skipped, in O(n log n).
void Llama2cTokenizer::merge(std::vector<int32_t>* ids_io) const {
  std::vector<int32_t>& ids = *ids_io;
  const int n = static_cast<int>(ids.size());
  if (n < 2) return;
  std::vector<int> next(n), prev(n);
  std::vector<char> alive(n, 1);
  for (int i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  struct Candidate {
    float score;
    int left, right;
    int32_t left_id, right_id, merged;
    bool operator<(const Candidate& o) const {  // priority_queue pops the largest
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::priority_queue<Candidate> queue;
  std::string joined;
  auto consider = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    joined = pieces_[static_cast<size_t>(ids[left])];
    joined += pieces_[static_cast<size_t>(ids[right])];
    auto it = index_.find(joined);
    if (it == index_.end()) return;
    float score = scores_[static_cast<size_t>(it->second)];
    if (score > -1e10f) queue.push({score, left, right, ids[left], ids[right], it->second});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i, i + 1);
  while (!queue.empty()) {
    Candidate c = queue.top();
    queue.pop();
    if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right || ids[c.left] != c.left_id ||
        ids[c.right] != c.right_id)
      continue;
    ids[c.left] = c.merged;
    alive[c.right] = 0;
    next[c.left] = next[c.right];
    if (next[c.right] >= 0) prev[next[c.right]] = c.left;
    consider(prev[c.left], c.left);
    consider(c.left, next[c.left]);
  }
  int k = 0;
  for (int i = 0; i < n; ++i)
    if (alive[i]) ids[k++] = ids[i];
  ids.resize(k);
}

std::string Llama2cTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  int32_t prev = -1;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) continue;
    const int32_t before = prev;
    prev = id;
    if (skip_special && is_special(id)) continue;
    const std::string& p = pieces_[static_cast<size_t>(id)];
    int b = byte_piece(p);
    if (b >= 0)
      bytes.push_back(static_cast<char>(b));
    else if (before == 1 && !p.empty() && p[0] == ' ')
      bytes.append(p, 1, std::string::npos);  // run.c: no space right after BOS
    else
      bytes += p;
  }
  return unicode::to_valid_lossy(bytes);
}

std::string Llama2cTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return {};
  const std::string& p = pieces_[static_cast<size_t>(id)];
  int b = byte_piece(p);
  return b >= 0 ? std::string(1, static_cast<char>(b)) : p;
}

std::string Llama2cTokenizer::token_text(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return {};
  return pieces_[static_cast<size_t>(id)];
}

int32_t Llama2cTokenizer::token_to_id(const std::string& text) const {
  auto it = index_.find(text);
  return it == index_.end() ? -1 : it->second;
}

}  // namespace kvscope::tokenizer
