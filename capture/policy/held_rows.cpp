#include "capture/policy/held_rows.h"

#include <algorithm>

#include "core/common/check.h"

namespace kvscope::policy {

HeldRows held_rows(const cache::RaggedKvCache& cache, int64_t layer, int64_t kv_head,
                   int64_t tier) {
  HeldRows r;
  r.pos = cache.positions(layer, kv_head, tier);
  std::sort(r.pos.begin(), r.pos.end());
  const int64_t m = r.size(), hd = cache.head_dim();
  r.keys = torch::empty({m, hd}, torch::kFloat32);
  r.values = torch::empty({m, hd}, torch::kFloat32);
  float *kp = r.keys.data_ptr<float>(), *vp = r.values.data_ptr<float>();
  for (int64_t j = 0; j < m; ++j)
    cache.read_entry(layer, kv_head, r.pos[size_t(j)], kp + j * hd, vp + j * hd);
  return r;
}

HeldRows subset_rows(const HeldRows& all, const std::vector<int64_t>& positions) {
  HeldRows r;
  std::vector<int64_t> index;
  for (int64_t pos : positions) {
    auto it = std::lower_bound(all.pos.begin(), all.pos.end(), int32_t(pos));
    KVSCOPE_CHECK(it != all.pos.end() && *it == pos, "subset_rows: position not held");
    index.push_back(it - all.pos.begin());
    r.pos.push_back(int32_t(pos));
  }
  torch::Tensor i = torch::tensor(index);
  r.keys = all.keys.index_select(0, i);
  r.values = all.values.index_select(0, i);
  return r;
}

RopeInverse::RopeInverse(const model::ModelConfig& config) {
  if (config.rope.enabled && !config.learned_positions)
    rope_ = std::make_unique<model::Rope>(config.rope, torch::Device(torch::kCPU));
  rope_factor_ = config.rope.attention_factor;
}

torch::Tensor RopeInverse::operator()(const torch::Tensor& keys, const std::vector<int32_t>& pos,
                                      int64_t seq_len) {
  if (!rope_ || pos.empty()) return keys;
  const int64_t last = *std::max_element(pos.begin(), pos.end());
  auto [cos, sin] = rope_->tables(0, last + 1, seq_len);  // [P, 1, d]
  torch::Tensor index = torch::tensor(std::vector<int64_t>(pos.begin(), pos.end()));
  torch::Tensor c = cos.index_select(0, index), s = sin.index_select(0, index);
  // The tables carry LongRoPE's attention factor a: the inverse of a R(t) is R(-t) / a.
  const double a = rope_factor_;
  if (a != 1.0) c = c / (a * a), s = s / (a * a);
  return model::Rope::apply(keys.unsqueeze(1), c, -s).squeeze(1);
}

torch::Tensor z_score(const torch::Tensor& x) {
  return (x - x.mean()) / x.std().clamp_min(1e-6);
}

}  // namespace kvscope::policy
