#include "capture/gates/kvpop_scorer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/common/check.h"
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

namespace {

// [softmax(u); softmax(-u)] of u [F] into out [2F], as hedgehog() computes it.
void hedgehog_row(const float* u, int64_t F, float* out) {
  for (float sign : {1.0f, -1.0f}) {
    float top = -std::numeric_limits<float>::infinity(), total = 0;
    for (int64_t f = 0; f < F; ++f) top = std::max(top, sign * u[f]);
    for (int64_t f = 0; f < F; ++f) total += out[f] = std::exp(sign * u[f] - top);
    for (int64_t f = 0; f < F; ++f) out[f] /= total;
    out += F;
  }
}

// y [O] = x [I] W [I, O].
void row_times(const float* x, const float* W, int64_t I, int64_t O, float* y) {
  std::fill(y, y + O, 0.0f);
  for (int64_t i = 0; i < I; ++i)
    for (int64_t o = 0; o < O; ++o) y[o] += x[i] * W[i * O + o];
}

// mlstm_tokens for a decode step's few tokens, in plain loops (its twenty
// tensor ops per layer would cost more than the products).
MlstmTokens mlstm_tokens_few(const GateSet& g, const std::string& p, const torch::Tensor& x) {
  const torch::Tensor xc = x.to(torch::kFloat32).contiguous();  // [K, n, I]
  const int64_t K = xc.size(0), n = xc.size(1), I = xc.size(2);
  const torch::Tensor wq = g.param(p + "wq").contiguous(), wk = g.param(p + "wk").contiguous(),
                      wv = g.param(p + "wv").contiguous();  // [K, I, *]
  const torch::Tensor wi = g.param(p + "wi").contiguous(), bi = g.param(p + "bi").contiguous(),
                      wf = g.param(p + "wf").contiguous(), bf = g.param(p + "bf").contiguous();
  const int64_t Fq = wq.size(2), Fk = wk.size(2), P = wv.size(2);
  MlstmTokens t;
  t.q = torch::empty({K, n, 2 * Fq}), t.k = torch::empty({K, n, 2 * Fk});
  t.v = torch::empty({K, n, P});
  t.log_i = torch::empty({K, n}), t.log_f = torch::empty({K, n});
  std::vector<float> u(static_cast<size_t>(std::max(Fq, Fk)));
  for (int64_t h = 0; h < K; ++h)
    for (int64_t j = 0; j < n; ++j) {
      const float* xr = xc.data_ptr<float>() + (h * n + j) * I;
      row_times(xr, wq.data_ptr<float>() + h * I * Fq, I, Fq, u.data());
      hedgehog_row(u.data(), Fq, t.q.data_ptr<float>() + (h * n + j) * 2 * Fq);
      row_times(xr, wk.data_ptr<float>() + h * I * Fk, I, Fk, u.data());
      hedgehog_row(u.data(), Fk, t.k.data_ptr<float>() + (h * n + j) * 2 * Fk);
      row_times(xr, wv.data_ptr<float>() + h * I * P, I, P,
                t.v.data_ptr<float>() + (h * n + j) * P);
      float li = 0, lf = 0;
      for (int64_t i = 0; i < I; ++i)
        li += xr[i] * wi.data_ptr<float>()[h * I + i],
            lf += xr[i] * wf.data_ptr<float>()[h * I + i];
      li += bi.data_ptr<float>()[h], lf += bf.data_ptr<float>()[h];
      t.log_i.data_ptr<float>()[h * n + j] = li;
      // log sigmoid, as torch computes it: min(x, 0) - log1p(exp(-|x|)).
      t.log_f.data_ptr<float>()[h * n + j] =
          std::min(lf, 0.0f) - std::log1p(std::exp(-std::fabs(lf)));
    }
  return t;
}

}  // namespace

