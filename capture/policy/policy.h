// The policy framework: a KV-cache policy composes four primitives, each per
// (layer, kv head) unless it says otherwise (docs/architecture.md):
//   admission  - before a new key/value is written: which tier, or rejected
//   selection  - at read time: which held entries each query reads
//   eviction   - after the layer attended: which entries leave for good
//   placement  - which tier an entry lives in (moves between tiers)
// plus end_step(), after all layers, for decisions over the whole model
// (global budgets). The step driver (step_driver.h) calls the hooks; a policy
// reads the cache (const) and writes its decisions into `decide`
// (decisions.h), which checks, applies and records each one.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "capture/cache/layer_stats.h"
#include "capture/cache/ragged_cache.h"
#include "capture/model/attention_backend.h"
#include "capture/model/model_config.h"
#include "capture/model/model_weights.h"
#include "capture/policy/decisions.h"
#include "core/trace/types.h"

namespace kvscope::tokenizer {
class Tokenizer;
}
namespace kvscope::model {
class Transformer;
}

namespace kvscope::policy {

inline constexpr float kNoScore = std::numeric_limits<float>::quiet_NaN();

struct PolicySetup {
  const model::ModelConfig* model = nullptr;
  int64_t max_tokens = 0;     // positions the run may reach
  int64_t prompt_tokens = 0;  // the prompt's length (prefill ends there)
  int64_t page_rows = 16;
  // The model's weights, for policies that read them (CriticalKV's output
  // projection); null where a policy runs without a model (unit tests).
  const model::ModelWeights* weights = nullptr;
};

// Where a new token goes, per (kv head, token of the step).
struct Admission {
  int tier = 0;
  bool reject = false;  // visible to the step's own queries, never persisted
  float score = kNoScore;
  uint16_t reason = 0;
};

struct AdmitContext {
  int64_t layer, step, pos0, n;
  bool prefill;
  const model::AttentionInputs& in;
  const cache::RaggedKvCache& cache;
  Decisions& decide;                  // gate values
  std::vector<Admission>& decisions;  // [K * n]
  Admission& at(int64_t kv_head, int64_t i) { return decisions[size_t(kv_head * n + i)]; }
};

struct SelectContext {
  int64_t layer, step, pos0, n;
  bool prefill;
  const model::AttentionInputs& in;
  const cache::RaggedKvCache& cache;
  Decisions& decide;
  // Optional per kv head: bool [n, m] over the positions `candidates[h]`
  // (the attended entries, new tokens included, in the order given); false
  // hides a key from a query. Causality and the model's window still apply.
  const std::vector<std::vector<int64_t>>& candidates;
  std::vector<torch::Tensor>& masks;
};

struct LayerContext {
  int64_t layer, step, pos0, n;
  bool prefill;
  bool prompt_complete;  // the prompt is fully in the cache after this step
  const model::AttentionInputs& in;
  const cache::RaggedKvCache& cache;
  Decisions& decide;
  const cache::LayerStats& stats;
  // A context-reconstruction step (CapturePlan::reconstruction): the chunk's index,
  // -1 for the sequence's own steps. Its tokens are no sequence tokens: they
  // are not in the cache any more when the hook runs.
  int64_t reconstruction = -1;
  int64_t tokens_fed() const { return pos0 + n; }
};

struct StepContext {
  int64_t step, pos0, n;
  bool prefill;
  bool prompt_complete;
  const cache::RaggedKvCache& cache;
  Decisions& decide;
  const std::vector<cache::LayerStats>& layer_stats;  // [layer]: its attention this step
  int64_t reconstruction = -1;                        // as LayerContext::reconstruction
  int64_t reconstruction_chunks = 0;  // chunks of the pass (the last one is chunks - 1)
  int64_t tokens_fed() const { return pos0 + n; }
};

// One forward step of a context-reconstruction pass (KVzip): after the
// prefill the engine feeds `ids` at the positions right after the prompt over
// the cache as the prefill left it. The step's own entries serve its queries
// and leave after each layer attended (no events: they are no sequence
// tokens); the trace records the step as kind "reconstruction".
struct ReconstructionChunk {
  std::vector<int32_t> ids;
  // The step's `peak` statistic (cache::StatsNeeds) renormalises each query's
  // weights over the keys at these position ranges [begin, end) plus the
  // step's own tokens, as a softmax over that subset would give them
  // (kvpress's chunked scoring); empty: no renormalisation.
  std::vector<std::pair<int64_t, int64_t>> softmax_keys;
};

// What Policy::plan is asked with: the prompt as tokenised (the policy's
// inserted tokens not yet in it), the model's tokenizer (null in unit tests
// that run without one) and the model's shape.
struct PlanInputs {
  const std::vector<int32_t>& prompt;
  const tokenizer::Tokenizer* tokenizer;
  const model::ModelConfig& model;
};

// Tokens a policy inserts into the sequence right after its reconstruction
// pass (RestoreKV's restore tokens). They are fed at CapturePlan::at (else
// after the prompt) through `model` and stay in the cache like the
// sequence's own; the tokens after them move on by count() positions, and
// setup() sees them in prompt_tokens. Their ids are the run model's
// vocab_size + i, named names[i] in the trace.
struct InsertedTokens {
  std::vector<std::string> names;
  // The model that feeds them (the run's own with the policy's adapters on);
  // valid once setup() has run.
  std::function<model::Transformer*()> model;
  int64_t count() const { return int64_t(names.size()); }
};

// The capture's protocol for one policy and one prompt: what run_capture
// does for it beyond the four primitives' hooks, in this order: the prefill
// stops at `at`; the reconstruction pass runs at the positions from there;
// the inserted tokens follow it; the rest of the prompt is fed after them.
struct CapturePlan {
  // The pass's chunks: after_attention and end_step see each chunk's step
  // with `reconstruction` set; admit and select are not called for them.
  std::vector<ReconstructionChunk> reconstruction;
  // Where in the prompt the pass runs (a chat prompt's generation prompt,
  // the question's place, stays after it); -1: after the whole prompt.
  int64_t at = -1;
  InsertedTokens inserted;
  // Whether the capture has anything to do for the policy (a composite
  // refuses such a part).
  bool empty() const { return reconstruction.empty() && inserted.count() == 0; }
};

// The four primitives; a composite holds at most one part of each kind.
enum class PartKind { Admission, Selection, Eviction, Placement };
const char* part_kind_name(PartKind kind);

// What the step driver checks after a layer's eviction (-1: nothing): the
// most entries one head, and the layer's heads together, hold in the attended
// tiers.
struct HeldLimit {
  int64_t per_head = -1;
  int64_t per_layer = -1;
};

class Policy {
 public:
  virtual ~Policy() = default;

