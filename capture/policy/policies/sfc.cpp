// sfc: the Salience Forecasting Cache (seed 004, KriraAI). Nothing is
// evicted: every kv head keeps its tokens in three tiers,
//   hot   T0  float32, attended
//   warm  T1  INT4 groups, attended through dequantisation
//   cold  T2  float32, not attended until promoted (host memory)
// and a learned forecaster (capture/gates/sfc_forecaster.h, one GRU per GQA
// group) predicts, every step and for every token, P(attention above tau now)
// and P(above tau within H steps). Per step and layer:
//   before attention  prefetches due land in T0; the forecaster steps (it
//                     sees the step's query); cold tokens forecast to be
//                     needed now are fetched reactively: the step stalls
//                     (a /stalls row with the modelled wait)
//   after attention   the received-attention EWMA moves; placement with
//                     hysteresis: sinks and window pinned hot, then tokens
//                     whose forecast crossed `up` (or stays above `down`
//                     while hot) up to the head's hot budget, the next best
//                     in warm up to its budget, the rest cold; cold tokens
//                     forecast above `up` are prefetched (speculative
//                     promotion, landing when the link model says)
//   every `rebalance` steps  the layer's hot budget is re-shared among its
//                     heads by forecast volatility (tiering/hot_budget.h)
// docs/policies/sfc.md
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "capture/policy/policies/descriptors.h"
#include "capture/policy/policies/sfc.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace sfc {

// Memory of the per-token forecast moments behind a head's volatility: ~32
// steps ("the variance of its recent forecasts"; the seed gives no window).
constexpr float kVolatilityDecay = 1.0f - 1.0f / 32.0f;

void SfcPolicy::setup(const PolicySetup& s) {
  Policy::setup(s);
  const model::ModelConfig& m = *s.model;
  L_ = m.n_layers, K_ = m.n_kv_heads, R_ = m.n_heads / m.n_kv_heads, M_ = s.max_tokens;
  hd_ = m.head_dim;
  cfg_.head_dim = hd_;
  if (spec_.forecast == "gru" && !spec_.gates.empty()) {  // none: a test scripts predict()
    gates::GateSet g = gates::load_gates(spec_.gates, m);
    const nlohmann::json& base = g.meta.value("base_model", nlohmann::json::object());
    if (base.is_object() && base.contains("name") && base["name"].is_string() &&
        base["name"].get<std::string>() != m.name)
      throw InputError(spec_.gates, "base_model.name",
                       "the forecaster was trained for " + base["name"].get<std::string>() +
                           ", not for " + m.name + " (expected a forecaster of this model)");
    cfg_ = gates::SfcConfig::of(g);
    torch::NoGradGuard no_grad;
    params_ = gates::SfcParams::of(g);
    gru_ = true;
  }
  G_ = cfg_.hidden, Z_ = cfg_.latent;
  if (spec_.hot * double(s.prompt_tokens) < double(spec_.sinks + spec_.window))
    throw InputError("--policy", "sfc:hot",
                     "the hot tier holds hot * prompt = " + std::to_string(spec_.hot) + " * " +
                         std::to_string(s.prompt_tokens) + " entries per head, less than sinks + " +
                         "window = " + std::to_string(spec_.sinks + spec_.window) +
                         " (expected a hot tier that holds the pinned window)");
  row_bytes_ = 2 * hd_ * int64_t(sizeof(float));
  lead_steps_ = std::max<int64_t>(
      1, int64_t(std::ceil(link_.copy_seconds(row_bytes_) / (spec_.link.step_us * 1e-6))));
  const auto f = torch::TensorOptions().dtype(torch::kFloat32);
  for (int64_t l = 0; l < L_; ++l) {
    LayerState st;
    st.hidden = torch::zeros({K_, M_, G_}, f);
    st.z_key = torch::zeros({K_, M_, Z_}, f);
    st.key_norm = torch::zeros({K_, M_}, f);
    st.ewma = torch::zeros({K_, M_}, f);
    st.acc = torch::zeros({K_, M_}, f);
    for (torch::Tensor* t : {&st.p_now, &st.p_hor, &st.mom_mean, &st.mom_sq, &st.sampled})
      *t = torch::full({K_, M_}, kNaN, f);
    st.landing.assign(size_t(K_ * M_), -1);
    st.target.assign(size_t(K_ * M_), int8_t(kCold));
    state_.push_back(std::move(st));
  }
  born_.assign(size_t(M_), -1);
  volatility_.assign(size_t(L_ * K_), 1.0);  // uniform until the first rebalance
}

