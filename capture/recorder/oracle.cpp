#include "capture/recorder/oracle.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace kvscope::recorder {

bool above_quantile(const std::vector<float>& w, float x, double q) {
  if (w.empty()) return false;
  std::vector<float> v = w;
  const double h = q * double(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(h));
  std::nth_element(v.begin(), v.begin() + long(lo), v.end());
  double quantile = v[lo];
  if (lo + 1 < v.size()) {
    // The next order statistic is the smallest of those above lo.
    const double next = *std::min_element(v.begin() + long(lo) + 1, v.end());
    quantile += (h - double(lo)) * (next - quantile);
  }
  return double(x) >= quantile;
}

OracleShadow::OracleShadow(model::Transformer& model, const policy::StepDriver::Options& options,
                           int64_t recall_k, const Recorder& policy_recorder,
                           const cache::RaggedKvCache& policy_cache, torch::Device device,
                           cache::DevicePrefill prefill)
    : model_(model),
      full_(policy::make_policy("full")),
      recall_k_(recall_k),
      policy_recorder_(policy_recorder),
      policy_cache_(policy_cache),
      L_(model.config().n_layers),
      H_(model.config().n_heads),
      K_(model.config().n_kv_heads),
      R_(model.config().n_heads / model.config().n_kv_heads) {
  policy::PolicySetup setup{&model.config(), options.max_tokens, options.prompt_tokens,
                            options.page_rows};
  full_.policy->setup(setup);
  shadow_ = std::make_unique<policy::StepDriver>(model.config(), options, *full_.policy, "full");
  shadow_->set_observer(this);
  shadow_->use_device(device, prefill);
  lost_.assign(size_t(L_ * H_), 0.0f);
  last_row_.resize(size_t(L_ * K_));
}

void OracleShadow::on_attention_begin(int64_t layer, int64_t kv_head, int64_t, int64_t n, int64_t m,
                                      const int64_t* key_pos, int64_t) {
  layer_ = layer, kv_head_ = kv_head, n_ = n, key_pos_ = key_pos;
  std::vector<std::pair<float, int64_t>>& row = last_row_[size_t(layer * K_ + kv_head)];
  row.resize(size_t(m));
  for (int64_t j = 0; j < m; ++j) row[size_t(j)] = {0.0f, key_pos[j]};
  for (int64_t r = 0; r < R_; ++r) lost_[size_t(layer * H_ + kv_head * R_ + r)] = 0.0f;
}

void OracleShadow::on_attention_block(const float* p, int64_t b, int64_t mk, int64_t i0,
                                      int64_t k0) {
  const int64_t last = n_ - 1;  // the step's last query
  if (last < i0 || last >= i0 + b) return;
  take_last_query(p + (last - i0) * mk, b * mk, mk, k0);
}

void OracleShadow::on_attention_last_query(const float* weights) {
  const int64_t m = int64_t(last_row_[size_t(layer_ * K_ + kv_head_)].size());
  take_last_query(weights, m, m, 0);
}

void OracleShadow::take_last_query(const float* w, int64_t stride, int64_t mk, int64_t k0) {
  const std::vector<uint8_t>& held = policy_recorder_.attended(layer_, kv_head_);
  std::vector<std::pair<float, int64_t>>& row = last_row_[size_t(layer_ * K_ + kv_head_)];
  for (int64_t r = 0; r < R_; ++r) {
    const float* wr = w + r * stride;
    float& lost = lost_[size_t(layer_ * H_ + kv_head_ * R_ + r)];
    for (int64_t j = 0; j < mk; ++j) {
      if (!held[size_t(key_pos_[k0 + j])]) lost += wr[j];
      row[size_t(k0 + j)].first += wr[j] / float(R_);
    }
  }
}

trace::OracleRow OracleShadow::step(const torch::Tensor& ids, int64_t pos0,
                                    const torch::Tensor& policy_logits) {
  torch::Tensor full_logits = model_.forward(ids, pos0, *shadow_);
  shadow_->take_events();  // the shadow's own decisions are not the policy's
  trace::OracleRow row;
  torch::Tensor lp_full = torch::log_softmax(full_logits.reshape({-1}).to(torch::kFloat64), 0);
  torch::Tensor lp_pol = torch::log_softmax(policy_logits.reshape({-1}).to(torch::kFloat64), 0);
  row.kl = static_cast<float>((lp_full.exp() * (lp_full - lp_pol)).sum().item<double>());
  row.lost_mass = lost_;
  row.recall.resize(size_t(L_ * K_));
  for (int64_t l = 0; l < L_; ++l)
    for (int64_t h = 0; h < K_; ++h) {
      std::vector<std::pair<float, int64_t>>& v = last_row_[size_t(l * K_ + h)];
      int64_t k = std::min<int64_t>(recall_k_, static_cast<int64_t>(v.size()));
      std::partial_sort(v.begin(), v.begin() + k, v.end(), [](auto& a, auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
      });
      int64_t kept = 0;
      for (int64_t i = 0; i < k; ++i)
        kept += policy_cache_.holds(l, h, v[size_t(i)].second) ? 1 : 0;
      row.recall[size_t(l * K_ + h)] = k > 0 ? float(kept) / float(k) : 1.0f;
    }
  return row;
}

int8_t OracleShadow::needed(int64_t layer, int64_t kv_head, int64_t token) const {
  if (layer < 0 || layer >= L_ || kv_head < 0 || kv_head >= K_) return -1;
  const std::vector<std::pair<float, int64_t>>& row = last_row_[size_t(layer * K_ + kv_head)];
  std::vector<float> weights;
  weights.reserve(row.size());
  float x = 0;
  bool found = false;
  for (const auto& [weight, position] : row) {
    weights.push_back(weight);
    if (position == token) {
      x = weight;
      found = true;
    }
  }
  if (!found) return -1;
  return above_quantile(weights, x, kNeededQuantile) ? 1 : 0;
}

}  // namespace kvscope::recorder
