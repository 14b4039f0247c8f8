// The ragged, paged KV cache: storage only. Every (layer, kv head) holds its
// own list of entries in fixed-size pages from a per-tier pool, so a head that
// keeps more really uses more memory and a head that keeps less really frees
// it. Entries keep their original positions (the RoPE they were written
// with); an entry can leave from any position (the last entry of the head
// moves into its slot), move between tiers, and is never read after it left.
//
// The cache exposes operations (append, remove, read, attend over the held
// entries) and knows nothing of policies: the step driver
// (capture/attention/step_driver.h) decides what to call, and records events.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "capture/cache/kv_pool.h"
#include "capture/model/model_config.h"
#include "kernels/attention.h"

namespace kvscope::cache {

struct TierSpec {
  std::string name;
  // F32 declares full precision: the cache stores such a tier in its
  // Options::kv_format (--kv-dtype); tiers() reports the stored format.
  RowFormat format = RowFormat::F32;
  bool attended = true;  // false: offloaded, not read until promoted back
  // Keys of this tier drop floor(ratio x head_dim) channels (ThinK's pruned
  // keys, kvpress's count) and store only the ones each head's
  // set_key_channels names; 0: whole keys. Values stay whole.
  double key_prune_ratio = 0;
};

// Receives every attention matrix the cache computes (capture levels and the
// oracle use it), streamed: for each kv head of a step, begin (n queries from
// q_pos0 over m keys at key_pos, valid until end), then blocks of weights
// while they are still in cache (kernels::BlockSink: p [R, b, mk], queries
// i0.., keys k0..; other keys weigh 0 for those queries), then end. A prefill
// chunk's [R, n, m] matrix is never materialised for the observer.
class AttentionObserver {
 public:
  virtual ~AttentionObserver() = default;
  virtual bool wants_probs(int64_t layer) const = 0;
  virtual void on_attention_begin(int64_t layer, int64_t kv_head, int64_t R, int64_t n, int64_t m,
                                  const int64_t* key_pos, int64_t q_pos0) = 0;
  virtual void on_attention_block(const float* p, int64_t b, int64_t mk, int64_t i0,
                                  int64_t k0) = 0;
  virtual void on_attention_end() = 0;
  // Whether the observer needs the weights themselves for `layer`; when it
  // does not, a layer attended on the device (--device cuda) gives it only
  // each key's mass between begin and end: the weights summed over the step's
  // queries and the group's query heads ([m], key_pos order).
  virtual bool needs_weights(int64_t layer) const { return wants_probs(layer); }
  // Whether it reads that mass (a device layer computes it only then).
  virtual bool wants_mass(int64_t layer) const { return true; }
  virtual void on_attention_mass(const float* mass) {}
  // Whether it wants, between begin and end of a device layer, the weights
  // of the step's last query per query head of the group: w [R, m], each
  // row in key_pos order (the oracle's top-k and lost mass).
  virtual bool wants_last_query(int64_t layer) const { return false; }
  virtual void on_attention_last_query(const float* weights) {}
  // Block size of the pooled maps the observer keeps for `layer` (0: none).
  // A device layer hands it each head's pooled weights between begin and end:
  // sum / max [R, q_blocks, n_blocks], per query head of the group, query
  // block (the one holding q_pos0, then on) and key block of positions.
  virtual int64_t pooled_block(int64_t layer) const { return 0; }
  virtual void on_attention_pooled(const float* sum, const float* max, int64_t q_blocks,
                                   int64_t n_blocks) {}
};

// An observer that wants each head's whole matrix (tests, small tools):
// assembles the blocks into probs [R, n, m] and calls on_attention.
class FullMatrixObserver : public AttentionObserver {
 public:
  virtual void on_attention(int64_t layer, int64_t kv_head, const float* probs, int64_t R,
                            int64_t n, int64_t m, const int64_t* key_pos, int64_t q_pos0) = 0;
  void on_attention_begin(int64_t layer, int64_t kv_head, int64_t R, int64_t n, int64_t m,
                          const int64_t* key_pos, int64_t q_pos0) override;
  void on_attention_block(const float* p, int64_t b, int64_t mk, int64_t i0, int64_t k0) override;
  void on_attention_end() override;

