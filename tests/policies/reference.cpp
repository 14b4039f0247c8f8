#include "tests/policies/reference.h"

#include <cmath>

namespace kvscope::test::ref {

std::vector<double> snapkv_votes(const torch::Tensor& probs, int64_t g, int64_t R, int64_t window) {
  const int64_t n = probs.size(1), m = probs.size(2);
  torch::Tensor group = probs.narrow(0, g * R, R).mean(0);           // [n, m]
  torch::Tensor votes = group.narrow(0, n - window, window).sum(0);  // [m]
  std::vector<double> out(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j) out[size_t(j)] = votes[j].item<double>();
  return out;
}

std::vector<double> pool(const std::vector<int64_t>& pos, const std::vector<double>& votes,
                         int64_t kernel, bool max_pool, size_t size) {
  std::vector<double> out(size, 0.0);
  const int64_t n = int64_t(pos.size());
  for (int64_t i = 0; i < n; ++i) {
    double acc = max_pool ? -1.0 : 0.0;
    for (int64_t j = i - kernel / 2; j <= i + kernel / 2; ++j) {
      const double v = (j < 0 || j >= n) ? 0.0 : votes[size_t(pos[size_t(j)])];
      if (max_pool && j >= 0 && j < n) acc = std::max(acc, v);
      if (!max_pool) acc += v;
    }
    out[size_t(pos[size_t(i)])] = max_pool ? acc : acc / double(kernel);
  }
  return out;
}

std::set<int64_t> snapkv_kept(const torch::Tensor& probs, int64_t g, int64_t R, int64_t n,
                              int64_t budget, int64_t window, int64_t kernel) {
  std::vector<double> votes = snapkv_votes(probs, g, R, window);
  std::vector<int64_t> prefix;
  for (int64_t j = 0; j < n - window; ++j) prefix.push_back(j);
  std::set<int64_t> kept =
      top_k(prefix, pool(prefix, votes, kernel, false, size_t(n)), budget - window);
  for (int64_t j = n - window; j < n; ++j) kept.insert(j);
  return kept;
}

torch::Tensor queries_before_rope(const model::Transformer& model, int64_t layer,
                                  const torch::Tensor& hidden) {
  const model::ModelConfig& c = model.config();
  torch::Tensor wq =
      model.weights().layers[size_t(layer)].wqkv.narrow(0, 0, c.n_heads * c.head_dim);
  return torch::matmul(hidden, wq.to(torch::kFloat32).t())
      .reshape({hidden.size(0), c.n_heads, c.head_dim});
}

std::vector<double> expected_attention_scores(const model::Transformer& model,
                                              const torch::Tensor& q_pre, const torch::Tensor& keys,
                                              const torch::Tensor& values,
                                              const std::vector<int64_t>& held, int64_t g,
                                              int64_t next_pos, int64_t n_future, int64_t sinks,
                                              double scale) {
  const model::ModelConfig& c = model.config();
  const int64_t d = c.head_dim, R = c.n_heads / c.n_kv_heads;
  torch::Tensor q = q_pre.to(torch::kFloat64);
  // Gaussian statistics of the queries (biased covariance, as kvpress).
  torch::Tensor mu = q.mean(0);  // [H, d]
  torch::Tensor centered = q - mu.unsqueeze(0);
  torch::Tensor cov = torch::einsum("nhi,nhj->hij", {centered, centered}) / double(q.size(0));
  // The RoPE rotation R(t) of pair (i, i + d/2) by angle t * theta^(-2i/d),
  // averaged over the next n_future positions.
  torch::Tensor rbar = torch::zeros({d, d}, torch::kFloat64);
  for (int64_t i = 0; i < d / 2; ++i) {
    const double inv = std::pow(c.rope.theta, -2.0 * double(i) / double(d));
    double cs = 0, sn = 0;
    for (int64_t t = next_pos; t < next_pos + n_future; ++t) {
      cs += std::cos(double(float(double(t) * inv)));
      sn += std::sin(double(float(double(t) * inv)));
    }
    cs /= double(n_future), sn /= double(n_future);
    rbar[i][i] = cs, rbar[i][i + d / 2] = -sn;
    rbar[i + d / 2][i] = sn, rbar[i + d / 2][i + d / 2] = cs;
  }
  torch::Tensor mu_r = torch::matmul(mu, rbar.t());
  torch::Tensor cov_r = torch::matmul(rbar, torch::matmul(cov, rbar.t()));
  std::vector<int64_t> scored;
  for (int64_t p : held)
    if (p >= sinks) scored.push_back(p);
  torch::Tensor idx = torch::tensor(scored, torch::kInt64);
  torch::Tensor k = keys.index_select(0, idx).select(1, g).to(torch::kFloat64);  // [m, d]
  torch::Tensor vn = values.index_select(0, idx).select(1, g).to(torch::kFloat64).norm(2, -1);
  // log of the group's mean softmax: logsumexp over the heads of log_softmax
  // minus log R (the softmax itself underflows for real models' logits).
  std::vector<torch::Tensor> log_p;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t h = g * R + r;
    torch::Tensor z = torch::matmul(k, mu_r[h]) * scale +
                      (torch::matmul(k, cov_r[h]) * k).sum(1) * (scale * scale / 2);
    log_p.push_back(torch::log_softmax(z, 0));
  }
  torch::Tensor s = torch::logsumexp(torch::stack(log_p), 0) - std::log(double(R)) + vn.log();
  std::vector<double> out(size_t(keys.size(0)), 1e30);
  for (size_t j = 0; j < scored.size(); ++j) out[size_t(scored[j])] = s[int64_t(j)].item<double>();
  return out;
}

}  // namespace kvscope::test::ref
