#include "capture/train/gated_trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "capture/generate/failure_text.h"
#include "capture/model/model_weights.h"
#include "capture/model/model_writer.h"
#include "capture/train/gated_attention.h"
#include "core/common/check.h"
#include "core/common/input_error.h"

namespace kvscope::gates {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

// One step's numbers (NaN where a kind has no such term).
struct Numbers {
  double loss = NAN, distill = NAN, reg = NAN, kl = NAN, ce = NAN, cap = NAN;
  double gate_mean = NAN, keep = NAN, cache = NAN;
  double score = NAN, agree = NAN, recall = NAN;  // kvpop: boundary loss, agreement, recall
  std::vector<double> recall_per_layer;
  std::vector<std::vector<double>> recall_per_head;
};

bool is_kvpop(GateKind k) {
  return k == GateKind::KvpopMlp || k == GateKind::KvpopMlstm;
}

using Base = GatedSettings::Base;

const char* setting_name(Base b) {
  return b == Base::Retrofit        ? "retrofit"
         : b == Base::StreamingPlus ? "streaming-plus"
                                    : "scorer-only";
}

// The option that asked for the base to train (for messages).
const char* setting_option(Base b) {
  return b == Base::Retrofit ? "--retrofit" : "--policy";
}

// KL(teacher || student) over the teacher's top-k tokens, both renormalised
// there (seed 003 App. F computes the KL over the top-256 teacher logits).
torch::Tensor topk_kl(const torch::Tensor& logits_t, const torch::Tensor& logits_s, int64_t k) {
  const int64_t kk = std::min<int64_t>(k, logits_t.size(-1));
  torch::Tensor idx = std::get<1>(logits_t.topk(kk, -1));
  torch::Tensor lt = torch::log_softmax(logits_t.gather(-1, idx), -1);
  torch::Tensor ls = torch::log_softmax(logits_s.gather(-1, idx), -1);
  return (lt.exp() * (lt - ls)).sum(-1).mean();
}

std::string fmt(double v) {
  if (std::isnan(v)) return "";
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

class Trainer {
 public:
  Trainer(const TrainOptions& o, const GatedSettings& s) : o_(o), s_(s) {}

  TrainResult run();
  void check_kvpop_budget() const;
  TrainResult evaluate_file(std::chrono::steady_clock::time_point t0);

 private:
  void validate();
  // Window tokens [seq_len + 1] on the model's device (the targets meet the
  // logits there).
  torch::Tensor window(int64_t start) const {
    std::vector<int64_t> ids(data_.ids.begin() + start, data_.ids.begin() + start + o_.seq_len + 1);
    return torch::tensor(ids, torch::kInt64).to(engine_.device);
  }
  // Where window b of a step starts (seeded; b = 0 as before batches existed).
  int64_t train_start(int64_t step, int64_t b) const {
    std::mt19937_64 rng(o_.seed * 7919ULL + uint64_t(step) * 104729ULL + 17 +
                        uint64_t(b) * 1000000007ULL);
    return int64_t(rng() % uint64_t(data_.train_end - o_.seq_len - 1 + 1));
  }
  double lr_at(int64_t step) const { return warmup_cosine_lr(o_, step); }
  // dms: the share of decisions to close at `step`, 1 - 1/cr with the ratio
  // ramped linearly from initial_cr to target_cr over the first `ramp` of
  // the run (the official dms_schedule); the final share when step < 0.
  double dms_target(int64_t step) const {
    const double c0 = gates_.hyper("initial_cr"), c1 = gates_.hyper("target_cr");
    const double ramp = std::max(1.0, gates_.hyper("ramp") * double(o_.steps));
    const double progress = step < 0 ? 1.0 : std::min(1.0, double(step) / ramp);
    return 1.0 - 1.0 / (c0 + (c1 - c0) * progress);
  }
  // The rate the CSV records: the gates', or the base's when only it trains.
  double csv_lr(int64_t step) const { return trains_gates() ? lr_at(step) : s_.base_lr; }
  bool trains_base() const { return s_.base != Base::Frozen; }
  bool trains_gates() const { return s_.base != Base::StreamingPlus; }
  // The model under training: the fine-tuned copy, or the frozen original
  // (which is always the teacher).
  model::Transformer& student() { return student_ ? *student_ : *engine_.model; }
  void make_student();
  void make_optimizer();
  double set_learning_rates(int64_t step);
  void clip_gradients();
  std::string model_out_path() const;
  void check_model_out() const;
  std::string streaming_spec() const;
  json write_finetuned_model();
  json write_outputs(int64_t steps_done, double wall, const Numbers& last, const Numbers& eval);
  void prepare();
  void open_outputs(int64_t step0);
  std::string heldout_line(const Numbers& e) const;
  Numbers train_step(int64_t step, double* lr);
  void progress(int64_t step, const Numbers& n, double secs, double per_step);
  // Forward both models on one window; the objective and its parts.
  std::pair<torch::Tensor, Numbers> objective(const torch::Tensor& w, GatedDenseBackend::Mode mode);
  std::pair<torch::Tensor, Numbers> kvpop_objective(const torch::Tensor& x,
                                                    const torch::Tensor& logits_t, int64_t seed);
  std::pair<torch::Tensor, Numbers> streaming_objective(const torch::Tensor& x,
                                                        const torch::Tensor& logits_t);
  // The gated student's window against the teacher's, one objective per
  // method (seed 001 WG-KV, 002 Attention-Gate, DMS, seed 003 retention).
  struct Window {
    const GatedDenseBackend& gated;
    const torch::Tensor &hidden_s, &hidden_t, &logp_t, &y;
  };
  torch::Tensor wgkv_loss(const Window& w, Numbers* n) const;
  torch::Tensor attention_gate_loss(const Window& w, Numbers* n) const;
  torch::Tensor dms_loss(const Window& w, Numbers* n) const;
  torch::Tensor retention_loss(const Window& w, Numbers* n) const;
  json fingerprint() const;
  json objective_json() const;
  void save_checkpoint(int64_t next_step, double elapsed);
  int64_t load_checkpoint(double* elapsed);
  void log(const std::string& line);
  void csv_row(const char* phase, int64_t step, double lr, const Numbers& n, double secs);
  Numbers evaluate();
  json gate_meta(int64_t steps_done, double wall, const Numbers& last, const Numbers& eval) const;

  const TrainOptions& o_;
  const GatedSettings& s_;
  generate::Engine engine_;
  TokenData data_;
  GateSet gates_;
  std::unique_ptr<torch::optim::AdamW> opt_;
  double budget_ = 0;
  // dms: the step whose compression target applies (-1: held-out, the final
  // target) and the seed of the window's Gumbel noise.
  int64_t step_ = -1;
  uint64_t noise_seed_ = 0;
  std::ofstream log_, csv_;
  // Retrofit, StreamingPlus: the fine-tuned copy of the base and its tensors
  // (name order of model::weight_tensors); the optimiser's groups.
  std::unique_ptr<model::Transformer> student_;
  std::vector<torch::Tensor> base_params_;
  int gate_group_ = -1, base_group_ = -1;
  Numbers before_;  // held-out numbers before the first step (base-training runs)
  model::ModelFormat format_ = model::ModelFormat::Llama2c;  // of --model (base-training runs)
  json model_written_;
};

void Trainer::validate() {
  if (o_.output.empty() && o_.evaluate.empty())
    throw InputError("", "-o", "an output gate file is required");
  if (o_.seq_len < 8) throw InputError("", "--seq-len", "at least 8 tokens expected");
  if (o_.steps < 1) throw InputError("", "--steps", "at least 1 step expected");
  if (o_.batch < 1) throw InputError("", "--batch", "at least 1 window per step expected");
  if (!(o_.lr > 0)) throw InputError("", "--lr", "a positive learning rate expected");
  if (s_.beta < 0 || s_.beta > 1) throw InputError("", "--beta", "a keep ratio in [0, 1] expected");
  if (s_.lambda < 0 || s_.alpha < 0 || s_.cap_weight < 0 || s_.ce_weight < 0)
    throw InputError("", "--lambda/--alpha/--cap-weight/--ce-weight",
                     "non-negative weights expected");
  if (!(o_.lr_min >= 0 && o_.lr_min <= o_.lr))
    throw InputError("", "--lr-min",
                     fmt(o_.lr_min) + " (expected a floor in [0, --lr = " + fmt(o_.lr) + "])");
  if (!trains_base()) return;
  if (!is_kvpop(o_.kind))
    throw InputError("", "--retrofit",
                     std::string("fine-tuning the base is KVpop's setting, not ") +
                         gate_kind_name(o_.kind) + "'s (expected --policy kvpop)");
  if (!o_.evaluate.empty())
    throw InputError("", "--evaluate",
                     std::string("evaluates a scorer on a frozen model, not with ") +
                         setting_option(s_.base) +
                         " (expected --model the fine-tuned model, and no --retrofit)");
  if (!(s_.base_lr > 0)) throw InputError("", "--base-lr", "a positive learning rate expected");
  std::error_code ec;
  if (!fs::exists(o_.model.model, ec)) return;  // open_engine says what is wrong
  format_ = model::detect_model_format(o_.model.model);
  check_model_out();
}

std::pair<torch::Tensor, Numbers> Trainer::objective(const torch::Tensor& w,
                                                     GatedDenseBackend::Mode mode) {
  model::Transformer& m = *engine_.model;  // the teacher, and the student of frozen-base kinds
  const int64_t L = o_.seq_len;
  torch::Tensor x = w.narrow(0, 0, L), y = w.narrow(0, 1, L);
  const bool wants_logits = gates_.kind != GateKind::WriteGate;
  torch::Tensor hidden_t, logits_t, logp_t;
  {
    torch::NoGradGuard no_grad;
    GatedDenseBackend full(nullptr, GatedDenseBackend::Mode::Full);
    hidden_t = m.forward_hidden(x, 0, full);
    if (wants_logits) logits_t = m.logits(hidden_t);
    if (wants_logits) logp_t = torch::log_softmax(logits_t, -1);
  }
  if (s_.base == Base::StreamingPlus) return streaming_objective(x, logits_t);
  if (is_kvpop(gates_.kind)) return kvpop_objective(x, logits_t, w[0].item<int64_t>());
  GatedDenseBackend gated(&gates_, mode);
  gated.noise_seed = noise_seed_;
  torch::Tensor hidden_s = m.forward_hidden(x, 0, gated);
  const Window win{gated, hidden_s, hidden_t, logp_t, y};
  Numbers n;
  torch::Tensor loss;
  switch (gates_.kind) {
    case GateKind::WriteGate: loss = wgkv_loss(win, &n); break;
    case GateKind::AttentionGate: loss = attention_gate_loss(win, &n); break;
    case GateKind::Dms: loss = dms_loss(win, &n); break;
    case GateKind::Retention:
    case GateKind::RetentionGlobal: loss = retention_loss(win, &n); break;
    case GateKind::KvpopMlp:
    case GateKind::KvpopMlstm:
    case GateKind::SfcGru:
    case GateKind::RestoreKv:
    case GateKind::QFilter:
    case GateKind::QueryStats:
    case GateKind::Kvzap:
    case GateKind::FastKvzip:
      KVSCOPE_CHECK(false, std::string("trainer: ") + gate_kind_name(gates_.kind) +
                               " does not train through the gated-attention objective");
  }
  n.loss = loss.item<double>();
  return {loss, n};
}

torch::Tensor Trainer::wgkv_loss(const Window& w, Numbers* n) const {
  const int64_t L = o_.seq_len;
  torch::Tensor g = torch::stack(w.gated.gate);  // [L, K, n]
  torch::Tensor distill =
      torch::mse_loss(w.hidden_s.to(torch::kFloat32), w.hidden_t.to(torch::kFloat32));
  torch::Tensor reg = (g + g * (1 - g)).mean();
  const double tau = gates_.hyper("tau");
  const int64_t W = int64_t(gates_.hyper("window"));
  torch::Tensor admitted = (g >= tau).to(torch::kFloat32);
  n->distill = distill.item<double>();
  n->reg = reg.item<double>();
  n->gate_mean = g.mean().item<double>();
  n->keep = admitted.mean().item<double>();
  // The cache at the end of the window: the local W plus the admitted older tokens.
  const int64_t older = std::max<int64_t>(0, L - W);
  const double global = older > 0 ? admitted.narrow(2, 0, older).sum(2).mean().item<double>() : 0.0;
  n->cache = (double(std::min(L, W)) + global) / double(L);
  return distill + s_.lambda * reg;
}

torch::Tensor Trainer::attention_gate_loss(const Window& w, Numbers* n) const {
  torch::Tensor logp_s = torch::log_softmax(engine_.model->logits(w.hidden_s), -1);
  torch::Tensor kl = (w.logp_t.exp() * (w.logp_t - logp_s)).sum(-1).mean();
  torch::Tensor flags = torch::stack(w.gated.flags);  // straight-through 0/1
  torch::Tensor keep = flags.mean();
  torch::Tensor evict = s_.alpha * torch::abs(keep - s_.beta);
  n->kl = kl.item<double>();
  n->reg = evict.item<double>();
  n->gate_mean = torch::stack(w.gated.gate).mean().item<double>();
  n->keep = keep.item<double>();
  n->cache = n->keep;
  return kl + evict;
}

// The official distillation_loss: sum p_s (log p_s - log p_t), i.e.
// KL(student || teacher), plus clamp(target - closed, min 0) with the
// straight-through share of closing decisions.
torch::Tensor Trainer::dms_loss(const Window& w, Numbers* n) const {
  const int64_t L = o_.seq_len;
  torch::Tensor logp_s = torch::log_softmax(engine_.model->logits(w.hidden_s), -1);
  torch::Tensor kl = (logp_s.exp() * (logp_s - w.logp_t)).sum(-1).mean();
  torch::Tensor decisions = torch::stack(w.gated.flags);  // [L, K, n]
  torch::Tensor closed = decisions.mean();
  torch::Tensor comp = torch::relu(dms_target(step_) - closed);
  n->kl = kl.item<double>();
  n->reg = comp.item<double>();
  n->gate_mean = torch::stack(w.gated.gate).mean().item<double>();
  n->keep = 1.0 - closed.item<double>();
  // The cache at the window's end: key j is gone when j < L - 1 - w and
  // the decision at j + 1 closed it.
  const int64_t older = std::max<int64_t>(0, L - 1 - int64_t(gates_.hyper("window")));
  const double gone =
      older > 0 ? decisions.detach().narrow(2, 1, older).sum(2).mean().item<double>() : 0.0;
  n->cache = (double(L) - gone) / double(L);
  return kl + comp;
}

torch::Tensor Trainer::retention_loss(const Window& w, Numbers* n) const {
  const int64_t L = o_.seq_len, nl = int64_t(w.gated.gate.size());
  torch::Tensor logp_s = torch::log_softmax(engine_.model->logits(w.hidden_s), -1);
  torch::Tensor kl = (w.logp_t.exp() * (w.logp_t - logp_s)).sum(-1).mean();
  torch::Tensor ce = torch::nll_loss(logp_s, w.y);
  torch::Tensor S = torch::stack(w.gated.soft_size);  // [L, K, n]
  torch::Tensor cap;
  if (gates_.kind == GateKind::Retention) {
    cap = torch::relu(S - budget_).mean() / budget_;
  } else {
    const double total = budget_ * double(nl) * double(S.size(1));
    cap = torch::relu(S.sum(torch::IntArrayRef{0, 1}) - total).mean() / total;
  }
  n->kl = kl.item<double>();
  n->ce = ce.item<double>();
  n->cap = cap.item<double>();
  n->gate_mean = torch::stack(w.gated.gate).exp().mean().item<double>();  // mean beta
  // Expected cache at the window's end, relative to the budget.
  n->cache = S.select(2, L - 1).mean().item<double>() / budget_;
  return kl + s_.ce_weight * ce + s_.cap_weight * cap;
}

// Scorer-only (the base frozen): the boundary loss alone trains the scorers;
// the KL of the sparse student is reported, not optimised (no gradient
// reaches the scorer through the hard top-k mask). Retrofit (Algorithm 1,
// line 13): loss = KL + L_score, the KL reaching the base through the sparse
// attention, L_score the scorers (their inputs are detached).
std::pair<torch::Tensor, Numbers> Trainer::kvpop_objective(const torch::Tensor& x,
                                                           const torch::Tensor& logits_t,
                                                           int64_t seed) {
  KvpopLossOptions lo = s_.kvpop;
  lo.seed = o_.seed * 1000003ULL + uint64_t(seed);
  KvpopTrainBackend sparse(gates_, lo);
  torch::Tensor hidden_s = student().forward_hidden(x, 0, sparse);
  torch::Tensor score = sparse.mean_loss(), loss = score;
  Numbers n;
  if (s_.base == Base::Retrofit) {
    torch::Tensor kl = topk_kl(logits_t, student().logits(hidden_s), s_.kl_topk);
    loss = kl + score;
    n.kl = kl.item<double>();
  } else {
    torch::NoGradGuard no_grad;
    n.kl = topk_kl(logits_t, student().logits(hidden_s.detach()), s_.kl_topk).item<double>();
  }
  n.score = score.item<double>();
  n.loss = loss.item<double>();
  double agree = 0, recall = 0;
  for (size_t l = 0; l < sparse.recall.size(); ++l) {
    agree += sparse.agreement[l];
    recall += sparse.recall[l];
  }
  n.agree = agree / double(sparse.recall.size());
  n.recall = recall / double(sparse.recall.size());
  n.recall_per_layer = sparse.recall;
  n.recall_per_head = sparse.recall_heads;
  const KvpopConfig c = kvpop_config(gates_);
  n.cache = std::min(1.0, double(c.sinks + c.window + c.topk) / double(o_.seq_len));
  return {loss, n};
}

// StreamingLLM+: KL(teacher || student) of the base under sinks + a window
// of w + k, the budget of the KVpop hyperparameters.
std::pair<torch::Tensor, Numbers> Trainer::streaming_objective(const torch::Tensor& x,
                                                               const torch::Tensor& logits_t) {
  const KvpopConfig c = kvpop_config(gates_);
  StreamingTrainBackend pattern(c.sinks, c.window + c.topk);
  torch::Tensor kl =
      topk_kl(logits_t, student().logits(student().forward_hidden(x, 0, pattern)), s_.kl_topk);
  Numbers n;
  n.kl = n.loss = kl.item<double>();
  n.cache = std::min(1.0, double(c.sinks + c.window + c.topk) / double(o_.seq_len));
  return {kl, n};
}

// Sums of the parts (NaN where no window had the part) and per-layer/head recalls.
void add_numbers(Numbers& sum, const Numbers& n) {
  auto add = [](double& a, double b) {
    if (!std::isnan(b)) a = std::isnan(a) ? b : a + b;
  };
  for (auto [a, b] : {std::pair{&sum.loss, n.loss},
                      {&sum.distill, n.distill},
                      {&sum.reg, n.reg},
                      {&sum.kl, n.kl},
                      {&sum.ce, n.ce},
                      {&sum.cap, n.cap},
                      {&sum.gate_mean, n.gate_mean},
                      {&sum.keep, n.keep},
                      {&sum.cache, n.cache},
                      {&sum.score, n.score},
                      {&sum.agree, n.agree},
                      {&sum.recall, n.recall}})
    add(*a, b);
  sum.recall_per_layer.resize(n.recall_per_layer.size(), 0.0);
  sum.recall_per_head.resize(n.recall_per_head.size());
  for (size_t l = 0; l < n.recall_per_layer.size(); ++l) {
    sum.recall_per_layer[l] += n.recall_per_layer[l];
    sum.recall_per_head[l].resize(n.recall_per_head[l].size(), 0.0);
    for (size_t h = 0; h < n.recall_per_head[l].size(); ++h)
      sum.recall_per_head[l][h] += n.recall_per_head[l][h];
  }
}

// The sums of `count` windows -> their means.
void divide_numbers(Numbers& sum, int64_t count) {
  const double E = double(count);
  for (double* a : {&sum.loss, &sum.distill, &sum.reg, &sum.kl, &sum.ce, &sum.cap, &sum.gate_mean,
                    &sum.keep, &sum.cache, &sum.score, &sum.agree, &sum.recall})
    *a /= E;
  for (double& r : sum.recall_per_layer) r /= E;
  for (auto& layer : sum.recall_per_head)
    for (double& r : layer) r /= E;
}

Numbers Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  step_ = -1;
  const int64_t E = std::max<int64_t>(1, o_.eval_windows);
  const int64_t span = int64_t(data_.ids.size()) - data_.train_end - o_.seq_len - 1;
  Numbers sum;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t start = data_.train_end + (E > 1 ? span * e / (E - 1) : 0);
    add_numbers(sum, objective(window(start), GatedDenseBackend::Mode::Hard).second);
  }
  divide_numbers(sum, E);
  return sum;
}

