// `kvscope train --policy sfc`: the Latent Salience Forecaster learned
// offline from full-cache traces (seed 004; docs/policies/sfc.md,
// "Training"). The traces are checked against the model before anything
// heavy runs; each becomes an SfcSequence (EWMAs and labels from its received
// attention, keys and queries recomputed by the frozen model); every step
// trains on `batch` traces, each a random sample of groups and tokens unrolled
// over the whole trace; AdamW with linear warmup and cosine decay;
// evaluations on the held-out traces (--holdout) report the loss, AUROC,
// precision and recall of both outputs and the onsets forecast `lead` steps
// ahead. Writes the gate file, .json, .csv and .log like the other kinds.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "capture/train/sfc_training.h"
#include "capture/train/trainers.h"
#include "core/common/input_error.h"
#include "core/trace/reader.h"

namespace kvscope::gates {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fmt(double v) {
  if (std::isnan(v)) return "";
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

// A number of a metrics JSON, NaN when absent or null.
double number(const json& j, const char* a, const char* b = nullptr) {
  const json* v = &j;
  for (const char* k : {a, b}) {
    if (!k) break;
    if (!v->is_object() || !v->contains(k)) return NAN;
    v = &(*v)[k];
  }
  return v->is_number() ? v->get<double>() : NAN;
}

class SfcTrainer {
 public:
  SfcTrainer(const TrainOptions& o, const SfcTrainOptions& s) : o_(o), s_(s) {}
  TrainResult run();

 private:
  void validate() const;
  void open_model();
  std::vector<SfcSequence> load(const std::vector<std::string>& paths);
  json describe(const std::vector<SfcSequence>& data, const std::vector<std::string>& paths) const;
  TrainResult evaluate_file(Clock::time_point t0);
  double lr_at(int64_t step) const;
  SfcLoss train_step(int64_t step, double* lr);
  json objective_json() const;
  void log(const std::string& line);
  void csv_row(const char* phase, int64_t step, double lr, const json& m, double secs);
  json evaluate_heldout(int64_t step, double lr);
  // The phases of run(): gates, outputs, traces and optimiser; the steps
  // (the last step's loss, the last rate in *lr); the held-out numbers, the
  // metadata and the gate file.
  void prepare(Clock::time_point t0);
  SfcLoss train_loop(double* lr);
  json training_meta(const SfcLoss& last, double lr, Clock::time_point t0);
  json loss_json(const SfcLoss& l) const {
    return {{"loss", l.now + l.hor + loss_.latency_weight * l.latency},
            {"loss_now", l.now},
            {"loss_horizon", l.hor},
            {"loss_latency", l.latency}};
  }