// ---- before attention ------------------------------------------------------------

void SfcPolicy::land_prefetches(AdmitContext& c) {
  for (int64_t h = 0; h < K_; ++h) {
    const std::vector<int32_t> cold = c.cache.positions(c.layer, h, kCold);  // copy: moves edit it
    LayerState& st = state_[size_t(c.layer)];
    for (int32_t pos : cold) {
      int32_t& land = landing(c.layer, h, pos);
      if (land < 0 || land > c.step) continue;
      land = -1;
      const int target = st.target[size_t(h * M_ + pos)];
      if (target != kCold)  // else placement dropped it while the copy was in flight
        c.decide.move(c.layer, h, pos, target, at(st.p_hor, h, pos), kLanded);
    }
  }
}

void SfcPolicy::predict(const AdmitContext& c, torch::Tensor p_now, torch::Tensor p_hor) {
  LayerState& st = state_[size_t(c.layer)];
  const int64_t T = c.pos0;
  if (!gru_) {
    // Ablation forecast=accumulated: the mean received attention relative to
    // a uniform share, u / (1 + u) (0.5 at uniform); attention-mass methods
    // never fetch back, so "now" is 0.
    std::vector<float> age(static_cast<size_t>(T));
    for (int64_t p = 0; p < T; ++p)
      age[size_t(p)] = float(std::max<int64_t>(1, c.step - born_[size_t(p)]));
    const torch::Tensor u = st.acc.narrow(1, 0, T) / torch::tensor(age) * float(T);
    p_hor.copy_(u / (1 + u));
    p_now.zero_();
    return;
  }
  const gates::SfcParams p = params_.groups(torch::arange(c.layer * K_, (c.layer + 1) * K_));
  const float inv_sqrt_hd = 1.0f / std::sqrt(float(hd_));
  // The step's last query, averaged over each group's heads, in the latent space.
  const torch::Tensor q =
      c.in.q.select(0, c.n - 1).to(torch::kFloat32).reshape({K_, R_, hd_}).mean(1);  // [K, hd]
  const torch::Tensor zq = torch::bmm(q.unsqueeze(1), p.latent);                     // [K, 1, Z]
  const torch::Tensor zk = st.z_key.narrow(1, 0, T);                                 // [K, T, Z]
  const torch::Tensor dist =
      torch::log1p(float(c.pos0) - torch::arange(T, torch::kFloat32)) / 8.0f;  // [T]
  const torch::Tensor x =
      torch::cat({torch::log1p(st.ewma.narrow(1, 0, T) * float(T)).unsqueeze(-1),
                  dist.expand({K_, T}).unsqueeze(-1),
                  (st.key_norm.narrow(1, 0, T) * inv_sqrt_hd).unsqueeze(-1),
                  ((zk * zq).sum(-1) * inv_sqrt_hd).unsqueeze(-1), zk},
                 -1);  // [K, T, F], the order of docs/policies/sfc.md
  torch::Tensor h = st.hidden.narrow(1, 0, T);
  h.copy_(gates::sfc_gru_step(x, h, p.w_ih, p.w_hh, p.b_ih, p.b_hh));
  const torch::Tensor logits = torch::matmul(h, p.head_w.t()) + p.head_b;  // [K, T, 2]
  p_now.copy_(torch::sigmoid(logits.select(-1, 0)));
  p_hor.copy_(torch::sigmoid(logits.select(-1, 1)));
}

