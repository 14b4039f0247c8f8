// duo_attention: DuoAttention-style static heads (Xiao et al., "DuoAttention:
// Efficient Long-Context LLM Inference with Retrieval and Streaming Heads",
// ICLR 2025). A head-pattern file gives every (layer, kv head) a gate value
// alpha in [0, 1] (the paper's trained full-attention ratio). Heads with a
// high alpha are retrieval heads and keep every token; the others are
// streaming heads: their queries see only the attention sinks and the recent
// window (a Lambda-shaped mask during the prefill) and they hold only those
// entries. The file is the official one: full_attention_heads.tsv (one row
// per layer, one tab-separated value per kv head), optionally in a directory
// with config.json {"sink_size", "recent_size"}. docs/policies/duo_attention.md
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "capture/policy/budget.h"
#include "capture/policy/policies/descriptors.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

struct DuoPattern {
  std::string file;
  std::vector<std::vector<double>> alpha;  // [layer][kv head]
  int64_t sink_size = -1, recent_size = -1;
};

DuoPattern load_pattern(const std::string& path) {
  namespace fs = std::filesystem;
  DuoPattern out;
  out.file = path;
  if (path.empty())
    throw InputError("--policy", "duo_attention:pattern",
                     "a head-pattern file or directory is required");
  if (fs::is_directory(path)) {
    out.file = (fs::path(path) / "full_attention_heads.tsv").string();
    const std::string cfg = (fs::path(path) / "config.json").string();
    if (fs::exists(cfg)) {
      std::ifstream in(cfg);
      nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      if (j.is_discarded() || !j.is_object()) throw InputError(cfg, "", "not a JSON object");
      for (const char* key : {"sink_size", "recent_size"})
        if (j.contains(key) && !j[key].is_number_integer())
          throw InputError(cfg, key, "an integer expected");
      if (j.contains("sink_size")) out.sink_size = j["sink_size"].get<int64_t>();
      if (j.contains("recent_size")) out.recent_size = j["recent_size"].get<int64_t>();
    }
  }
  std::ifstream in(out.file);
  if (!in) throw InputError(out.file, "", "cannot open the head-pattern file");
  std::string line;
  for (int64_t row = 1; std::getline(in, line); ++row) {
    std::istringstream cells(line);
    std::vector<double> values;
    std::string cell;
    while (cells >> cell) {
      char* end = nullptr;
      const double v = std::strtod(cell.c_str(), &end);
      if (*end != 0 || !std::isfinite(v))
        throw InputError(
            out.file, "row " + std::to_string(row) + " column " + std::to_string(values.size() + 1),
            "a number expected, got '" + cell + "'");
      values.push_back(std::clamp(v, 0.0, 1.0));  // as duo_attn.utils.load_attn_pattern
    }
    if (!values.empty()) out.alpha.push_back(std::move(values));
  }
  if (out.alpha.empty())
    throw InputError(out.file, "", "no rows: one row per layer of per-kv-head values expected");
  return out;
}

