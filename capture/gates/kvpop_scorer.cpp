#include "capture/gates/kvpop_scorer.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "core/common/input_error.h"

namespace kvscope::gates {

namespace {

std::string layer_prefix(int64_t layer) {
  return "layers." + std::to_string(layer) + ".kvpop.";
}

// Hedgehog feature map in its softmax form (E.3): [softmax(u); softmax(-u)]
// over the feature dimension; positive, so q^T z > 0 and the readout's
// division is safe.
torch::Tensor hedgehog(const torch::Tensor& u) {
  return torch::cat({torch::softmax(u, -1), torch::softmax(-u, -1)}, -1);
}

}  // namespace

KvpopConfig kvpop_config(const GateSet& g) {
  if (g.kind != GateKind::KvpopMlp && g.kind != GateKind::KvpopMlstm)
    throw InputError(g.source, "policy",
                     std::string("kvpop needs a KVpop scorer file (kind kvpop-mlp or kvpop-mlstm); "
                                 "this file holds ") +
                         gate_kind_name(g.kind) + " gates");
  KvpopConfig c;
  c.mlstm = g.kind == GateKind::KvpopMlstm;
  c.sinks = int64_t(g.hyper("sinks"));
  c.window = int64_t(g.hyper("window"));
  c.topk = int64_t(g.hyper("topk"));
  c.gamma_min = g.hyper("gamma_min");
  c.gamma_max = g.hyper("gamma_max");
  c.decay_step = int64_t(g.hyper("decay_step"));
  if (c.mlstm) c.delayed = g.meta.at("hyperparameters").value("readout", "delayed") == "delayed";
  return c;
}

torch::Tensor kvpop_log_gamma(const GateSet& g, int64_t layer) {
  const double lo = std::log(g.hyper("gamma_min")), hi = std::log(g.hyper("gamma_max"));
  return lo + torch::sigmoid(g.param(layer_prefix(layer) + "decay_logit")) * (hi - lo);
}

torch::Tensor kvpop_inputs(const torch::Tensor& k, const torch::Tensor& v) {
  return torch::cat({k, v}, -1).to(torch::kFloat32).permute({1, 0, 2});
}

torch::Tensor kvpop_mlp_scores(const GateSet& g, int64_t layer, const torch::Tensor& x) {
  const std::string p = layer_prefix(layer) + "mlp.";
  torch::Tensor hidden =
      torch::silu(torch::bmm(x, g.param(p + "w1")) + g.param(p + "b1").unsqueeze(1));  // [K, n, I]
  return (hidden * g.param(p + "w2").unsqueeze(1)).sum(-1) + g.param(p + "b2").unsqueeze(1);
}

MlstmTokens mlstm_tokens(const GateSet& g, int64_t layer, const torch::Tensor& x) {
  const std::string p = layer_prefix(layer) + "mlstm.";
  MlstmTokens t;
  t.q = hedgehog(torch::bmm(x, g.param(p + "wq")));
  t.k = hedgehog(torch::bmm(x, g.param(p + "wk")));
  t.v = torch::bmm(x, g.param(p + "wv"));
  t.log_i = (x * g.param(p + "wi").unsqueeze(1)).sum(-1) + g.param(p + "bi").unsqueeze(1);
  t.log_f = torch::log_sigmoid((x * g.param(p + "wf").unsqueeze(1)).sum(-1) +
                               g.param(p + "bf").unsqueeze(1));
  return t;
}

torch::Tensor mlstm_score_of(const GateSet& g, int64_t layer, const torch::Tensor& h) {
  const std::string p = layer_prefix(layer) + "mlstm.";
  torch::Tensor a = g.param(p + "out_w"), b = g.param(p + "out_b");
  std::vector<int64_t> shape(size_t(h.dim()), 1);
  shape[0] = a.size(0);
  shape.back() = a.size(1);
  std::vector<int64_t> bshape(size_t(h.dim() - 1), 1);
  bshape[0] = b.size(0);
  return (torch::silu(h) * a.view(shape)).sum(-1) + b.view(bshape);
}

torch::Tensor mlstm_scores_parallel(const GateSet& g, int64_t layer, const torch::Tensor& x,
                                    int64_t delay) {
  MlstmTokens t = mlstm_tokens(g, layer, x);
  const int64_t n = x.size(1);
  torch::Tensor F = torch::cumsum(t.log_f, 1);  // [K, n]
  const auto idx = torch::TensorOptions().dtype(torch::kInt64).device(x.device());
  torch::Tensor read_at = torch::clamp_max(torch::arange(n, idx) + delay, n - 1);  // p(u)
  torch::Tensor Fp = F.index_select(1, read_at);  // [K, n]
  // log weight of token j in the state read by token u: F_p - F_j + log i_j, j <= p(u).
  torch::Tensor logw = Fp.unsqueeze(2) - F.unsqueeze(1) + t.log_i.unsqueeze(1);  // [K, u, j]
  torch::Tensor visible = torch::arange(n, idx).unsqueeze(0) <= read_at.unsqueeze(1);
  logw =
      logw.masked_fill(visible.logical_not().unsqueeze(0), -std::numeric_limits<float>::infinity());
  // The stabiliser (a row max) cancels in the ratio of eq. 41.
  torch::Tensor w = torch::exp(logw - std::get<0>(logw.max(2, true)));
  torch::Tensor qk = torch::bmm(t.q, t.k.transpose(1, 2)) * w;  // [K, u, j]
  torch::Tensor h = torch::bmm(qk, t.v) / qk.sum(2, true);      // [K, u, P]
  return mlstm_score_of(g, layer, h);
}

MlstmState mlstm_initial_state(int64_t K, int64_t F, int64_t P) {
  return {torch::zeros({K, F, P}), torch::zeros({K, F}),
          torch::full({K}, -std::numeric_limits<float>::infinity())};
}

void mlstm_write(MlstmState& s, const MlstmTokens& tok, int64_t i) {
  torch::Tensor li = tok.log_i.select(1, i), lf = tok.log_f.select(1, i);  // [K]
  torch::Tensor m = torch::maximum(lf + s.m, li);
  torch::Tensor keep = torch::exp(lf + s.m - m),
                write = torch::exp(li - m);                      // exp(-inf) = 0 at start
  torch::Tensor k = tok.k.select(1, i), v = tok.v.select(1, i);  // [K, F], [K, P]
  s.C = keep.view({-1, 1, 1}) * s.C + write.view({-1, 1, 1}) * k.unsqueeze(2) * v.unsqueeze(1);
  s.z = keep.view({-1, 1}) * s.z + write.view({-1, 1}) * k;
  s.m = m;
}

torch::Tensor mlstm_read(const MlstmState& s, const torch::Tensor& q) {
  torch::Tensor num = torch::bmm(q.unsqueeze(1), s.C).squeeze(1);  // [K, P]
  torch::Tensor den = (q * s.z).sum(-1, true);                     // [K, 1]
  return num / den;
}

}  // namespace kvscope::gates
