#include "capture/train/sfc_training.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace kvscope::gates {

using nlohmann::json;

// ---- the batched forecaster ------------------------------------------------------

namespace {

// On the device the sequence's tensors are on (the trainer moves them there).
torch::Tensor int_tensor(const std::vector<int64_t>& v, torch::Device device) {
  return torch::tensor(v, torch::kInt64).to(device);
}

torch::TensorOptions on(torch::Device device, torch::ScalarType dtype) {
  return torch::TensorOptions().dtype(dtype).device(device);
}

// The features of docs/policies/sfc.md for every (group, step, token):
// [Bg, St, Bt, F], as sfc_features computes them one at a time.
torch::Tensor features(const SfcParams& p, const SfcConfig& c, const SfcSequence& s,
                       const torch::Tensor& groups, const torch::Tensor& tokens, int64_t t0) {
  const int64_t Bg = groups.size(0), Bt = tokens.size(0), St = s.S - t0, Z = c.latent;
  const double inv_sqrt_hd = 1.0 / std::sqrt(double(c.head_dim));
  torch::Tensor first =
      int_tensor(s.first, s.keys.device()).narrow(0, t0, St).to(torch::kFloat32);  // T of step t
  torch::Tensor keys = s.keys.index_select(0, groups).index_select(1, tokens);     // [Bg, Bt, hd]
  torch::Tensor q = s.qmean.index_select(0, groups).narrow(1, t0, St);             // [Bg, St, hd]
  torch::Tensor zk = torch::bmm(keys, p.latent);                                   // [Bg, Bt, Z]
  torch::Tensor zq = torch::bmm(q, p.latent);                                      // [Bg, St, Z]
  torch::Tensor a = s.ewma.narrow(0, t0, St).index_select(1, groups).index_select(2, tokens);
  torch::Tensor x0 = torch::log1p(a.permute({1, 0, 2}) * first.view({1, St, 1}));
  // Distance from the step's first position; clamped at 0 for tokens not fed
  // yet (their outputs are masked, but a NaN would reach the gradients).
  torch::Tensor d = (first.view({St, 1}) - tokens.to(torch::kFloat32).view({1, Bt})).clamp_min(0);
  torch::Tensor x1 = (torch::log1p(d) / 8.0).unsqueeze(0).expand({Bg, St, Bt});
  torch::Tensor x2 = (keys.norm(2, -1) * inv_sqrt_hd).unsqueeze(1).expand({Bg, St, Bt});
  torch::Tensor x3 = torch::bmm(zq, zk.transpose(1, 2)) * inv_sqrt_hd;  // [Bg, St, Bt]
  return torch::cat({x0.unsqueeze(-1), x1.unsqueeze(-1), x2.unsqueeze(-1), x3.unsqueeze(-1),
                     zk.unsqueeze(1).expand({Bg, St, Bt, Z})},
                    -1);
}

}  // namespace

SfcForward sfc_forward(const SfcParams& all, const SfcConfig& c, const SfcSequence& s,
                       const torch::Tensor& groups, const torch::Tensor& tokens, int64_t bptt) {
  const SfcParams p = all.groups(groups);
  const int64_t Bg = groups.size(0), Bt = tokens.size(0), G = c.hidden, F = c.features();
  const torch::Device device = s.keys.device();
  torch::Tensor fed = int_tensor(s.fed_at, device).index_select(0, tokens);
  SfcForward f;
  f.t0 = fed.min().item<int64_t>() + 1;
  const int64_t St = s.S - f.t0;
  if (St < 1) throw std::invalid_argument("sfc_forward: no token is forecast in the trace");
  f.active = fed.unsqueeze(0) <
             torch::arange(f.t0, s.S, on(device, torch::kInt64)).unsqueeze(1);  // [St, Bt]
  torch::Tensor x = features(p, c, s, groups, tokens, f.t0);
  f.features = x.detach();
  // unbind, not select per step: select's backward would write a zero
  // gradient of the whole [Bg, St, Bt, 3G] tensor at every step.
  const std::vector<torch::Tensor> gi = sfc_input_gates(x.reshape({Bg, St * Bt, F}), p.w_ih, p.b_ih)
                                            .view({Bg, St, Bt, 3 * G})
                                            .unbind(1);
  const std::vector<torch::Tensor> mask =
      f.active.to(torch::kFloat32).view({St, 1, Bt, 1}).unbind(0);
  torch::Tensor h = torch::zeros({Bg, Bt, G}, on(device, torch::kFloat32));
  std::vector<torch::Tensor> hs;
  hs.reserve(size_t(St));
  for (int64_t i = 0; i < St; ++i) {
    // A token not fed yet keeps h = 0, so it starts from 0 at its first step.
    h = sfc_gru_update(gi[size_t(i)], h, p.w_hh, p.b_hh) * mask[size_t(i)];
    hs.push_back(h);
    if (bptt > 0 && (i + 1) % bptt == 0) h = h.detach();
  }
  f.logits = torch::matmul(torch::stack(hs, 1), p.head_w.t()) + p.head_b;  // [Bg, St, Bt, 2]
  return f;
}