  const TrainOptions& o_;
  const SfcTrainOptions& s_;
  std::string model_path_;
  generate::Engine engine_;
  std::vector<SfcTraceHeader> headers_;
  GateSet gates_;
  SfcConfig cfg_;
  SfcLossOptions loss_;
  std::vector<SfcSequence> train_, heldout_;
  std::unique_ptr<SfcTrainable> trainable_;
  std::unique_ptr<torch::optim::AdamW> opt_;
  std::ofstream log_, csv_;
};

void SfcTrainer::validate() const {
  const SfcTrainOptions& s = s_;
  if (o_.evaluate.empty() && o_.output.empty())
    throw InputError("", "-o", "an output gate file is required");
  if (s.traces.empty() && (o_.evaluate.empty() || s.holdout.empty()))
    throw InputError("", "--traces",
                     "no trace given (expected full-cache traces captured with --policy full "
                     "--capture received)");
  if (!o_.data.paths.empty() || o_.data.generate_tokens > 0)
    throw InputError("", o_.data.paths.empty() ? "--generate" : "--data",
                     "sfc learns from traces (expected --traces, not text)");
  if (o_.resume)
    throw InputError("", "--resume", "sfc training keeps no checkpoint (runs take minutes)");
  if (o_.steps < 1) throw InputError("", "--steps", "at least 1 step expected");
  if (!(o_.lr > 0)) throw InputError("", "--lr", "a positive learning rate expected");
  if (s.tokens < 1) throw InputError("", "--tokens", "at least 1 token per trace expected");
  if (s.groups < 0) throw InputError("", "--groups", "a count >= 0 expected (0: all)");
  if (s.bptt < 0) throw InputError("", "--bptt", "a step count >= 0 expected (0: no truncation)");
  if (!(o_.lr_min >= 0 && o_.lr_min <= o_.lr))
    throw InputError("", "--lr-min",
                     fmt(o_.lr_min) + " (expected a floor in [0, --lr = " + fmt(o_.lr) + "])");
}

// Every trace checked (policy, received attention) before the model loads,
// then against the model (sha256 or name and shape).
void SfcTrainer::open_model() {
  std::vector<std::string> all = s_.traces;
  all.insert(all.end(), s_.holdout.begin(), s_.holdout.end());
  for (const std::string& p : all) headers_.push_back(check_sfc_trace(p));
  model_path_ = sfc_model_path(headers_.front(), o_.model.model);
  generate::ModelOptions mo = o_.model;
  mo.model = model_path_;
  engine_ = generate::open_engine(mo);
  for (const SfcTraceHeader& h : headers_) check_sfc_model(h, engine_.model->config(), model_path_);
}

std::vector<SfcSequence> SfcTrainer::load(const std::vector<std::string>& paths) {
  SfcLabelOptions lo;
  lo.ewma = cfg_.ewma;
  lo.tau_quantile = cfg_.tau_quantile;
  std::vector<SfcSequence> out;
  for (const std::string& p : paths) {
    const auto t0 = Clock::now();
    out.push_back(load_sfc_sequence(p, *engine_.model, lo));
    SfcSequence& s = out.back();
    // Read on the host; trained where the model is (--device).
    for (torch::Tensor* t : {&s.keys, &s.qmean, &s.ewma, &s.y_now, &s.tau})
      *t = t->to(engine_.device);
    double held = 0;  // (token, step) pairs held, per group
    for (int64_t t = 0; t < s.S; ++t) held += double(t + 1 < s.S ? s.first[size_t(t + 1)] : s.T);
    const double positives = s.y_now.sum().item<double>() / double(s.NG);
    log("read " + p + ": " + std::to_string(s.S) + " steps, " + std::to_string(s.T) +
        " tokens; y_now = 1 for " + fmt(positives / held) + " of the held (token, step) pairs (" +
        fmt(seconds_since(t0)) + " s)");
  }
  return out;
}

json SfcTrainer::describe(const std::vector<SfcSequence>& data,
                          const std::vector<std::string>& paths) const {
  json out = json::array();
  for (size_t i = 0; i < data.size(); ++i) {
    std::unique_ptr<trace::TraceReader> r = trace::TraceReader::open(paths[i]);
    const trace::RunInfo& run = r->run();
    out.push_back({{"file", paths[i]},
                   {"sha256", file_sha256(paths[i])},
                   {"steps", data[i].S},
                   {"tokens", data[i].T},
                   {"task", run.task_kind},
                   {"policy", run.policy},
                   {"capture_levels", run.capture_levels},
                   {"command", run.command_line}});
  }
  return out;
}

double SfcTrainer::lr_at(int64_t step) const {
  return warmup_cosine_lr(o_, step);
}

// `count` of [0, n) without replacement, ascending (seeded).
std::vector<int64_t> sample(std::mt19937_64& rng, int64_t n, int64_t count) {
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  if (count >= n) return all;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t j = i + int64_t(rng() % uint64_t(n - i));
    std::swap(all[size_t(i)], all[size_t(j)]);
  }
  all.resize(size_t(count));
  std::sort(all.begin(), all.end());
  return all;
}

// `batch` traces, each a sample of groups and tokens; gradients accumulated.
SfcLoss SfcTrainer::train_step(int64_t step, double* lr) {
  *lr = lr_at(step);
  for (auto& group : opt_->param_groups())
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(*lr);
  opt_->zero_grad();
  const SfcParams p = trainable_->params();
  SfcLoss sum;
  for (int64_t b = 0; b < o_.batch; ++b) {
    std::mt19937_64 rng(o_.seed * 7919ULL + uint64_t(step) * 104729ULL + 17 +
                        uint64_t(b) * 1000000007ULL);
    const SfcSequence& s = train_[size_t(rng() % train_.size())];
    int64_t forecast = 0;  // tokens fed before the last step: they have forecasts
    while (forecast < s.T && s.fed_at[size_t(forecast)] + 1 < s.S) ++forecast;
    const int64_t ng = s_.groups > 0 ? std::min(s_.groups, s.NG) : s.NG;
    const torch::Tensor groups =
        torch::tensor(sample(rng, s.NG, ng), torch::kInt64).to(engine_.device);
    const torch::Tensor tokens =
        torch::tensor(sample(rng, forecast, s_.tokens), torch::kInt64).to(engine_.device);
    const SfcForward f = sfc_forward(p, cfg_, s, groups, tokens, s_.bptt);
    const SfcLoss l = sfc_loss(f, sfc_targets(s, f, groups, tokens, loss_), loss_);
    (l.total / double(o_.batch)).backward();
    sum.now += l.now / double(o_.batch);
    sum.hor += l.hor / double(o_.batch);
    sum.latency += l.latency / double(o_.batch);
    sum.n_now += l.n_now, sum.n_hor += l.n_hor, sum.n_onsets += l.n_onsets;
  }
  opt_->step();
  return sum;
}

json SfcTrainer::objective_json() const {
  return {{"loss",
           "L_now + L_hor + latency_weight * L_lat; L_now, L_hor: mean over valid entries of "
           "-[alpha y (1-p)^gamma log p + (1-y) p^gamma log(1-p)]; L_lat: mean over need onsets "
           "s (y_now(s) = 1, y_now(s-1) = 0) of alpha (1 - p_hor(s - lead))^gamma "
           "(-log p_hor(s - lead))"},
          {"alpha", loss_.alpha},
          {"focal_gamma", loss_.gamma},
          {"latency_weight", loss_.latency_weight},
          {"lead", loss_.lead},
          {"horizon", loss_.horizon},
          {"tau_quantile", cfg_.tau_quantile},
          {"ewma", cfg_.ewma},
          {"labels",
           "y_now = r > tau (the tau_quantile quantile of r over the held tokens, linear "
           "interpolation); y_hor = any y_now in [t, t + H - 1], entries past the trace masked"}};
}

void SfcTrainer::log(const std::string& line) {
  if (!o_.quiet) std::fprintf(stderr, "%s\n", line.c_str());
  if (log_.is_open()) log_ << line << "\n", log_.flush();
}

void SfcTrainer::csv_row(const char* phase, int64_t step, double lr, const json& m, double secs) {
  csv_ << phase << "," << step << "," << fmt(lr) << "," << fmt(number(m, "loss")) << ","
       << fmt(number(m, "loss_now")) << "," << fmt(number(m, "loss_horizon")) << ","
       << fmt(number(m, "loss_latency")) << "," << fmt(number(m, "now", "auroc")) << ","
       << fmt(number(m, "horizon", "auroc")) << "," << fmt(number(m, "now", "precision")) << ","
       << fmt(number(m, "now", "recall")) << "," << fmt(number(m, "horizon", "precision")) << ","
       << fmt(number(m, "horizon", "recall")) << "," << fmt(number(m, "onsets_forecast_lead"))
       << "," << fmt(secs) << "\n";
  csv_.flush();
}

std::string heldout_line(const json& m) {
  return "loss " + fmt(number(m, "loss")) + " | now: AUROC " + fmt(number(m, "now", "auroc")) +
         " (EWMA alone " + fmt(number(m, "now", "ewma_baseline_auroc")) + ") P " +
         fmt(number(m, "now", "precision")) + " R " + fmt(number(m, "now", "recall")) +
         " | horizon: AUROC " + fmt(number(m, "horizon", "auroc")) + " (EWMA alone " +
         fmt(number(m, "horizon", "ewma_baseline_auroc")) + ") P " +
         fmt(number(m, "horizon", "precision")) + " R " + fmt(number(m, "horizon", "recall")) +
         " | onsets forecast >= lead ahead " + fmt(number(m, "onsets_forecast_lead"));
}

json SfcTrainer::evaluate_heldout(int64_t step, double lr) {
  const auto t0 = Clock::now();
  trainable_->write_to(gates_);
  json m = sfc_evaluate(gates_, heldout_, s_.eval_cells).to_json();
  csv_row("eval", step, lr, m, seconds_since(t0));
  log("  held-out: " + heldout_line(m));
  return m;
}

// --evaluate: the held-out numbers of an existing forecaster (its own
// hyperparameters label the data); nothing is written.
TrainResult SfcTrainer::evaluate_file(Clock::time_point t0) {
  gates_ = load_gates(o_.evaluate, engine_.model->config());
  gates_.to(engine_.device);
  if (gates_.kind != GateKind::SfcGru)
    throw InputError(
        o_.evaluate, "policy",
        std::string("holds ") + gate_kind_name(gates_.kind) + " gates, --policy asks for sfc-gru");
  cfg_ = SfcConfig::of(gates_);
  loss_ = SfcLossOptions::of(gates_);
  const std::vector<std::string>& paths = s_.holdout.empty() ? s_.traces : s_.holdout;
  const std::vector<SfcSequence> data = load(paths);
  TrainResult r;
  r.summary = sfc_evaluate(gates_, data, s_.eval_cells).to_json();
  r.summary["gates"] = o_.evaluate;
  r.summary["hyperparameters"] = gates_.meta["hyperparameters"];
  r.summary["traces"] = describe(data, paths);
  r.wall_seconds = seconds_since(t0);
  return r;
}

void SfcTrainer::prepare(Clock::time_point t0) {
  const model::ModelConfig& c = engine_.model->config();
  const GateShape shape = GateShape::of(c);
  gates_ = init_gates(GateKind::SfcGru,
                      resolve_hyperparameters(GateKind::SfcGru, shape, o_.hyper_given, "--gate"),
                      shape, o_.seed);
  gates_.to(engine_.device);  // initialised on the host: one seed, one start on every device
  gates_.source = o_.output;
  cfg_ = SfcConfig::of(gates_);
  loss_ = SfcLossOptions::of(gates_);
  log_.open(sidecar_path(o_.output, ".log"), std::ios::trunc);
  csv_.open(sidecar_path(o_.output, ".csv"), std::ios::trunc);
  csv_ << "phase,step,lr,loss,loss_now,loss_horizon,loss_latency,auroc_now,auroc_horizon,"
          "precision_now,recall_now,precision_horizon,recall_horizon,onsets_forecast_lead,"
          "seconds\n";
  train_ = load(s_.traces);
  heldout_ = load(s_.holdout);
  const double load_seconds = seconds_since(t0);
  trainable_ = std::make_unique<SfcTrainable>(gates_, train_);
  opt_ = std::make_unique<torch::optim::AdamW>(
      trainable_->leaves(), torch::optim::AdamWOptions(o_.lr).weight_decay(o_.weight_decay));
  int64_t params = 0;
  for (const torch::Tensor& t : trainable_->leaves()) params += t.numel();
  log("train sfc-gru for " + c.name + ": " + std::to_string(params) + " parameters; " +
      std::to_string(train_.size()) + " training traces, " + std::to_string(heldout_.size()) +
      " held out (read in " + fmt(load_seconds) + " s); " + std::to_string(o_.steps) +
      " steps of " + std::to_string(o_.batch) + " trace(s) x " + std::to_string(s_.tokens) +
      " tokens x " + (s_.groups > 0 ? std::to_string(s_.groups) : std::string("all")) + " groups");
}

SfcLoss SfcTrainer::train_loop(double* lr) {
  SfcLoss last;
  const auto loop0 = Clock::now();
  for (int64_t step = 0; step < o_.steps; ++step) {
    const auto s0 = Clock::now();
    last = train_step(step, lr);
    const double secs = seconds_since(s0);
    const json m = loss_json(last);
    csv_row("train", step, *lr, m, secs);
    char line[300];
    const double per_step = seconds_since(loop0) / double(step + 1);
    std::snprintf(line, sizeof line,
                  "step %lld/%lld  loss %.5g  [now %.4g hor %.4g latency %.4g, %lld onsets]  "
                  "| %.2f s/step, ETA %.0f s",
                  (long long)(step + 1), (long long)o_.steps, m["loss"].get<double>(), last.now,
                  last.hor, last.latency, (long long)last.n_onsets, secs,
                  per_step * double(o_.steps - step - 1));
    log(line);
    if (!heldout_.empty() && o_.eval_every > 0 && (step + 1) % o_.eval_every == 0 &&
        step + 1 < o_.steps)
      evaluate_heldout(step + 1, *lr);
  }
  return last;
}

json SfcTrainer::training_meta(const SfcLoss& last, double lr, Clock::time_point t0) {
  const model::ModelConfig& c = engine_.model->config();
  json heldout, training_eval;
  if (!heldout_.empty()) {
    heldout = evaluate_heldout(o_.steps, lr);
  } else {
    // No held-out traces: the numbers on the training traces, named so.
    training_eval = sfc_evaluate(gates_, train_, s_.eval_cells).to_json();
    csv_row("eval_train", o_.steps, lr, training_eval, 0);
    log("  on the training traces: " + heldout_line(training_eval));
  }
  const double wall = seconds_since(t0);
  json meta = gates_.meta;
  meta["base_model"] = model_json(c, c.name, model_path_, model_path_);
  meta["training"] = {
      {"data",
       {{"traces", describe(train_, s_.traces)}, {"holdout", describe(heldout_, s_.holdout)}}},
      {"steps", o_.steps},
      {"batch", o_.batch},
      {"tokens", s_.tokens},
      {"groups", s_.groups},
      {"bptt", s_.bptt},
      {"seed", o_.seed},
      {"lr", o_.lr},
      {"lr_min", o_.lr_min},
      {"weight_decay", o_.weight_decay},
      {"warmup", o_.warmup},
      {"schedule", "linear warmup, cosine decay (AdamW)"},
      {"objective", objective_json()},
      {"preconditioning", trainable_->describe()},
      {"threads", at::get_num_threads()},
      {"device", engine_.device.str()},
      {"dtype", generate::dtype_name(engine_.dtype)},
      {"command", o_.command_line},
      {"wall_seconds", wall},
      {"last_step", loss_json(last)}};
  if (!heldout.is_null()) meta["training"]["heldout"] = heldout;
  if (!training_eval.is_null()) meta["training"]["training_eval"] = training_eval;
  return meta;
}

TrainResult SfcTrainer::run() {
  validate();
  const auto t0 = Clock::now();
  open_model();
  if (!o_.evaluate.empty()) return evaluate_file(t0);
  prepare(t0);
  double lr = 0;
  const SfcLoss last = train_loop(&lr);
  trainable_->write_to(gates_);
  gates_.meta = training_meta(last, lr, t0);
  const double wall = gates_.meta["training"]["wall_seconds"].get<double>();
  save_gates(gates_, o_.output);
  std::ofstream js(sidecar_path(o_.output, ".json"));
  js << gates_.meta.dump(2) << "\n";
  log("wrote " + o_.output + " in " + fmt(wall) + " s");
  TrainResult r;
  r.summary = gates_.meta["training"];
  r.wall_seconds = wall;
  return r;
}

}  // namespace