json Trainer::objective_json() const {
  if (s_.base == Base::StreamingPlus)
    return {{"loss", "KL(teacher || student) on the teacher's top logits"},
            {"kl_topk", s_.kl_topk},
            {"pattern", streaming_spec()},
            {"setting", "StreamingLLM+ (base fine-tuned, fixed sinks + window; seed 003 §4)"}};
  if (is_kvpop(gates_.kind)) {
    const KvpopLossOptions& k = s_.kvpop;
    return {{"loss", "boundary-aware logistic (seed 003 eq. 7)"},
            {"target_lse", k.dense_lse ? "dense" : "sparse"},
            {"target_agg", k.target.agg == kvpop::TargetOptions::Max ? "max" : "mean"},
            {"count_normalise", k.target.count_normalise},
            {"eps", k.target.eps},
            {"tau", k.tau},
            {"margin_weighting", k.margin_weighting},
            {"w_min", k.w_min},
            {"tau_w", k.tau_w},
            {"balance", k.balance},
            {"c_min", k.c_min},
            {"c_max", k.c_max},
            {"pairs", k.max_pairs},
            {"kl_topk", s_.kl_topk},
            {"setting", s_.base == Base::Retrofit
                            ? "full retrofit (Algorithm 1): base + scorers, loss = KL(teacher || "
                              "sparse student) on the teacher's top logits + L_score"
                            : "scorer-only (base frozen)"}};
  }
  if (gates_.kind == GateKind::Dms)
    return {{"loss",
             "KL(student || teacher) of the next-token distributions + max(0, 1 - 1/cr - share "
             "of closing decisions) (DMS; cr ramped from initial_cr to target_cr)"},
            {"target_cr", gates_.hyper("target_cr")}};
  return {{"lambda", s_.lambda}, {"alpha", s_.alpha},           {"beta", s_.beta},
          {"budget", budget_},   {"cap_weight", s_.cap_weight}, {"ce_weight", s_.ce_weight}};
}

