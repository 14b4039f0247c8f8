#include "capture/gates/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "capture/gates/gated_attention.h"
#include "core/common/input_error.h"

namespace kvscope::gates {

namespace fs = std::filesystem;
using nlohmann::json;

std::string sidecar_path(const std::string& output, const std::string& ext) {
  std::string base = output;
  const std::string st = ".safetensors";
  if (base.size() > st.size() && base.compare(base.size() - st.size(), st.size(), st) == 0)
    base.resize(base.size() - st.size());
  return base + ext;
}

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
  explicit Trainer(const TrainOptions& o) : o_(o) {}

  TrainResult run();
  void check_kvpop_budget() const;
  TrainResult evaluate_file(std::chrono::steady_clock::time_point t0);

 private:
  void validate();
  torch::Tensor window(int64_t start) const {
    std::vector<int64_t> ids(data_.ids.begin() + start, data_.ids.begin() + start + o_.seq_len + 1);
    return torch::tensor(ids, torch::kInt64);
  }
  int64_t train_start(int64_t step) const {
    std::mt19937_64 rng(o_.seed * 7919ULL + uint64_t(step) * 104729ULL + 17);
    return int64_t(rng() % uint64_t(data_.train_end - o_.seq_len - 1 + 1));
  }
  double lr_at(int64_t step) const {
    const double warm = std::max(1.0, o_.warmup * double(o_.steps));
    if (double(step) < warm) return o_.lr * double(step + 1) / warm;
    const double t = (double(step) - warm) / std::max(1.0, double(o_.steps) - warm);
    return o_.lr * 0.5 * (1.0 + std::cos(M_PI * std::min(1.0, t)));
  }
  // Forward both models on one window; the objective and its parts.
  std::pair<torch::Tensor, Numbers> objective(const torch::Tensor& w, GatedDenseBackend::Mode mode);
  std::pair<torch::Tensor, Numbers> kvpop_objective(const torch::Tensor& x,
                                                    const torch::Tensor& logits_t, int64_t seed);
  json fingerprint() const;
  json objective_json() const;
  void save_checkpoint(int64_t next_step, double elapsed);
  int64_t load_checkpoint(double* elapsed);
  void log(const std::string& line);
  void csv_row(const char* phase, int64_t step, double lr, const Numbers& n, double secs);
  Numbers evaluate();
  json gate_meta(int64_t steps_done, double wall, const Numbers& last, const Numbers& eval) const;

  const TrainOptions& o_;
  generate::Engine engine_;
  TokenData data_;
  GateSet gates_;
  std::unique_ptr<torch::optim::AdamW> opt_;
  double budget_ = 0;
  std::ofstream log_, csv_;
};

void Trainer::validate() {
  if (o_.output.empty() && o_.evaluate.empty())
    throw InputError("", "-o", "an output gate file is required");
  if (o_.seq_len < 8) throw InputError("", "--seq-len", "at least 8 tokens expected");
  if (o_.steps < 1) throw InputError("", "--steps", "at least 1 step expected");
  if (!(o_.lr > 0)) throw InputError("", "--lr", "a positive learning rate expected");
  if (o_.beta < 0 || o_.beta > 1) throw InputError("", "--beta", "a keep ratio in [0, 1] expected");
  if (o_.lambda < 0 || o_.alpha < 0 || o_.cap_weight < 0 || o_.ce_weight < 0)
    throw InputError("", "--lambda/--alpha/--cap-weight/--ce-weight",
                     "non-negative weights expected");
}

