// Q-Filters calibration (Godey et al., "Q-Filters: Leveraging QK Geometry for
// Efficient KV Cache Compression", 2025; docs/policies/qfilter.md). The
// queries of a head concentrate along one direction; projecting a key on it
// estimates the key's attention logit without a query. Per (layer, kv head),
// over the post-RoPE queries q of the group's heads on the calibration text:
//   G = sum q q^T,  u = the eigenvector of G's largest eigenvalue (the first
//   right singular vector of the stacked queries), oriented so that sum q.u > 0.
// The policy keeps the keys with the largest u.k. Nothing is trained: one
// forward pass per window of text with a dense cache.
#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <string>

#include "capture/gates/trainer.h"
#include "capture/generate/dense_kv_cache.h"
#include "core/common/input_error.h"

namespace kvscope::gates {

namespace {

// The dense cache, recording each layer's queries on the way.
class QueryMoments : public model::AttentionBackend {
 public:
  QueryMoments(const model::ModelConfig& c, int64_t capacity)
      : dense_(c, capacity, torch::kCPU, torch::kFloat32),
        K_(c.n_kv_heads),
        R_(c.n_heads / c.n_kv_heads),
        hd_(c.head_dim) {
    for (int64_t l = 0; l < c.n_layers; ++l) {
      gram.push_back(torch::zeros({K_, hd_, hd_}, torch::kFloat64));
      sum.push_back(torch::zeros({K_, hd_}, torch::kFloat64));
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
    return dense_.attend(in);
  }

  std::vector<torch::Tensor> gram, sum;  // per layer [K, hd, hd], [K, hd]
  int64_t queries = 0;                   // per (kv head, layer 0)

 private:
  generate::DenseKvCache dense_;
  int64_t K_, R_, hd_;
};

}  // namespace

TrainResult calibrate_qfilters(const TrainOptions& o) {
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

  QueryMoments moments(c, o.seq_len);
  torch::NoGradGuard no_grad;
  int64_t windows = 0;
  for (int64_t w = 0; w < o.steps; ++w, ++windows) {
    // Consecutive windows through the training part, wrapping around.
    const int64_t start = span == 0 ? 0 : (w * o.seq_len) % (span + 1);
    torch::Tensor ids = torch::from_blob(const_cast<int32_t*>(data.ids.data()) + start, {o.seq_len},
                                         torch::kInt32)
                            .to(torch::kInt64);
    moments.reset();
    engine.model->forward(ids, 0, moments, false);
  }

  GateSet set = init_gates(GateKind::QFilter, nlohmann::json::object(), GateShape::of(c), 0);
  nlohmann::json explained = nlohmann::json::array();
  for (int64_t l = 0; l < c.n_layers; ++l) {
    auto [values, vectors] = torch::linalg_eigh(moments.gram[size_t(l)]);  // ascending
    torch::Tensor u = vectors.select(2, c.head_dim - 1);                    // [K, hd]
    torch::Tensor sign = (u * moments.sum[size_t(l)]).sum(1).sign();
    sign = torch::where(sign == 0, torch::ones_like(sign), sign);
    set.params["layers." + std::to_string(l) + ".qfilter"] = (u * sign.unsqueeze(1)).to(torch::kFloat32);
    // The share of the queries' energy along u, per kv head.
    const torch::Tensor share = (values.select(1, c.head_dim - 1) / values.sum(1)).contiguous();
    explained.push_back(
        std::vector<double>(share.data_ptr<double>(), share.data_ptr<double>() + share.numel()));
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json meta = set.meta;
  meta["base_model"] = model_json(c, c.name, o.model.model, o.model.model);
  meta["training"] = {{"method", "calibration: top eigenvector of the post-RoPE queries' Gram matrix"},
                      {"data", data.describe},
                      {"windows", windows},
                      {"seq_len", o.seq_len},
                      {"queries_per_kv_head", moments.queries},
                      {"seed", o.seed},
                      {"command", o.command_line},
                      {"wall_seconds", wall},
                      {"explained_share", explained}};
  set.meta = meta;
  save_gates(set, o.output);
  std::ofstream js(sidecar_path(o.output, ".json"));
  js << meta.dump(2) << "\n";
  TrainResult r;
  r.summary = meta["training"];
  r.wall_seconds = wall;
  return r;
}

}  // namespace kvscope::gates
