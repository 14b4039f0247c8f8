// Calibrations from the model's own queries on a text: nothing is trained,
// one forward pass per window of text with a dense cache.
//
// qfilter (Godey et al., "Q-Filters: Leveraging QK Geometry for Efficient KV
// Cache Compression", 2025; docs/policies/qfilter.md). The queries of a head
// concentrate along one direction; projecting a key on it estimates the key's
// attention logit without a query. Per (layer, kv head), over the post-RoPE
// queries q of the group's heads:
//   G = sum q q^T,  u = the eigenvector of G's largest eigenvalue (the first
//   right singular vector of the stacked queries), oriented so that sum q.u > 0.
// The policy keeps the keys with the largest u.k.
//
// query-stats (expected attention with calibrated statistics, kvpress
// ExpectedAttentionStatsPress; docs/policies/expected_attention_stats.md):
// per (layer, query head) the mean and the unbiased covariance of the pre-RoPE
// queries, the first `sinks` of each window left out.
#include <torch/torch.h>

#include <chrono>
#include <string>

#include "capture/generate/dense_kv_cache.h"
#include "capture/policy/query_moments.h"
#include "capture/train/trainers.h"
#include "core/common/input_error.h"

namespace kvscope::gates {

namespace {

// The dense cache, recording each layer's queries on the way. The forward
// runs where the model is (the cache in float32 on the host, where the shared
// kernels want it; in the model's dtype on a GPU); the sums accumulate in
// float64 where the queries are, and cross to the host once, for the fit (no
// copy and no synchronisation per layer).
class QueryRecorder : public model::AttentionBackend {
 public:
  // stats: the pre-RoPE moments to feed too (query-stats), or null.
  QueryRecorder(const model::ModelConfig& c, int64_t capacity, torch::Device device,
                torch::ScalarType dtype, policy::QueryMoments* stats)
      : stats_(stats),
        dense_(c, capacity, device, generate::DenseKvCache::readback_dtype(device, dtype)),
        K_(c.n_kv_heads),
        R_(c.n_heads / c.n_kv_heads),
        hd_(c.head_dim) {
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(device);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      gram.push_back(torch::zeros({K_, hd_, hd_}, f64));
      sum.push_back(torch::zeros({K_, hd_}, f64));
    }
  }
  void reset() { dense_.reset(); }
  void begin_step(int64_t pos0, int64_t n) override { dense_.begin_step(pos0, n); }
  void end_step() override { dense_.end_step(); }
  torch::Tensor attend(const model::AttentionInputs& in) override {
    const int64_t n = in.q.size(0);
    // [n, H, hd] -> [K, n R, hd]: a kv head's group of query heads together.
    torch::Tensor q = in.q.to(torch::kFloat64).view({n, K_, R_, hd_}).permute({1, 0, 2, 3});
    q = q.reshape({K_, n * R_, hd_});
    gram[size_t(in.layer)] += q.transpose(1, 2).bmm(q);
    sum[size_t(in.layer)] += q.sum(1);
    queries += n * R_ * (in.layer == 0 ? 1 : 0);
    if (stats_) stats_->add(in.layer, in.q.cpu(), in.pos0, in.pos0 + n);
    return dense_.attend(in);
  }

  std::vector<torch::Tensor> gram, sum;  // per layer [K, hd, hd], [K, hd], on the model's device
  int64_t queries = 0;                   // per (kv head, layer 0)

 private:
  policy::QueryMoments* stats_;
  generate::DenseKvCache dense_;
  int64_t K_, R_, hd_;
};

}  // namespace

namespace {

// The filters of every layer into `set`; the per-head shares of the queries'
// energy along them (the anisotropy the method rests on), per layer.
nlohmann::json qfilters(const QueryRecorder& rec, const model::ModelConfig& c, GateSet& set) {
  nlohmann::json explained = nlohmann::json::array();
  for (int64_t l = 0; l < c.n_layers; ++l) {
    auto [values, vectors] = torch::linalg_eigh(rec.gram[size_t(l)].cpu());  // ascending
    torch::Tensor u = vectors.select(2, c.head_dim - 1);                     // [K, hd]
    torch::Tensor sign = (u * rec.sum[size_t(l)].cpu()).sum(1).sign();
    sign = torch::where(sign == 0, torch::ones_like(sign), sign);
    set.params["layers." + std::to_string(l) + ".qfilter"] =
        (u * sign.unsqueeze(1)).to(torch::kFloat32);
    const torch::Tensor share = (values.select(1, c.head_dim - 1) / values.sum(1)).contiguous();
    explained.push_back(
        std::vector<double>(share.data_ptr<double>(), share.data_ptr<double>() + share.numel()));
  }
  return explained;
}

void query_stats(const policy::QueryMoments& m, const model::ModelConfig& c, GateSet& set) {
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const double n = double(m.count(l));
    const std::string p = "layers." + std::to_string(l) + ".";
    set.params[p + "query_mean"] = m.mean(l).to(torch::kFloat32);
    // QueryMoments' covariance is the biased one; kvpress's statistics divide by N - 1.
    set.params[p + "query_cov"] =
        (m.covariance(l) * (n / std::max(1.0, n - 1))).to(torch::kFloat32);
  }
}

}  // namespace