 private:
  int64_t layer_ = 0, kv_head_ = 0, R_ = 0, n_ = 0, m_ = 0, q_pos0_ = 0;
  const int64_t* key_pos_ = nullptr;
  std::vector<float> probs_;
};

class RaggedKvCache {
 public:
  struct Options {
    int64_t page_rows = 16;
    int64_t max_tokens = 0;                // positions the run may reach
    RowFormat kv_format = RowFormat::F32;  // full-precision tiers: F32, BF16 or F16
  };

  RaggedKvCache(const model::ModelConfig& config, const Options& options,
                std::vector<TierSpec> tiers);
  ~RaggedKvCache();

  int64_t n_layers() const { return L_; }
  int64_t n_kv_heads() const { return K_; }
  int64_t n_heads() const { return H_; }
  int64_t head_dim() const { return hd_; }
  int64_t n_tiers() const { return static_cast<int64_t>(tiers_.size()); }
  const std::vector<TierSpec>& tiers() const { return tiers_; }
  int64_t max_tokens() const { return M_; }

  int64_t count(int64_t layer, int64_t kv_head, int64_t tier) const;
  int64_t count(int64_t layer, int64_t kv_head) const;  // all tiers
  // Entries of the head in the attended tiers.
  int64_t attended_count(int64_t layer, int64_t kv_head) const;
  // Positions held in a tier, in slot order (not sorted).
  const std::vector<int32_t>& positions(int64_t layer, int64_t kv_head, int64_t tier) const;
  // Tier holding `pos` at head (layer, kv_head), or -1.
  int tier_of(int64_t layer, int64_t kv_head, int64_t pos) const;
  bool holds(int64_t layer, int64_t kv_head, int64_t pos) const {
    return tier_of(layer, kv_head, pos) >= 0;
  }
  // Key / value of a held entry (dequantised), hd floats each; a key held in
  // a tier with pruned channels reads 0 in them.
  void read_entry(int64_t layer, int64_t kv_head, int64_t pos, float* key, float* value) const;
  // Positions of the attended tiers, tier by tier in slot order (the key
  // order of attend_head).
  void attended_positions(int64_t layer, int64_t kv_head, std::vector<int64_t>* key_pos) const;

  // ---- operations (preconditions checked: KVSCOPE_CHECK, InvariantError) ----
  void append(int64_t layer, int64_t kv_head, int tier, int64_t pos, const float* k,
              const float* v);
  void remove(int64_t layer, int64_t kv_head, int64_t pos);
  // Replaces the key and/or the value of a held entry (null: keep that half;
  // quantised tiers requantise the row).
  void rewrite(int64_t layer, int64_t kv_head, int64_t pos, const float* k, const float* v);
  // Attention of kv head `kv_head`'s query group q [R, n, hd] (queries at
  // q_pos0..) over the attended entries `key_pos` (attended_positions); mask
  // optional bool [n, m]; sink receives the weights block by block.
  // Returns [R, n, hd].
  torch::Tensor attend_head(int64_t layer, int64_t kv_head, const torch::Tensor& q, int64_t q_pos0,
                            double scale, int64_t sliding_window, const torch::Tensor* mask,
                            const std::vector<int64_t>& key_pos,
                            const kernels::BlockSink* sink) const;
  // The key channels (ascending) a head keeps in tiers with pruned channels:
  // as many as those tiers' key_channels, each < hd; allowed while the head
  // holds no entry in such a tier (the stored keys are read through them).
  void set_key_channels(int64_t layer, int64_t kv_head, std::vector<int32_t> channels);
  // Key channels a tier stores per entry (head_dim unless it prunes them).
  int64_t tier_key_channels(int64_t tier) const { return pools_[size_t(tier)]->key_dim(); }
  // Empty until set.
  const std::vector<int32_t>& key_channels(int64_t layer, int64_t kv_head) const {
    return head(layer, kv_head).key_channels;
  }
  // Returns sparse pools' free pages to the system (between steps).
  void compact();