json Trainer::fingerprint() const {
  return {{"policy", gate_kind_name(gates_.kind)},
          {"hyperparameters", gates_.meta["hyperparameters"]},
          {"model_sha256", file_sha256(o_.model.model)},
          {"data", data_.describe},
          {"seq_len", o_.seq_len},
          {"batch", o_.batch},
          {"steps", o_.steps},
          {"seed", o_.seed},
          {"lr", o_.lr},
          {"weight_decay", o_.weight_decay},
          {"warmup", o_.warmup},
          {"objective", objective_json()},
          {"setting", setting_name(s_.base)},
          {"optimizer",
           {{"base_lr", trains_base() ? s_.base_lr : 0.0},
            {"lr_min", o_.lr_min},
            {"warmup_steps", o_.warmup_steps},
            {"beta2", o_.beta2},
            {"grad_clip", o_.grad_clip}}}};
}

void Trainer::save_checkpoint(int64_t next_step, double elapsed) {
  torch::serialize::OutputArchive ar;
  ar.write("next_step", torch::tensor(next_step, torch::kInt64));
  ar.write("elapsed", torch::tensor(elapsed, torch::kFloat64));
  ar.write("fingerprint", c10::IValue(fingerprint().dump()));
  // Archive keys may not contain '.': the parameters go by index (name order).
  int64_t k = 0;
  for (const auto& [name, t] : gates_.params) ar.write("param_" + std::to_string(k++), t.detach());
  for (size_t b = 0; b < base_params_.size(); ++b)
    ar.write("base_" + std::to_string(b), base_params_[b].detach());
  torch::serialize::OutputArchive opt;
  opt_->save(opt);
  ar.write("optimizer", opt);
  const std::string path = sidecar_path(o_.output, ".ckpt");
  ar.save_to(path + ".partial");
  fs::rename(path + ".partial", path);
}