// ---- the training-time parametrisation --------------------------------------------------

namespace {

torch::Tensor stacked(const GateSet& g, const char* name) {
  std::vector<torch::Tensor> parts;
  for (int64_t l = 0; l < g.shape.n_layers; ++l)
    parts.push_back(g.param("layers." + std::to_string(l) + ".sfc." + name));
  return torch::cat(parts).detach().clone();
}

}  // namespace

SfcTrainable::SfcTrainable(const GateSet& init, const std::vector<SfcSequence>& data,
                           int64_t tokens)
    : cfg_(SfcConfig::of(init)), L_(init.shape.n_layers), K_(init.shape.n_kv_heads) {
  torch::NoGradGuard no_grad;
  const int64_t NG = L_ * K_, F = cfg_.features();
  // Where the gates and the sequences are (the trainer puts both on the
  // model's device).
  const torch::Device device = init.param("sfc_shared.head.bias").device();
  v_ = stacked(init, "latent") * std::sqrt(double(cfg_.head_dim));
  w_ = stacked(init, "w_ih");
  b_ = stacked(init, "b_ih");
  w_hh_ = stacked(init, "w_hh");
  b_hh_ = stacked(init, "b_hh");
  head_w_ = init.param("sfc_shared.head.weight").detach().clone();
  head_b_ = init.param("sfc_shared.head.bias").detach().clone();
  // rms_k over every token of the training data; then the features' moments
  // with the latent that gives, the input weights still plain.
  torch::Tensor sq = torch::zeros({NG}, on(device, torch::kFloat64)),
                count = torch::zeros({}, on(device, torch::kFloat64));
  for (const SfcSequence& s : data) {
    sq += s.keys.to(torch::kFloat64).pow(2).sum({1, 2});
    count += double(s.T);
  }
  key_rms = (sq / count.clamp_min(1)).sqrt().clamp_min(1e-6).to(torch::kFloat32);
  mu = torch::zeros({NG, F}, on(device, torch::kFloat32));
  sigma = torch::ones({NG, F}, on(device, torch::kFloat32));
  const SfcParams p = params();
  torch::Tensor sum = torch::zeros({NG, F}, on(device, torch::kFloat64)), sum2 = sum.clone(),
                n = torch::zeros({NG, 1}, on(device, torch::kFloat64));
  const torch::Tensor groups = torch::arange(NG, on(device, torch::kInt64));
  for (const SfcSequence& s : data) {
    int64_t forecast = 0;
    while (forecast < s.T && s.fed_at[size_t(forecast)] + 1 < s.S) ++forecast;
    const int64_t m = std::min(tokens, forecast);
    if (m < 1) continue;
    std::vector<int64_t> pick;
    for (int64_t i = 0; i < m; ++i) pick.push_back(i * forecast / m);
    const SfcForward f =
        sfc_forward(p, cfg_, s, groups, torch::tensor(pick, torch::kInt64).to(device));
    const torch::Tensor mask = f.active.to(torch::kFloat64).unsqueeze(0).unsqueeze(-1);
    const torch::Tensor x = f.features.to(torch::kFloat64) * mask;  // [NG, St, Bt, F]
    sum += x.sum({1, 2});
    sum2 += (x * x).sum({1, 2});
    n += mask.sum({1, 2}).expand({NG, 1});
  }
  const torch::Tensor nn = n.clamp_min(1);
  mu = (sum / nn).to(torch::kFloat32);
  sigma = ((sum2 / nn) - (sum / nn).pow(2)).clamp_min(0).sqrt().clamp_min(1e-3).to(torch::kFloat32);
  for (torch::Tensor* t : {&v_, &w_, &b_, &w_hh_, &b_hh_, &head_w_, &head_b_})
    t->requires_grad_(true);
}

