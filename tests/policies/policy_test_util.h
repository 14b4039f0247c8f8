// Helpers of the policy tests: run stories260K under a policy on the ragged
// cache, record what each layer's attention saw (queries, keys, values, the
// layer input) and the attention weights, and compute attention ourselves.
#pragma once

#include <torch/torch.h>
// LibTorch brings glog, whose CHECK would shadow Catch's.
#undef CHECK
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "capture/attention/step_driver.h"
#include "capture/cache/ragged_cache.h"
#include "capture/model/transformer.h"
#include "capture/policy/registry.h"

namespace kvscope::test {

std::unique_ptr<model::Transformer> load_stories();
// A real story prompt, tokenized with tok512 (BOS first).
std::vector<int64_t> story_prompt_ids();
// The InputError make_policy(spec) throws, as text; empty when it builds.
std::string policy_error(const std::string& spec);

// One layer's inputs of one step (float32 copies).
struct LayerInputs {
  int64_t pos0 = 0;
  torch::Tensor hidden, q, k, v;  // [n, D], [n, H, hd], [n, K, hd], [n, K, hd]
  double scale = 1.0;
};

// Attention weights of one step and layer, per kv head: probs [R, n, m] over key_pos.
struct HeadProbs {
  torch::Tensor probs;
  std::vector<int64_t> key_pos;
};

class PolicyRun : public model::AttentionBackend, public cache::FullMatrixObserver {
 public:
  PolicyRun(const model::Transformer& model, const std::string& spec, int64_t max_tokens,
            int64_t prompt_tokens);
  // A policy built by the test itself (e.g. with scripted scores), named `name`.
  PolicyRun(const model::Transformer& model, std::unique_ptr<policy::Policy> policy,
            const std::string& name, int64_t max_tokens, int64_t prompt_tokens);

  // Feeds tokens at pos0 (one forward step); returns the last token's logits.
  torch::Tensor feed(model::Transformer& model, const std::vector<int64_t>& ids, int64_t pos0);
  // Prefill of the whole prompt in one step, then `decode` greedy steps.
  void generate(model::Transformer& model, const std::vector<int64_t>& prompt, int64_t decode,
                const std::function<void(int64_t step)>& after_step = {});

  const cache::RaggedKvCache& cache() const { return driver_->cache(); }
  policy::StepDriver& driver() { return *driver_; }
  policy::Policy& policy() { return *instance_.policy; }
  std::set<int64_t> held(int64_t layer, int64_t kv_head) const;
  // Inputs of every step per layer: steps[step][layer].
  const std::vector<std::vector<LayerInputs>>& steps() const { return steps_; }
  // The last step's attention per [layer][kv head].
  const std::vector<std::vector<HeadProbs>>& last_probs() const { return probs_; }
  // Events of the last step.
  const std::vector<trace::Event>& last_events() const { return events_; }
  // Gate values (the scored policies' scores) of the last step.
  const std::vector<trace::GateValue>& last_gates() const { return gates_; }
  // Stalls of the last step (Decisions::stall).
  const std::vector<trace::StallRow>& last_stalls() const { return stalls_; }
  // Merges of the last step (Decisions::merge).
  const std::vector<trace::MergeRow>& last_merges() const { return merges_; }
  // Re-rotations of the last step (Decisions::rerotate).
  const std::vector<trace::RerotationRow>& last_rerotations() const { return rerotations_; }
  // Key channels pruned by the last step (Decisions::prune_key_channels).
  const std::vector<trace::KeyChannelRow>& last_key_channels() const { return key_channels_; }
  // All inputs of a layer concatenated over the steps so far.
  LayerInputs all_inputs(int64_t layer) const;

  // AttentionBackend
  void begin_step(int64_t pos0, int64_t n) override;
  torch::Tensor attend(const model::AttentionInputs& in) override;
  void end_step() override;
  // AttentionObserver
  bool wants_probs(int64_t) const override { return true; }
  void on_attention(int64_t layer, int64_t kv_head, const float* probs, int64_t R, int64_t n,
                    int64_t m, const int64_t* key_pos, int64_t q_pos0) override;

 private:
  policy::PolicyInstance instance_;
  std::unique_ptr<policy::StepDriver> driver_;
  std::vector<std::vector<LayerInputs>> steps_;
  std::vector<std::vector<HeadProbs>> probs_;
  std::vector<trace::Event> events_;
  std::vector<trace::GateValue> gates_;
  std::vector<trace::StallRow> stalls_;
  std::vector<trace::MergeRow> merges_;
  std::vector<trace::RerotationRow> rerotations_;
  std::vector<trace::KeyChannelRow> key_channels_;
  int64_t L_ = 0, K_ = 0;

  void start(const model::Transformer& model, const std::string& name, int64_t max_tokens,
             int64_t prompt_tokens);
};

// softmax(q k^T * scale) with the causal mask, computed here: [H, n, m] for
// queries at positions q_pos0.. and keys 0..m-1 (GQA: query head h reads kv
// head h / R).
torch::Tensor reference_attention(const torch::Tensor& q, const torch::Tensor& k, int64_t q_pos0,
                                  double scale);

// The `keep` best of `scores` over `candidates` (higher first, ties to the
// newer position), as a set.
std::set<int64_t> top_k(const std::vector<int64_t>& candidates,
                        const std::vector<double>& score_by_pos, int64_t keep);

std::string describe(const std::set<int64_t>& s);

// Every event of a stories260K run under `spec` (the story prompt in one
// prefill step, then `decode` greedy steps), as (kind, step, layer, kv head,
// token, to tier); `raw` receives the events themselves.
using EventKey = std::tuple<int, int32_t, int16_t, int16_t, int32_t, int>;
std::vector<EventKey> events_of_story_run(const std::string& spec, int64_t decode,
                                          std::vector<trace::Event>* raw = nullptr);

}  // namespace kvscope::test