int64_t Trainer::load_checkpoint(double* elapsed) {
  const std::string path = sidecar_path(o_.output, ".ckpt");
  if (!fs::exists(path)) throw InputError(path, "--resume", "no checkpoint to resume from");
  torch::serialize::InputArchive ar;
  try {
    // Onto this run's device: a checkpoint from a GPU run resumes on the CPU
    // and the other way round (the fingerprint leaves the device out).
    ar.load_from(path, engine_.device);
  } catch (const std::exception& e) {
    throw InputError(path, "--resume", "unreadable checkpoint: " + generate::failure_text(e));
  }
  c10::IValue fp;
  ar.read("fingerprint", fp);
  json saved = json::parse(fp.toStringRef()), now = fingerprint();
  for (auto it = now.begin(); it != now.end(); ++it)
    if (saved.value(it.key(), json()) != it.value())
      throw InputError(path, it.key(),
                       "the checkpoint belongs to another run (" + it.key() + " was " +
                           saved.value(it.key(), json()).dump() + ", now " + it.value().dump() +
                           ")");
  torch::NoGradGuard no_grad;
  int64_t k = 0;
  for (auto& [name, t] : gates_.params) {
    torch::Tensor saved_t;
    ar.read("param_" + std::to_string(k++), saved_t);
    t.copy_(saved_t);
  }
  for (size_t b = 0; b < base_params_.size(); ++b) {
    torch::Tensor saved_t;
    ar.read("base_" + std::to_string(b), saved_t);
    base_params_[b].copy_(saved_t);
  }
  torch::serialize::InputArchive opt;
  ar.read("optimizer", opt);
  opt_->load(opt);
  torch::Tensor step, el;
  ar.read("next_step", step);
  ar.read("elapsed", el);
  *elapsed = el.item<double>();
  return step.item<int64_t>();
}

