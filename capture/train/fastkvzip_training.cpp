// fastkvzip: trains the Fast KVzip gates (fastkvzip_gate.h) the way the
// official trainer does (optim.py of the paper's repository): the targets are
// the KVzip scores y in (0, 1] of the text read back after a repeat prompt
// (kvzip_targets.h, recorded once), the loss per step is
//   sum over layers of  sum over kv heads of  mean over the batch's tokens of
//   BCE(s(l, k, j), y(l, k, j)),
// over `batch` tokens drawn without replacement (reshuffled each epoch), SGD
// with momentum 0.9 at `sgd_lr` times the official schedule (a warm-up over
// the first 1 % of the steps, then 1, 0.5 from half-way, 0.25 from three
// quarters). Held-out windows from the text's last 10 % are scored at the end:
// BCE and the official "accuracy" (prediction and target on the same side of
// 0.05). docs/policies/fastkvzip.md
#include <torch/torch.h>

#include <chrono>

#include "capture/gates/fastkvzip_gate.h"
#include "capture/tokenizer/tokenizer.h"
#include "capture/train/kvzip_targets.h"
#include "capture/train/trainers.h"
#include "core/common/input_error.h"

namespace kvscope::gates {

namespace {

// The optimizer's learning-rate factor at step i of n (optim.py's lr_schedule).
double lr_factor(int64_t i, int64_t n) {
  if (double(i) < 0.01 * double(n)) return 0.01 * double(i);
  if (double(i) >= 0.75 * double(n)) return 0.25;
  if (double(i) >= 0.5 * double(n)) return 0.5;
  return 1.0;
}

// Fresh gate parameters: nn.Linear's default initialisation (seeded), norms 1,
// b and the sink keys 0, as the official module starts.
std::vector<FastKvzipLayer> init_layers(const model::ModelConfig& c, int64_t dim, int64_t base) {
  const int64_t K = c.n_kv_heads, G = c.n_heads / K, D = c.hidden_size;
  std::vector<FastKvzipLayer> out;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    torch::nn::Linear q(torch::nn::LinearOptions(D, K * G * dim).bias(true));
    torch::nn::Linear k(torch::nn::LinearOptions(D, K * dim).bias(false));
    FastKvzipLayer p{q->weight.detach().clone(),
                     q->bias.detach().clone(),
                     k->weight.detach().clone(),
                     torch::ones({dim}),
                     torch::ones({dim}),
                     torch::zeros({K, 1, G}),
                     base > 0 ? torch::zeros({K, 1, base, dim}) : torch::Tensor()};
    out.push_back(p);
  }
  return out;
}

std::vector<torch::Tensor> parameters(std::vector<FastKvzipLayer>& layers) {
  std::vector<torch::Tensor> out;
  for (FastKvzipLayer& p : layers)
    for (torch::Tensor* t : {&p.q_w, &p.q_b, &p.k_w, &p.q_norm, &p.k_norm, &p.b, &p.k_base})
      if (t->defined()) out.push_back(t->requires_grad_(true));
  return out;
}

// BCE summed over heads of its mean over tokens, and the share of (token,
// head) pairs on the same side of 0.05 (the official metrics).
std::pair<torch::Tensor, double> loss_and_accuracy(const torch::Tensor& pred,
                                                   const torch::Tensor& y) {
  torch::Tensor bce = torch::binary_cross_entropy(pred, y, {}, at::Reduction::None);
  const double acc = ((pred >= 0.05) == (y >= 0.05)).to(torch::kFloat64).mean().item<double>();
  return {bce.mean(0).sum(), acc};
}

}  // namespace