std::pair<torch::Tensor, Numbers> Trainer::objective(const torch::Tensor& w,
                                                     GatedDenseBackend::Mode mode) {
  model::Transformer& m = *engine_.model;
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
  if (is_kvpop(gates_.kind)) return kvpop_objective(x, logits_t, w[0].item<int64_t>());
  GatedDenseBackend gated(&gates_, mode);
  torch::Tensor hidden_s = m.forward_hidden(x, 0, gated);
  Numbers n;
  torch::Tensor loss;
  const int64_t nl = int64_t(gated.gate.size());
  switch (gates_.kind) {
    case GateKind::WriteGate: {
      torch::Tensor g = torch::stack(gated.gate);  // [L, K, n]
      torch::Tensor distill =
          torch::mse_loss(hidden_s.to(torch::kFloat32), hidden_t.to(torch::kFloat32));
      torch::Tensor reg = (g + g * (1 - g)).mean();
      loss = distill + o_.lambda * reg;
      const double tau = gates_.hyper("tau");
      const int64_t W = int64_t(gates_.hyper("window"));
      torch::Tensor admitted = (g >= tau).to(torch::kFloat32);
      n.distill = distill.item<double>();
      n.reg = reg.item<double>();
      n.gate_mean = g.mean().item<double>();
      n.keep = admitted.mean().item<double>();
      // The cache at the end of the window: the local W plus the admitted older tokens.
      const int64_t older = std::max<int64_t>(0, L - W);
      const double global =
          older > 0 ? admitted.narrow(2, 0, older).sum(2).mean().item<double>() : 0.0;
      n.cache = (double(std::min(L, W)) + global) / double(L);
      break;
    }
    case GateKind::AttentionGate: {
      torch::Tensor logp_s = torch::log_softmax(m.logits(hidden_s), -1);
      torch::Tensor kl = (logp_t.exp() * (logp_t - logp_s)).sum(-1).mean();
      torch::Tensor flags = torch::stack(gated.flags);  // straight-through 0/1
      torch::Tensor keep = flags.mean();
      torch::Tensor evict = o_.alpha * torch::abs(keep - o_.beta);
      loss = kl + evict;
      n.kl = kl.item<double>();
      n.reg = evict.item<double>();
      n.gate_mean = torch::stack(gated.gate).mean().item<double>();
      n.keep = keep.item<double>();
      n.cache = n.keep;
      break;
    }
    case GateKind::KvpopMlp:
    case GateKind::KvpopMlstm:
      break;  // kvpop_objective
    case GateKind::Retention:
    case GateKind::RetentionGlobal: {
      torch::Tensor logp_s = torch::log_softmax(m.logits(hidden_s), -1);
      torch::Tensor kl = (logp_t.exp() * (logp_t - logp_s)).sum(-1).mean();
      torch::Tensor ce = torch::nll_loss(logp_s, y);
      torch::Tensor S = torch::stack(gated.soft_size);  // [L, K, n]
      torch::Tensor cap;
      if (gates_.kind == GateKind::Retention) {
        cap = torch::relu(S - budget_).mean() / budget_;
      } else {
        const double total = budget_ * double(nl) * double(S.size(1));
        cap = torch::relu(S.sum(torch::IntArrayRef{0, 1}) - total).mean() / total;
      }
      loss = kl + o_.ce_weight * ce + o_.cap_weight * cap;
      n.kl = kl.item<double>();
      n.ce = ce.item<double>();
      n.cap = cap.item<double>();
      n.gate_mean = torch::stack(gated.gate).exp().mean().item<double>();  // mean beta
      // Expected cache at the window's end, relative to the budget.
      n.cache = S.select(2, L - 1).mean().item<double>() / budget_;
      break;
    }
  }
  n.loss = loss.item<double>();
  return {loss, n};
}

// Scorer-only (the base frozen): the boundary loss alone trains the scorers;
// the KL of the sparse student is reported, not optimised (no gradient
// reaches the scorer through the hard top-k mask).
std::pair<torch::Tensor, Numbers> Trainer::kvpop_objective(const torch::Tensor& x,
                                                           const torch::Tensor& logits_t,
                                                           int64_t seed) {
  KvpopLossOptions lo = o_.kvpop;
  lo.seed = o_.seed * 1000003ULL + uint64_t(seed);
  KvpopTrainBackend sparse(gates_, lo);
  torch::Tensor hidden_s = engine_.model->forward_hidden(x, 0, sparse);
  torch::Tensor score = sparse.mean_loss();
  Numbers n;
  {
    torch::NoGradGuard no_grad;
    n.kl = topk_kl(logits_t, engine_.model->logits(hidden_s.detach()), o_.kl_topk).item<double>();
  }
  n.score = score.item<double>();
  n.loss = n.score;
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
  return {score, n};
}