SfcParams SfcTrainable::params() const {
  const int64_t NG = L_ * K_, F = cfg_.features();
  torch::Tensor w_ih = w_ / sigma.view({NG, 1, F});
  return {v_ / key_rms.view({NG, 1, 1}),
          w_ih,
          b_ - (w_ih * mu.view({NG, 1, F})).sum(-1),
          w_hh_,
          b_hh_,
          head_w_,
          head_b_};
}

std::vector<torch::Tensor> SfcTrainable::leaves() const {
  return {v_, w_, b_, w_hh_, b_hh_, head_w_, head_b_};
}

void SfcTrainable::write_to(GateSet& g) const {
  torch::NoGradGuard no_grad;
  const SfcParams p = params();
  const std::pair<const char*, const torch::Tensor*> per_layer[] = {{"latent", &p.latent},
                                                                    {"w_ih", &p.w_ih},
                                                                    {"b_ih", &p.b_ih},
                                                                    {"w_hh", &p.w_hh},
                                                                    {"b_hh", &p.b_hh}};
  for (int64_t l = 0; l < L_; ++l)
    for (const auto& [name, t] : per_layer)
      g.params["layers." + std::to_string(l) + ".sfc." + name] =
          t->narrow(0, l * K_, K_).detach().clone().contiguous();
  g.params["sfc_shared.head.weight"] = p.head_w.detach().clone();
  g.params["sfc_shared.head.bias"] = p.head_b.detach().clone();
}

nlohmann::json SfcTrainable::describe() const {
  auto rows = [](const torch::Tensor& t) {
    torch::Tensor c = t.to(torch::kFloat64).cpu().contiguous();
    return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  };
  return {{"parametrisation",
           "trained in standardised coordinates: W_lat = V / rms_k, w_ih = W / sigma, b_ih = b - "
           "w_ih mu (per group); the file holds the effective parameters"},
          {"feature_mean", rows(mu.mean(0))},
          {"feature_std", rows(sigma.mean(0))},
          {"key_rms_mean", key_rms.mean().item<double>()}};
}

// ---- loss ------------------------------------------------------------------------------

torch::Tensor sfc_focal_bce(const torch::Tensor& logits, const torch::Tensor& y, double alpha,
                            double gamma) {
  const torch::Tensor log_p = torch::log_sigmoid(logits), log_q = torch::log_sigmoid(-logits);
  const torch::Tensor pos = alpha * torch::exp(gamma * log_q) * log_p;  // alpha (1-p)^g log p
  const torch::Tensor neg = torch::exp(gamma * log_p) * log_q;          // p^g log(1-p)
  return -(y * pos + (1 - y) * neg);
}

SfcLossOptions SfcLossOptions::of(const GateSet& g) {
  SfcLossOptions o;
  o.alpha = g.hyper("alpha");
  o.gamma = g.hyper("focal_gamma");
  o.latency_weight = g.hyper("latency_weight");
  o.lead = int64_t(g.hyper("lead"));
  o.horizon = int64_t(g.hyper("horizon"));
  return o;
}

SfcTargets sfc_targets(const SfcSequence& s, const SfcForward& f, const torch::Tensor& groups,
                       const torch::Tensor& tokens, const SfcLossOptions& o) {
  const int64_t S = s.S, t0 = f.t0, St = S - t0, Bg = groups.size(0), Bt = tokens.size(0);
  torch::Tensor yn = s.y_now.index_select(1, groups).index_select(2, tokens);  // [S, Bg, Bt]
  torch::Tensor yh, rows;
  sfc_horizon_labels(yn, o.horizon, &yh, &rows);
  SfcTargets t;
  auto window = [&](const torch::Tensor& v) { return v.narrow(0, t0, St).permute({1, 0, 2}); };
  t.y_now = window(yn).to(torch::kFloat32);
  t.y_hor = window(yh).to(torch::kFloat32);
  t.valid_now = f.active.unsqueeze(0).expand({Bg, St, Bt});
  t.valid_hor = t.valid_now.logical_and(rows.narrow(0, t0, St).view({1, St, 1}));
  // Onset at s = t + lead for the forecast at t (the token forecast at t:
  // active, hence also held at s - 1).
  t.onset_at = torch::zeros({Bg, St, Bt}, on(f.active.device(), torch::kBool));
  const int64_t n = S - o.lead - t0;
  if (n > 0) {
    torch::Tensor need = yn.narrow(0, t0 + o.lead, n).to(torch::kBool);
    torch::Tensor before = yn.narrow(0, t0 + o.lead - 1, n).to(torch::kBool);
    torch::Tensor onset = need.logical_and(before.logical_not()).permute({1, 0, 2});
    t.onset_at.narrow(1, 0, n).copy_(onset.logical_and(f.active.narrow(0, 0, n).unsqueeze(0)));
  }
  return t;
}

