#include "capture/tokenizer/bpe_model.h"

#include <cstdio>
#include <queue>

#include "capture/tokenizer/unicode.h"
#include "core/common/input_error.h"

namespace kvscope::tokenizer {

BpeModel::BpeModel(std::unordered_map<std::string, int32_t> vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options, const std::string& source, const std::string& merges_field)
    : vocab_(std::move(vocab)), source_(source), options_(std::move(options)) {
  // Tables below are sized by the largest id: one id of 2^31 - 1 would ask
  // for 64 GB. 2^24 is far above any vocabulary (Llama 3: 128256).
  constexpr int32_t kMaxId = (1 << 24) - 1;
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab_) {
    if (id < 0)
      throw InputError(source, "vocab[\"" + token + "\"]", "negative id " + std::to_string(id));
    if (id > kMaxId)
      throw InputError(source, "vocab[\"" + token + "\"]",
                       "id " + std::to_string(id) + " is outside [0, " + std::to_string(kMaxId) +
                           "] (the largest id sizes the id tables)");
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  has_id_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : vocab_) {
    id_to_token_[static_cast<size_t>(id)] = token;
    has_id_[static_cast<size_t>(id)] = true;
  }

  const size_t prefix_len = options_.continuing_subword_prefix.size();
  merges_.reserve(merges.size() * 2);
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [a, b] = merges[i];
    auto field = [&] { return merges_field + "[" + std::to_string(i) + "]"; };
    int32_t ia = token_to_id(a), ib = token_to_id(b);
    if (ia < 0)
      throw InputError(source, field(),
                       "merge refers to \"" + a + "\", which is not in the vocabulary");
    if (ib < 0)
      throw InputError(source, field(),
                       "merge refers to \"" + b + "\", which is not in the vocabulary");
    // With a continuing-subword prefix the right half carries it, the merged token does not.
    std::string merged =
        a + (prefix_len && b.compare(0, prefix_len, options_.continuing_subword_prefix) == 0
                 ? b.substr(prefix_len)
                 : b);
    int32_t im = token_to_id(merged);
    if (im < 0)
      throw InputError(source, field(), "merged token \"" + merged + "\" is not in the vocabulary");
    // A repeated pair keeps its last rank, as a HashMap built from the list does.
    merges_[key(ia, ib)] = Merge{static_cast<int32_t>(i), im};
  }

  if (!options_.unk_token.empty()) unk_id_ = token_to_id(options_.unk_token);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    byte_ids_[b] = token_to_id(name);
  }
}

int32_t BpeModel::token_to_id(const std::string& token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[static_cast<size_t>(id)])
    return nullptr;
  return &id_to_token_[static_cast<size_t>(id)];
}

void BpeModel::tokenize(const std::string& word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    int32_t id = token_to_id(word);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(word, &ids);
  out->insert(out->end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(word, std::move(ids));
  }
}

// Characters to initial symbols (formats.md 4.4 step 1), then merges.
void BpeModel::merge_word(const std::string& w, std::vector<int32_t>* out) const {
  std::vector<int32_t> symbols;
  symbols.reserve(w.size());
  int32_t pending_unk = -1;  // a fused run of unknowns waiting to be emitted
  std::string s;
  for (size_t i = 0; i < w.size();) {
    size_t len = static_cast<size_t>(unicode::char_length(static_cast<unsigned char>(w[i])));
    if (i + len > w.size()) len = w.size() - i;
    const bool first = i == 0, last = i + len == w.size();
    s.assign(w, i, len);
    if (!first && !options_.continuing_subword_prefix.empty())
      s.insert(0, options_.continuing_subword_prefix);
    if (last && !options_.end_of_word_suffix.empty()) s += options_.end_of_word_suffix;
    int32_t id = token_to_id(s);
    i += len;
    if (id >= 0) {
      if (pending_unk >= 0) {
        symbols.push_back(pending_unk);
        pending_unk = -1;
      }
      symbols.push_back(id);
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (unsigned char b : s) all = all && byte_ids_[b] >= 0;
      if (all) {
        // As in `tokenizers`, a pending unknown stays pending across byte tokens.
        for (unsigned char b : s) symbols.push_back(byte_ids_[b]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk >= 0 && !options_.fuse_unk) symbols.push_back(pending_unk);
      pending_unk = unk_id_;
    } else if (!options_.unk_token.empty()) {
      // As `tokenizers` does, only when a character needs it; but the file is
      // what is wrong, so this is bad input like any other.
      throw InputError(source_, "model.unk_token",
                       "\"" + options_.unk_token +
                           "\" is not in the vocabulary, and the text has a character no token "
                           "covers");
    }
  }
  if (pending_unk >= 0) symbols.push_back(pending_unk);
  apply_merges(&symbols);
  out->insert(out->end(), symbols.begin(), symbols.end());
}

// `tokenizers` Word::merge_all: a min-heap of (rank, position) over adjacent
// pairs, skipping entries made stale by earlier merges.
void BpeModel::apply_merges(std::vector<int32_t>* symbols_io) const {
  std::vector<int32_t>& ids = *symbols_io;
  const int n = static_cast<int>(ids.size());
  if (n < 2) return;
  std::vector<int> prev(n), next(n);
  std::vector<char> alive(n, 1);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Entry {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator<(const Entry& o) const {  // priority_queue pops the largest
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Entry> queue;
  for (int i = 0; i + 1 < n; ++i) {
    auto it = merges_.find(key(ids[i], ids[i + 1]));
    if (it != merges_.end()) queue.push({it->second.rank, i, it->second.new_id});
  }
  while (!queue.empty()) {
    Entry top = queue.top();
    queue.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    int right = next[top.pos];
    auto it = merges_.find(key(ids[top.pos], ids[right]));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    ids[top.pos] = top.new_id;
    alive[right] = 0;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0) {
      auto p = merges_.find(key(ids[prev[top.pos]], ids[top.pos]));
      if (p != merges_.end()) queue.push({p->second.rank, prev[top.pos], p->second.new_id});
    }
    if (next[top.pos] >= 0) {
      auto q = merges_.find(key(ids[top.pos], ids[next[top.pos]]));
      if (q != merges_.end()) queue.push({q->second.rank, top.pos, q->second.new_id});
    }
  }
  int k = 0;
  for (int i = 0; i < n; ++i)
    if (alive[i]) ids[k++] = ids[i];
  ids.resize(k);
}

}  // namespace kvscope::tokenizer