void Trainer::log(const std::string& line) {
  if (!o_.quiet) std::fprintf(stderr, "%s\n", line.c_str());
  log_ << line << "\n";
  log_.flush();
}

void Trainer::csv_row(const char* phase, int64_t step, double lr, const Numbers& n, double secs) {
  csv_ << phase << "," << step << "," << fmt(lr) << "," << fmt(n.loss) << "," << fmt(n.distill)
       << "," << fmt(n.reg) << "," << fmt(n.kl) << "," << fmt(n.ce) << "," << fmt(n.cap) << ","
       << fmt(n.gate_mean) << "," << fmt(n.keep) << "," << fmt(n.cache) << "," << fmt(n.score)
       << "," << fmt(n.agree) << "," << fmt(n.recall) << "," << fmt(secs) << "\n";
  csv_.flush();
}

json numbers_json(const Numbers& n) {
  json j;
  for (auto [k, v] : {std::pair{"loss", n.loss},
                      {"distill", n.distill},
                      {"reg", n.reg},
                      {"kl", n.kl},
                      {"ce", n.ce},
                      {"cap", n.cap},
                      {"gate_mean", n.gate_mean},
                      {"keep", n.keep},
                      {"cache_fraction", n.cache},
                      {"score", n.score},
                      {"agreement", n.agree},
                      {"recall", n.recall}})
    if (!std::isnan(v)) j[k] = v;
  if (!n.recall_per_layer.empty()) j["recall_per_layer"] = n.recall_per_layer;
  if (!n.recall_per_head.empty()) j["recall_per_head"] = n.recall_per_head;
  return j;
}

