// restorekv: trains RestoreKV's restore tokens and LoRA adapters
// (restorekv_model.h) by self-distillation from the frozen full-cache model,
// as the paper does (arXiv 2608.01247; docs/policies/restorekv.md). Each step
// takes one window of --seq-len tokens: the first context_share of it is the
// context C, the rest the continuation U.
//   1. KVzip scores of the context (kvzip_targets.h: the context read back
//      after the repeat prompt) and KVzip's global selection (kvzip_evictions,
//      the policy's own) down to keep * |C| - n entries per (layer, kv head)
//      on average, the first `sinks` kept.
//   2. Teacher: the base model over C + U, every entry kept.
//   3. Restore pass: the n restore tokens at positions |C|.. through the
//      adapted model over the full context cache.
//   4. Student: the base model over U at positions |C| + n.., reading the
//      kept context entries and the restore entries.
//   loss = mean over U of KL(teacher || student) of the next-token
//   distributions; only the restore embeddings and the LoRA matrices train
//   (AdamW, --lr with linear warm-up and cosine decay).
// Held-out windows from the text's last 10 % are scored at the end against
// KVzip alone at the same budget (keep * |C| context entries, no restore).
#include <torch/torch.h>

#include <chrono>
#include <cmath>

#include "capture/gates/restorekv_model.h"
#include "capture/model/transformer.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/policies/kvzip_selection.h"
#include "capture/train/kvzip_targets.h"
#include "capture/train/trainers.h"
#include "core/common/input_error.h"

namespace kvscope::gates {

namespace {

// Per layer [K, C] bool on `device`: kept after KVzip's selection to
// `budget` per head (the selection runs on the host scores).
std::vector<torch::Tensor> kvzip_keep(const std::vector<torch::Tensor>& scores, int64_t sinks,
                                      int64_t budget, torch::Device device) {
  const int64_t L = int64_t(scores.size()), C = scores[0].size(0), K = scores[0].size(1);
  std::vector<float> flat(size_t(L * K * C));
  for (int64_t l = 0; l < L; ++l) {
    torch::Tensor t = scores[size_t(l)].t().contiguous();  // [K, C]
    std::copy_n(t.data_ptr<float>(), K * C, flat.begin() + l * K * C);
  }
  policy::lift_sinks(flat, L * K, C, sinks);
  std::vector<torch::Tensor> keep;
  for (int64_t l = 0; l < L; ++l) keep.push_back(torch::ones({K, C}, torch::kBool));
  for (const auto& e : policy::kvzip_evictions(flat, L, K, C, budget, false))
    keep[size_t(e[0])][e[1]][e[2]] = false;
  for (torch::Tensor& k : keep) k = k.to(device);
  return keep;
}

struct Window {
  torch::Tensor context, continuation;  // int64 ids
  std::vector<torch::Tensor> scores;    // per layer [C, K]: KVzip's
};

Window read_window(ReadBackSource& src, KvzipTargets& rec, int64_t start, int64_t C, int64_t U) {
  torch::NoGradGuard no_grad;
  Window w;
  rec.reset();
  rec.ys.clear();
  rec.xs.clear();
  src.engine.model->forward(kvzip_read_back(src.data.ids, start, C, src.repeat), 0, rec, false);
  w.scores = rec.ys;
  std::vector<int64_t> ids(src.data.ids.begin() + start, src.data.ids.begin() + start + C + U);
  torch::Tensor all = torch::tensor(ids, torch::kInt64);
  w.context = all.narrow(0, 0, C);
  w.continuation = all.narrow(0, C, U);
  return w;
}

// The teacher: the base model over C + U with every entry kept; its
// log-probabilities over U and the context's entries.
struct Teacher {
  torch::Tensor logp;  // [U, V]
  ContextEntries context;
};

Teacher run_teacher(model::Transformer& m, const Window& w) {
  torch::NoGradGuard no_grad;
  const int64_t C = w.context.size(0), U = w.continuation.size(0);
  Teacher t;
  t.context = context_entries(m, torch::cat({w.context, w.continuation}));
  t.logp = torch::log_softmax(t.context.logits.narrow(0, C, U), -1);
  for (size_t l = 0; l < t.context.k.size(); ++l) {
    t.context.k[l] = t.context.k[l].narrow(0, 0, C);
    t.context.v[l] = t.context.v[l].narrow(0, 0, C);
  }
  return t;
}

// The student's log-probabilities over U (KVzip alone when adapted is null:
// the continuation right after the context).
torch::Tensor run_student(model::Transformer& base, model::Transformer* adapted, const Window& w,
                          const Teacher& t, const std::vector<torch::Tensor>& keep,
                          const torch::Tensor& restore_ids) {
  const int64_t C = w.context.size(0), n = adapted ? restore_ids.size(0) : 0;
  return torch::log_softmax(
      restored_logits(base, adapted, t.context, keep, restore_ids, w.continuation, C + n), -1);
}

torch::Tensor kl(const torch::Tensor& teacher_logp, const torch::Tensor& student_logp) {
  return (teacher_logp.exp() * (teacher_logp - student_logp)).sum(-1).mean();
}

}  // namespace

namespace {

TrainResult train_restorekv(const TrainOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.resume)
    throw InputError(
        "", "--resume",
        "restorekv writes no checkpoint to resume from (run it again without --resume)");
  ReadBackSource src = open_read_back(o, "restorekv");
  model::Transformer& base = *src.engine.model;
  const model::ModelConfig& c = base.config();
  check_restorekv_model(c, "--model");
  const nlohmann::json hyper =
      resolve_hyperparameters(o.kind, GateShape::of(c), o.hyper_given, "--gate");
  const int64_t n = hyper.at("tokens").get<int64_t>(), sinks = hyper.at("sinks").get<int64_t>();
  const int64_t C = int64_t(std::llround(hyper.at("context_share").get<double>() * o.seq_len));
  const int64_t U = o.seq_len - C;
  const int64_t budget = int64_t(std::llround(hyper.at("keep").get<double>() * double(C)));
  if (U < 1 || budget - n <= sinks)
    throw InputError("", "--gate",
                     "keep * context (" + std::to_string(budget) + " of " + std::to_string(C) +
                         " tokens of --seq-len " + std::to_string(o.seq_len) +
                         ") must exceed the restore tokens + sinks (" + std::to_string(n + sinks) +
                         "), and a continuation must remain");

