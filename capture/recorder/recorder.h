// The recorder turns one forward step of a capture into one trace::StepData:
// the tokens fed, the cache's events and gate values, occupancy and bytes,
// and the attention statistics the capture levels ask for — computed from the
// attention weights while the cache has them (it observes the policy cache),
// one kv head at a time, never as a T x T matrix for all heads.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "capture/attention/step_driver.h"
#include "capture/cache/ragged_cache.h"
#include "capture/recorder/capture_levels.h"
#include "capture/tokenizer/tokenizer.h"
#include "core/trace/types.h"

namespace kvscope::recorder {

class Recorder : public cache::AttentionObserver {
 public:
  Recorder(policy::StepDriver& driver, const tokenizer::Tokenizer* tokenizer,
           const CaptureLevels& levels, std::string prompt_text);

  // AttentionObserver (the policy cache)
  bool wants_probs(int64_t layer) const override;
  void on_attention_begin(int64_t layer, int64_t kv_head, int64_t R, int64_t n, int64_t m,
                          const int64_t* key_pos, int64_t q_pos0) override;
  void on_attention_block(const float* p, int64_t b, int64_t mk, int64_t i0, int64_t k0) override;
  void on_attention_end() override;
  // Received mass, pooled maps and the attended set need no weights (device
  // layers give them directly); dense rows and top-k do.
  bool needs_weights(int64_t layer) const override;
  bool wants_mass(int64_t) const override { return levels_.received; }
  void on_attention_mass(const float* mass) override;
  int64_t pooled_block(int64_t) const override { return levels_.pooled_block; }
  void on_attention_pooled(const float* sum, const float* max, int64_t q_blocks,
                           int64_t n_blocks) override;

  // Keys the policy's queries could read at `layer`, kv head `kv_head`, in the
  // step just run (for the oracle's lost mass): a bitmap over positions.
  const std::vector<uint8_t>& attended(int64_t layer, int64_t kv_head) const;
  void set_track_attended(bool on) { track_attended_ = on; }
  // Ids first_id + i are a policy's inserted tokens (RestoreKV's restore
  // tokens), no vocabulary entries: recorded as `names[i]`, role template,
  // never mapped into the prompt text nor decoded.
  void set_inserted_tokens(int32_t first_id, std::vector<std::string> names) {
    inserted_first_ = first_id;
    inserted_names_ = std::move(names);
  }

  // Builds the step's record. `ids` are the tokens the step fed (positions
  // pos0..), `sampled` the token sampled from its logits (-1: none, or the
  // next token is teacher-forced). `forced`: a decode step feeding a
  // teacher-forced token, recorded like prompt text (role, no generated text).
  trace::StepData finish_step(int64_t pos0, const std::vector<int32_t>& ids, bool prefill,
                              int32_t sampled, bool forced = false);
  // The record of a context-reconstruction step (trace step kind 2): `ids`
  // fed at positions pos0.. are no sequence tokens (its /reconstruction
  // rows); its events are the policy's decisions after it. The driver does
  // not show such steps to the observer, so it has no attention statistics.
  trace::StepData finish_reconstruction_step(int64_t pos0, const std::vector<int32_t>& ids);
  // Text of the generation not yet emitted (incomplete UTF-8 at the end).
  std::string finish_text();
  // Time between pause() and resume() (the oracle's shadow run) is not
  // counted in the step's wall time.
  void pause() { paused_at_ = std::chrono::steady_clock::now(); }
  void resume() { last_ += std::chrono::steady_clock::now() - paused_at_; }

 private:
  trace::StepData open_step_data(trace::StepKind kind, int64_t pos0, int32_t n_tokens) const;
  void take_policy_record(trace::StepData& sd);
  struct PooledBlock {
    std::vector<float> sum, max;  // [H, KB]
    std::vector<double> pairs;    // [KB]: causal (query, key) pairs seen so far
  };
  trace::TokenRole role_of(int32_t id) const;
  void pool(const float* p, int64_t b, int64_t mk, int64_t i0, int64_t k0);
  PooledBlock& pooled_block_for(int64_t qb, int64_t qpos0, int64_t last_qpos);
  void dense_block(const float* p, int64_t b, int64_t mk, int64_t i0, int64_t k0);
  void topk_block(const float* p, int64_t b, int64_t mk, int64_t i0, int64_t k0);

  bool is_inserted(int32_t id) const {
    return inserted_first_ >= 0 && id >= inserted_first_ &&
           id - inserted_first_ < int32_t(inserted_names_.size());
  }

  policy::StepDriver& driver_;
  int32_t inserted_first_ = -1;
  std::vector<std::string> inserted_names_;
  const tokenizer::Tokenizer* tokenizer_;
  CaptureLevels levels_;
  std::string prompt_text_;
  int64_t prompt_offset_ = 0;
  std::unique_ptr<tokenizer::StreamDecoder> decoder_;
  int64_t L_, H_, K_, R_, M_, KB_ = 0;

  bool track_attended_ = false;
  std::vector<std::vector<uint8_t>> attended_;  // [L*K][M]

  // The (layer, kv head) being observed: between on_attention_begin and _end.
  struct Head {
    int64_t layer = 0, kv_head = 0, n = 0, m = 0, q_pos0 = 0;
    const int64_t* key_pos = nullptr;
    size_t first_dense = 0;  // its rows in dense_ start here
  } cur_;
  trace::ReceivedRow received_row_;

  // Per step.
  std::vector<trace::ReceivedRow> received_;
  std::map<std::pair<int64_t, int64_t>, PooledBlock> open_blocks_;  // (layer, query block)
  std::vector<trace::DenseRow> dense_;
  std::map<int64_t, trace::TopkRow> topk_;  // by query token

  std::chrono::steady_clock::time_point start_, last_, paused_at_;
};

}  // namespace kvscope::recorder