// One forecaster step for every token the layer holds (all tiers), then the
// moments behind the volatility and the gate samples of forecasts that moved.
void SfcPolicy::forecast(AdmitContext& c) {
  LayerState& st = state_[size_t(c.layer)];
  const int64_t T = c.pos0;
  torch::Tensor p_now = st.p_now.narrow(1, 0, T), p_hor = st.p_hor.narrow(1, 0, T);
  predict(c, p_now, p_hor);
  const float rho = kVolatilityDecay;
  torch::Tensor mean = st.mom_mean.narrow(1, 0, T), sq = st.mom_sq.narrow(1, 0, T);
  const torch::Tensor fresh = torch::isnan(mean);
  mean.copy_(torch::where(fresh, p_hor, rho * mean + (1 - rho) * p_hor));
  sq.copy_(torch::where(fresh, p_hor * p_hor, rho * sq + (1 - rho) * p_hor * p_hor));
  torch::Tensor sampled = st.sampled.narrow(1, 0, T);
  const torch::Tensor moved =
      torch::isnan(sampled) | ((p_hor - sampled).abs() >= float(spec_.sample));
  const torch::Tensor idx = moved.nonzero().contiguous();  // [N, 2]: (head, position)
  const int64_t* ix = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < idx.size(0); ++i) {
    const int64_t h = ix[2 * i], pos = ix[2 * i + 1];
    if (!c.cache.holds(c.layer, h, pos)) continue;  // evicted (ablation demote=evict)
    const float v = at(st.p_hor, h, pos);
    st.sampled.data_ptr<float>()[h * M_ + pos] = v;
    c.decide.gate(0, c.layer, h, pos, v, true);
  }
}

// Cold tokens the forecaster says this query needs now: fetched before the
// attention, the step waiting for the link (one batch per head and layer).
void SfcPolicy::fetch_reactively(AdmitContext& c) {
  const LayerState& st = state_[size_t(c.layer)];
  for (int64_t h = 0; h < K_; ++h) {
    std::vector<int32_t> fetch;
    for (int32_t pos : c.cache.positions(c.layer, h, kCold))
      if (at(st.p_now, h, pos) >= float(spec_.now)) fetch.push_back(pos);
    if (fetch.empty()) continue;
    std::sort(fetch.begin(), fetch.end());
    const double wait = link_.fetch_now(c.step, phase(c.layer), int64_t(fetch.size()) * row_bytes_);
    for (int32_t pos : fetch) {
      landing(c.layer, h, pos) = -1;  // a prefetch in flight came too late
      c.decide.stall(c.layer, h, pos, float(wait));
      c.decide.move(c.layer, h, pos, kHot, at(st.p_now, h, pos), kReactive);
    }
  }
}

void SfcPolicy::admit(AdmitContext& c) {
  for (int64_t h = 0; h < K_; ++h)
    for (int64_t i = 0; i < c.n; ++i) c.at(h, i) = Admission{kHot, false, kNoScore, kNewToken};
  if (c.pos0 == 0) return;  // nothing held yet
  torch::NoGradGuard no_grad;
  land_prefetches(c);
  forecast(c);
  if (spec_.forecast == "gru") fetch_reactively(c);
}

// ---- after attention -------------------------------------------------------------

// The EWMA and the sum of the received attention (a cold token received 0:
// the statistics hold 0 for every position the head did not attend); the
// step's new tokens get their key norm and latent (their GRU state is 0).
void SfcPolicy::update_attention(LayerContext& c) {
  LayerState& st = state_[size_t(c.layer)];
  const int64_t T = c.tokens_fed();
  torch::Tensor r = torch::empty({K_, T}, torch::kFloat32);
  for (int64_t h = 0; h < K_; ++h)
    std::copy_n(c.stats.received[size_t(h)].data(), T, r.data_ptr<float>() + h * T);
  const float beta = float(cfg_.ewma);
  torch::Tensor ewma = st.ewma.narrow(1, 0, T);
  ewma.mul_(beta).add_(r, 1.0f - beta);
  st.acc.narrow(1, 0, T).add_(r);
  const torch::Tensor k = c.in.k.to(torch::kFloat32).permute({1, 0, 2});  // [K, n, hd]
  st.key_norm.narrow(1, c.pos0, c.n).copy_(k.norm(2, -1));
  if (gru_)
    st.z_key.narrow(1, c.pos0, c.n)
        .copy_(torch::bmm(k, params_.latent.narrow(0, c.layer * K_, K_)));
  for (int64_t i = 0; i < c.n; ++i) born_[size_t(c.pos0 + i)] = int32_t(c.step);
}

