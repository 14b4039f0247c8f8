// streaming_llm: attention sinks + a recent window (Xiao et al., "Efficient
// Streaming Language Models with Attention Sinks", ICLR 2024). Keeps the first
// `sinks` tokens and the last `window` tokens of every head; everything else
// leaves as soon as it falls out of the window. docs/policies/streaming_llm.md
#include "capture/policy/budget.h"
#include "capture/policy/policies/descriptors.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class StreamingLlmPolicy : public Policy {
 public:
  std::vector<PartKind> kinds() const override { return {PartKind::Eviction}; }
  StreamingLlmPolicy(int64_t sinks, int64_t window) : protect_{sinks, window} {}
  std::vector<std::string> reason_names() const override {
    return {"new token", "outside sinks and window"};
  }
  std::string budget_kind() const override { return "head"; }
  int64_t budget() const override { return protect_.sinks + protect_.recent; }

  void after_attention(LayerContext& c) override {
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
      std::vector<int64_t> out = evictable(c.decide, c.layer, h, protect_);
      std::sort(out.begin(), out.end());
      evict_all(c.decide, c.layer, h, out, nullptr, 1);
    }
  }

 private:
  Protection protect_;
};

}  // namespace

PolicyDescriptor streaming_llm_descriptor() {
  return {"streaming_llm",
          "attention sinks + recent window",
          "Xiao et al., Efficient Streaming Language Models with Attention Sinks, ICLR 2024",
          "docs/policies/streaming_llm.md",
          {{"sinks", ParamType::Int, "4", "first tokens always kept"},
           {"window", ParamType::Int, "252", "most recent tokens kept"}},
          [](const Params& p) {
            if (p.get_int("sinks") < 0 || p.get_int("window") < 1)
              throw InputError("--policy", "streaming_llm", "sinks must be >= 0 and window >= 1");
            return std::make_unique<StreamingLlmPolicy>(p.get_int("sinks"), p.get_int("window"));
          }};
}

}  // namespace kvscope::policy