json Trainer::gate_meta(int64_t steps_done, double wall, const Numbers& last,
                        const Numbers& eval) const {
  const model::ModelConfig& c = engine_.model->config();
  json meta = gates_.meta;
  const json original = model_json(c, c.name, o_.model.model, o_.model.model);
  // A retrofit scorer belongs to the fine-tuned model it was trained with.
  meta["base_model"] = trains_base() ? model_written_ : original;
  json fp = fingerprint();
  const bool hard = gates_.kind == GateKind::WriteGate || gates_.kind == GateKind::AttentionGate ||
                    gates_.kind == GateKind::Dms;
  meta["training"] = {
      {"data", data_.describe},
      {"steps", steps_done},
      {"seq_len", o_.seq_len},
      {"batch", o_.batch},
      {"seed", o_.seed},
      {"lr", o_.lr},
      {"weight_decay", o_.weight_decay},
      {"warmup", o_.warmup},
      {"schedule", "linear warmup, cosine decay (AdamW)"},
      {"objective", fp["objective"]},
      {"threads", at::get_num_threads()},
      {"device", engine_.device.str()},
      {"dtype", generate::dtype_name(engine_.dtype)},
      {"command", o_.command_line},
      {"wall_seconds", wall},
      {"last_step", numbers_json(last)},
      {"heldout", numbers_json(eval)},
      {"heldout_mode", hard                             ? "hard (inference-time decisions)"
                       : s_.base == Base::StreamingPlus ? "hard (the sinks + window pattern)"
                       : is_kvpop(gates_.kind) ? "hard (the sparse top-k attention inference uses)"
                                               : "soft (retention-gated attention)"}};
  if (trains_base()) {
    json& t = meta["training"];
    t["setting"] = setting_name(s_.base);
    t["original_model"] = original;  // the teacher
    t["optimizer"] = fp["optimizer"];
    t["optimizer"]["schedule"] =
        "AdamW, two groups: base weights at a constant base_lr; gates warmed up over "
        "warmup_steps, then cosine from lr to lr_min; global gradient-norm clip";
    t["heldout_before"] = numbers_json(before_);
  }
  return meta;
}

void Trainer::check_kvpop_budget() const {
  if (!is_kvpop(gates_.kind)) return;
  const KvpopConfig k = kvpop_config(gates_);
  const int64_t B = k.sinks + k.window + k.topk;
  if (o_.seq_len <= B)
    throw InputError("", "--seq-len",
                     std::to_string(o_.seq_len) +
                         " tokens never fill the budget B = s + w + k = " + std::to_string(B) +
                         ": no boundary decision to learn (expected > " + std::to_string(B) + ")");
}

// --evaluate: the held-out numbers of an existing gate file (for KVpop at
// the budget --gate sinks/window/topk give, e.g. the exact oracle recall with
// --target-lse dense); nothing is written.
TrainResult Trainer::evaluate_file(Clock::time_point t0) {
  const model::ModelConfig& c = engine_.model->config();
  GateSet trained = load_gates(o_.evaluate, c);
  if (trained.kind != o_.kind)
    throw InputError(o_.evaluate, "policy",
                     std::string("holds ") + gate_kind_name(trained.kind) +
                         " gates, --policy asks for " + gate_kind_name(o_.kind));
  for (const char* key : {"sinks", "window", "topk"})
    if (o_.hyper_given.contains(key))
      trained.meta["hyperparameters"][key] = gates_.meta["hyperparameters"][key];
  gates_ = std::move(trained);
  gates_.to(engine_.device);
  check_kvpop_budget();
  torch::NoGradGuard no_grad;
  Numbers e = evaluate();
  TrainResult r;
  r.summary = numbers_json(e);
  r.summary["gates"] = o_.evaluate;
  r.summary["hyperparameters"] = gates_.meta["hyperparameters"];
  r.summary["objective"] = objective_json();
  r.summary["windows"] = o_.eval_windows;
  r.summary["seq_len"] = o_.seq_len;
  r.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

// The student: writable copies of the base's weights with autograd on; the
// original model stays untouched as the teacher.
void Trainer::make_student() {
  model::ModelWeights w = model::clone_weights(engine_.model->weights());
  base_params_ = model::weight_tensors(w);
  for (torch::Tensor& t : base_params_) t.requires_grad_(true);
  student_ = std::make_unique<model::Transformer>(engine_.model->config(), std::move(w));
}

// One AdamW with a group for the gates and one for the base (Table 3: the
// new parameters on a schedule, the existing ones at a constant rate).
void Trainer::make_optimizer() {
  auto options = [&](double lr) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(lr).betas({0.9, o_.beta2}).weight_decay(o_.weight_decay));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (trains_gates()) {
    for (auto& [name, t] : gates_.params) t.requires_grad_(true);
    gate_group_ = int(groups.size());
    groups.emplace_back(gates_.trainable(), options(o_.lr));
  }
  if (trains_base()) {
    base_group_ = int(groups.size());
    groups.emplace_back(base_params_, options(s_.base_lr));
  }
  opt_ = std::make_unique<torch::optim::AdamW>(std::move(groups), *options(o_.lr));
}

// Sets each group's rate for `step`; returns csv_lr(step).
double Trainer::set_learning_rates(int64_t step) {
  auto set = [&](int group, double lr) {
    if (group >= 0)
      static_cast<torch::optim::AdamWOptions&>(opt_->param_groups()[size_t(group)].options())
          .lr(lr);
  };
  set(gate_group_, lr_at(step));
  set(base_group_, s_.base_lr);
  return csv_lr(step);
}

// The norm over every trained parameter together (as FSDP clips).
void Trainer::clip_gradients() {
  if (!(o_.grad_clip > 0)) return;
  std::vector<torch::Tensor> all;
  for (auto& group : opt_->param_groups())
    for (auto& p : group.params()) all.push_back(p);
  torch::nn::utils::clip_grad_norm_(all, o_.grad_clip);
}

std::string Trainer::streaming_spec() const {
  const KvpopConfig c = kvpop_config(gates_);
  return "streaming_llm:sinks=" + std::to_string(c.sinks) +
         ",window=" + std::to_string(c.window + c.topk);
}

std::string Trainer::model_out_path() const {
  if (s_.base == Base::StreamingPlus) return o_.output;
  if (!s_.model_out.empty()) return s_.model_out;
  return sidecar_path(o_.output, format_ == model::ModelFormat::Llama2c ? ".bin" : "");
}

