#include "capture/train/sfc_data.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "capture/gates/gate_set.h"
#include "capture/generate/dense_kv_cache.h"
#include "capture/model/attention_backend.h"
#include "core/common/input_error.h"
#include "core/trace/reader.h"

namespace kvscope::gates {

namespace fs = std::filesystem;

double sfc_quantile(std::vector<float> v, double q) {
  std::sort(v.begin(), v.end());
  const double h = q * double(v.size() - 1);
  const size_t lo = size_t(std::floor(h));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return double(v[lo]) + (h - double(lo)) * (double(v[hi]) - double(v[lo]));
}

float sfc_step_labels(const std::vector<float>& mass, double q, uint8_t* y) {
  const float tau = float(sfc_quantile(mass, q));
  for (size_t j = 0; j < mass.size(); ++j) y[j] = mass[j] > tau;
  return tau;
}

void sfc_horizon_labels(const torch::Tensor& y_now, int64_t horizon, torch::Tensor* y_hor,
                        torch::Tensor* valid) {
  const int64_t S = y_now.size(0);
  // c[t] = positives in steps [0, t); y_hor[t] = c[t + H] - c[t] > 0.
  torch::Tensor c = torch::cat({torch::zeros_like(y_now.narrow(0, 0, 1), torch::kInt32),
                                y_now.to(torch::kInt32).cumsum(0, torch::kInt32)});
  *y_hor = torch::zeros_like(y_now, torch::kUInt8);
  const int64_t n = std::max<int64_t>(0, S - horizon + 1);
  if (n > 0) y_hor->narrow(0, 0, n).copy_((c.narrow(0, horizon, n) - c.narrow(0, 0, n)).gt(0));
  *valid =
      torch::arange(S, torch::TensorOptions().dtype(torch::kInt64).device(y_now.device())).lt(n);
}

// ---- traces ----------------------------------------------------------------------

SfcTraceHeader check_sfc_trace(const std::string& path) {
  std::unique_ptr<trace::TraceReader> r = trace::TraceReader::open(path);
  const trace::RunInfo& run = r->run();
  if (run.policy_name != "full")
    throw InputError(path, "/run policy_name",
                     "is '" + run.policy_name +
                         "' (expected full: the forecaster learns from the attention of a full "
                         "cache, capture with --policy full --capture received)");
  if (!r->layout().received)
    throw InputError(path, "/run capture_levels",
                     "'" + run.capture_levels +
                         "' has no received attention (expected a trace captured with "
                         "--capture received)");
  if (r->n_steps() < 2)
    throw InputError(path, "/steps",
                     std::to_string(r->n_steps()) +
                         " step(s) (expected at least 2: a token is forecast from the step after "
                         "the one that fed it)");
  SfcTraceHeader h;
  h.path = path;
  h.model_name = run.model.name;
  h.model_path = run.model.path;
  h.model_sha256 = run.model.sha256;
  h.n_layers = run.model.n_layers;
  h.n_heads = run.model.n_heads;
  h.n_kv_heads = run.model.n_kv_heads;
  h.head_dim = run.model.head_dim;
  h.vocab_size = run.model.vocab_size;
  return h;
}

std::string sfc_model_path(const SfcTraceHeader& h, const std::string& model_override) {
  if (!model_override.empty()) return model_override;
  std::error_code ec;
  if (h.model_path.empty() || !fs::exists(h.model_path, ec))
    throw InputError(h.path, "/run model_path",
                     "'" + h.model_path +
                         "' is not found from here (expected --model naming the trace's model)");
  return h.model_path;
}

void check_sfc_model(const SfcTraceHeader& h, const model::ModelConfig& c,
                     const std::string& model_file) {
  if (!h.model_sha256.empty()) {
    const std::string sha = file_sha256(model_file);
    if (sha != h.model_sha256)
      throw InputError(h.path, "/run model_sha256",
                       "is " + h.model_sha256 + ", the model " + model_file + " has " + sha +
                           " (expected a trace of this model)");
  }
  if (h.model_name != c.name)
    throw InputError(h.path, "/run model_name",
                     "is '" + h.model_name + "', the model " + model_file + " is '" + c.name +
                         "' (expected a trace of this model)");
  const std::pair<const char*, std::pair<int64_t, int64_t>> shape[] = {
      {"/run n_layers", {h.n_layers, c.n_layers}},
      {"/run n_heads", {h.n_heads, c.n_heads}},
      {"/run n_kv_heads", {h.n_kv_heads, c.n_kv_heads}},
      {"/run head_dim", {h.head_dim, c.head_dim}},
      {"/run vocab_size", {h.vocab_size, c.vocab_size}}};
  for (const auto& [field, v] : shape)
    if (v.first != v.second)
      throw InputError(h.path, field,
                       "is " + std::to_string(v.first) + ", the model " + model_file + " has " +
                           std::to_string(v.second) + " (expected a trace of this model)");
}

namespace {

// Dense causal attention (the plain engine's cache, on the model's device)
// that keeps what the forecaster reads, in host memory: every layer's
// post-RoPE keys and some queries.
class QkRecorder : public model::AttentionBackend {
 public:
  QkRecorder(const model::ModelConfig& c, int64_t tokens, torch::Device device,
             torch::ScalarType dtype, const torch::Tensor& query_rows)
      : cache_(c, tokens, device, dtype), rows_(query_rows.to(device)) {
    out.k.resize(size_t(c.n_layers));
    out.q.resize(size_t(c.n_layers));
  }
  void begin_step(int64_t pos0, int64_t n) override { cache_.begin_step(pos0, n); }
  void end_step() override { cache_.end_step(); }
  torch::Tensor attend(const model::AttentionInputs& in) override {
    out.k[size_t(in.layer)] = in.k.to(torch::kFloat32).cpu().contiguous();
    out.q[size_t(in.layer)] = in.q.index_select(0, rows_).to(torch::kFloat32).cpu().contiguous();
    return cache_.attend(in);
  }

