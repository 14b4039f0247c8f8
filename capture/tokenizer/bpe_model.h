// The BPE model of Hugging Face `tokenizers` (formats.md 4.4): vocabulary,
// ranked merges, byte fallback, unknown-token fusing, ignore_merges and the
// word-piece affixes. One word in, ids out; words are cached because real
// text repeats them.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvscope::tokenizer {

struct BpeOptions {
  std::string unk_token;  // empty: no unknown token (unknown characters are dropped)
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class BpeModel {
 public:
  // `tokens` maps token text to id. Merges are (left, right) in rank order.
  // `source`/`merges_field` name the file and field in error messages; throws
  // InputError when a merge refers to a token that is not in the vocabulary.
  BpeModel(std::unordered_map<std::string, int32_t> vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
           const std::string& source, const std::string& merges_field);

  // Appends the ids of one pre-tokenized word.
  void tokenize(const std::string& word, std::vector<int32_t>* out) const;

  int32_t token_to_id(const std::string& token) const;  // -1 when absent
  const std::string* id_to_token(int32_t id) const;     // nullptr when absent
  int64_t size() const { return static_cast<int64_t>(vocab_.size()); }
  int64_t max_id() const { return static_cast<int64_t>(id_to_token_.size()) - 1; }
  const BpeOptions& options() const { return options_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t key(int32_t a, int32_t b) {
    return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
  }
  void merge_word(const std::string& word, std::vector<int32_t>* out) const;
  void apply_merges(std::vector<int32_t>* symbols) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::string source_;  // the file, for errors at encode time
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  BpeOptions options_;
  int32_t unk_id_ = -1;
  int32_t byte_ids_[256];  // <0xNN> tokens for byte fallback, -1 when absent

  // Word cache (as in `tokenizers`): bounded, shared between threads.
  static constexpr size_t kCacheCapacity = 10000;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace kvscope::tokenizer