// Before anything loads: a model that cannot be written back, or a place it
// cannot go, would lose the run.
void Trainer::check_model_out() const {
  if (format_ == model::ModelFormat::Gguf)
    throw InputError(o_.model.model, setting_option(s_.base),
                     "a GGUF model cannot be written back after fine-tuning (KVScope reads GGUF, "
                     "it does not write it; expected a llama2.c .bin or a Hugging Face directory)");
  const std::string out = model_out_path();
  const char* option = s_.base == Base::StreamingPlus ? "-o" : "--model-out";
  if (out == o_.output && s_.base == Base::Retrofit)
    throw InputError(out, option, "is the scorer file -o (expected another path for the model)");
  const bool dir_out = format_ == model::ModelFormat::HfDirectory;
  std::error_code ec;
  // The loaders tell a llama2.c checkpoint from other formats partly by its name.
  const bool bin = out.size() > 4 && out.compare(out.size() - 4, 4, ".bin") == 0;
  if (!dir_out && (!bin || fs::is_directory(out, ec)))
    throw InputError(out, option,
                     "a llama2.c model is written to a .bin file (expected a path "
                     "ending in .bin)");
  const fs::path parent = fs::absolute(out).parent_path();
  if (!fs::is_directory(parent, ec))
    throw InputError(out, option, "the directory " + parent.string() + " does not exist");
}

// Writes the student as a model file and describes it as a gate file's
// base_model (named as the loader will name it).
json Trainer::write_finetuned_model() {
  const std::string out = model_out_path();
  const std::string hashed =
      model::write_model_like(student(), o_.model.model, out, setting_option(s_.base));
  const std::string name = model::inspect_model(out).config.name;
  json j = model_json(student().config(), name, out, hashed);
  j["fine_tuned_from"] = file_sha256(o_.model.model);
  return j;
}

// The gate file and its .json (gates trained), or the run's .json beside
// the model (StreamingLLM+); the fine-tuned model first, so the scorer can
// name it. Returns the metadata's "training".
json Trainer::write_outputs(int64_t steps_done, double wall, const Numbers& last,
                            const Numbers& eval) {
  if (trains_base()) model_written_ = write_finetuned_model();
  json meta = gate_meta(steps_done, wall, last, eval);
  if (trains_gates()) {
    gates_.meta = meta;
    save_gates(gates_, o_.output);
  } else {
    const KvpopConfig c = kvpop_config(gates_);
    meta = {{"format", "kvscope-finetune"},
            {"version", 1},
            {"setting", setting_name(s_.base)},
            {"policy", streaming_spec()},
            {"budget", {{"sinks", c.sinks}, {"window", c.window}, {"topk", c.topk}}},
            {"model", model_written_},
            {"training", meta["training"]}};
  }
  std::ofstream js(sidecar_path(o_.output, ".json"));
  js << meta.dump(2) << "\n";
  return meta["training"];
}

void Trainer::prepare() {
  engine_ = generate::open_engine(o_.model);
  const model::ModelConfig& c = engine_.model->config();
  if (o_.seq_len > c.context_length && c.context_length > 0)
    throw InputError("", "--seq-len",
                     std::to_string(o_.seq_len) + " is past the model's context (" +
                         std::to_string(c.context_length) + ")");
  DataOptions d = o_.data;
  d.window = o_.seq_len;
  d.seed = o_.seed;
  if (d.generate_tokens > 0 && d.generated_cache.empty() && o_.evaluate.empty())
    d.generated_cache = sidecar_path(o_.output, ".generated.jsonl");
  data_ = load_training_data(engine_, d);
  const GateShape shape = GateShape::of(c);
  json hyper = resolve_hyperparameters(o_.kind, shape, o_.hyper_given, "--gate");
  // Initialised on the host (the same seeded values on every device), then
  // moved to the model's device before the optimiser takes them.
  gates_ = init_gates(o_.kind, hyper, shape, o_.seed);
  gates_.to(engine_.device);
  gates_.source = o_.output;
  budget_ = s_.budget > 0 ? s_.budget : double(o_.seq_len) / 4.0;
  if (o_.kind == GateKind::Dms && o_.seq_len < int64_t(gates_.hyper("window")) + 2)
    throw InputError("", "--seq-len",
                     std::to_string(o_.seq_len) + " tokens leave no key outside the DMS window " +
                         std::to_string(int64_t(gates_.hyper("window"))) +
                         " (expected at least window + 2; set --gate window=N)");
}

// The .log and .csv (a resumed run keeps the curve up to its checkpoint) and
// the first lines.
void Trainer::open_outputs(int64_t step0) {
  const std::string csv_path = sidecar_path(o_.output, ".csv");
  std::vector<std::string> kept_rows;
  if (o_.resume && fs::exists(csv_path)) {
    std::ifstream in(csv_path);
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      const size_t a = line.find(','), b = line.find(',', a + 1);
      if (a != std::string::npos && std::stoll(line.substr(a + 1, b - a - 1)) < step0)
        kept_rows.push_back(line);
    }
  }
  log_.open(sidecar_path(o_.output, ".log"), o_.resume ? std::ios::app : std::ios::trunc);
  csv_.open(csv_path, std::ios::trunc);
  csv_ << "phase,step,lr,loss,distill,reg,kl,ce,cap,gate_mean,keep,cache_fraction,score,agreement,"
          "recall,seconds\n";
  for (const std::string& r : kept_rows) csv_ << r << "\n";
  int64_t tensors = 0, params = 0;
  for (auto& group : opt_->param_groups())
    for (auto& t : group.params()) ++tensors, params += t.numel();
  const model::ModelConfig& c = engine_.model->config();
  log("train " + std::string(trains_gates() ? gate_kind_name(o_.kind) : "streaming-plus") +
      " for " + c.name + " (" + setting_name(s_.base) + "): " + std::to_string(tensors) +
      " tensors, " + std::to_string(params) + " parameters; " + std::to_string(data_.train_end) +
      " training tokens, " + std::to_string(int64_t(data_.ids.size()) - data_.train_end) +
      " held out; " + std::to_string(o_.steps) + " steps of " + std::to_string(o_.seq_len) +
      " tokens" + (step0 > 0 ? "; resumed at step " + std::to_string(step0) : ""));
  if (trains_base() && step0 == 0) {
    csv_row("eval", 0, csv_lr(0), before_, 0);
    log("held-out before training: " + heldout_line(before_));
  }
}

