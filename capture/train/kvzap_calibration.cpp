// kvzap: the KVzap surrogate (Jegou et al., "KVzap: Fast, Adaptive, and
// Faithful KV Cache Pruning", 2026; kvpress KVzapPress and kvzap/train.py;
// docs/policies/kvzap.md). KVzap predicts, from a token's normalised layer
// input h_j alone, the log of the KVzip+ score its entry would get:
//   y(l, k, j) = log max over query heads g of k and over the repeat's queries i of
//                p_lgi(j) / ||h_i|| * ||v_j W_O^g||,
// where the text is read back after a repeat prompt in the same forward pass
// (window, "\n\nRepeat the previous context exactly.\n", window) and p is
// the causal softmax of query i over everything before it. The surrogate is
// linear per layer, y ≈ W_l h_j + b_l, fitted in closed form by ridge
// regression with an unpenalised intercept (scikit-learn's Ridge, which
// kvpress's trainer calls). Nothing else is trained; one forward pass per
// window with a dense cache.
#include <torch/torch.h>

#include <chrono>
#include <string>

#include "capture/tokenizer/tokenizer.h"
#include "capture/train/kvzip_targets.h"
#include "capture/train/trainers.h"
#include "core/common/input_error.h"

namespace kvscope::gates {

namespace {

// Ridge regression with an unpenalised intercept from the sums [h, 1]^T [h, 1]
// and [h, 1]^T y: (A + alpha diag(1, ..., 1, 0)) [W^T; b] = B.
std::pair<torch::Tensor, torch::Tensor> ridge(const torch::Tensor& xtx, const torch::Tensor& xty,
                                              double alpha) {
  const int64_t D = xtx.size(0) - 1;
  torch::Tensor penalty = torch::ones({D + 1}, xtx.options()) * alpha;
  penalty[D] = 0;
  torch::Tensor sol = torch::linalg_solve(xtx + torch::diag(penalty), xty);  // [D+1, K]
  return {sol.narrow(0, 0, D).t().to(torch::kFloat32).contiguous(),
          sol[D].to(torch::kFloat32).contiguous()};
}

}  // namespace

namespace {

TrainResult calibrate_kvzap(const TrainOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  ReadBackSource src = open_read_back(o, "kvzap");
  const model::ModelConfig& c = src.engine.model->config();
  const nlohmann::json hyper =
      resolve_hyperparameters(o.kind, GateShape::of(c), o.hyper_given, "--gate");
  const double alpha = hyper.at("ridge").get<double>();

  KvzipTargets rec(c, src.engine.model->weights(), o.seq_len, int64_t(src.repeat.size()), true);
  feed_read_backs(src, rec, o.seq_len, o.steps, false);
  GateSet set = init_gates(o.kind, hyper, GateShape::of(c), 0);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> fit;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    fit.push_back(ridge(rec.xtx[size_t(l)], rec.xty[size_t(l)], alpha));
    set.params["layers." + std::to_string(l) + ".kvzap.weight"] = fit.back().first;
    set.params["layers." + std::to_string(l) + ".kvzap.bias"] = fit.back().second;
  }

  // Held-out R^2 per layer: windows from the held-out tail of the text.
  const int64_t held_windows = std::max<int64_t>(1, o.steps / 8);
  rec.keep_samples = true;
  feed_read_backs(src, rec, o.seq_len, held_windows, true);
  std::vector<torch::Tensor> xs, ys;
  stack_samples(rec, c.n_layers, &xs, &ys);
  std::vector<double> r2;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const torch::Tensor y = ys[size_t(l)].to(torch::kFloat64);
    const torch::Tensor pred =
        (xs[size_t(l)].mm(fit[size_t(l)].first.t()) + fit[size_t(l)].second).to(torch::kFloat64);
    const double sse = (y - pred).square().sum().item<double>();
    const double sst = (y - y.mean(0, true)).square().sum().item<double>();
    r2.push_back(sst > 0 ? 1.0 - sse / sst : 0.0);
  }

  return save_fitted_gates(
      std::move(set), c, o,
      {{"method",
        "calibration: ridge regression (unpenalised intercept) from each layer's normalised "
        "input to the log KVzip+ score of the text read back after a repeat prompt"},
       {"data", src.data.describe},
       {"windows", o.steps},
       {"seq_len", o.seq_len},
       {"repeat_prompt_tokens", src.repeat.size()},
       {"heldout_windows", held_windows},
       {"heldout_r2", r2}},
      t0);
}

}  // namespace

TrainerDescriptor kvzap_trainer() {
  return {"kvzap",
          "KVzap's surrogate: KVzip+ scores of the text read back, fitted by ridge regression "
          "from the layer inputs",
          "Jegou et al., KVzap: Fast, Adaptive, and Faithful KV Cache Pruning, 2026 (kvpress "
          "kvzap/train.py)",
          "docs/policies/kvzap.md",
          TrainInput::Text,
          TrainOutput::File,
          "-o the gate file (.safetensors) + .json metadata",
          hyper_keys({GateKind::Kvzap}),
          {},
          [](TrainOptions o, const Params&) {
            o.kind = GateKind::Kvzap;
            return calibrate_kvzap(o);
          }};
}

}  // namespace kvscope::gates
