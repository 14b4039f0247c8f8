// The query calibrations (`kvscope train --policy qfilter` and
// `query-stats`): the Q-Filter against an SVD of the same queries computed
// here, the mean and covariance against the pre-RoPE queries recomputed
// here. The policy: tests/policies/test_qfilter.cpp.
#include <filesystem>
#include <fstream>
#include <set>

#include "capture/generate/dense_kv_cache.h"
#include "capture/policy/held_rows.h"
#include "capture/train/train_options.h"
#include "core/common/input_error.h"
#include "tests/gates/gate_test_util.h"
#include "tests/support/paths.h"
#include "tests/train/train_runner.h"

namespace kvscope::test {

namespace {

using gates::GateKind;

// Records every layer's queries [n, H, hd] while attending densely.
class QueryRecorder : public model::AttentionBackend {
 public:
  QueryRecorder(const model::ModelConfig& c, int64_t n)
      : dense_(c, n, torch::kCPU, torch::kFloat32), q(size_t(c.n_layers)) {}
  void begin_step(int64_t pos0, int64_t n) override { dense_.begin_step(pos0, n); }
  void end_step() override { dense_.end_step(); }
  torch::Tensor attend(const model::AttentionInputs& in) override {
    q[size_t(in.layer)] = in.q.to(torch::kFloat64).clone();
    return dense_.attend(in);
  }
  generate::DenseKvCache dense_;
  std::vector<torch::Tensor> q;
};

gates::TrainOptions qfilter_options(const std::string& out) {
  const std::string text = write_story_text("qfilter-text.txt", 3);
  gates::TrainOptions o;
  o.kind = GateKind::QFilter;
  o.model.model = stories_model_path();
  o.model.tokenizer = stories_tokenizer_path();
  o.model.threads = 1;
  o.data.paths = {text};
  o.data.holdout = 0.1;
  o.seq_len = 24;
  o.steps = 1;  // the first window: ids [0, 24)
  o.output = out;
  return o;
}

}  // namespace

TEST_CASE("qfilter: the calibrated filter is the top right singular vector of the group's queries",
          "[gates][qfilter]") {
  const std::string out = temp_dir() + "/stories-qfilter.safetensors";
  const gates::TrainOptions o = qfilter_options(out);
  test::train_kind(o);
  generate::Engine engine = generate::open_engine(o.model);
  const model::ModelConfig& c = engine.model->config();
  const gates::GateSet g = gates::load_gates(out, c);
  CHECK(g.kind == GateKind::QFilter);
  CHECK(g.meta["base_model"]["sha256"] == gates::file_sha256(stories_model_path()));

  // The same window through the model, queries recorded here.
  gates::DataOptions d = o.data;
  d.window = o.seq_len;
  const gates::TokenData data = gates::load_training_data(engine, d);
  std::vector<int64_t> ids(data.ids.begin(), data.ids.begin() + o.seq_len);
  QueryRecorder rec(c, o.seq_len);
  torch::NoGradGuard no_grad;
  engine.model->forward(torch::tensor(ids), 0, rec, false);
  const int64_t K = c.n_kv_heads, R = c.n_heads / K, hd = c.head_dim;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const torch::Tensor u = g.param("layers." + std::to_string(l) + ".qfilter").to(torch::kFloat64);
    for (int64_t h = 0; h < K; ++h) {
      INFO("layer " << l << ", kv head " << h);
      // [n, R, hd] -> [n R, hd]: the group's queries stacked.
      torch::Tensor q = rec.q[size_t(l)].narrow(1, h * R, R).reshape({-1, hd});
      torch::Tensor v = std::get<2>(torch::linalg_svd(q, false)).select(0, 0);  // top right vector
      const torch::Tensor uh = u[h];
      CHECK(uh.norm().item<double>() == Approx(1.0).epsilon(1e-6));
      CHECK(std::abs(uh.dot(v).item<double>()) == Approx(1.0).epsilon(1e-6));
      CHECK(q.matmul(uh).sum().item<double>() > 0);  // oriented with the queries
    }
  }
}

TEST_CASE("query-stats: the calibrated mean and covariance of the pre-RoPE queries",
          "[gates][qfilter]") {
  const std::string out = temp_dir() + "/stories-query-stats.safetensors";
  gates::TrainOptions o = qfilter_options(out);
  o.kind = GateKind::QueryStats;
  test::train_kind(o);
  generate::Engine engine = generate::open_engine(o.model);
  const model::ModelConfig& c = engine.model->config();
  const gates::GateSet g = gates::load_gates(out, c);
  CHECK(g.kind == GateKind::QueryStats);
  gates::DataOptions d = o.data;
  d.window = o.seq_len;
  const gates::TokenData data = gates::load_training_data(engine, d);
  std::vector<int64_t> ids(data.ids.begin(), data.ids.begin() + o.seq_len);
  QueryRecorder rec(c, o.seq_len);
  torch::NoGradGuard no_grad;
  engine.model->forward(torch::tensor(ids), 0, rec, false);
  const int64_t sinks = 4, n = o.seq_len;
  policy::RopeInverse unrotate(c);
  std::vector<int32_t> pos;
  for (int64_t i = 0; i < n; ++i) pos.push_back(int32_t(i));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    INFO("layer " << l);
    // [n, H, hd] after RoPE -> before RoPE, the first `sinks` left out.
    torch::Tensor q = rec.q[size_t(l)].to(torch::kFloat32);
    std::vector<torch::Tensor> heads;
    for (int64_t h = 0; h < c.n_heads; ++h) heads.push_back(unrotate(q.select(1, h), pos, n));
    torch::Tensor pre = torch::stack(heads, 1).narrow(0, sinks, n - sinks).to(torch::kFloat64);
    const std::string p = "layers." + std::to_string(l) + ".";
    const torch::Tensor mean = pre.mean(0);  // [H, hd]
    CHECK((g.param(p + "query_mean").to(torch::kFloat64) - mean).abs().max().item<double>() < 1e-5);
    for (int64_t h = 0; h < c.n_heads; ++h) {
      const torch::Tensor x = pre.select(1, h) - mean[h];
      const torch::Tensor cov = x.t().matmul(x) / double(n - sinks - 1);  // unbiased
      CHECK((g.param(p + "query_cov")[h].to(torch::kFloat64) - cov).abs().max().item<double>() <
            1e-4 * std::max(1.0, cov.abs().max().item<double>()));
    }
  }
}

}  // namespace kvscope::test