MlstmTokens mlstm_tokens(const GateSet& g, int64_t layer, const torch::Tensor& x) {
  const std::string p = layer_prefix(layer) + "mlstm.";
  // Loops only where no gradient is wanted (the trainer's sequences differentiate).
  if (x.size(1) <= 4 && x.device().is_cpu() && !torch::GradMode::is_enabled())
    return mlstm_tokens_few(g, p, x);
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
  torch::Tensor Fp = F.index_select(1, read_at);                                   // [K, n]
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

// The recurrence in plain loops: a decode step writes and reads one token per
// layer, where the dozen tensor ops of an update cost more than its K F P
// multiply-adds (docs/performance.md, "Every policy's cost per decode step").
void mlstm_write(MlstmState& s, const MlstmTokens& tok, int64_t i) {
  const int64_t K = s.C.size(0), F = s.C.size(1), P = s.C.size(2), n = tok.log_i.size(1);
  KVSCOPE_CHECK(i >= 0 && i < n, "mlstm_write: token index out of range");
  KVSCOPE_CHECK(s.C.is_contiguous() && s.z.is_contiguous() && s.m.is_contiguous() &&
                    tok.k.is_contiguous() && tok.v.is_contiguous() && tok.log_i.is_contiguous() &&
                    tok.log_f.is_contiguous(),
                "mlstm_write: state and tokens must be contiguous");
  float *C = s.C.data_ptr<float>(), *z = s.z.data_ptr<float>(), *m = s.m.data_ptr<float>();
  for (int64_t h = 0; h < K; ++h) {
    const float li = tok.log_i.data_ptr<float>()[h * n + i];
    const float lf = tok.log_f.data_ptr<float>()[h * n + i];
    const float mn = std::max(lf + m[h], li);
    const float keep = std::exp(lf + m[h] - mn), write = std::exp(li - mn);  // exp(-inf) = 0
    const float* k = tok.k.data_ptr<float>() + (h * n + i) * F;
    const float* v = tok.v.data_ptr<float>() + (h * n + i) * P;
    float* Ch = C + h * F * P;
    for (int64_t f = 0; f < F; ++f) {
      const float wk = write * k[f];
      for (int64_t e = 0; e < P; ++e) Ch[f * P + e] = keep * Ch[f * P + e] + wk * v[e];
      z[h * F + f] = keep * z[h * F + f] + wk;
    }
    m[h] = mn;
  }
}

namespace {

// h = q^T C / q^T z of head h, q [F].
void read_head(const MlstmState& s, int64_t h, const float* q, float* out) {
  const int64_t F = s.C.size(1), P = s.C.size(2);
  const float* C = s.C.data_ptr<float>() + h * F * P;
  const float* z = s.z.data_ptr<float>() + h * F;
  float den = 0;
  for (int64_t e = 0; e < P; ++e) out[e] = 0;
  for (int64_t f = 0; f < F; ++f) {
    den += q[f] * z[f];
    for (int64_t e = 0; e < P; ++e) out[e] += q[f] * C[f * P + e];
  }
  for (int64_t e = 0; e < P; ++e) out[e] /= den;
}

}  // namespace

torch::Tensor mlstm_read(const MlstmState& s, const torch::Tensor& q) {
  const int64_t K = s.C.size(0), F = s.C.size(1), P = s.C.size(2);
  const torch::Tensor qc = q.to(torch::kFloat32).contiguous();
  KVSCOPE_CHECK(qc.numel() == K * F, "mlstm_read: query features of the wrong shape");
  torch::Tensor out = torch::empty({K, P}, torch::kFloat32);
  for (int64_t h = 0; h < K; ++h)
    read_head(s, h, qc.data_ptr<float>() + h * F, out.data_ptr<float>() + h * P);
  return out;
}

void mlstm_read_scores(const GateSet& g, int64_t layer, const MlstmState& s, const float* q,
                       float* scores) {
  const std::string p = layer_prefix(layer) + "mlstm.";
  const torch::Tensor& a = g.param(p + "out_w");  // [K, P]
  const torch::Tensor& b = g.param(p + "out_b");  // [K]
  const int64_t K = s.C.size(0), F = s.C.size(1), P = s.C.size(2);
  KVSCOPE_CHECK(a.is_contiguous() && a.numel() == K * P && b.numel() == K,
                "mlstm_read_scores: score projection of the wrong shape");
  std::vector<float> h(static_cast<size_t>(P));
  for (int64_t k = 0; k < K; ++k) {
    read_head(s, k, q + k * F, h.data());
    float total = 0;
    for (int64_t e = 0; e < P; ++e)
      total += h[size_t(e)] / (1.0f + std::exp(-h[size_t(e)])) * a.data_ptr<float>()[k * P + e];
    scores[k] = total + b.data_ptr<float>()[k];
  }
}

}  // namespace kvscope::gates
