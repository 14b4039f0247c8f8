// KVzap's fit (`kvscope train --policy kvzap`): the fitted surrogate against
// KVzip+ targets recomputed here from one dense forward pass and a ridge
// regression solved another way. The policy: tests/policies/test_kvzap.cpp.
#include "capture/generate/dense_kv_cache.h"
#include "capture/tokenizer/tokenizer.h"
#include "capture/train/train_options.h"
#include "core/common/input_error.h"
#include "tests/gates/gate_test_util.h"
#include "tests/support/paths.h"
#include "tests/train/train_runner.h"

namespace kvscope::test {

namespace {

using gates::GateKind;

// Records every layer's inputs (float64) while attending densely.
class InputRecorder : public model::AttentionBackend {
 public:
  InputRecorder(const model::ModelConfig& c, int64_t n)
      : dense_(c, n, torch::kCPU, torch::kFloat32), in(size_t(c.n_layers)) {}
  void begin_step(int64_t pos0, int64_t n) override { dense_.begin_step(pos0, n); }
  void end_step() override { dense_.end_step(); }
  torch::Tensor attend(const model::AttentionInputs& a) override {
    Recorded& r = in[size_t(a.layer)];
    r.hidden = a.hidden.to(torch::kFloat64).clone();
    r.q = a.q.to(torch::kFloat64).clone();
    r.k = a.k.to(torch::kFloat64).clone();
    r.v = a.v.to(torch::kFloat64).clone();
    r.scale = a.scale;
    return dense_.attend(a);
  }
  struct Recorded {
    torch::Tensor hidden, q, k, v;
    double scale = 1;
  };
  generate::DenseKvCache dense_;
  std::vector<Recorded> in;
};

// y(l, k, j) for the first T tokens, by loops: [T, K] of layer l.
torch::Tensor kvzip_plus_targets(const InputRecorder::Recorded& r, const torch::Tensor& wo,
                                 int64_t T, int64_t P, int64_t K) {
  const int64_t N = r.q.size(0), H = r.q.size(1), hd = r.q.size(2), R = H / K;
  const torch::Tensor wot = wo.to(torch::kFloat64).t();  // [H hd, D]
  torch::Tensor y = torch::empty({T, K}, torch::kFloat64);
  auto yp = y.accessor<double, 2>();
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < T; ++j) {
      double best = 0;
      for (int64_t g = k * R; g < (k + 1) * R; ++g) {
        const double wov = r.v[j][k].matmul(wot.narrow(0, g * hd, hd)).norm().item<double>();
        double peak = 0;
        for (int64_t i = T + P; i < N; ++i) {
          // The causal softmax of query i over keys 0..i, weight on key j.
          const torch::Tensor logits =
              r.k.narrow(0, 0, i + 1).select(1, k).matmul(r.q[i][g]) * r.scale;
          const double p = torch::softmax(logits, 0)[j].item<double>();
          peak = std::max(peak, p / r.hidden[i].norm().item<double>());
        }
        best = std::max(best, peak * wov);
      }
      yp[j][k] = std::log(best);
    }
  return y;
}

gates::TrainOptions kvzap_options(const std::string& out) {
  const std::string text = write_story_text("kvzap-text.txt", 3);
  gates::TrainOptions o;
  o.kind = GateKind::Kvzap;
  o.model.model = stories_model_path();
  o.model.tokenizer = stories_tokenizer_path();
  o.model.threads = 1;
  o.data.paths = {text};
  o.data.holdout = 0.1;
  o.seq_len = 16;
  o.steps = 1;  // the first window: ids [0, 16)
  o.output = out;
  return o;
}

}  // namespace

TEST_CASE("kvzap: the surrogate is the ridge fit of h to the log KVzip+ scores of the read-back",
          "[gates][kvzap]") {
  const std::string out = temp_dir() + "/stories-kvzap.safetensors";
  const gates::TrainOptions o = kvzap_options(out);
  test::train_kind(o);
  generate::Engine engine = generate::open_engine(o.model);
  const model::ModelConfig& c = engine.model->config();
  const gates::GateSet g = gates::load_gates(out, c);
  CHECK(g.kind == GateKind::Kvzap);
  CHECK(g.meta["base_model"]["sha256"] == gates::file_sha256(stories_model_path()));
  CHECK(g.meta["training"]["heldout_r2"].size() == size_t(c.n_layers));

  // The window, the repeat prompt and the window again, through the model here.
  gates::DataOptions d = o.data;
  d.window = o.seq_len;
  const gates::TokenData data = gates::load_training_data(engine, d);
  const std::vector<int32_t> repeat =
      engine.tokenizer->encode("\n\nRepeat the previous context exactly.\n", false);
  const int64_t T = o.seq_len, P = int64_t(repeat.size());
  std::vector<int64_t> ids(data.ids.begin(), data.ids.begin() + T);
  ids.insert(ids.end(), repeat.begin(), repeat.end());
  ids.insert(ids.end(), data.ids.begin(), data.ids.begin() + T);
  InputRecorder rec(c, int64_t(ids.size()));
  torch::NoGradGuard no_grad;
  engine.model->forward(torch::tensor(ids), 0, rec, false);

  const double alpha = 1.0;  // the default `ridge`
  for (int64_t l = 0; l < c.n_layers; ++l) {
    INFO("layer " << l);
    const auto& r = rec.in[size_t(l)];
    const torch::Tensor y =
        kvzip_plus_targets(r, engine.model->weights().layers[size_t(l)].wo, T, P, c.n_kv_heads);
    // Ridge with an unpenalised intercept, the centred way (scikit-learn's):
    // w = argmin ||Xc w - yc||^2 + alpha ||w||^2 as least squares on
    // [Xc; sqrt(alpha) I], then b = mean(y) - mean(x) w.
    const torch::Tensor x = r.hidden.narrow(0, 0, T);
    const torch::Tensor xm = x.mean(0, true), ym = y.mean(0, true);
    const int64_t D = x.size(1);
    const torch::Tensor a = torch::cat({x - xm, std::sqrt(alpha) * torch::eye(D, torch::kFloat64)});
    const torch::Tensor rhs = torch::cat({y - ym, torch::zeros({D, y.size(1)}, torch::kFloat64)});
    const torch::Tensor w = std::get<0>(torch::linalg_lstsq(a, rhs));  // [D, K]
    const torch::Tensor b = (ym - xm.mm(w)).squeeze(0);
    const std::string p = "layers." + std::to_string(l) + ".kvzap.";
    const torch::Tensor fw = g.param(p + "weight").to(torch::kFloat64).t();
    const torch::Tensor fb = g.param(p + "bias").to(torch::kFloat64);
    const double scale = std::max(1.0, w.abs().max().item<double>());
    CHECK((fw - w).abs().max().item<double>() < 1e-3 * scale);
    CHECK((fb - b).abs().max().item<double>() < 1e-3 * std::max(1.0, b.abs().max().item<double>()));
  }
}

}  // namespace kvscope::test
