// kvzap: the KVzap surrogate (Jegou et al., "KVzap: Fast, Adaptive, and
// Faithful KV Cache Pruning", 2026; kvpress KVzapPress and kvzap/train.py;
// docs/policies/kvzap.md). KVzap predicts, from a token's normalised layer
// input h_j alone, the log of the KVzip+ score its entry would get:
//   y(l, k, j) = log max over query heads g of k and over the repeat's queries i of
//                p_lgi(j) / ||h_i|| * ||v_j W_O^g||,
// where the text is read back after a repeat prompt in the same forward pass
// (window, "\n\nRepeat the previous context exactly.\n", window) and p is
// the causal softmax of query i over everything before it. The surrogate is
// linear per layer, y ≈ W_l h_j + b_l, fitted in closed form by ridge
// regression with an unpenalised intercept (scikit-learn's Ridge, which
// kvpress's trainer calls). Nothing else is trained; one forward pass per
// window with a dense cache.
#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <string>

#include "capture/gates/trainer.h"
#include "capture/generate/dense_kv_cache.h"
#include "capture/policy/policies/output_projection.h"
#include "capture/tokenizer/tokenizer.h"
#include "core/common/input_error.h"

namespace kvscope::gates {

namespace {

// kvpress's first repeat prompt (kvzip_press.py) with its suffix for a model
// without a chat template.
constexpr const char* kRepeatPrompt = "\n\nRepeat the previous context exactly.\n";

// The dense cache of one window + repeat prompt + window, computing each
// layer's KVzip+ targets for the first window on the way.
class KvzipTargets : public model::AttentionBackend {
 public:
  KvzipTargets(const model::ModelConfig& c, const model::ModelWeights& w, int64_t window,
               int64_t repeat)
      : dense_(c, 2 * window + repeat, torch::kCPU, torch::kFloat32),
        wo_(policy::per_head_output_projections(&w, c.n_heads, c.head_dim, "kvzap")),
        T_(window),
        P_(repeat),
        L_(c.n_layers) {
    for (int64_t l = 0; l < L_; ++l) {
      xtx.push_back(torch::zeros({c.hidden_size + 1, c.hidden_size + 1}, torch::kFloat64));
      xty.push_back(torch::zeros({c.hidden_size + 1, c.n_kv_heads}, torch::kFloat64));
    }
  }
  void reset() { dense_.reset(); }
  void begin_step(int64_t pos0, int64_t n) override { dense_.begin_step(pos0, n); }
  void end_step() override { dense_.end_step(); }

  torch::Tensor attend(const model::AttentionInputs& in) override {
    const int64_t N = 2 * T_ + P_;
    if (in.pos0 != 0 || in.q.size(0) != N)
      throw std::logic_error("KvzipTargets: one step feeds the whole window + repeat + window");
    torch::Tensor x = in.hidden.to(torch::kFloat32).narrow(0, 0, T_);  // [T, D]
    torch::Tensor y = targets(in);                                     // [T, K]
    torch::Tensor x1 = torch::cat({x, torch::ones({T_, 1})}, 1).to(torch::kFloat64);
    const size_t l = size_t(in.layer);
    xtx[l] += x1.t().mm(x1);
    xty[l] += x1.t().mm(y.to(torch::kFloat64));
    if (keep_samples) {
      xs.push_back(x);
      ys.push_back(y);
    }
    return dense_.attend(in);
  }

  std::vector<torch::Tensor> xtx, xty;  // per layer [D+1, D+1], [D+1, K]: [h, 1] sums
  bool keep_samples = false;            // also keep every (x, y) (held-out evaluation)
  std::vector<torch::Tensor> xs, ys;    // per window and layer, in that order

 private:
  // y(l, k, j) for the first window's T entries: [T, K].
  torch::Tensor targets(const model::AttentionInputs& in) const {
    const int64_t N = 2 * T_ + P_, H = in.q.size(1), K = in.k.size(1), R = H / K;
    torch::Tensor q =
        in.q.to(torch::kFloat32).narrow(0, T_ + P_, T_).permute({1, 0, 2});  // [H,T,hd]
    torch::Tensor k =
        in.k.to(torch::kFloat32).repeat_interleave(R, 1).permute({1, 2, 0});  // [H,hd,N]
    torch::Tensor logits = q.bmm(k) * in.scale;                               // [H,T,N]
    // Query i (at T + P + i) sees keys j <= T + P + i, within the model's window.
    torch::Tensor qpos = torch::arange(T_ + P_, N).unsqueeze(1),
                  kpos = torch::arange(N).unsqueeze(0);
    torch::Tensor hidden = kpos > qpos;
    if (in.sliding_window > 0) hidden = hidden | (kpos <= qpos - in.sliding_window);
    logits.masked_fill_(hidden.unsqueeze(0), -std::numeric_limits<float>::infinity());
    torch::Tensor p = torch::softmax(logits, -1).narrow(2, 0, T_);  // [H, T queries, T keys]
    torch::Tensor h_norm = in.hidden.to(torch::kFloat32).narrow(0, T_ + P_, T_).norm(2, -1);
    torch::Tensor peak = (p / h_norm.view({1, T_, 1})).amax(1);  // [H, T keys]
    torch::Tensor v = in.v.to(torch::kFloat32).narrow(0, 0, T_).repeat_interleave(R, 1);
    torch::Tensor wov = v.permute({1, 0, 2}).bmm(wo_[size_t(in.layer)]).norm(2, -1);  // [H, T]
    torch::Tensor s = (peak * wov).view({K, R, T_}).amax(1);                          // [K, T]
    return s.log().t().contiguous();
  }

