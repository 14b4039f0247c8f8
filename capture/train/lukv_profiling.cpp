// LU-KV's offline profile: the budget curve of `lukv` (lukv_profiling.h).
#include "capture/train/lukv_profiling.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>

#include "capture/attention/step_driver.h"
#include "capture/generate/dense_kv_cache.h"
#include "capture/policy/policies/descriptors.h"
#include "capture/policy/policies/output_projection.h"
#include "capture/policy/registry.h"
#include "capture/policy/scorer.h"
#include "capture/train/kvzip_targets.h"
#include "capture/train/trainers.h"
#include "core/common/atomic_file.h"
#include "core/common/check.h"
#include "core/common/input_error.h"
#include "core/common/npy_reader.h"

namespace kvscope::gates {

constexpr int64_t kRatios = 99;  // global compression ratios 1 %..99 % (the curve's rows)

std::vector<double> concave_hull_slopes(const std::vector<double>& marginal) {
  struct Block {
    double sum;
    int64_t n;
    double mean() const { return sum / double(n); }
  };
  std::vector<Block> blocks;
  for (double x : marginal) {
    blocks.push_back({x, 1});
    // A later block above an earlier one breaks "non-increasing": pool them.
    while (blocks.size() > 1 && blocks[blocks.size() - 2].mean() < blocks.back().mean()) {
      blocks[blocks.size() - 2].sum += blocks.back().sum;
      blocks[blocks.size() - 2].n += blocks.back().n;
      blocks.pop_back();
    }
  }
  std::vector<double> out;
  out.reserve(marginal.size());
  for (const Block& b : blocks) out.insert(out.end(), size_t(b.n), b.mean());
  return out;
}

std::vector<std::vector<double>> lukv_sample_prune_ratios(
    const std::vector<int64_t>& forced, const std::vector<std::vector<double>>& slopes,
    int64_t tokens) {
  const int64_t heads = int64_t(forced.size());
  struct Unit {
    double slope;
    int32_t head, index;
  };
  std::vector<Unit> units;
  for (int64_t h = 0; h < heads; ++h)
    for (size_t i = 0; i < slopes[size_t(h)].size(); ++i)
      units.push_back({slopes[size_t(h)][i], int32_t(h), int32_t(i)});
  std::sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) {
    if (a.slope != b.slope) return a.slope > b.slope;
    return a.head != b.head ? a.head < b.head : a.index < b.index;
  });
  const int64_t forced_total = std::accumulate(forced.begin(), forced.end(), int64_t(0));
  std::vector<int64_t> count(forced);
  std::vector<std::vector<double>> out(static_cast<size_t>(kRatios),
                                       std::vector<double>(static_cast<size_t>(heads)));
  size_t taken = 0;
  for (int64_t t = kRatios - 1; t >= 0; --t) {  // growing budgets: the greedy choices nest
    // (1 - rho) = (99 - t) / 100 for rho = (t + 1) %.
    const int64_t B = std::llround(double(99 - t) * double(heads * tokens) / 100.0);
    const size_t extra = size_t(std::clamp<int64_t>(B - forced_total, 0, int64_t(units.size())));
    for (; taken < extra; ++taken) ++count[size_t(units[taken].head)];
    for (int64_t h = 0; h < heads; ++h)
      out[size_t(t)][size_t(h)] = 1.0 - double(count[size_t(h)]) / double(tokens);
  }
  return out;
}

namespace {

// What the profile runs: the `lukv` policy's scorer with its parameters, the
// protected positions, and the future's length.
struct ProfileSettings {
  policy::Params params;
  policy::Protection protect;
  int64_t future = 64;
  std::string scorer;
};

std::string gate_value_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  const double d = v.get<double>();
  return d == std::floor(d) && std::fabs(d) < 1e15 ? std::to_string(int64_t(d)) : v.dump();
}