TrainResult train_sfc(const TrainOptions& o, const SfcTrainOptions& s) {
  return SfcTrainer(o, s).run();
}

namespace {

// A comma-separated list of existing files.
std::vector<std::string> trace_list(const std::string& text, const char* option) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= text.size() && !text.empty()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string path = text.substr(begin, end - begin);
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) throw InputError(path, option, "no such trace file");
    out.push_back(path);
    begin = end + 1;
  }
  return out;
}

}  // namespace

TrainerDescriptor sfc_trainer() {
  return {
      "sfc",
      "the Salience Forecasting Cache's forecaster (sfc-gru) from full-cache traces",
      "seed 004 (Salience Forecasting Cache), the asymmetric salience loss",
      "docs/policies/sfc.md",
      TrainInput::Traces,
      TrainOutput::File,
      "-o the forecaster gate file (.safetensors) + .json metadata, .log, .csv loss curve",
      hyper_keys({GateKind::SfcGru}),
      {{"traces", ParamType::String, "",
        "full-cache traces (--policy full --capture received), comma-separated"},
       {"holdout", ParamType::String, "",
        "held-out traces, evaluated and never trained on, comma-separated"},
       {"tokens", ParamType::Int, "128", "tokens sampled per trace and step", 1,
        double(int64_t(1) << 24)},
       {"groups", ParamType::Int, "0",
        "(layer, kv head) groups sampled per trace and step (0: all)", 0, double(int64_t(1) << 24)},
       {"bptt", ParamType::Int, "0",
        "truncate backpropagation through time every N steps (0: the whole trace)", 0,
        double(int64_t(1) << 24)}},
      [](TrainOptions o, const Params& p) {
        o.kind = GateKind::SfcGru;
        SfcTrainOptions s;
        s.traces = trace_list(p.get_string("traces"), "--traces");
        s.holdout = trace_list(p.get_string("holdout"), "--holdout");
        s.tokens = p.get_int("tokens");
        s.groups = p.get_int("groups");
        s.bptt = p.get_int("bptt");
        return train_sfc(o, s);
      }};
}

}  // namespace kvscope::gates
