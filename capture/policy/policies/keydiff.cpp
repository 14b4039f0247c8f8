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

#include <algorithm>
#include <cmath>
#include <vector>

#include "capture/policy/held_rows.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"
#include "kernels/cpu/float_loops.h"

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
    const int64_t m = r.size(), d = r.keys.size(1);
    if (m == 0) return;
    // torch.nn.functional.normalize (eps 1e-12) and cosine_similarity (eps
    // 1e-8, each norm clamped), as kvpress computes them, in plain loops: a
    // decode step scores a few hundred rows per head, and six tensor ops per
    // head cost ten times their arithmetic (docs/performance.md).
    const float* k = r.keys.data_ptr<float>();
    norm_.resize(size_t(m));
    anchor_.assign(size_t(d), 0.0f);
    for (int64_t j = 0; j < m; ++j) {
      const float* kj = k + j * d;
      norm_[size_t(j)] = std::sqrt(kernels::cpu::dot(kj, kj, d));
      const float inv = 1.0f / std::max(norm_[size_t(j)], 1e-12f);
      for (int64_t i = 0; i < d; ++i) anchor_[size_t(i)] += kj[i] * inv;
    }
    for (float& a : anchor_) a /= float(m);
    const float anchor_norm =
        std::max(std::sqrt(kernels::cpu::dot(anchor_.data(), anchor_.data(), d)), 1e-8f);
    for (int64_t j = 0; j < m; ++j) {
      const float dot = kernels::cpu::dot(k + j * d, anchor_.data(), d);
      out[r.pos[size_t(j)]] = -dot / (std::max(norm_[size_t(j)], 1e-8f) * anchor_norm);
    }
  }

 private:
  std::vector<float> norm_, anchor_;  // scratch, reused across heads and steps
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
