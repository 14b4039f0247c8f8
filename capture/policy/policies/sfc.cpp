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
  if (spec_.forecast == "gru" && !spec_.gates.empty()) {  // none: a test scripts predict()
    gates::GateSet g = gates::load_gates(spec_.gates, m);
    const nlohmann::json& base = g.meta.value("base_model", nlohmann::json::object());
    if (base.is_object() && base.contains("name") && base["name"].is_string() &&
        base["name"].get<std::string>() != m.name)
      throw InputError(spec_.gates, "base_model.name",
                       "the forecaster was trained for " + base["name"].get<std::string>() +
                           ", not for " + m.name + " (expected a forecaster of this model)");
    net_ = std::make_unique<gates::SfcForecaster>(g);
    cfg_ = net_->config();
  } else {
    cfg_.head_dim = hd_;
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
  state_.assign(size_t(L_ * K_ * M_), TokenState{});
  hid_.assign(size_t(L_ * K_ * M_ * G_), 0.0f);
  zkey_.assign(size_t(L_ * K_ * M_ * Z_), 0.0f);
  volatility_.assign(size_t(L_ * K_), 1.0);  // uniform until the first rebalance
  features_.assign(size_t(cfg_.features()), 0.0f);
}

// ---- before attention ------------------------------------------------------------

void SfcPolicy::land_prefetches(AdmitContext& c) {
  for (int64_t h = 0; h < K_; ++h) {
    const std::vector<int32_t> cold = c.cache.positions(c.layer, h, kCold);  // copy: moves edit it
    for (int32_t pos : cold) {
      TokenState& t = tok(c.layer, h, pos);
      if (t.landing < 0 || t.landing > c.step) continue;
      t.landing = -1;
      c.decide.move(c.layer, h, pos, kHot, t.p_hor, kLanded);
    }
  }
}

// One GRU step for every token the layer holds (all tiers), with the step's
// query: the forecasts `now` and `horizon` of the token for this step.
void SfcPolicy::forecast(AdmitContext& c) {
  torch::Tensor q = c.in.q.select(0, c.n - 1).to(torch::kFloat32).contiguous();  // [H, hd]
  std::vector<float> qmean(static_cast<size_t>(hd_));
  std::vector<float> zq(static_cast<size_t>(std::max<int64_t>(Z_, 1)));
  for (int64_t h = 0; h < K_; ++h) {
    std::fill(qmean.begin(), qmean.end(), 0.0f);
    for (int64_t r = 0; r < R_; ++r)
      for (int64_t i = 0; i < hd_; ++i)
        qmean[size_t(i)] += q.data_ptr<float>()[(h * R_ + r) * hd_ + i] / float(R_);
    if (net_) net_->latent(c.layer, h, qmean.data(), zq.data());
    for (int tier = kHot; tier <= kCold; ++tier)
      for (int32_t pos : c.cache.positions(c.layer, h, tier)) {
        TokenState& t = tok(c.layer, h, pos);
        std::tie(t.p_now, t.p_hor) = predict(c.layer, h, c.step, c.pos0, pos, t, zq.data());
        t.moments.add(t.p_hor, kVolatilityDecay);
        if (std::isnan(t.sampled) || std::fabs(t.p_hor - t.sampled) >= float(spec_.sample)) {
          t.sampled = t.p_hor;
          c.decide.gate(0, c.layer, h, pos, t.p_hor, true);
        }
      }
  }
}

// Cold tokens the forecaster says this query needs now: fetched before the
// attention, the step waiting for the link (one batch per head and layer).
std::pair<float, float> SfcPolicy::predict(int64_t layer, int64_t h, int64_t step, int64_t pos0,
                                           int64_t pos, TokenState& t, const float* z_query) {
  if (net_) {
    std::vector<float>& x = features_;
    gates::sfc_features(cfg_, t.ewma, pos0, pos0 - pos, t.key_norm, z_query, zkey(layer, h, pos),
                        x.data());
    float logits[2];
    net_->step(layer, h, x.data(), hidden(layer, h, pos), logits);
    return {gates::sfc_sigmoid(logits[0]), gates::sfc_sigmoid(logits[1])};
  }
  // Ablation forecast=accumulated: the mean received attention relative to a
  // uniform share, u / (1 + u) (0.5 at uniform); attention-mass methods never
  // fetch back, so "now" is 0.
  const float u = t.acc / float(std::max<int64_t>(1, step - t.born)) * float(pos0);
  return {0.0f, u / (1.0f + u)};
}

void SfcPolicy::fetch_reactively(AdmitContext& c) {
  for (int64_t h = 0; h < K_; ++h) {
    std::vector<int32_t> fetch;
    for (int32_t pos : c.cache.positions(c.layer, h, kCold))
      if (tok(c.layer, h, pos).p_now >= float(spec_.now)) fetch.push_back(pos);
    if (fetch.empty()) continue;
    std::sort(fetch.begin(), fetch.end());
    const double wait = link_.fetch_now(c.step, phase(c.layer), int64_t(fetch.size()) * row_bytes_);
    for (int32_t pos : fetch) {
      TokenState& t = tok(c.layer, h, pos);
      t.landing = -1;  // a prefetch in flight came too late
      c.decide.stall(c.layer, h, pos, float(wait));
      c.decide.move(c.layer, h, pos, kHot, t.p_now, kReactive);
    }
  }
}