  SfcQk out;

 private:
  generate::DenseKvCache cache_;
  torch::Tensor rows_;
};

}  // namespace

SfcQk sfc_recompute_qk(model::Transformer& model, const std::vector<int64_t>& ids,
                       const std::vector<int64_t>& query_positions) {
  torch::NoGradGuard no_grad;
  const int64_t T = int64_t(ids.size());
  QkRecorder rec(model.config(), T, model.device(), model.dtype(),
                 torch::tensor(query_positions, torch::kInt64));
  model.forward_hidden(torch::tensor(ids, torch::kInt64).to(model.device()), 0, rec);
  return std::move(rec.out);
}

namespace {

// The EWMAs and labels of one trace from its received rows (see the file
// comment of sfc_data.h).
void read_received(const trace::TraceReader& r, const SfcLabelOptions& o, SfcSequence& s) {
  const int64_t L = r.n_layers(), K = r.n_kv_heads(), S = s.S, T = s.T, NG = s.NG;
  s.ewma = torch::zeros({S, NG, T}, torch::kFloat32);
  s.y_now = torch::zeros({S, NG, T}, torch::kUInt8);
  s.tau = torch::zeros({S, NG}, torch::kFloat32);
  float* ewma = s.ewma.data_ptr<float>();
  uint8_t* y = s.y_now.data_ptr<uint8_t>();
  float* tau = s.tau.data_ptr<float>();
  std::vector<float> a(size_t(NG * T), 0.0f), mass;
  std::vector<uint8_t> seen;
  const float beta = float(o.ewma);
  for (int64_t st = 0; st < S; ++st) {
    const int64_t held = st + 1 < S ? s.first[size_t(st + 1)] : T;  // tokens fed up to st
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < K; ++h) {
        const int64_t g = l * K + h;
        trace::ReceivedRow row = r.received(st, int(l), int(h));
        mass.assign(size_t(held), 0.0f);
        seen.assign(size_t(held), 0);
        bool full = int64_t(row.tokens.size()) == held;
        for (size_t i = 0; full && i < row.tokens.size(); ++i) {
          const int64_t j = row.tokens[i];
          full = j >= 0 && j < held && !seen[size_t(j)];
          if (full) seen[size_t(j)] = 1, mass[size_t(j)] = row.mass[i];
        }
        if (!full)
          throw InputError(r.path(), "/attention/received",
                           "step " + std::to_string(st) + ", layer " + std::to_string(l) +
                               ", kv head " + std::to_string(h) + " holds " +
                               std::to_string(row.tokens.size()) + " entries (expected tokens 0.." +
                               std::to_string(held - 1) + " once each: a full cache)");
        tau[st * NG + g] = sfc_step_labels(mass, o.tau_quantile, y + (st * NG + g) * T);
        float* arow = a.data() + g * T;
        for (int64_t j = 0; j < held; ++j)
          arow[j] = beta * arow[j] + (1.0f - beta) * mass[size_t(j)];
        if (st + 1 < S) std::copy(arow, arow + held, ewma + ((st + 1) * NG + g) * T);
      }
  }
}

}  // namespace