ProfileSettings profile_settings(const nlohmann::json& given) {
  std::map<std::string, std::string> values;
  ProfileSettings s;
  for (const auto& [key, value] : given.items()) {
    if (key == "curve" || key == "budget")
      throw InputError("", "--gate " + key,
                       "is not a profile setting (the profile makes the curve for every budget; "
                       "expected the scorer and its parameters, keep_first, keep_last, future)");
    if (key == "future") {
      if (!value.is_number() || value.get<double>() < 1 || value.get<double>() > 65536 ||
          value.get<double>() != std::floor(value.get<double>()))
        throw InputError("", "--gate future",
                         "'" + gate_value_text(value) +
                             "': the future's length in tokens expected, an integer in [1, 65536]");
      s.future = int64_t(value.get<double>());
      continue;
    }
    values[key] = gate_value_text(value);
  }
  values["curve"] = "(profiled)";  // required by the policy, not read here
  try {
    s.params = policy::Params("lukv", policy::find_policy("lukv")->params, values);
    s.protect = {s.params.get_int("keep_first"), s.params.get_int("keep_last")};
    s.scorer = s.params.get_string("scorer");
    policy::make_named_scorer("lukv", s.params);  // refuses a bad scorer before the model loads
  } catch (const InputError& e) {                 // the policy's message, said of --gate KEY
    const std::string what = e.what(), lead = e.field() + ": ";
    const size_t at = what.find(lead);
    std::string key = e.field();
    if (key.rfind("lukv:", 0) == 0) key = key.substr(5);
    throw InputError("", "--gate " + key,
                     at == std::string::npos ? what : what.substr(at + lead.size()));
  }
  return s;
}

// The scorer's ratings of the whole prompt at the end of its prefill, as
// `lukv` sees them, and nothing evicted.
class ScoreTap : public policy::Policy {
 public:
  explicit ScoreTap(std::unique_ptr<policy::HeadScorer> scorer) : scorer_(std::move(scorer)) {}
  void setup(const policy::PolicySetup& s) override {
    Policy::setup(s);
    scorer_->setup(s);
    K_ = s.model->n_kv_heads;
    T_ = s.prompt_tokens;
    scores_.assign(size_t(s.model->n_layers * K_ * T_), std::numeric_limits<float>::quiet_NaN());
  }
  cache::StatsNeeds stats_needs() const override { return scorer_->stats_needs(); }
  void after_attention(policy::LayerContext& c) override {
    scorer_->observe(c);
    if (!c.prefill || !c.prompt_complete || !scorer_->compresses(c)) return;
    for (int64_t h = 0; h < K_; ++h) scorer_->score(c, h, head(c.layer, h));
  }
  float* head(int64_t layer, int64_t h) { return &scores_[size_t((layer * K_ + h) * T_)]; }
  policy::Protection protection() const { return scorer_->protection(); }

 private:
  std::unique_ptr<policy::HeadScorer> scorer_;
  int64_t K_ = 0, T_ = 0;
  std::vector<float> scores_;  // [L][K][T]
};

// The dense cache over context + future in one step, keeping every context
// entry's oracle importance max_{g, i} p_gi(j) ||v_j W_O^g|| per layer: [K, T].
// It runs where the model is (float32 on the host, where the shared kernels
// want it; the model's dtype on a GPU, as KVzip's read-backs); `wo` is there.
class FutureUtility : public model::AttentionBackend {
 public:
  FutureUtility(const model::ModelConfig& c, std::vector<torch::Tensor> wo, torch::Device device,
                torch::ScalarType dtype, int64_t T, int64_t C)
      : dense_(c, T + C, device, generate::DenseKvCache::readback_dtype(device, dtype)),
        wo_(std::move(wo)),
        T_(T),
        C_(C) {}
  void begin_step(int64_t pos0, int64_t n) override { dense_.begin_step(pos0, n); }
  void end_step() override { dense_.end_step(); }
  torch::Tensor attend(const model::AttentionInputs& in) override {
    KVSCOPE_CHECK(in.pos0 == 0 && in.q.size(0) == T_ + C_,
                  "FutureUtility: one step feeds the context and its future");
    const int64_t K = in.k.size(1), R = in.q.size(1) / K;
    torch::Tensor p = step_probabilities(in, T_, C_).narrow(2, 0, T_).amax(1);  // [H, T]
    torch::Tensor v = in.v.to(torch::kFloat32).narrow(0, 0, T_).repeat_interleave(R, 1);
    torch::Tensor wov = v.permute({1, 0, 2}).bmm(wo_[size_t(in.layer)]).norm(2, -1);  // [H, T]
    if (size_t(in.layer) >= oracle.size()) oracle.resize(size_t(in.layer) + 1);
    oracle[size_t(in.layer)] = (p * wov).view({K, R, T_}).amax(1).contiguous();  // [K, T]
    return dense_.attend(in);
  }
  std::vector<torch::Tensor> oracle;  // per layer [K, T] float32, on the model's device

