#include "capture/policy/merge_values.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>

#include "capture/policy/held_rows.h"

namespace kvscope::policy {

void merge_on_evict(LayerContext& c, int64_t kv_head, const std::vector<int64_t>& leaving,
                    const MergeOptions& o) {
  if (leaving.empty()) return;
  const HeldRows all = held_rows(c.cache, c.layer, kv_head);
  std::vector<int64_t> kept;
  for (int32_t pos : all.pos)
    if (!std::binary_search(leaving.begin(), leaving.end(), int64_t(pos))) kept.push_back(pos);
  if (kept.empty()) return;
  const HeldRows out = subset_rows(all, leaving), stay = subset_rows(all, kept);
  constexpr double kEps = 1e-6;  // kvpress's _EPS
  torch::Tensor ke = out.keys / out.keys.norm(2, -1, true).clamp_min(kEps);
  torch::Tensor kk = stay.keys / stay.keys.norm(2, -1, true).clamp_min(kEps);
  auto [sim, target] = ke.matmul(kk.t()).max(-1);  // [E]
  torch::Tensor ok = sim >= o.threshold;
  if (o.fraction < 1.0 && ok.any().item<bool>()) {
    const torch::Tensor masked =
        sim.masked_fill(ok.logical_not(), -std::numeric_limits<float>::infinity());
    ok = ok.logical_and(sim >= masked.quantile(1.0 - o.fraction));
  }
  torch::Tensor ve_norm = out.values.norm(2, -1);
  torch::Tensor vt_norm = stay.values.norm(2, -1).index_select(0, target);
  torch::Tensor w = sim.clamp_min(0) * ok.to(torch::kFloat32) * ve_norm / (ve_norm + vt_norm + kEps);
  // Blend per survivor: (v_t + sum w v_e) / (1 + sum w).
  torch::Tensor acc = torch::zeros_like(stay.values).index_add_(0, target, w.unsqueeze(1) * out.values);
  torch::Tensor wsum = torch::zeros({stay.size()}).index_add_(0, target, w);
  torch::Tensor blended = ((stay.values + acc) / (1 + wsum).unsqueeze(1)).contiguous();
  const float* wp = w.data_ptr<float>();
  const int64_t* tp = target.data_ptr<int64_t>();
  const int64_t hd = stay.values.size(1);
  for (size_t i = 0; i < leaving.size(); ++i)
    if (wp[i] > 0)
      c.decide.merge(c.layer, kv_head, leaving[i], kept[size_t(tp[i])], wp[i],
                     blended.data_ptr<float>() + tp[i] * hd);
}

}  // namespace kvscope::policy
