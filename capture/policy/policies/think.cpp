// think: ThinK (Xu et al., "ThinK: Thinner Key Cache by Query-Driven
// Pruning", ICLR 2025), as kvpress's ThinKPress computes it. ThinK prunes the
// key cache along the channel axis, not the sequence: when the prompt is in,
// each (layer, kv head) scores its key channels c with the prompt's last
// `window` queries (after RoPE, mean over the window and over the group's
// query heads) and its held prompt keys (mean over the keys):
//   score(c) = mean_i q_ic^2 * mean_j k_jc^2
// and drops the floor(ratio x head_dim) lowest-scored channels. The pruned
// keys really shrink: they move into the tier "thin keys", whose key rows
// store only the kept channels (values stay whole), and attention reads them
// as keys with 0 in the pruned channels, i.e. q' . k' over the kept channels
// (the paper's softmax over concat(q' K_pruned^T, q K_whole^T)). The trace's
// /key_channels records which channels each head dropped; the moves are
// demote events with the reason "key channels pruned".
// Left open by the paper and decided here: keys fed after the prompt stay
// whole (the paper and kvpress prune the prompt's keys only); the prompt's
// last `recent` keys stay whole too (the official code's recent window;
// kvpress prunes them all, recent = 0).
// docs/policies/think.md
#include <torch/torch.h>

#include <algorithm>

#include "capture/policy/held_rows.h"
#include "capture/policy/policies/descriptors.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

struct ThinkOptions {
  double ratio = 0.5;
  int64_t window = 32, recent = 0;
};

constexpr int kWholeTier = 0, kThinTier = 1;

class ThinkPolicy : public Policy {
 public:
  cache::StatsNeeds stats_needs() const override {
    return cache::StatsNeeds::reading(&cache::StatsNeeds::query);
  }
  explicit ThinkPolicy(ThinkOptions o) : o_(o) {}

  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    const model::ModelConfig& m = *s.model;
    // One tensor per layer (assign would share one storage among them all).
    query_sq_.clear();
    for (int64_t l = 0; l < m.n_layers; ++l)
      query_sq_.push_back(torch::zeros({m.n_heads, m.head_dim}, torch::kFloat32));
    queries_.assign(size_t(m.n_layers), 0);
    pruned_.assign(size_t(m.n_layers), false);
  }
  std::vector<cache::TierSpec> tiers() const override {
    return {{"hot", cache::RowFormat::F32, true},
            {"thin keys", cache::RowFormat::F32, true, o_.ratio}};
  }
  std::vector<PartKind> kinds() const override { return {PartKind::Placement}; }
  std::vector<std::string> reason_names() const override {
    return {"new token", "key channels pruned"};
  }
  std::string describe() const override {
    return "ThinK: drops floor(" + std::to_string(o_.ratio) +
           " x head_dim) key channels per head when the prompt is in (last " +
           std::to_string(o_.window) + " prompt queries); the prompt's keys move to 'thin keys'";
  }

  void after_attention(LayerContext& c) override {
    if (c.reconstruction >= 0 || !c.prefill || pruned_[size_t(c.layer)]) return;
    add_window_queries(c);
    if (!c.prompt_complete) return;
    pruned_[size_t(c.layer)] = true;
    // floor(ratio x head_dim): what the thin tier's rows leave out.
    const int64_t n_pruned = c.cache.head_dim() - c.cache.tier_key_channels(kThinTier);
    if (n_pruned == 0 || queries_[size_t(c.layer)] == 0) return;  // kvpress: keys unchanged
    const torch::Tensor query_norm = group_query_norm(c);         // [K, hd]
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) prune_head(c, h, query_norm[h], n_pruned);
  }

 private:
  // Sums q^2 of the prompt's last `window` queries that this step fed.
  void add_window_queries(const LayerContext& c) {
    const int64_t first = std::max(c.pos0, setup_.prompt_tokens - o_.window);
    const int64_t end = std::min(c.pos0 + c.n, setup_.prompt_tokens);
    if (first >= end) return;
    const torch::Tensor q = c.in.q.narrow(0, first - c.pos0, end - first).to(torch::kFloat32);
    query_sq_[size_t(c.layer)] += q.pow(2).sum(0);
    queries_[size_t(c.layer)] += end - first;
  }

  // mean_i q_ic^2 per query head, then the mean over each kv head's group.
  torch::Tensor group_query_norm(const LayerContext& c) const {
    const int64_t K = c.cache.n_kv_heads(), H = c.cache.n_heads();
    torch::Tensor per_head = query_sq_[size_t(c.layer)] / double(queries_[size_t(c.layer)]);
    return per_head.view({K, H / K, -1}).mean(1);
  }

  void prune_head(LayerContext& c, int64_t h, const torch::Tensor& query_norm, int64_t n_pruned) {
    const HeldRows rows = held_rows(c.cache, c.layer, h, kWholeTier);
    if (rows.size() == 0) return;
    const torch::Tensor score = query_norm * rows.keys.pow(2).mean(0);  // [hd]
    torch::Tensor low = std::get<1>(score.topk(n_pruned, -1, /*largest=*/false));
    low = std::get<0>(low.sort()).to(torch::kInt32).contiguous();
    const int32_t* p = low.data_ptr<int32_t>();
    c.decide.prune_key_channels(c.layer, h, std::vector<int32_t>(p, p + n_pruned));
    const int64_t whole_from = setup_.prompt_tokens - o_.recent;
    for (int32_t pos : rows.pos)
      if (pos < whole_from) c.decide.move(c.layer, h, pos, kThinTier, kNoScore, 1);
  }

  ThinkOptions o_;
  std::vector<torch::Tensor> query_sq_;  // per layer [H, hd]: summed q^2 of the window
  std::vector<int64_t> queries_;         // per layer: window queries summed so far
  std::vector<bool> pruned_;             // per layer: channels chosen
};

}  // namespace

PolicyDescriptor think_descriptor() {
  return {"think",
          "prune each head's least query-relevant key channels when the prompt is in (the keys "
          "really shrink); compose after an eviction part",
          "Xu et al., ThinK: Thinner Key Cache by Query-Driven Pruning, ICLR 2025 (kvpress "
          "ThinKPress)",
          "docs/policies/think.md",
          {{"ratio", ParamType::Float, "0.5",
            "fraction of key channels pruned per head (floor(ratio x head_dim) of them)", 0, 0.99},
           {"window", ParamType::Int, "32", "last prompt queries that score the channels", 1},
           {"recent", ParamType::Int, "0", "last prompt keys kept whole (kvpress: 0)", 0}},
          [](const Params& p) -> std::unique_ptr<Policy> {
            ThinkOptions o;
            o.ratio = p.get_float("ratio");
            o.window = p.get_int("window");
            o.recent = p.get_int("recent");
            return std::make_unique<ThinkPolicy>(o);
          }};
}

}  // namespace kvscope::policy
