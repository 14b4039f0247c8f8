// The ragged, paged KV cache that policies shape. Every (layer, kv head) holds
// its own list of entries in fixed-size pages from a per-tier pool, so a head
// that keeps more really uses more memory and a head that keeps less really
// frees it. Entries keep their original positions (the RoPE they were written
// with); an entry can leave from any position (the last entry of the head
// moves into its slot), move between tiers, and is never read after it left.
//
// Per step and layer: the policy admits the new tokens (admission), may
// restrict what each query reads (selection), the layer attends over the
// attended tiers, then the policy evicts and moves entries (eviction,
// placement); after the last layer it may act globally. Every decision is
// recorded as a trace event.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "capture/cache/kv_pool.h"
#include "capture/cache/layer_stats.h"
#include "capture/model/attention_backend.h"
#include "capture/model/model_config.h"
#include "core/trace/types.h"
#include "kernels/attention.h"

namespace kvscope::policy {
class Policy;
}

namespace kvscope::cache {

struct TierSpec {
  std::string name;
  RowFormat format = RowFormat::F32;
  bool attended = true;  // false: offloaded, not read until promoted back
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

class RaggedKvCache : public model::AttentionBackend {
 public:
  struct Options {
    int64_t page_rows = 16;
    int64_t max_tokens = 0;     // positions the run may reach
    int64_t prompt_tokens = 0;  // for policies acting when the prompt is complete
  };

  RaggedKvCache(const model::ModelConfig& config, const Options& options, policy::Policy& policy);
  ~RaggedKvCache() override;

  void set_observer(AttentionObserver* observer) { observer_ = observer; }

  // AttentionBackend
  void begin_step(int64_t pos0, int64_t n) override;
  torch::Tensor attend(const model::AttentionInputs& in) override;
  void end_step() override;

  // ---- what policies and the recorder read ----
  int64_t n_layers() const { return L_; }
  int64_t n_kv_heads() const { return K_; }
  int64_t n_heads() const { return H_; }
  int64_t head_dim() const { return hd_; }
  int64_t n_tiers() const { return static_cast<int64_t>(tiers_.size()); }
  const std::vector<TierSpec>& tiers() const { return tiers_; }
  int64_t max_tokens() const { return M_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t step() const { return step_; }
  int64_t step_pos0() const { return pos0_; }
  int64_t step_tokens() const { return n_; }
  int64_t tokens_fed() const { return pos0_ + n_; }  // after the current step

  int64_t count(int64_t layer, int64_t kv_head, int64_t tier) const;
  int64_t count(int64_t layer, int64_t kv_head) const;  // all tiers
  // Positions held in a tier, in slot order (not sorted).
  const std::vector<int32_t>& positions(int64_t layer, int64_t kv_head, int64_t tier) const;
  // Tier holding `pos` at head (layer, kv_head), or -1.
  int tier_of(int64_t layer, int64_t kv_head, int64_t pos) const;
  bool holds(int64_t layer, int64_t kv_head, int64_t pos) const {
    return tier_of(layer, kv_head, pos) >= 0;
  }
  // Key / value of a held entry (dequantised), hd floats each.
  void read_entry(int64_t layer, int64_t kv_head, int64_t pos, float* key, float* value) const;
  // Attention statistics of the layer's last attention (what the policy asked for).
  const LayerStats& stats(int64_t layer) const { return stats_[static_cast<size_t>(layer)]; }

  // ---- what policies do (each records an event of the current step) ----
  void evict(int64_t layer, int64_t kv_head, int64_t pos, float score, uint16_t reason);
  void move(int64_t layer, int64_t kv_head, int64_t pos, int to_tier, float score, uint16_t reason);
  void record_select(int64_t layer, int64_t kv_head, int64_t pos, float score, uint16_t reason);
  void record_gate(int32_t gate, int64_t layer, int64_t kv_head, int64_t pos, float value,
                   bool sample);

  // ---- what the recorder reads after a step ----
  std::vector<trace::Event> take_events();
  std::vector<trace::GateValue> take_gates();
  std::vector<int32_t> occupancy() const;   // [L, K, R]
  std::vector<int64_t> tier_bytes() const;  // bytes in use per tier
  int64_t entries() const;
  int64_t bytes_in_use() const;
  int64_t bytes_reserved() const;
  // Wall time spent inside the policy's hooks since construction.
  double policy_seconds() const { return policy_seconds_; }

 private:
  struct HeadTier {
    std::vector<int32_t> pages;
    std::vector<int32_t> positions;  // slot -> position
  };
  struct HeadState {
    std::vector<HeadTier> tiers;
    std::vector<int32_t> slot_of;  // position -> slot in its tier, -1 when not held
    std::vector<int8_t> tier_of;   // position -> tier, -1 when not held
  };

  HeadState& head(int64_t layer, int64_t kv_head) { return heads_[size_t(layer * K_ + kv_head)]; }
  const HeadState& head(int64_t layer, int64_t kv_head) const {
    return heads_[size_t(layer * K_ + kv_head)];
  }
  int64_t owner_tag(int64_t layer, int64_t kv_head, int64_t tier) const {
    return (layer * K_ + kv_head) * n_tiers() + tier;
  }
  void append(int64_t layer, int64_t kv_head, int tier, int64_t pos, const float* k,
              const float* v);
  void remove(int64_t layer, int64_t kv_head, int64_t pos);
  void relocate_page(int64_t owner, int32_t from, int32_t to);
  void event(int64_t layer, int64_t kv_head, int64_t pos, trace::EventKind kind, float score,
             uint16_t reason, uint8_t from, uint8_t to);
  void attended_positions(int64_t layer, int64_t kv_head, std::vector<int64_t>* key_pos) const;
  torch::Tensor attend_head(const model::AttentionInputs& in, int64_t h, const torch::Tensor* mask,
                            const std::vector<int64_t>& key_pos, const kernels::BlockSink* sink);

  int64_t L_, H_, K_, R_, hd_, M_;
  int64_t page_rows_;
  int64_t prompt_tokens_;
  policy::Policy& policy_;
  std::vector<TierSpec> tiers_;
  std::vector<std::unique_ptr<KvPool>> pools_;
  std::vector<HeadState> heads_;
  std::vector<LayerStats> stats_;
  AttentionObserver* observer_ = nullptr;

  int64_t step_ = -1, pos0_ = 0, n_ = 0;
  double policy_seconds_ = 0;
  std::vector<trace::Event> events_;
  std::vector<trace::GateValue> gates_;
};

}  // namespace kvscope::cache