 private:
  generate::DenseKvCache dense_;
  std::vector<torch::Tensor> wo_;
  int64_t T_, C_;
};

// One sample: per head (layer-major), its entries in the order `lukv` keeps
// them, how many of them are protected, and their oracle importances.
struct HeadOrder {
  std::vector<int32_t> positions;  // keep order
  int64_t forced = 0;              // the protected ones (a prefix)
  std::vector<double> importance;  // per position (not in keep order)
};

std::vector<HeadOrder> profile_sample(generate::Engine& e, const ProfileSettings& s,
                                      const std::vector<torch::Tensor>& wo,
                                      const std::vector<int32_t>& ids, int64_t start, int64_t T,
                                      int64_t C) {
  const model::ModelConfig& c = e.model->config();
  torch::InferenceMode guard;
  ScoreTap tap(policy::make_named_scorer("lukv", s.params));
  tap.setup({&c, T, T, 16, &e.model->weights()});
  {
    // As a capture runs it: on --device cuda the device kernels attend and
    // the scorer reads host tensors (StepDriver::use_device).
    policy::StepDriver driver(c, {16, T, T}, tap, "lukv");
    driver.use_device(e.device);
    std::vector<int64_t> context(ids.begin() + start, ids.begin() + start + T);
    e.model->forward(torch::tensor(context, torch::kInt64), 0, driver);
  }
  FutureUtility future(c, wo, e.device, e.dtype, T, C);
  std::vector<int64_t> all(ids.begin() + start, ids.begin() + start + T + C);
  e.model->forward(torch::tensor(all, torch::kInt64), 0, future);

  const policy::Protection own = tap.protection();
  std::vector<HeadOrder> heads;
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int64_t h = 0; h < c.n_kv_heads; ++h) {
      const float* score = tap.head(l, h);
      for (int64_t p = 0; p < T; ++p)
        if (std::isnan(score[p]))
          throw InputError("", "--gate scorer",
                           "'" + s.scorer + "' left entry " + std::to_string(p) + " of layer " +
                               std::to_string(l) + ", kv head " + std::to_string(h) +
                               " unscored at the end of the prefill (LU-KV's profile needs "
                               "a scorer that rates the whole prompt there)");
      auto rank = [&](int32_t pos) {
        return s.protect.protects(pos, T) ? 0 : own.protects(pos, T) ? 1 : 2;
      };
      HeadOrder o;
      o.positions.resize(size_t(T));
      std::iota(o.positions.begin(), o.positions.end(), 0);
      std::stable_sort(o.positions.begin(), o.positions.end(), [&](int32_t a, int32_t b) {
        if (rank(a) != rank(b)) return rank(a) < rank(b);
        return rank(a) == 2 && score[a] > score[b];  // equal scores: the older first
      });
      for (int32_t pos : o.positions) o.forced += rank(pos) < 2 ? 1 : 0;
      const torch::Tensor imp =
          future.oracle[size_t(l)][h].to(torch::kCPU, torch::kFloat64).contiguous();
      o.importance.assign(imp.data_ptr<double>(), imp.data_ptr<double>() + T);
      heads.push_back(std::move(o));
    }
  return heads;
}