Numbers Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  const int64_t E = std::max<int64_t>(1, o_.eval_windows);
  const int64_t span = int64_t(data_.ids.size()) - data_.train_end - o_.seq_len - 1;
  Numbers sum;
  auto add = [](double& a, double b) { a = std::isnan(a) ? b : a + b; };
  for (int64_t e = 0; e < E; ++e) {
    const int64_t start = data_.train_end + (E > 1 ? span * e / (E - 1) : 0);
    auto [loss, n] = objective(window(start), GatedDenseBackend::Mode::Hard);
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
      if (!std::isnan(b)) add(*a, b);
    sum.recall_per_layer.resize(n.recall_per_layer.size(), 0.0);
    sum.recall_per_head.resize(n.recall_per_head.size());
    for (size_t l = 0; l < n.recall_per_layer.size(); ++l) {
      sum.recall_per_layer[l] += n.recall_per_layer[l] / double(E);
      sum.recall_per_head[l].resize(n.recall_per_head[l].size(), 0.0);
      for (size_t h = 0; h < n.recall_per_head[l].size(); ++h)
        sum.recall_per_head[l][h] += n.recall_per_head[l][h] / double(E);
    }
  }
  for (double* a : {&sum.loss, &sum.distill, &sum.reg, &sum.kl, &sum.ce, &sum.cap, &sum.gate_mean,
                    &sum.keep, &sum.cache, &sum.score, &sum.agree, &sum.recall})
    *a /= double(E);
  return sum;
}

json Trainer::objective_json() const {
  if (is_kvpop(gates_.kind)) {
    const KvpopLossOptions& k = o_.kvpop;
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
            {"kl_topk", o_.kl_topk},
            {"setting", "scorer-only (base frozen)"}};
  }
  return {{"lambda", o_.lambda}, {"alpha", o_.alpha},           {"beta", o_.beta},
          {"budget", budget_},   {"cap_weight", o_.cap_weight}, {"ce_weight", o_.ce_weight}};
}

json Trainer::fingerprint() const {
  return {{"policy", gate_kind_name(gates_.kind)},
          {"hyperparameters", gates_.meta["hyperparameters"]},
          {"model_sha256", file_sha256(o_.model.model)},
          {"data", data_.describe},
          {"seq_len", o_.seq_len},
          {"steps", o_.steps},
          {"seed", o_.seed},
          {"lr", o_.lr},
          {"weight_decay", o_.weight_decay},
          {"warmup", o_.warmup},
          {"objective", objective_json()}};
}