void SfcPolicy::admit(AdmitContext& c) {
  for (int64_t h = 0; h < K_; ++h)
    for (int64_t i = 0; i < c.n; ++i) c.at(h, i) = Admission{kHot, false, kNoScore, kNewToken};
  if (c.pos0 == 0) return;  // nothing held yet
  land_prefetches(c);
  forecast(c);
  if (spec_.forecast == "gru") fetch_reactively(c);
}

// ---- after attention -------------------------------------------------------------

// The EWMA (and, for the ablation, the sum) of the received attention; the
// step's new tokens get their key features and a fresh GRU state.
void SfcPolicy::update_attention(LayerContext& c) {
  const float beta = float(cfg_.ewma);
  torch::Tensor k = c.in.k.to(torch::kFloat32).contiguous();  // [n, K, hd]
  for (int64_t h = 0; h < K_; ++h) {
    const std::vector<float>& rec = c.stats.received[size_t(h)];
    for (int64_t i = 0; i < c.n; ++i) {
      const int64_t pos = c.pos0 + i;
      if (!c.cache.holds(c.layer, h, pos)) continue;
      const float* key = k.data_ptr<float>() + (i * K_ + h) * hd_;
      TokenState& t = tok(c.layer, h, pos);
      t.born = int32_t(c.step);
      float n2 = 0;
      for (int64_t j = 0; j < hd_; ++j) n2 += key[j] * key[j];
      t.key_norm = std::sqrt(n2);
      if (net_) net_->latent(c.layer, h, key, zkey(c.layer, h, pos));
    }
    for (int tier = kHot; tier <= kCold; ++tier)
      for (int32_t pos : c.cache.positions(c.layer, h, tier)) {
        TokenState& t = tok(c.layer, h, pos);
        const float r = tier == kCold ? 0.0f : rec[size_t(pos)];
        t.ewma = beta * t.ewma + (1.0f - beta) * r;
        t.acc += r;
      }
  }
}

// Hysteresis placement of one head (see the file comment), then speculative
// prefetch of the cold tokens forecast above `up`.
void SfcPolicy::place(LayerContext& c, int64_t h, int64_t hot_budget) {
  const int64_t T = c.tokens_fed(), l = c.layer;
  struct Cand {
    int32_t pos;
    int tier;
    float p;
  };
  std::vector<Cand> pinned_c, eligible, rest;
  for (int tier : {kHot, kWarm})
    for (int32_t pos : c.cache.positions(l, h, tier)) {
      const TokenState& t = tok(l, h, pos);
      const float p = std::isnan(t.p_hor) ? 1.0f : t.p_hor;  // new: no forecast yet
      if (is_pinned(pos, T))
        pinned_c.push_back({pos, tier, p});
      else if ((tier == kHot && p >= float(spec_.down)) || (tier == kWarm && p >= float(spec_.up)))
        eligible.push_back({pos, tier, p});
      else
        rest.push_back({pos, tier, p});
    }
  // Best forecast first; ties to the older token (deterministic).
  auto by_forecast = [](const Cand& a, const Cand& b) {
    return a.p != b.p ? a.p > b.p : a.pos < b.pos;
  };
  std::sort(eligible.begin(), eligible.end(), by_forecast);
  int64_t room = hot_budget - int64_t(pinned_c.size());
  std::vector<std::pair<Cand, int>> moves;  // (token, target)
  for (const Cand& e : pinned_c)
    if (e.tier != kHot) moves.push_back({e, kHot});
  for (const Cand& e : eligible) {
    if (room > 0) {
      --room;
      if (e.tier != kHot) moves.push_back({e, kHot});
    } else {
      rest.push_back(e);
    }
  }
  std::sort(rest.begin(), rest.end(), by_forecast);
  int64_t warm_room = warm_budget(T);
  for (const Cand& e : rest) {
    const int target = warm_room-- > 0 ? kWarm : kCold;
    if (e.tier != target) moves.push_back({e, target});
  }
  for (const auto& [e, target] : moves) {
    if (target == kCold && spec_.demote == "evict") {
      c.decide.evict(l, h, e.pos, e.p, kEvicted);
      continue;
    }
    const uint16_t why = target == kHot ? kWarmUp : target == kWarm ? kHotDown : kColdDown;
    c.decide.move(l, h, e.pos, target, e.p, why);
  }
  if (!spec_.speculate || spec_.forecast != "gru") return;
  for (int32_t pos : c.cache.positions(l, h, kCold)) {
    TokenState& t = tok(l, h, pos);
    if (t.landing < 0 && t.p_hor >= float(spec_.up))
      t.landing = int32_t(link_.prefetch(c.step, phase(l), row_bytes_));
  }
}

void SfcPolicy::after_attention(LayerContext& c) {
  update_attention(c);
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
  for (int64_t l = 0; l < L_; ++l)
    for (int64_t h = 0; h < K_; ++h) {
      double sum = 0;
      int64_t n = 0;
      for (int tier = kHot; tier <= kCold; ++tier)
        for (int32_t pos : c.cache.positions(l, h, tier)) {
          sum += tok(l, h, pos).moments.variance();
          ++n;
        }
      volatility_[size_t(l * K_ + h)] = n > 0 ? sum / double(n) : 0.0;
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