std::vector<std::vector<double>> sample_prune_ratios(const std::vector<HeadOrder>& heads,
                                                     int64_t T) {
  std::vector<int64_t> forced;
  std::vector<std::vector<double>> slopes;
  for (const HeadOrder& o : heads) {
    forced.push_back(o.forced);
    std::vector<double> marginal;
    for (size_t i = size_t(o.forced); i < o.positions.size(); ++i)
      marginal.push_back(o.importance[size_t(o.positions[i])]);
    slopes.push_back(concave_hull_slopes(marginal));
  }
  return lukv_sample_prune_ratios(forced, slopes, T);
}

// The oracle importance the first n entries of a head's keep order hold.
double kept_importance(const HeadOrder& o, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < std::min<int64_t>(n, int64_t(o.positions.size())); ++i)
    sum += o.importance[size_t(o.positions[size_t(i)])];
  return sum;
}

// The share of the oracle importance kept at global ratio rho on a sample by
// the curve's budgets (as `lukv` applies them) and by uniform budgets.
std::pair<double, double> kept_shares(const std::vector<HeadOrder>& heads,
                                      const std::vector<float>& curve, int64_t L, int64_t K,
                                      int64_t T, double rho) {
  const int64_t row = policy::lukv_curve_row(rho);
  const int64_t uniform = std::max<int64_t>(1, std::llround((1.0 - rho) * double(T)));
  double total = 0, by_curve = 0, by_uniform = 0;
  for (int64_t l = 0; l < L; ++l) {
    std::vector<double> prune(curve.begin() + (row * L + l) * K,
                              curve.begin() + (row * L + l + 1) * K);
    const std::vector<int64_t> n = policy::lukv_head_counts(prune, T);
    for (int64_t h = 0; h < K; ++h) {
      const HeadOrder& o = heads[size_t(l * K + h)];
      total += kept_importance(o, T);
      by_curve += kept_importance(o, n[size_t(h)]);
      by_uniform += kept_importance(o, uniform);
    }
  }
  return {by_curve / total, by_uniform / total};
}

std::string check_curve_output(const std::string& output) {
  const std::string ext = ".npy";
  if (output.size() <= ext.size() ||
      output.compare(output.size() - ext.size(), ext.size(), ext) != 0)
    throw InputError("", "-o",
                     "'" + output +
                         "': the budget curve is a .npy file (expected a path ending "
                         "in .npy)");
  return sidecar_path(output, ".json");
}

}  // namespace