// Hysteresis placement of one head: the hot and warm sets it should hold
// (see the file comment). Hot and warm tokens move at once; a cold token
// chosen for either set is prefetched and moves when its copy lands, its
// slot reserved meanwhile (a token that lands only to be pushed out again
// would ping-pong over the link every step).
void SfcPolicy::place(LayerContext& c, int64_t h, int64_t hot_budget) {
  const int64_t T = c.tokens_fed(), l = c.layer;
  LayerState& st = state_[size_t(l)];
  const bool prefetch = spec_.speculate && spec_.forecast == "gru";
  struct Cand {
    int32_t pos;
    int tier;
    float p;
  };
  std::vector<Cand> pinned_c, eligible, rest;
  for (int tier : {kHot, kWarm, kCold}) {
    if (tier == kCold && !prefetch) break;  // cold tokens come back only reactively
    for (int32_t pos : c.cache.positions(l, h, tier)) {
      const float f = at(st.p_hor, h, pos);
      const float p = std::isnan(f) ? 1.0f : f;  // new: no forecast yet
      if (is_pinned(pos, T))
        pinned_c.push_back({pos, tier, p});
      else if (p >= float(tier == kHot ? spec_.down : spec_.up))
        eligible.push_back({pos, tier, p});
      else
        rest.push_back({pos, tier, p});
    }
  }
  // Best forecast first; ties to the older token (deterministic).
  auto by_forecast = [](const Cand& a, const Cand& b) {
    return a.p != b.p ? a.p > b.p : a.pos < b.pos;
  };
  std::sort(eligible.begin(), eligible.end(), by_forecast);
  int64_t room = hot_budget - int64_t(pinned_c.size());
  std::vector<std::pair<Cand, int>> targets;  // (token, tier it should be in)
  for (const Cand& e : pinned_c) targets.push_back({e, kHot});
  for (const Cand& e : eligible) {
    if (room-- > 0)
      targets.push_back({e, kHot});
    else
      rest.push_back(e);
  }
  std::sort(rest.begin(), rest.end(), by_forecast);
  int64_t warm_room = warm_budget(T);
  for (const Cand& e : rest) targets.push_back({e, warm_room-- > 0 ? kWarm : kCold});
  for (const auto& [e, target] : targets) {
    if (e.tier == kCold) {
      int32_t& land = landing(l, h, e.pos);
      st.target[size_t(h * M_ + e.pos)] = int8_t(target);  // kCold: a copy in flight is dropped
      if (target != kCold && land < 0) land = int32_t(link_.prefetch(c.step, phase(l), row_bytes_));
      continue;
    }
    if (e.tier == target) continue;
    if (target == kCold && spec_.demote == "evict") {
      c.decide.evict(l, h, e.pos, e.p, kEvicted);
      continue;
    }
    const uint16_t why = target == kHot ? kWarmUp : target == kWarm ? kHotDown : kColdDown;
    c.decide.move(l, h, e.pos, target, e.p, why);
  }
}

void SfcPolicy::after_attention(LayerContext& c) {
  {
    torch::NoGradGuard no_grad;
    update_attention(c);
  }
  const int64_t T = c.tokens_fed();
  std::vector<double> vol(volatility_.begin() + c.layer * K_,
                          volatility_.begin() + (c.layer + 1) * K_);
  if (spec_.budgets == "uniform") std::fill(vol.begin(), vol.end(), 1.0);
  const std::vector<int64_t> budgets = tiering::allocate_by_volatility(
      layer_hot(T), vol, std::vector<int64_t>(size_t(K_), pinned(T)));
  for (int64_t h = 0; h < K_; ++h) {
    place(c, h, budgets[size_t(h)]);
    c.decide.series(0, c.layer, h, float(budgets[size_t(h)]));
    c.decide.series(1, c.layer, h, float(volatility_[size_t(c.layer * K_ + h)]));
  }
}

// Every `rebalance` steps: each head's volatility, the mean variance of its
// tokens' recent forecasts (the budgets of the next steps follow it).
void SfcPolicy::end_step(StepContext& c) {
  if ((c.step + 1) % spec_.rebalance != 0) return;
  torch::NoGradGuard no_grad;
  const int64_t T = c.tokens_fed();
  for (int64_t l = 0; l < L_; ++l) {
    const LayerState& st = state_[size_t(l)];
    const torch::Tensor mean = st.mom_mean.narrow(1, 0, T), sq = st.mom_sq.narrow(1, 0, T);
    const torch::Tensor var = torch::nan_to_num(torch::clamp_min(sq - mean * mean, 0.0)).mean(1);
    for (int64_t h = 0; h < K_; ++h) volatility_[size_t(l * K_ + h)] = var[h].item<double>();
  }
}

}  // namespace sfc