namespace {

// Mean of `v` over `mask`, 0 (connected to the graph) when the mask is empty.
torch::Tensor masked_mean(const torch::Tensor& v, const torch::Tensor& mask, int64_t* count) {
  *count = mask.sum().item<int64_t>();
  if (*count == 0) return (v * 0).sum();
  return v.masked_select(mask).mean();
}

}  // namespace

SfcLoss sfc_loss(const SfcForward& f, const SfcTargets& y, const SfcLossOptions& o) {
  const torch::Tensor now = f.logits.select(-1, 0), hor = f.logits.select(-1, 1);
  SfcLoss l;
  torch::Tensor ln =
      masked_mean(sfc_focal_bce(now, y.y_now, o.alpha, o.gamma), y.valid_now, &l.n_now);
  torch::Tensor lh =
      masked_mean(sfc_focal_bce(hor, y.y_hor, o.alpha, o.gamma), y.valid_hor, &l.n_hor);
  // The latency term: the focal BCE of a positive at the onset's forecast
  // step, alpha (1 - p)^gamma (-log p).
  torch::Tensor lat = masked_mean(sfc_focal_bce(hor, torch::ones_like(hor), o.alpha, o.gamma),
                                  y.onset_at, &l.n_onsets);
  l.total = ln + lh + o.latency_weight * lat;
  l.now = ln.item<double>();
  l.hor = lh.item<double>();
  l.latency = lat.item<double>();
  return l;
}

// ---- metrics ---------------------------------------------------------------------------

namespace {

// Histogram bins of 1/1024 over [-32, 32] (values outside fall in the ends).
constexpr double kBinsPerUnit = 1024, kBinRange = 32;
constexpr int64_t kBins = int64_t(2 * kBinRange * kBinsPerUnit);

int64_t bin_of(float v) {
  const double b = std::floor((double(v) + kBinRange) * kBinsPerUnit);
  return std::isnan(v) ? 0 : int64_t(std::clamp(b, 0.0, double(kBins - 1)));
}

double ratio(double a, double b) {
  return b > 0 ? a / b : std::nan("");
}

}  // namespace

double sfc_auroc(const std::vector<double>& pos, const std::vector<double>& neg) {
  double P = 0, N = 0, below = 0, sum = 0;
  for (size_t b = 0; b < pos.size(); ++b) {
    sum += pos[b] * (below + 0.5 * neg[b]);
    below += neg[b];
    P += pos[b];
  }
  N = below;
  return P > 0 && N > 0 ? sum / (P * N) : std::nan("");
}

SfcMetrics::SfcMetrics(const SfcLossOptions& o) : o_(o) {
  for (Output* out : {&now_, &hor_})
    out->pos = out->neg = out->base_pos = out->base_neg = std::vector<double>(size_t(kBins), 0.0);
}

void SfcMetrics::add_output(Output& o, const torch::Tensor& logits, const torch::Tensor& x0,
                            const torch::Tensor& y, const torch::Tensor& valid) {
  // Counted on the host, wherever the forecast ran.
  const torch::Tensor l = logits.masked_select(valid).cpu().contiguous();
  // The baseline ranks by the EWMA feature alone; its log spreads the many
  // near-zero values over the bins (AUROC does not change under it).
  const torch::Tensor b = torch::log(x0.masked_select(valid) + 1e-12).cpu().contiguous();
  const torch::Tensor t = y.masked_select(valid).to(torch::kUInt8).cpu().contiguous();
  const float* lp = l.data_ptr<float>();
  const float* bp = b.data_ptr<float>();
  const uint8_t* tp = t.data_ptr<uint8_t>();
  for (int64_t i = 0; i < l.numel(); ++i) {
    const bool positive = tp[i] != 0, predicted = lp[i] >= 0;  // p >= 0.5
    (positive ? o.pos : o.neg)[size_t(bin_of(lp[i]))] += 1;
    (positive ? o.base_pos : o.base_neg)[size_t(bin_of(bp[i]))] += 1;
    o.tp += positive && predicted;
    o.fp += !positive && predicted;
    o.fn += positive && !predicted;
    o.tn += !positive && !predicted;
  }
}