TrainResult profile_lukv(const TrainOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string meta_path = check_curve_output(o.output);
  const ProfileSettings s = profile_settings(o.hyper_given);
  generate::Engine engine = generate::open_engine(o.model);
  const model::ModelConfig& c = engine.model->config();
  const int64_t T = o.seq_len, C = s.future, L = c.n_layers, K = c.n_kv_heads;
  if (c.context_length > 0 && T + C > c.context_length)
    throw InputError(
        "", "--seq-len",
        std::to_string(T) + " context + " + std::to_string(C) +
            " future tokens exceed the model's context of " + std::to_string(c.context_length) +
            " (expected --seq-len + --gate future <= " + std::to_string(c.context_length) + ")");
  DataOptions d = o.data;
  d.window = T + C;
  d.seed = o.seed;
  const TokenData data = load_training_data(engine, d);
  const std::vector<torch::Tensor> wo = policy::per_head_output_projections(
      &engine.model->weights(), c.n_heads, c.head_dim, "lukv", engine.device);

  std::vector<double> sum(size_t(kRatios * L * K), 0.0);
  for (int64_t w = 0; w < o.steps; ++w) {
    const int64_t start = kvzip_window_start(w, T + C, 0, data.train_end);
    const auto r = sample_prune_ratios(profile_sample(engine, s, wo, data.ids, start, T, C), T);
    for (int64_t t = 0; t < kRatios; ++t)
      for (int64_t i = 0; i < L * K; ++i) sum[size_t(t * L * K + i)] += r[size_t(t)][size_t(i)];
    if (!o.quiet)
      std::fprintf(stderr, "lukv: sample %lld/%lld profiled (%.1f s)\n", (long long)(w + 1),
                   (long long)o.steps,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::vector<float> curve(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) curve[i] = float(sum[i] / double(o.steps));

  // Held out: the oracle importance the curve's budgets keep, against
  // uniform budgets of the same memory, on windows of the text's tail.
  const int64_t held = std::max<int64_t>(1, o.steps / 8);
  const std::vector<double> ratios = {0.5, 0.75, 0.875};
  std::vector<double> by_curve(ratios.size(), 0.0), by_uniform(ratios.size(), 0.0);
  for (int64_t w = 0; w < held; ++w) {
    const int64_t start = kvzip_window_start(w, T + C, data.train_end, int64_t(data.ids.size()));
    const std::vector<HeadOrder> heads = profile_sample(engine, s, wo, data.ids, start, T, C);
    for (size_t i = 0; i < ratios.size(); ++i) {
      const auto shares = kept_shares(heads, curve, L, K, T, ratios[i]);
      by_curve[i] += shares.first / double(held);
      by_uniform[i] += shares.second / double(held);
    }
  }
  nlohmann::json heldout = nlohmann::json::array();
  for (size_t i = 0; i < ratios.size(); ++i)
    heldout.push_back({{"compression_ratio", ratios[i]},
                       {"oracle_share_kept_by_curve", by_curve[i]},
                       {"oracle_share_kept_uniform", by_uniform[i]}});

  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json training = {
      {"method",
       "LU-KV offline profile: per sample, the scorer's keep order per (layer, kv head) at the "
       "end of the context's prefill; oracle importance max over the future's queries and the "
       "group's heads of p * ||v W_O||; each head's cumulative importance replaced by its least "
       "concave majorant (pool adjacent violators), budgets given greedily to the largest "
       "slopes for each global ratio 1 %..99 %; prune ratios averaged over the samples"},
      {"data", data.describe},
      {"samples", o.steps},
      {"context_tokens", T},
      {"future_tokens", C},
      {"scorer", s.scorer},
      {"scorer_params", nlohmann::json::parse(s.params.to_json())},
      {"heldout_windows", held},
      {"heldout", heldout},
      {"seed", o.seed},
      {"device", engine.device.str()},
      {"command", o.command_line},
      {"wall_seconds", wall}};
  const nlohmann::json meta = {
      {"format", "LU-KV budget curve: prune ratio per (global ratio 1 %..99 %, layer, kv head)"},
      {"policy", "lukv"},
      {"shape", {kRatios, L, K}},
      {"base_model", model_json(c, c.name, o.model.model, o.model.model)},
      {"training", training}};
  write_npy_float32(o.output, {kRatios, L, K}, curve);
  write_file_atomically(meta_path, meta.dump(2) + "\n", "the curve's metadata");
  TrainResult r;
  r.summary = training;
  r.wall_seconds = wall;
  return r;
}

TrainerDescriptor lukv_trainer() {
  return {"lukv",
          "LU-KV's budget curve: --steps windows of --seq-len context tokens, the scorer's order "
          "against the future's attention",
          "Tang et al., Predicting Future Utility: Global Combinatorial Optimization for "
          "Task-Agnostic KV Cache Eviction, 2026",
          "docs/policies/lukv.md",
          TrainInput::Text,
          TrainOutput::File,
          "-o the budget curve (.npy, [99, layers, kv heads]) + .json",
          "scorer and its parameters, keep_first, keep_last, future",
          {},
          [](TrainOptions o, const Params&) { return profile_lukv(o); }};
}

}  // namespace kvscope::gates