namespace {

TrainResult calibrate_queries(const TrainOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  generate::Engine engine = generate::open_engine(o.model);
  const model::ModelConfig& c = engine.model->config();
  DataOptions d = o.data;
  d.window = o.seq_len;
  d.seed = o.seed;
  const TokenData data = load_training_data(engine, d);
  const int64_t span = data.train_end - o.seq_len;
  if (span < 0)
    throw InputError("--data", "", "the text holds fewer tokens than one --seq-len window");

  const bool stats = o.kind == GateKind::QueryStats;
  const nlohmann::json hyper =
      resolve_hyperparameters(o.kind, GateShape::of(c), o.hyper_given, "--gate");
  policy::QueryMoments moments;
  if (stats) moments.setup(c, hyper.at("sinks").get<int64_t>(), true);
  QueryRecorder rec(c, o.seq_len, engine.device, engine.dtype, stats ? &moments : nullptr);
  torch::NoGradGuard no_grad;
  int64_t windows = 0;
  for (int64_t w = 0; w < o.steps; ++w, ++windows) {
    // Consecutive windows through the training part, wrapping around.
    const int64_t start = span == 0 ? 0 : (w * o.seq_len) % (span + 1);
    torch::Tensor ids =
        torch::from_blob(const_cast<int32_t*>(data.ids.data()) + start, {o.seq_len}, torch::kInt32)
            .to(torch::kInt64);
    rec.reset();
    engine.model->forward(ids, 0, rec, false);
  }

  GateSet set = init_gates(o.kind, hyper, GateShape::of(c), 0);
  nlohmann::json explained;
  if (stats)
    query_stats(moments, c, set);
  else
    explained = qfilters(rec, c, set);
  nlohmann::json training = {
      {"method", stats ? "calibration: mean and unbiased covariance of the pre-RoPE queries"
                       : "calibration: top eigenvector of the post-RoPE queries' Gram matrix"},
      {"data", data.describe},
      {"windows", windows},
      {"seq_len", o.seq_len},
      {"queries_per_kv_head", rec.queries}};
  if (!stats) training["explained_share"] = explained;
  return save_fitted_gates(std::move(set), c, o, training, t0);
}

}  // namespace

TrainerDescriptor qfilter_trainer() {
  return {"qfilter",
          "Q-Filters' query directions: the principal direction of each head's queries "
          "(--steps windows of --seq-len tokens of the text; a calibration, nothing trains)",
          "Godey et al., Q-Filters: Leveraging QK Geometry for Efficient KV Cache Compression, "
          "2025",
          "docs/policies/qfilter.md",
          TrainInput::Text,
          TrainOutput::File,
          "-o the gate file (.safetensors) + .json metadata",
          hyper_keys({GateKind::QFilter}),
          {},
          [](TrainOptions o, const Params&) {
            o.kind = GateKind::QFilter;
            return calibrate_queries(o);
          }};
}

TrainerDescriptor query_stats_trainer() {
  return {"query-stats",
          "Expected Attention's query statistics: mean and covariance of each head's pre-RoPE "
          "queries (a calibration, likewise)",
          "Devoto et al., Expected Attention, 2025 (kvpress ExpectedAttentionStatsPress)",
          "docs/policies/expected_attention_stats.md",
          TrainInput::Text,
          TrainOutput::File,
          "-o the gate file (.safetensors) + .json metadata",
          hyper_keys({GateKind::QueryStats}),
          {},
          [](TrainOptions o, const Params&) {
            o.kind = GateKind::QueryStats;
            return calibrate_queries(o);
          }};
}

}  // namespace kvscope::gates