std::string Trainer::heldout_line(const Numbers& e) const {
  return "loss " + fmt(e.loss) + " distill " + fmt(e.distill) + " kl " + fmt(e.kl) + " ce " +
         fmt(e.ce) + " keep " + fmt(e.keep) + " cache " + fmt(e.cache) +
         (std::isnan(e.agree) ? "" : " agree " + fmt(e.agree) + " recall " + fmt(e.recall));
}

// One optimiser step over `batch` windows, their gradients accumulated (the
// paper's batch of 128 sequences is reached the same way); the mean numbers.
Numbers Trainer::train_step(int64_t step, double* lr) {
  *lr = set_learning_rates(step);
  opt_->zero_grad();
  Numbers sum;
  step_ = step;
  for (int64_t b = 0; b < o_.batch; ++b) {
    noise_seed_ = o_.seed * 7919ULL + uint64_t(step) * 131ULL + uint64_t(b);
    auto [loss, n] = objective(window(train_start(step, b)), GatedDenseBackend::Mode::Soft);
    (loss / double(o_.batch)).backward();
    add_numbers(sum, n);
  }
  divide_numbers(sum, o_.batch);
  clip_gradients();
  opt_->step();
  return sum;
}

void Trainer::progress(int64_t step, const Numbers& n, double secs, double per_step) {
  char line[400];
  std::snprintf(
      line, sizeof line,
      "step %lld/%lld  loss %.5g  [distill %s reg %s kl %s ce %s cap %s]  gate %s keep %s "
      "cache %.3g%s | %.2f s/step, ETA %.0f s",
      (long long)(step + 1), (long long)o_.steps, n.loss, fmt(n.distill).c_str(),
      fmt(n.reg).c_str(), fmt(n.kl).c_str(), fmt(n.ce).c_str(), fmt(n.cap).c_str(),
      fmt(n.gate_mean).c_str(), fmt(n.keep).c_str(), n.cache,
      std::isnan(n.agree) ? "" : (" agree " + fmt(n.agree) + " recall " + fmt(n.recall)).c_str(),
      secs, per_step * double(o_.steps - step - 1));
  log(line);
}

TrainResult Trainer::run() {
  validate();
  const auto t0 = Clock::now();
  prepare();
  if (!o_.evaluate.empty()) return evaluate_file(t0);
  check_kvpop_budget();
  if (trains_base()) make_student();
  make_optimizer();
  if (trains_base()) before_ = evaluate();  // the original weights, the fresh gates
  int64_t step0 = 0;
  double elapsed_before = 0;
  if (o_.resume) step0 = load_checkpoint(&elapsed_before);
  open_outputs(step0);

  Numbers last;
  const auto loop0 = Clock::now();
  for (int64_t step = step0; step < o_.steps; ++step) {
    const auto s0 = Clock::now();
    double lr = 0;
    last = train_step(step, &lr);
    const double secs = std::chrono::duration<double>(Clock::now() - s0).count();
    csv_row("train", step, lr, last, secs);
    progress(
        step, last, secs,
        std::chrono::duration<double>(Clock::now() - loop0).count() / double(step - step0 + 1));
    if (o_.eval_every > 0 && (step + 1) % o_.eval_every == 0 && step + 1 < o_.steps) {
      Numbers e = evaluate();
      csv_row("eval", step + 1, lr, e, 0);
      log("  held-out: " + heldout_line(e));
    }
    if (o_.checkpoint_every > 0 && (step + 1) % o_.checkpoint_every == 0 && step + 1 < o_.steps)
      save_checkpoint(step + 1,
                      elapsed_before + std::chrono::duration<double>(Clock::now() - t0).count());
    if (o_.stop_after > 0 && step + 1 >= o_.stop_after) {
      log("stopped after step " + std::to_string(step + 1) + " (--stop-after)");
      TrainResult r;
      r.wall_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      return r;
    }
  }
  Numbers e = evaluate();
  csv_row("eval", o_.steps, csv_lr(o_.steps - 1), e, 0);
  const double wall = elapsed_before + std::chrono::duration<double>(Clock::now() - t0).count();
  log("held-out (" + std::to_string(o_.eval_windows) + " windows): " + heldout_line(e) + "; wall " +
      fmt(wall) + " s");
  TrainResult r;
  r.summary = write_outputs(o_.steps, wall, last, e);
  save_checkpoint(o_.steps, wall);
  r.wall_seconds = wall;
  if (trains_base()) r.model_file = model_out_path();
  return r;
}

}  // namespace

void apply_table3_defaults(TrainOptions& o, GatedSettings::Base base) {
  if (base == GatedSettings::Base::Frozen) return;
  auto set = [&](const char* option, auto& field, auto value) {
    if (!o.given.count(option)) field = value;
  };
  set("--lr", o.lr, 1e-3);
  set("--lr-min", o.lr_min, 8e-5);
  set("--warmup-steps", o.warmup_steps, int64_t(100));
  set("--weight-decay", o.weight_decay, 1e-4);
  set("--beta2", o.beta2, 0.95);
  set("--grad-clip", o.grad_clip, 1.0);
}

TrainResult train_gated(const TrainOptions& o, const GatedSettings& s) {
  return Trainer(o, s).run();
}

}  // namespace kvscope::gates
