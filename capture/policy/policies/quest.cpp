// quest: Quest (Tang et al., "Quest: Query-Aware Sparsity for Efficient
// Long-Context LLM Inference", ICML 2024). Read-time selection only: the cache
// keeps every token. Keys are grouped in pages of `page_size` consecutive
// positions; each page keeps the channel-wise minimum m and maximum M of its
// keys. At a decode step the query q bounds every page's best dot product,
//   U(page) = sum_i max(q_i m_i, q_i M_i),
// and attends only to the top budget / page_size pages. The first
// `dense_layers` layers and the prefill stay dense (as in the paper). GQA:
// the group's query heads share the kv head's selection, ranked by the sum of
// their bounds. Every selected page is recorded as a select event at its
// first position. docs/policies/quest.md
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "capture/policy/policies/descriptors.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class QuestPolicy : public Policy {
 public:
  cache::StatsNeeds stats_needs() const override {
    return cache::StatsNeeds::reading(&cache::StatsNeeds::query);
  }
  std::vector<PartKind> kinds() const override { return {PartKind::Selection}; }
  QuestPolicy(int64_t budget, int64_t page_size, int64_t dense_layers)
      : budget_(budget), page_(page_size), dense_layers_(dense_layers) {}

  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    K_ = s.model->n_kv_heads, H_ = s.model->n_heads, d_ = s.model->head_dim;
    pages_ = (s.max_tokens + page_ - 1) / page_;
    const size_t n = size_t(s.model->n_layers * K_ * pages_ * d_);
    min_.assign(n, std::numeric_limits<float>::infinity());
    max_.assign(n, -std::numeric_limits<float>::infinity());
  }
  std::vector<std::string> reason_names() const override {
    return {"new token", "page selected (top-k bound)"};
  }

  void select(SelectContext& c) override {
    update_pages(c);
    if (c.prefill || c.n != 1 || c.layer < dense_layers_) return;
    const int64_t fed = c.pos0 + c.n;
    const int64_t n_pages = (fed + page_ - 1) / page_;
    const int64_t keep = std::max<int64_t>(1, budget_ / page_);
    if (n_pages <= keep) return;  // everything fits the budget: dense
    const int64_t R = H_ / K_;
    torch::Tensor q = c.in.q.to(torch::kFloat32).contiguous();  // [1, H, hd]
    const float* qp = q.data_ptr<float>();
    std::vector<float> bound(static_cast<size_t>(n_pages));
    std::vector<int64_t> order(static_cast<size_t>(n_pages));
    for (int64_t h = 0; h < K_; ++h) {
      for (int64_t p = 0; p < n_pages; ++p) {
        const float* mn = page_min(c.layer, h, p);
        const float* mx = page_max(c.layer, h, p);
        double u = 0;
        for (int64_t r = 0; r < R; ++r) {
          const float* qr = qp + (h * R + r) * d_;
          for (int64_t i = 0; i < d_; ++i) u += std::max(qr[i] * mn[i], qr[i] * mx[i]);
        }
        bound[size_t(p)] = float(u);
      }
      std::iota(order.begin(), order.end(), 0);
      // Highest bound first; ties to the newer page.
      std::partial_sort(
          order.begin(), order.begin() + keep, order.end(), [&](int64_t a, int64_t b) {
            return bound[size_t(a)] != bound[size_t(b)] ? bound[size_t(a)] > bound[size_t(b)]
                                                        : a > b;
          });
      std::vector<bool> chosen(size_t(n_pages), false);
      for (int64_t i = 0; i < keep; ++i) chosen[size_t(order[size_t(i)])] = true;
      const std::vector<int64_t>& cand = c.candidates[size_t(h)];
      torch::Tensor mask = torch::zeros({1, int64_t(cand.size())}, torch::kBool);
      auto m = mask.accessor<bool, 2>();
      for (size_t j = 0; j < cand.size(); ++j) m[0][int64_t(j)] = chosen[size_t(cand[j] / page_)];
      c.masks[size_t(h)] = mask;
      for (int64_t p = 0; p < n_pages; ++p)
        if (chosen[size_t(p)]) c.decide.select(c.layer, h, p * page_, bound[size_t(p)], 1);
    }
  }

  const float* page_min(int64_t l, int64_t h, int64_t p) const { return &min_[index(l, h, p)]; }
  const float* page_max(int64_t l, int64_t h, int64_t p) const { return &max_[index(l, h, p)]; }

 private:
  size_t index(int64_t l, int64_t h, int64_t p) const {
    return size_t(((l * K_ + h) * pages_ + p) * d_);
  }

  // The step's new keys (after RoPE, as cached) widen their pages' bounds.
  void update_pages(SelectContext& c) {
    torch::Tensor k = c.in.k.to(torch::kFloat32).contiguous();  // [n, K, hd]
    const float* kp = k.data_ptr<float>();
    for (int64_t i = 0; i < c.n; ++i)
      for (int64_t h = 0; h < K_; ++h) {
        const size_t at = index(c.layer, h, (c.pos0 + i) / page_);
        const float* key = kp + (i * K_ + h) * d_;
        for (int64_t j = 0; j < d_; ++j) {
          min_[at + size_t(j)] = std::min(min_[at + size_t(j)], key[j]);
          max_[at + size_t(j)] = std::max(max_[at + size_t(j)], key[j]);
        }
      }
  }

  int64_t budget_, page_, dense_layers_;
  int64_t K_ = 0, H_ = 0, d_ = 0, pages_ = 0;
  std::vector<float> min_, max_;  // [L, K, pages, hd]
};

}  // namespace

PolicyDescriptor quest_descriptor() {
  return {
      "quest",
      "read-time top-k pages by a query-aware bound from per-page key min/max (cache untouched)",
      "Tang et al., Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference, ICML "
      "2024",
      "docs/policies/quest.md",
      {{"budget", ParamType::Int, "256",
        "tokens each decode query reads per head (budget / page_size pages)"},
       {"page_size", ParamType::Int, "16", "tokens per Quest page (consecutive positions)"},
       {"dense_layers", ParamType::Int, "2",
        "first layers that always read everything (paper: 2)"}},
      [](const Params& p) -> std::unique_ptr<Policy> {
        if (p.get_int("page_size") < 1)
          throw InputError("--policy", "quest:page_size", "must be >= 1");
        if (p.get_int("budget") < p.get_int("page_size"))
          throw InputError("--policy", "quest:budget", "must be >= page_size (at least one page)");
        if (p.get_int("dense_layers") < 0)
          throw InputError("--policy", "quest:dense_layers", "must be >= 0");
        return std::make_unique<QuestPolicy>(p.get_int("budget"), p.get_int("page_size"),
                                             p.get_int("dense_layers"));
      }};
}

}  // namespace kvscope::policy