  GateSet set = init_gates(o.kind, hyper, GateShape::of(c), o.seed);
  {  // the restore embeddings start as n rows of the model's own table (seeded)
    torch::NoGradGuard no_grad;
    torch::Tensor rows = torch::randint(c.vocab_size, {n}, torch::kInt64);
    set.params["restore_embeddings"] =
        base.weights().embed.index_select(0, rows.to(base.device())).to(torch::kFloat32).clone();
  }
  // Trained where the model is; initialised on the host (one seed, one start).
  set.to(base.device());
  std::vector<torch::Tensor> params = set.trainable();
  for (torch::Tensor& p : params) p.requires_grad_(true);
  torch::optim::AdamW adam(params, torch::optim::AdamWOptions(o.lr).weight_decay(0));
  torch::Tensor restore_ids = torch::arange(c.vocab_size, c.vocab_size + n, torch::kInt64);
  const model::ModelConfig adapted_config = restorekv_config(c, set);

  KvzipTargets rec(c, base.weights(), C, int64_t(src.repeat.size()), false);
  rec.keep_samples = true;
  const int64_t train_windows = std::max<int64_t>(1, (src.data.train_end - o.seq_len) / o.seq_len);
  std::vector<double> curve;  // the KL of every step's window
  for (int64_t i = 0; i < o.steps; ++i) {
    const int64_t start = kvzip_window_start(i % train_windows, o.seq_len, 0, src.data.train_end);
    Window w = read_window(src, rec, start, C, U);
    Teacher t = run_teacher(base, w);
    std::vector<torch::Tensor> keep = kvzip_keep(w.scores, sinks, budget - n, base.device());
    model::Transformer adapted(adapted_config, restorekv_weights(base.weights(), set));
    torch::Tensor loss = kl(t.logp, run_student(base, &adapted, w, t, keep, restore_ids));
    adam.zero_grad();
    loss.backward();
    for (auto& g : adam.param_groups())
      static_cast<torch::optim::AdamWOptions&>(g.options()).lr(warmup_cosine_lr(o, i));
    adam.step();
    curve.push_back(loss.item<double>());
    if (!o.quiet && (i % 10 == 0 || i + 1 == o.steps))
      std::fprintf(stderr, "restorekv: step %lld/%lld, KL %.5f\n", (long long)i + 1,
                   (long long)o.steps, curve.back());
  }

  // Held out: KVzip + restore against KVzip alone at the same budget.
  torch::NoGradGuard no_grad;
  for (torch::Tensor& p : params) p.requires_grad_(false);
  model::Transformer adapted(adapted_config, restorekv_weights(base.weights(), set));
  double kl_restore = 0, kl_kvzip = 0;
  const int64_t held = std::max<int64_t>(1, o.eval_windows);
  for (int64_t i = 0; i < held; ++i) {
    const int64_t start =
        kvzip_window_start(i, o.seq_len, src.data.train_end, int64_t(src.data.ids.size()));
    Window w = read_window(src, rec, start, C, U);
    Teacher t = run_teacher(base, w);
    kl_restore +=
        kl(t.logp, run_student(base, &adapted, w, t,
                               kvzip_keep(w.scores, sinks, budget - n, base.device()), restore_ids))
            .item<double>();
    kl_kvzip +=
        kl(t.logp, run_student(base, nullptr, w, t,
                               kvzip_keep(w.scores, sinks, budget, base.device()), restore_ids))
            .item<double>();
  }
  return save_fitted_gates(
      std::move(set), c, o,
      {{"method",
        "self-distillation: KL(full-cache teacher || student) of the continuation's next-token "
        "distributions, the student reading KVzip's kept context entries plus the restore "
        "pass's entries (budget-matched); AdamW on the restore embeddings and LoRA only"},
       {"data", src.data.describe},
       {"steps", o.steps},
       {"seq_len", o.seq_len},
       {"context_tokens", C},
       {"continuation_tokens", U},
       {"budget_per_head", budget},
       {"first_train_kl", curve.front()},
       {"final_train_kl", curve.back()},
       {"train_kl", curve},
       {"heldout_windows", held},
       {"heldout_kl_restorekv", kl_restore / double(held)},
       {"heldout_kl_kvzip_same_budget", kl_kvzip / double(held)}},
      t0);
}

}  // namespace

TrainerDescriptor restorekv_trainer() {
  return {"restorekv",
          "RestoreKV's restore tokens and LoRA adapters: self-distillation under KVzip's eviction",
          "Baek et al., RestoreKV: Recovering Full-Cache Behavior Under Aggressive Query-Agnostic "
          "KV Cache Eviction, arXiv 2608.01247",
          "docs/policies/restorekv.md",
          TrainInput::Text,
          TrainOutput::File,
          "-o the gate file (.safetensors) + .json metadata",
          hyper_keys({GateKind::RestoreKv}),
          {},
          [](TrainOptions o, const Params&) {
            o.kind = GateKind::RestoreKv;
            return train_restorekv(o);
          }};
}

}  // namespace kvscope::gates
