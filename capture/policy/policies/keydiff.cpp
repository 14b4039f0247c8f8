// keydiff: KeyDiff (Park et al., "KeyDiff: Key Similarity-Based KV Cache
// Eviction for Long-Context LLM Inference in Resource-Constrained
// Environments", 2025). Keys that look like the average key carry little
// information; the distinctive ones stay. Per head, over the held keys k_j
// (as cached, after RoPE):
//   anchor = mean_j k_j / ||k_j||,   score(j) = -cos(k_j, anchor)
// The paper evicts block by block as the prompt streams in; KVScope's
// chunked prefill (--prefill-chunk N) is that block-wise process for real
// (kvpress simulates it with BlockPress over one forward pass). At decode the
// anchor is re-derived from the held keys at every step.
// docs/policies/keydiff.md
#include <torch/torch.h>

#include "capture/policy/held_rows.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class KeyDiffScorer : public HeadScorer {
 public:
  std::string score_name() const override { return "keydiff"; }
  std::string score_meaning() const override {
    return "-cosine similarity of the key to the mean normalised key of the head (higher = "
           "kept)";
  }
  // Every forward pass: the paper's block-wise eviction as the prompt streams in.
  bool compresses(const LayerContext&) const override { return true; }

  void score(LayerContext& c, int64_t kv_head, float* out) override {
    score_rows(c, kv_head, held_rows(c.cache, c.layer, kv_head), out);
  }
  Subsets subsets() const override { return Subsets::Set; }
  void score_rows(LayerContext&, int64_t, const HeldRows& r, float* out) override {
    if (r.size() == 0) return;
    // torch.nn.functional.normalize (eps 1e-12) and cosine_similarity (eps
    // 1e-8), as kvpress computes them.
    torch::Tensor unit = r.keys / r.keys.norm(2, -1, true).clamp_min(1e-12);
    torch::Tensor anchor = unit.mean(0, true);  // [1, hd]
    torch::Tensor s = -torch::cosine_similarity(r.keys, anchor, -1, 1e-8).contiguous();
    const float* p = s.data_ptr<float>();
    for (int64_t j = 0; j < r.size(); ++j) out[r.pos[size_t(j)]] = p[j];
  }
};

std::unique_ptr<HeadScorer> make_keydiff(const Params&) {
  return std::make_unique<KeyDiffScorer>();
}

}  // namespace

ScorerDescriptor keydiff_scorer() {
  return {"keydiff", {}, make_keydiff};
}

PolicyDescriptor keydiff_descriptor() {
  return {"keydiff",
          "keep the keys least similar to the head's mean key direction, at every step",
          "Park et al., KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM "
          "Inference in Resource-Constrained Environments, 2025 (kvpress KeyDiffPress)",
          "docs/policies/keydiff.md",
          {{"budget", ParamType::Int, "256", "entries kept per head"}},
          [](const Params& p) -> std::unique_ptr<Policy> {
            if (p.get_int("budget") < 1)
              throw InputError("--policy", "keydiff:budget", "must be >= 1");
            return std::make_unique<ScoredPolicy>(make_keydiff(p),
                                                  std::vector<int64_t>{p.get_int("budget")}, true,
                                                  "most similar to the mean key");
          }};
}

}  // namespace kvscope::policy
