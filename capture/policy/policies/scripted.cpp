// scripted: a scorer written in Python (PyTorch) and saved as TorchScript,
// loaded by LibTorch's own loader (torch::jit::load): no rebuild of KVScope.
// For every (layer, kv head) that compresses, the module's forward gets the
// head's held entries and returns a score per entry (higher = kept); the
// eviction part around it (budget, wrappers, cadence) is the same as every
// built-in scorer's. Signature and an example: docs/policies/scripted.md
#include <torch/script.h>

#include <sstream>

#include "capture/policy/policies/descriptors.h"
#include "capture/policy/scorer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

class ScriptedScorer : public HeadScorer {
 public:
  ScriptedScorer(std::string file, int64_t window) : file_(std::move(file)), window_(window) {
    try {
      module_ = torch::jit::load(file_, torch::kCPU);
    } catch (const std::exception& e) {
      std::string why = e.what();
      why = why.substr(0, why.find('\n'));
      throw InputError(file_, "",
                       "not a TorchScript module LibTorch " + std::string(TORCH_VERSION) +
                           " can load (save it with torch.jit.script(m).save(path)): " + why);
    }
    module_.eval();
    if (!module_.find_method("forward"))
      throw InputError(file_, "forward", "the module has no forward method");
  }

  void setup(const PolicySetup& s) override { R_ = s.model->n_heads / s.model->n_kv_heads; }
  cache::StatsNeeds stats_needs() const override {
    cache::StatsNeeds n{true, false, 0};
    n.query = true;  // a script may read the step's queries
    return n;
  }
  std::string score_name() const override { return "scripted_score"; }
  std::string score_meaning() const override { return "score of the TorchScript scorer " + file_; }

  void score(LayerContext& c, int64_t kv_head, float* out) override {
    const std::vector<int32_t>& held = c.cache.positions(c.layer, kv_head, 0);
    const int64_t m = int64_t(held.size()), hd = c.cache.head_dim();
    torch::Tensor keys = torch::empty({m, hd}), values = torch::empty({m, hd});
    torch::Tensor positions = torch::empty({m}, torch::kInt64), received = torch::empty({m});
    const std::vector<float>& rec = c.stats.received[size_t(kv_head)];
    // Raw pointers: a Tensor view per row would cost more than the scorer.
    float *kp = keys.data_ptr<float>(), *vp = values.data_ptr<float>();
    int64_t* pp = positions.data_ptr<int64_t>();
    float* rp = received.data_ptr<float>();
    for (int64_t j = 0; j < m; ++j) {
      const int32_t pos = held[size_t(j)];
      c.cache.read_entry(c.layer, kv_head, pos, kp + j * hd, vp + j * hd);
      pp[j] = pos;
      rp[j] = rec[size_t(pos)];
    }
    // The step's last `window` queries of the head's group: [w, R, hd].
    const int64_t w = std::min(window_, c.n);
    torch::Tensor queries =
        c.in.q.narrow(0, c.n - w, w).narrow(1, kv_head * R_, R_).to(torch::kFloat32).contiguous();
    torch::Tensor s;
    try {
      s = module_.forward({keys, values, queries, positions, received, c.layer, c.step}).toTensor();
    } catch (const std::exception& e) {
      std::string why = e.what();
      throw InputError(file_, "forward",
                       "failed at layer " + std::to_string(c.layer) + ", kv head " +
                           std::to_string(kv_head) + ": " + why.substr(0, why.find('\n')));
    }
    if (s.dim() != 1 || s.size(0) != m || !s.is_floating_point()) {
      std::ostringstream got;
      got << s.scalar_type() << " " << s.sizes();
      throw InputError(file_, "forward",
                       "at layer " + std::to_string(c.layer) + ", kv head " +
                           std::to_string(kv_head) +
                           ": must return one float score per held entry: a float tensor [" +
                           std::to_string(m) + "] expected, got " + got.str());
    }
    s = s.to(torch::kFloat32).contiguous();
    const float* sp = s.data_ptr<float>();
    for (int64_t j = 0; j < m; ++j) out[held[size_t(j)]] = sp[j];
  }

 private:
  std::string file_;
  int64_t window_;
  int64_t R_ = 1;
  torch::jit::Module module_;
};

}  // namespace

PolicyDescriptor scripted_descriptor() {
  return {
      "scripted",
      "your scorer: a TorchScript module scores each held entry; keep the top `budget` per head",
      "bring your own (docs/policies/scripted.md)",
      "docs/policies/scripted.md",
      {{"file", ParamType::String, "", "the TorchScript file (torch.jit.script(m).save(path))"},
       {"budget", ParamType::Int, "256", "entries kept per head (or a fraction: 0.25)"},
       {"decode", ParamType::Bool, "true", "also compress at every decode step"},
       {"window", ParamType::Int, "32", "queries passed to the scorer: the step's last `window`", 1,
        1 << 20}},
      [](const Params& p) -> std::unique_ptr<Policy> {
        if (p.get_string("file").empty())
          throw InputError("--policy", "scripted:file", "required (a TorchScript .pt file)");
        if (p.get_int("budget") < 1)
          throw InputError("--policy", "scripted:budget", "at least 1 entry");
        return std::make_unique<ScoredPolicy>(
            std::make_unique<ScriptedScorer>(p.get_string("file"), p.get_int("window")),
            std::vector<int64_t>{p.get_int("budget")}, p.get_bool("decode"),
            "lowest scripted score");
      }};
}

}  // namespace kvscope::policy