PolicyDescriptor sfc_descriptor() {
  PolicyDescriptor d = {
      "sfc",
      "Salience Forecasting Cache: a GRU forecaster moves tokens between hot, INT4 warm and cold "
      "(unattended) tiers; never evicts; speculative prefetch, stalls, head-adaptive hot budgets",
      "KriraAI, Salience-Aware KV Cache Compression With the Forecasting Cache, seed 004",
      "docs/policies/sfc.md",
      {{"gates", ParamType::String, "", "forecaster file (kind sfc-gru)"},
       {"hot", ParamType::Float, "0.25", "hot (T0) entries per head, as a share of the tokens fed",
        0.001, 1},
       {"warm", ParamType::Float, "0.25", "warm (T1, INT4) entries per head, share of the tokens",
        0, 1},
       {"sinks", ParamType::Int, "4", "first tokens pinned hot", 0},
       {"window", ParamType::Int, "16", "newest tokens pinned hot", 1},
       {"up", ParamType::Float, "0.5", "forecast that promotes (warm -> hot, cold prefetch)", 0, 1},
       {"down", ParamType::Float, "0.3", "forecast under which a hot token may be demoted", 0, 1},
       {"now", ParamType::Float, "0.5",
        "'needed now' forecast that fetches a cold token reactively", 0, 1},
       {"rebalance", ParamType::Int, "128", "steps between hot-budget rebalances (K)", 1},
       {"forecast", ParamType::String, "gru", "gru, or accumulated (ablation: H2O's signal)"},
       {"budgets", ParamType::String, "volatility", "volatility, or uniform (ablation)"},
       {"demote", ParamType::String, "cold", "cold, or evict (ablation: no cold tier)"},
       {"speculate", ParamType::Bool, "true", "speculative prefetch (false: reactive only)"},
       {"link_gbps", ParamType::Float, "25", "cold-tier link bandwidth, GB/s (PCIe 4.0 x16)", 0.001,
        1e4},
       {"link_us", ParamType::Float, "10", "cold-tier copy latency, microseconds", 0, 1e6},
       {"step_us", ParamType::Float, "1000", "compute time of a step that prefetches overlap, us",
        1, 1e9},
       {"sample", ParamType::Float, "0.05", "forecast change that records a new gate sample", 0,
        1}},
      [](const Params& p) {
        sfc::SfcSpec s;
        s.gates = p.get_string("gates");
        s.hot = p.get_float("hot"), s.warm = p.get_float("warm");
        s.sinks = p.get_int("sinks"), s.window = p.get_int("window");
        s.up = p.get_float("up"), s.down = p.get_float("down"), s.now = p.get_float("now");
        s.rebalance = p.get_int("rebalance");
        s.forecast = p.get_string("forecast"), s.budgets = p.get_string("budgets");
        s.demote = p.get_string("demote");
        s.speculate = p.get_bool("speculate");
        s.link = {p.get_float("link_gbps"), p.get_float("link_us"), p.get_float("step_us")};
        s.sample = p.get_float("sample");
        if (s.down > s.up)
          throw InputError("--policy", "sfc:down",
                           std::to_string(s.down) + " is above up = " + std::to_string(s.up) +
                               " (expected down <= up: the hysteresis band)");
        if (s.forecast != "gru" && s.forecast != "accumulated")
          throw InputError("--policy", "sfc:forecast",
                           "'" + s.forecast + "' (expected gru or accumulated)");
        if (s.budgets != "volatility" && s.budgets != "uniform")
          throw InputError("--policy", "sfc:budgets",
                           "'" + s.budgets + "' (expected volatility or uniform)");
        if (s.demote != "cold" && s.demote != "evict")
          throw InputError("--policy", "sfc:demote", "'" + s.demote + "' (expected cold or evict)");
        if (s.forecast == "gru" && s.gates.empty())
          throw InputError("--policy", "sfc:gates",
                           "a forecaster file is required (e.g. "
                           "sfc:gates=resources/gates/<model>-sfc.safetensors)");
        return std::make_unique<sfc::SfcPolicy>(std::move(s));
      }};
  d.gate_kinds = {"sfc-gru"};
  return d;
}

}  // namespace kvscope::policy