  virtual void setup(const PolicySetup& setup) { setup_ = setup; }
  // Declared before capture (the trace fixes them when it is created).
  virtual std::vector<cache::TierSpec> tiers() const {
    return {{"hot", cache::RowFormat::F32, true}};
  }
  virtual std::vector<std::string> reason_names() const { return {"new token"}; }
  virtual std::vector<trace::GateSpec> gates() const { return {}; }
  // Per-step values per (layer, kv head), e.g. an eviction cutoff (/series).
  virtual std::vector<trace::SeriesSpec> series() const { return {}; }
  virtual cache::StatsNeeds stats_needs() const { return {}; }
  // For /run: "none", "head", "layer" or "global", and the entries it allows.
  virtual std::string budget_kind() const { return "none"; }
  virtual int64_t budget() const { return 0; }

  // The primitives this policy fills (composition refuses two of a kind).
  virtual std::vector<PartKind> kinds() const { return {}; }
  // Tiers the policy acts on without declaring them (a selection part over
  // the warm tier): a composite refuses them when no part declares them.
  virtual std::vector<std::string> reads_tiers() const { return {}; }
  // Parameters the policy resolved itself at setup (from its gate file, or a
  // pattern file), as (name, value): /run policy_params records these instead
  // of the placeholder that asked for them (tau -1: the gate file's).
  virtual std::vector<std::pair<std::string, double>> resolved_params() const { return {}; }
  // How the policy is put together, one line (kvscope policies --explain).
  virtual std::string describe() const { return ""; }
  // Checked by the step driver after the layer's after_attention.
  virtual HeldLimit held_limit(const LayerContext& c) const { return {}; }

  // What the capture does for this policy besides calling its hooks
  // (CapturePlan): called once per prompt, before setup(). The default asks
  // for nothing.
  virtual CapturePlan plan(const PlanInputs& in) { return {}; }
  // Whether plan() may ask for anything; declared before any prompt is seen
  // (a composite refuses such a part).
  virtual bool plans_capture() const { return false; }

  virtual void admit(AdmitContext& c) {}
  virtual void select(SelectContext& c) {}
  virtual void after_attention(LayerContext& c) {}
  virtual void end_step(StepContext& c) {}

 protected:
  PolicySetup setup_;
};

}  // namespace kvscope::policy