class DuoAttentionPolicy : public Policy {
 public:
  std::vector<PartKind> kinds() const override { return {PartKind::Eviction}; }
  DuoAttentionPolicy(DuoPattern pattern, double sparsity, double threshold, int64_t sinks,
                     int64_t recent)
      : pattern_(std::move(pattern)),
        sparsity_(sparsity),
        threshold_(threshold),
        protect_{sinks, recent} {}

  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    const int64_t L = s.model->n_layers, K = s.model->n_kv_heads;
    if (int64_t(pattern_.alpha.size()) != L)
      throw InputError(pattern_.file, "rows",
                       std::to_string(L) + " rows (one per layer) expected, found " +
                           std::to_string(pattern_.alpha.size()));
    for (size_t l = 0; l < pattern_.alpha.size(); ++l)
      if (int64_t(pattern_.alpha[l].size()) != K)
        throw InputError(pattern_.file, "row " + std::to_string(l + 1),
                         std::to_string(K) + " values (one per kv head) expected, found " +
                             std::to_string(pattern_.alpha[l].size()));
    streaming_.assign(size_t(L * K), false);
    if (threshold_ >= 0) {  // the official threshold rule
      for (int64_t l = 0; l < L; ++l)
        for (int64_t h = 0; h < K; ++h)
          streaming_[size_t(l * K + h)] = pattern_.alpha[size_t(l)][size_t(h)] < threshold_;
      return;
    }
    // The sparsity rule: the round(sparsity x heads) lowest gates stream
    // (kvpress); ties go to the earlier (layer, head), not to random noise.
    std::vector<int64_t> order(static_cast<size_t>(L * K));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return pattern_.alpha[size_t(a / K)][size_t(a % K)] <
             pattern_.alpha[size_t(b / K)][size_t(b % K)];
    });
    const int64_t n_stream = std::llround(double(L * K) * sparsity_);
    for (int64_t i = 0; i < n_stream; ++i) streaming_[size_t(order[size_t(i)])] = true;
  }
  std::vector<std::string> reason_names() const override {
    return {"new token", "streaming head: outside sinks and recent window"};
  }

  bool streaming(int64_t layer, int64_t kv_head) const {
    return streaming_[size_t(layer * setup_.model->n_kv_heads + kv_head)];
  }

  // Prefill: a streaming head's query i sees the sinks, the `recent` tokens
  // before it and itself (what it sees at decode, where the cache holds them).
  void select(SelectContext& c) override {
    if (c.n == 1) return;
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
      if (!streaming(c.layer, h)) continue;
      const std::vector<int64_t>& cand = c.candidates[size_t(h)];
      torch::Tensor mask = torch::zeros({c.n, int64_t(cand.size())}, torch::kBool);
      auto m = mask.accessor<bool, 2>();
      for (int64_t i = 0; i < c.n; ++i) {
        const int64_t q = c.pos0 + i;
        for (size_t j = 0; j < cand.size(); ++j)
          m[i][int64_t(j)] = cand[j] < protect_.sinks || cand[j] >= q - protect_.recent;
      }
      c.masks[size_t(h)] = mask;
    }
  }

  void after_attention(LayerContext& c) override {
    for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
      if (!streaming(c.layer, h)) continue;
      std::vector<int64_t> out = evictable(c.decide, c.layer, h, protect_);
      std::sort(out.begin(), out.end());
      evict_all(c.decide, c.layer, h, out, nullptr, 1);
    }
  }

 private:
  DuoPattern pattern_;
  double sparsity_, threshold_;
  Protection protect_;
  std::vector<bool> streaming_;
};

}  // namespace

PolicyDescriptor duo_attention_descriptor() {
  return {"duo_attention",
          "static retrieval heads (full cache) and streaming heads (sinks + recent) from a "
          "head-pattern file",
          "Xiao et al., DuoAttention: Efficient Long-Context LLM Inference with Retrieval and "
          "Streaming Heads, ICLR 2025",
          "docs/policies/duo_attention.md",
          {{"pattern", ParamType::String, "",
            "full_attention_heads.tsv, or the official pattern directory holding it"},
           {"sparsity", ParamType::Float, "0.5",
            "fraction of heads made streaming (lowest gate values)", 0, 1},
           {"threshold", ParamType::Float, "-1",
            "if >= 0: streaming iff gate < threshold (sparsity ignored)", -1, 1},
           {"sinks", ParamType::Int, "-1",
            "sink tokens of streaming heads (-1: config.json's sink_size, else 128)"},
           {"recent", ParamType::Int, "-1",
            "recent tokens of streaming heads (-1: config.json's recent_size, else 256)"}},
          [](const Params& p) -> std::unique_ptr<Policy> {
            DuoPattern pattern = load_pattern(p.get_string("pattern"));
            const double sparsity = p.get_float("sparsity");
            if (sparsity < 0 || sparsity > 1)
              throw InputError("--policy", "duo_attention:sparsity", "a number in [0, 1] expected");
            int64_t sinks = p.get_int("sinks"), recent = p.get_int("recent");
            if (sinks < 0) sinks = pattern.sink_size >= 0 ? pattern.sink_size : 128;
            if (recent < 0) recent = pattern.recent_size >= 0 ? pattern.recent_size : 256;
            if (recent < 1) throw InputError("--policy", "duo_attention:recent", "must be >= 1");
            return std::make_unique<DuoAttentionPolicy>(std::move(pattern), sparsity,
                                                        p.get_float("threshold"), sinks, recent);
          }};
}

}  // namespace kvscope::policy