void Trainer::save_checkpoint(int64_t next_step, double elapsed) {
  torch::serialize::OutputArchive ar;
  ar.write("next_step", torch::tensor(next_step, torch::kInt64));
  ar.write("elapsed", torch::tensor(elapsed, torch::kFloat64));
  ar.write("fingerprint", c10::IValue(fingerprint().dump()));
  // Archive keys may not contain '.': the parameters go by index (name order).
  int64_t k = 0;
  for (const auto& [name, t] : gates_.params) ar.write("param_" + std::to_string(k++), t.detach());
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
    ar.load_from(path);
  } catch (const std::exception& e) {
    throw InputError(path, "--resume", std::string("unreadable checkpoint: ") + e.what());
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
  meta["base_model"] = {{"name", c.name},
                        {"file", fs::path(o_.model.model).filename().string()},
                        {"sha256", file_sha256(o_.model.model)},
                        {"n_layers", c.n_layers},
                        {"n_kv_heads", c.n_kv_heads},
                        {"head_dim", c.head_dim},
                        {"hidden_size", c.hidden_size}};
  json fp = fingerprint();
  meta["training"] = {
      {"data", data_.describe},
      {"steps", steps_done},
      {"seq_len", o_.seq_len},
      {"seed", o_.seed},
      {"lr", o_.lr},
      {"weight_decay", o_.weight_decay},
      {"warmup", o_.warmup},
      {"schedule", "linear warmup, cosine decay (AdamW)"},
      {"objective", fp["objective"]},
      {"threads", at::get_num_threads()},
      {"command", o_.command_line},
      {"wall_seconds", wall},
      {"last_step", numbers_json(last)},
      {"heldout", numbers_json(eval)},
      {"heldout_mode", gates_.kind == GateKind::WriteGate || gates_.kind == GateKind::AttentionGate
                           ? "hard (inference-time decisions)"
                       : is_kvpop(gates_.kind) ? "hard (the sparse top-k attention inference uses)"
                                               : "soft (retention-gated attention)"}};
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

TrainResult Trainer::run() {
  validate();
  const auto t0 = Clock::now();
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
  gates_ = init_gates(o_.kind, hyper, shape, o_.seed);
  gates_.source = o_.output;
  budget_ = o_.budget > 0 ? o_.budget : double(o_.seq_len) / 4.0;
  if (!o_.evaluate.empty()) return evaluate_file(t0);
  check_kvpop_budget();
  for (auto& [name, t] : gates_.params) t.requires_grad_(true);
  opt_ = std::make_unique<torch::optim::AdamW>(
      gates_.trainable(), torch::optim::AdamWOptions(o_.lr).weight_decay(o_.weight_decay));

  int64_t step0 = 0;
  double elapsed_before = 0;
  if (o_.resume) step0 = load_checkpoint(&elapsed_before);
  const std::string csv_path = sidecar_path(o_.output, ".csv");
  std::vector<std::string> kept_rows;
  if (o_.resume && fs::exists(csv_path)) {  // keep the curve up to the checkpoint
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
  log("train " + std::string(gate_kind_name(o_.kind)) + " for " + c.name + ": " +
      std::to_string(gates_.trainable().size()) + " tensors, " +
      [&] {
        int64_t k = 0;
        for (auto& t : gates_.trainable()) k += t.numel();
        return std::to_string(k);
      }() +
      " parameters; " + std::to_string(data_.train_end) + " training tokens, " +
      std::to_string(int64_t(data_.ids.size()) - data_.train_end) + " held out; " +
      std::to_string(o_.steps) + " steps of " + std::to_string(o_.seq_len) + " tokens" +
      (step0 > 0 ? "; resumed at step " + std::to_string(step0) : ""));

  Numbers last;
  const auto loop0 = Clock::now();
  for (int64_t step = step0; step < o_.steps; ++step) {
    const auto s0 = Clock::now();
    const double lr = lr_at(step);
    for (auto& group : opt_->param_groups())
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    auto [loss, n] = objective(window(train_start(step)), GatedDenseBackend::Mode::Soft);
    opt_->zero_grad();
    loss.backward();
    opt_->step();
    last = n;
    const double secs = std::chrono::duration<double>(Clock::now() - s0).count();
    csv_row("train", step, lr, n, secs);
    const double per =
        std::chrono::duration<double>(Clock::now() - loop0).count() / double(step - step0 + 1);
    char line[400];
    std::snprintf(
        line, sizeof line,
        "step %lld/%lld  loss %.5g  [distill %s reg %s kl %s ce %s cap %s]  gate %s keep %s "
        "cache %.3g%s | %.2f s/step, ETA %.0f s",
        (long long)(step + 1), (long long)o_.steps, n.loss, fmt(n.distill).c_str(),
        fmt(n.reg).c_str(), fmt(n.kl).c_str(), fmt(n.ce).c_str(), fmt(n.cap).c_str(),
        fmt(n.gate_mean).c_str(), fmt(n.keep).c_str(), n.cache,
        std::isnan(n.agree) ? "" : (" agree " + fmt(n.agree) + " recall " + fmt(n.recall)).c_str(),
        secs, per * double(o_.steps - step - 1));
    log(line);
    if (o_.eval_every > 0 && (step + 1) % o_.eval_every == 0 && step + 1 < o_.steps) {
      Numbers e = evaluate();
      csv_row("eval", step + 1, lr, e, 0);
      log("  held-out: loss " + fmt(e.loss) + " distill " + fmt(e.distill) + " kl " + fmt(e.kl) +
          " keep " + fmt(e.keep) + " cache " + fmt(e.cache));
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
  csv_row("eval", o_.steps, lr_at(o_.steps - 1), e, 0);
  const double wall = elapsed_before + std::chrono::duration<double>(Clock::now() - t0).count();
  log("held-out (" + std::to_string(o_.eval_windows) + " windows): loss " + fmt(e.loss) +
      " distill " + fmt(e.distill) + " kl " + fmt(e.kl) + " ce " + fmt(e.ce) + " keep " +
      fmt(e.keep) + " cache " + fmt(e.cache) +
      (std::isnan(e.agree) ? "" : " agree " + fmt(e.agree) + " recall " + fmt(e.recall)) +
      "; wall " + fmt(wall) + " s");
  gates_.meta = gate_meta(o_.steps, wall, last, e);
  save_gates(gates_, o_.output);
  {
    std::ofstream js(sidecar_path(o_.output, ".json"));
    js << gates_.meta.dump(2) << "\n";
  }
  save_checkpoint(o_.steps, wall);
  TrainResult r;
  r.summary = gates_.meta["training"];
  r.wall_seconds = wall;
  return r;
}

}  // namespace

TrainResult train_gates(const TrainOptions& options) {
  return Trainer(options).run();
}

}  // namespace kvscope::gates
