// The Fast KVzip gate's forward (fastkvzip_gate.h).
#include "capture/gates/fastkvzip_gate.h"

#include <cmath>

namespace kvscope::gates {

namespace {

// Qwen3RMSNorm (kvpress's choice for the gate): x / sqrt(mean(x^2) + 1e-6) * w.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w) {
  return x * torch::rsqrt(x.square().mean(-1, true) + 1e-6) * w;
}

}  // namespace

std::string fastkvzip_prefix(int64_t layer) {
  return "layers." + std::to_string(layer) + ".fastkvzip.";
}

FastKvzipLayer fastkvzip_layer(const GateSet& g, int64_t layer) {
  const std::string p = fastkvzip_prefix(layer);
  FastKvzipLayer out{g.param(p + "q_proj.weight"),
                     g.param(p + "q_proj.bias"),
                     g.param(p + "k_proj.weight"),
                     g.param(p + "q_norm.weight"),
                     g.param(p + "k_norm.weight"),
                     g.param(p + "b"),
                     torch::Tensor()};
  if (g.params.count(p + "k_base")) out.k_base = g.param(p + "k_base");
  return out;
}

torch::Tensor fastkvzip_forward(const FastKvzipLayer& p, const torch::Tensor& hidden, int64_t K,
                                int64_t G, int64_t dim) {
  const int64_t n = hidden.size(0);
  const double d = std::sqrt(double(dim));
  torch::Tensor q = rms_norm(torch::addmm(p.q_b, hidden, p.q_w.t()).view({n, K, G, dim}), p.q_norm);
  torch::Tensor k = rms_norm(hidden.mm(p.k_w.t()).view({n, K, 1, dim}), p.k_norm);
  torch::Tensor z = (k * q).sum(-1) / d + p.b.view({1, K, G});  // [n, K, G]
  torch::Tensor score;
  if (p.k_base.defined()) {
    // [K, S, dim] x [n, K, G, dim] -> [n, K, S, G]
    torch::Tensor base = torch::einsum("ksd,nkgd->nksg", {p.k_base.view({K, -1, dim}), q}) / d;
    score = 1.0 / (1.0 + torch::exp(base - z.unsqueeze(2)).sum(2));
  } else {
    score = torch::sigmoid(z);
  }
  return score.mean(-1);  // [n, K]
}

}  // namespace kvscope::gates
