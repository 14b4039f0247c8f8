// window: a sliding window of the last `window` tokens per head.
#include "capture/policy/budget.h"
#include "capture/policy/policies/descriptors.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class WindowPolicy : public Policy {
 public:
  std::vector<PartKind> kinds() const override { return {PartKind::Eviction}; }
  explicit WindowPolicy(int64_t window) : window_(window) {}
  std::vector<std::string> reason_names() const override { return {"new token", "outside window"}; }
  std::string budget_kind() const override { return "head"; }
  int64_t budget() const override { return window_; }

  void after_attention(LayerContext& c) override {
    const int64_t oldest = c.tokens_fed() - window_;  // positions below leave
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
      std::vector<int64_t> out;
      for (int32_t pos : c.cache.positions(c.layer, h, 0))
        if (pos < oldest) out.push_back(pos);
      std::sort(out.begin(), out.end());
      evict_all(c.decide, c.layer, h, out, nullptr, 1);
    }
  }

 private:
  int64_t window_;
};

}  // namespace

PolicyDescriptor window_descriptor() {
  return {"window",
          "sliding window: keep the last `window` tokens of every head",
          "baseline (local attention)",
          "docs/policies/window.md",
          {{"window", ParamType::Int, "256", "tokens kept per head"}},
          [](const Params& p) {
            if (p.get_int("window") < 1) throw InputError("--policy", "window:window", "must be >= 1");
            return std::make_unique<WindowPolicy>(p.get_int("window"));
          }};
}

}  // namespace kvscope::policy