namespace {

TrainResult train_fastkvzip(const TrainOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  ReadBackSource src = open_read_back(o, "fastkvzip");
  const model::ModelConfig& c = src.engine.model->config();
  const nlohmann::json hyper =
      resolve_hyperparameters(o.kind, GateShape::of(c), o.hyper_given, "--gate");
  const int64_t dim = hyper.at("dim").get<int64_t>(), base = hyper.at("base_keys").get<int64_t>();
  const int64_t iters = hyper.at("iters").get<int64_t>(), batch = hyper.at("batch").get<int64_t>();
  const double lr = hyper.at("sgd_lr").get<double>();
  const int64_t K = c.n_kv_heads, G = c.n_heads / K, L = c.n_layers;

  // The targets: --steps windows of training text, max(1, steps/8) held out.
  std::vector<torch::Tensor> x, y, x_held, y_held;
  {
    KvzipTargets rec(c, src.engine.model->weights(), o.seq_len, int64_t(src.repeat.size()), false);
    rec.keep_samples = true;
    feed_read_backs(src, rec, o.seq_len, o.steps, false);
    stack_samples(rec, L, &x, &y);
    rec.xs.clear();
    rec.ys.clear();
    feed_read_backs(src, rec, o.seq_len, std::max<int64_t>(1, o.steps / 8), true);
    stack_samples(rec, L, &x_held, &y_held);
  }

  torch::manual_seed(o.seed);
  std::vector<FastKvzipLayer> layers = init_layers(c, dim, base);
  torch::optim::SGD sgd(parameters(layers), torch::optim::SGDOptions(lr).momentum(0.9));
  const int64_t n = x[0].size(0), per_epoch = std::max<int64_t>(1, n / batch);
  torch::Tensor order;
  double first_loss = 0, last_loss = 0;
  for (int64_t i = 0; i < iters; ++i) {
    if (i % per_epoch == 0) order = torch::randperm(n);
    torch::Tensor idx = order.narrow(0, (i % per_epoch) * std::min(batch, n), std::min(batch, n));
    sgd.zero_grad();
    torch::Tensor loss = torch::zeros({});
    for (int64_t l = 0; l < L; ++l) {
      torch::Tensor pred =
          fastkvzip_forward(layers[size_t(l)], x[size_t(l)].index_select(0, idx), K, G, dim);
      loss = loss + loss_and_accuracy(pred, y[size_t(l)].index_select(0, idx)).first;
    }
    loss.backward();
    for (auto& group : sgd.param_groups())
      static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr * lr_factor(i, iters));
    sgd.step();
    last_loss = loss.item<double>() / double(L);
    if (i == 0) first_loss = last_loss;
    if (!o.quiet && (i % 100 == 0 || i + 1 == iters))
      std::fprintf(stderr, "fastkvzip: step %lld/%lld, BCE per layer %.4f\n", (long long)i + 1,
                   (long long)iters, last_loss);
  }

  GateSet set = init_gates(o.kind, hyper, GateShape::of(c), 0);
  std::vector<double> held_bce, held_acc;
  torch::NoGradGuard no_grad;
  for (int64_t l = 0; l < L; ++l) {
    FastKvzipLayer& p = layers[size_t(l)];
    const std::string f = fastkvzip_prefix(l);
    set.params[f + "q_proj.weight"] = p.q_w.detach().clone();
    set.params[f + "q_proj.bias"] = p.q_b.detach().clone();
    set.params[f + "k_proj.weight"] = p.k_w.detach().clone();
    set.params[f + "q_norm.weight"] = p.q_norm.detach().clone();
    set.params[f + "k_norm.weight"] = p.k_norm.detach().clone();
    set.params[f + "b"] = p.b.detach().clone();
    if (p.k_base.defined()) set.params[f + "k_base"] = p.k_base.detach().clone();
    auto [bce, acc] =
        loss_and_accuracy(fastkvzip_forward(p, x_held[size_t(l)], K, G, dim), y_held[size_t(l)]);
    held_bce.push_back(bce.item<double>() / double(K));
    held_acc.push_back(acc);
  }
  return save_fitted_gates(
      std::move(set), c, o,
      {{"method",
        "BCE of the gate's score against the KVzip score of the text read back after a repeat "
        "prompt; SGD (momentum 0.9) with the official schedule"},
       {"data", src.data.describe},
       {"windows", o.steps},
       {"seq_len", o.seq_len},
       {"samples", n},
       {"repeat_prompt_tokens", src.repeat.size()},
       {"first_train_bce_per_layer", first_loss},
       {"final_train_bce_per_layer", last_loss},
       {"heldout_bce", held_bce},
       {"heldout_accuracy", held_acc}},
      t0);
}

}  // namespace

TrainerDescriptor fastkvzip_trainer() {
  return {"fastkvzip",
          "Fast KVzip's gates: KVzip scores of the text read back, the gates trained on them by "
          "BCE",
          "Kim, Han, Yun, Fast KVzip: Efficient and Accurate LLM Inference with Gated KV "
          "Eviction, 2026",
          "docs/policies/fastkvzip.md",
          TrainInput::Text,
          TrainOutput::File,
          "-o the gate file (.safetensors) + .json metadata",
          hyper_keys({GateKind::FastKvzip}),
          {},
          [](TrainOptions o, const Params&) {
            o.kind = GateKind::FastKvzip;
            return train_fastkvzip(o);
          }};
}

}  // namespace kvscope::gates