  // ---- device mirror (--device cuda; capture/attention/device_attention.h) ----
  // Mirrors the pools of the attended tiers to `device` where their keys are
  // whole (float32 or INT4 rows; KvPool::mirror_to); the host pages stay the
  // truth.
  void mirror_to(torch::Device device);
  // The one attended tier when its rows are whole float rows, 32 or 16 bits
  // (what the device kernels read); -1 when there are several attended
  // tiers, or INT4 or pruned keys.
  int whole_row_tier() const;
  // The attended tiers when each holds whole keys, float or INT4 (what the
  // blocked path reads, attention/blocked_attention.h); empty when one holds
  // pruned keys or none is attended.
  std::vector<int> whole_key_tiers() const;
  // The tier the device kernels read: whole_row_tier() when it is mirrored,
  // else -1 (attention stays on the host).
  int device_tier() const;
  KvPool& pool(int64_t tier) { return *pools_[size_t(tier)]; }
  const KvPool& pool(int64_t tier) const { return *pools_[size_t(tier)]; }
  // Pages of a head's tier, in slot order (slot s in page s / page_rows).
  const std::vector<int32_t>& pages(int64_t layer, int64_t kv_head, int64_t tier) const {
    return head(layer, kv_head).tiers[size_t(tier)].pages;
  }
  int64_t page_rows() const { return page_rows_; }

  std::vector<int32_t> occupancy() const;   // [L, K, tiers]
  std::vector<int64_t> tier_bytes() const;  // bytes in use per tier
  int64_t entries() const;
  int64_t bytes_in_use() const;
  int64_t bytes_reserved() const;

 private:
  struct HeadTier {
    std::vector<int32_t> pages;
    std::vector<int32_t> positions;  // slot -> position
  };
  struct HeadState {
    std::vector<HeadTier> tiers;
    std::vector<int32_t> slot_of;       // position -> slot in its tier, -1 when not held
    std::vector<int8_t> tier_of;        // position -> tier, -1 when not held
    std::vector<int32_t> key_channels;  // kept in tiers with pruned key channels
  };

  HeadState& head(int64_t layer, int64_t kv_head) { return heads_[size_t(layer * K_ + kv_head)]; }
  const HeadState& head(int64_t layer, int64_t kv_head) const {
    return heads_[size_t(layer * K_ + kv_head)];
  }
  int64_t owner_tag(int64_t layer, int64_t kv_head, int64_t tier) const {
    return (layer * K_ + kv_head) * n_tiers() + tier;
  }
  void relocate_page(int64_t owner, int32_t from, int32_t to);
  bool narrow(size_t tier) const { return pools_[tier]->key_dim() != hd_; }
  // Row r of `page` in tier `tier` of head hs: whole keys in and out, gathered
  // through (and scattered back from) the head's key channels in narrow tiers.
  void write_slot(const HeadState& hs, size_t tier, int32_t page, int64_t r, const float* k,
                  const float* v);
  void read_slot(const HeadState& hs, size_t tier, int32_t page, int64_t r, float* k,
                 float* v) const;
  void tier_segments(const HeadState& hs, size_t tier, std::vector<kernels::Segment>* segs,
                     std::vector<float>* scratch) const;

  int64_t L_, H_, K_, R_, hd_, M_;
  int64_t page_rows_;
  std::vector<TierSpec> tiers_;
  std::vector<std::unique_ptr<KvPool>> pools_;
  std::vector<HeadState> heads_;
};

}  // namespace kvscope::cache