  generate::DenseKvCache dense_;
  std::vector<torch::Tensor> wo_;  // per layer [H, hd, D]
  int64_t T_, P_, L_;
};

// Ridge regression with an unpenalised intercept from the sums [h, 1]^T [h, 1]
// and [h, 1]^T y: (A + alpha diag(1, ..., 1, 0)) [W^T; b] = B.
std::pair<torch::Tensor, torch::Tensor> ridge(const torch::Tensor& xtx, const torch::Tensor& xty,
                                              double alpha) {
  const int64_t D = xtx.size(0) - 1;
  torch::Tensor penalty = torch::ones({D + 1}, torch::kFloat64) * alpha;
  penalty[D] = 0;
  torch::Tensor sol = torch::linalg_solve(xtx + torch::diag(penalty), xty);  // [D+1, K]
  return {sol.narrow(0, 0, D).t().to(torch::kFloat32).contiguous(),
          sol[D].to(torch::kFloat32).contiguous()};
}

int64_t window_start(int64_t w, int64_t window, int64_t begin, int64_t end) {
  const int64_t span = end - begin - window;
  return begin + (span <= 0 ? 0 : (w * window) % (span + 1));
}

torch::Tensor sequence(const std::vector<int32_t>& ids, int64_t start, int64_t window,
                       const std::vector<int32_t>& repeat) {
  std::vector<int64_t> out(ids.begin() + start, ids.begin() + start + window);
  out.insert(out.end(), repeat.begin(), repeat.end());
  out.insert(out.end(), ids.begin() + start, ids.begin() + start + window);
  return torch::tensor(out, torch::kInt64);
}

}  // namespace

TrainResult calibrate_kvzap(const TrainOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  generate::Engine engine = generate::open_engine(o.model);
  if (!engine.tokenizer)
    throw InputError("--tokenizer", "", "kvzap needs the model's tokenizer for its repeat prompt");
  const model::ModelConfig& c = engine.model->config();
  DataOptions d = o.data;
  d.window = o.seq_len;
  d.seed = o.seed;
  const TokenData data = load_training_data(engine, d);
  const std::vector<int32_t> repeat = engine.tokenizer->encode(kRepeatPrompt, false);
  const nlohmann::json hyper =
      resolve_hyperparameters(o.kind, GateShape::of(c), o.hyper_given, "--gate");
  const double alpha = hyper.at("ridge").get<double>();

  KvzipTargets rec(c, engine.model->weights(), o.seq_len, int64_t(repeat.size()));
  torch::NoGradGuard no_grad;
  for (int64_t w = 0; w < o.steps; ++w) {
    rec.reset();
    engine.model->forward(
        sequence(data.ids, window_start(w, o.seq_len, 0, data.train_end), o.seq_len, repeat), 0,
        rec, false);
  }
  GateSet set = init_gates(o.kind, hyper, GateShape::of(c), 0);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> fit;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    fit.push_back(ridge(rec.xtx[size_t(l)], rec.xty[size_t(l)], alpha));
    set.params["layers." + std::to_string(l) + ".kvzap.weight"] = fit.back().first;
    set.params["layers." + std::to_string(l) + ".kvzap.bias"] = fit.back().second;
  }

  // Held-out R^2 per layer: windows from the held-out tail of the text.
  const int64_t held_windows = std::max<int64_t>(1, o.steps / 8);
  rec.keep_samples = true;
  for (int64_t w = 0; w < held_windows; ++w) {
    rec.reset();
    engine.model->forward(
        sequence(data.ids, window_start(w, o.seq_len, data.train_end, int64_t(data.ids.size())),
                 o.seq_len, repeat),
        0, rec, false);
  }
  std::vector<double> r2;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    std::vector<torch::Tensor> xl, yl;
    for (int64_t w = 0; w < held_windows; ++w) {
      xl.push_back(rec.xs[size_t(w * c.n_layers + l)]);
      yl.push_back(rec.ys[size_t(w * c.n_layers + l)]);
    }
    torch::Tensor x = torch::cat(xl), y = torch::cat(yl).to(torch::kFloat64);
    torch::Tensor pred =
        (x.mm(fit[size_t(l)].first.t()) + fit[size_t(l)].second).to(torch::kFloat64);
    const double sse = (y - pred).square().sum().item<double>();
    const double sst = (y - y.mean(0, true)).square().sum().item<double>();
    r2.push_back(sst > 0 ? 1.0 - sse / sst : 0.0);
  }

  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json meta = set.meta;
  meta["base_model"] = model_json(c, c.name, o.model.model, o.model.model);
  meta["training"] = {
      {"method",
       "calibration: ridge regression (unpenalised intercept) from each layer's normalised "
       "input to the log KVzip+ score of the text read back after a repeat prompt"},
      {"data", data.describe},
      {"windows", o.steps},
      {"seq_len", o.seq_len},
      {"repeat_prompt_tokens", repeat.size()},
      {"heldout_windows", held_windows},
      {"heldout_r2", r2},
      {"seed", o.seed},
      {"command", o.command_line},
      {"wall_seconds", wall}};
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
