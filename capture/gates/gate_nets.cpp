#include "capture/gates/gate_nets.h"

#include <torch/torch.h>

#include <cmath>

#include "core/common/input_error.h"

namespace kvscope::gates {

namespace {

std::string lp(int64_t layer) { return "layers." + std::to_string(layer) + "."; }

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  torch::Tensor xf = x.to(torch::kFloat32);
  return w * (xf * torch::rsqrt(xf.square().mean(-1, true) + eps));
}

torch::Tensor activation(const GateSet& g, const torch::Tensor& x) {
  const std::string act = g.meta.at("hyperparameters").value("activation", "silu");
  return act == "gelu" ? torch::gelu(x) : torch::silu(x);
}

}  // namespace

torch::Tensor wgkv_gate(const GateSet& g, int64_t layer, const torch::Tensor& k_pre,
                        const torch::Tensor& k_post) {
  const std::string p = lp(layer) + "self_attn.g_predictors.";
  const double eps = g.hyper("norm_eps");
  const int64_t n = k_post.size(0), K = k_post.size(1);
  torch::Tensor x = torch::cat({rms_norm(k_pre, g.param(p + "pre_key_norm.weight"), eps),
                                rms_norm(k_post, g.param(p + "post_key_norm.weight"), eps)},
                               -1);                       // [n, K, 2hd]
  const torch::Tensor& c1 = g.param(p + "conv1.weight");  // [K*inner, 2hd, 1]
  const int64_t inner = c1.size(0) / K;
  torch::Tensor w1 = c1.view({K, inner, x.size(2)});
  torch::Tensor b1 = g.param(p + "conv1.bias").view({K, 1, inner});
  torch::Tensor h = torch::baddbmm(b1, x.permute({1, 0, 2}), w1.transpose(1, 2));  // [K, n, inner]
  const std::string act = g.meta.at("hyperparameters").value("activation", "gelu");
  h = act == "silu" ? torch::silu(h) : torch::gelu(h);  // nn.GELU(): exact erf form
  torch::Tensor w2 = g.param(p + "conv2.weight").view({K, inner, 1});
  torch::Tensor b2 = g.param(p + "conv2.bias").view({K, 1, 1});
  torch::Tensor s = torch::baddbmm(b2, h, w2).view({K, n});
  return torch::sigmoid(s).clamp_min(g.hyper("epsilon"));
}

torch::Tensor attention_gate_scores(const GateSet& g, int64_t layer, const torch::Tensor& hidden) {
  const std::string p = lp(layer) + "attention_gate.";
  const int64_t heads = int64_t(g.hyper("heads")), d = int64_t(g.hyper("head_dim"));
  const int64_t n = hidden.size(0);
  torch::Tensor x = hidden.to(torch::kFloat32);
  auto proj = [&](const char* name) {
    return torch::mm(x, g.param(p + name + ".weight").t()).view({n, heads, d}).permute({1, 0, 2});
  };
  torch::Tensor q = proj("q_proj"), k = proj("k_proj"), v = proj("v_proj");  // [h', n, d']
  torch::Tensor a = torch::softmax(torch::bmm(q, k.transpose(1, 2)) / std::sqrt(double(d)), -1);
  torch::Tensor o = torch::bmm(a, v).permute({1, 0, 2}).reshape({n, heads * d});
  return torch::mm(o, g.param(p + "o_proj.weight").t()).t();  // [K, n]
}

torch::Tensor retention_log_beta(const GateSet& g, int64_t layer, const torch::Tensor& hidden) {
  const std::string p = lp(layer) + "self_attn.retention_gate.";
  torch::Tensor x = hidden.to(torch::kFloat32);
  torch::Tensor h = activation(g, torch::addmm(g.param(p + "linear1.bias"), x, g.param(p + "linear1.weight").t()));
  if (g.kind == GateKind::Retention) {
    torch::Tensor s = torch::mm(h, g.param(p + "linear2.weight").t()) + g.param(p + "bias");  // [n, K]
    return torch::log_sigmoid(s).t();
  }
  if (g.kind != GateKind::RetentionGlobal)
    throw InputError(g.source, "policy", "not a retention gate file");
  const int64_t n = x.size(0);
  const torch::Tensor& w = g.param("retention_gate_shared.linear2.weight");  // [1, I]
  const int64_t I = w.size(1);
  torch::Tensor s = torch::matmul(h.view({n, -1, I}), w.view({I})) + g.param("retention_gate_shared.bias");
  return torch::log_sigmoid(s).t();  // [K, n]
}

torch::Tensor dms_decision_logits(const GateSet& g, int64_t layer, const torch::Tensor& hidden) {
  const torch::Tensor& w = g.param(lp(layer) + "dms.weight");  // [K, D]
  return torch::matmul(w, hidden.to(torch::kFloat32).t()) * g.hyper("scale") - g.hyper("offset");
}

}  // namespace kvscope::gates