void SfcMetrics::add(const SfcForward& f, const SfcTargets& y, const SfcLoss& l) {
  const torch::Tensor x0 = f.features.select(-1, kSfcAttention);
  const torch::Tensor logits = f.logits.detach();
  add_output(now_, logits.select(-1, 0), x0, y.y_now, y.valid_now);
  add_output(hor_, logits.select(-1, 1), x0, y.y_hor, y.valid_hor);
  onsets_ += double(l.n_onsets);
  onsets_early_ += double(y.onset_at.logical_and(logits.select(-1, 1) >= 0).sum().item<int64_t>());
  loss_now_ += l.now * double(l.n_now);
  loss_hor_ += l.hor * double(l.n_hor);
  loss_lat_ += l.latency * double(l.n_onsets);
  n_now_ += double(l.n_now);
  n_hor_ += double(l.n_hor);
  n_lat_ += double(l.n_onsets);
}

double SfcMetrics::loss() const {
  const double lat = n_lat_ > 0 ? loss_lat_ / n_lat_ : 0.0;
  return ratio(loss_now_, n_now_) + ratio(loss_hor_, n_hor_) + o_.latency_weight * lat;
}

json SfcMetrics::to_json() const {
  auto output = [](const Output& o) {
    nlohmann::json j = {{"auroc", sfc_auroc(o.pos, o.neg)},
                        {"precision", ratio(o.tp, o.tp + o.fp)},
                        {"recall", ratio(o.tp, o.tp + o.fn)},
                        {"positive_rate", ratio(o.tp + o.fn, o.tp + o.fp + o.fn + o.tn)},
                        {"predicted_rate", ratio(o.tp + o.fp, o.tp + o.fp + o.fn + o.tn)},
                        {"entries", o.tp + o.fp + o.fn + o.tn},
                        {"ewma_baseline_auroc", sfc_auroc(o.base_pos, o.base_neg)}};
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it->is_number_float() && std::isnan(it->get<double>())) *it = nullptr;
    return j;
  };
  nlohmann::json j = {{"loss", loss()},
                      {"loss_now", ratio(loss_now_, n_now_)},
                      {"loss_horizon", ratio(loss_hor_, n_hor_)},
                      {"loss_latency", n_lat_ > 0 ? loss_lat_ / n_lat_ : 0.0},
                      {"now", output(now_)},
                      {"horizon", output(hor_)},
                      {"onsets", onsets_},
                      {"onsets_forecast_lead", ratio(onsets_early_, onsets_)}};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it->is_number_float() && std::isnan(it->get<double>())) *it = nullptr;
  return j;
}

// ---- evaluation ----------------------------------------------------------------------------

SfcMetrics sfc_evaluate(const GateSet& g, const std::vector<SfcSequence>& data, int64_t cells) {
  torch::NoGradGuard no_grad;
  const SfcParams p = SfcParams::of(g);
  const SfcConfig c = SfcConfig::of(g);
  const SfcLossOptions lo = SfcLossOptions::of(g);
  SfcMetrics m(lo);
  for (const SfcSequence& s : data) {
    const auto idx = on(s.keys.device(), torch::kInt64);
    const torch::Tensor groups = torch::arange(s.NG, idx);
    int64_t forecast = 0;  // tokens with a forecast step: fed before the last step
    while (forecast < s.T && s.fed_at[size_t(forecast)] + 1 < s.S) ++forecast;
    const int64_t chunk = std::max<int64_t>(1, cells / std::max<int64_t>(1, s.NG * s.S));
    for (int64_t j0 = 0; j0 < forecast; j0 += chunk) {
      const torch::Tensor tokens = torch::arange(j0, std::min(forecast, j0 + chunk), idx);
      const SfcForward f = sfc_forward(p, c, s, groups, tokens);
      const SfcTargets y = sfc_targets(s, f, groups, tokens, lo);
      m.add(f, y, sfc_loss(f, y, lo));
    }
  }
  return m;
}

}  // namespace kvscope::gates