SfcSequence load_sfc_sequence(const std::string& path, model::Transformer& model,
                              const SfcLabelOptions& o) {
  std::unique_ptr<trace::TraceReader> r = trace::TraceReader::open(path);
  const model::ModelConfig& c = model.config();
  SfcSequence s;
  s.source = path;
  s.S = r->n_steps();
  s.T = r->n_tokens();
  s.NG = c.n_layers * c.n_kv_heads;
  s.head_dim = c.head_dim;
  const std::vector<trace::StepRecord> steps = r->steps(0, s.S);
  std::vector<int64_t> last;
  for (int64_t st = 0; st < s.S; ++st) {
    const trace::StepRecord& rec = steps[size_t(st)];
    const int64_t expected = st == 0 ? 0 : s.first.back() + steps[size_t(st - 1)].n_tokens;
    if (rec.first_token != expected || rec.n_tokens < 1)
      throw InputError(path, "/steps/first_token",
                       "step " + std::to_string(st) + " feeds tokens from " +
                           std::to_string(rec.first_token) + " (" + std::to_string(rec.n_tokens) +
                           " tokens; expected from " + std::to_string(expected) +
                           ", at least one)");
    s.first.push_back(rec.first_token);
    last.push_back(rec.first_token + rec.n_tokens - 1);
    for (int32_t i = 0; i < rec.n_tokens; ++i) s.fed_at.push_back(st);
  }
  if (int64_t(s.fed_at.size()) != s.T)
    throw InputError(path, "/steps/n_tokens",
                     "the steps feed " + std::to_string(s.fed_at.size()) + " tokens, /tokens has " +
                         std::to_string(s.T));
  std::vector<int64_t> ids;
  for (const trace::TokenRecord& t : r->tokens(0, s.T)) {
    if (t.id < 0 || t.id >= c.vocab_size)
      throw InputError(path, "/tokens/id",
                       std::to_string(t.id) + " is outside the model's vocabulary (expected 0.." +
                           std::to_string(c.vocab_size - 1) + ")");
    ids.push_back(t.id);
  }
  read_received(*r, o, s);

  const SfcQk qk = sfc_recompute_qk(model, ids, last);
  const int64_t K = c.n_kv_heads, R = c.n_heads / K, hd = c.head_dim;
  std::vector<torch::Tensor> keys, queries;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    keys.push_back(qk.k[size_t(l)].permute({1, 0, 2}));  // [K, T, hd]
    queries.push_back(
        qk.q[size_t(l)].view({s.S, K, R, hd}).mean(2).permute({1, 0, 2}));  // [K, S, hd]
  }
  s.keys = torch::cat(keys).contiguous();
  s.qmean = torch::cat(queries).contiguous();
  return s;
}

}  // namespace kvscope::gates
