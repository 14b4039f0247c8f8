// KVgrad (`kvgrad`, kvpress KVgradPress) on stories260K: every score against a
// reference computed another way — the prompt and the repeat prompt as one
// sequence through the dense differentiable attention (the replay over a
// read-only cache is that sequence's tail), the gradient of the tail's last
// residual energy, and KVzip's chunked softmax in double from the real pass's
// queries and keys — and the kept sets it implies.
#include <algorithm>
#include <cmath>

#include "capture/tokenizer/tokenizer.h"
#include "capture/train/gated_attention.h"
#include "tests/policies/policy_test_util.h"
#include "tests/support/paths.h"

namespace kvscope::test {

namespace {

// ||d Phi / d a_li|| for the tail tokens i >= T of prompt + ids, per layer
// [n], Phi = sum over the tail of the last residual stream's squared norm.
std::vector<torch::Tensor> tail_gradient_norms(const model::Transformer& model,
                                               const std::vector<int64_t>& prompt,
                                               const std::vector<int32_t>& ids) {
  // A model object of its own: the run's RoPE tables were made in inference
  // mode, which autograd refuses to save.
  model::Transformer m(model.config(), model.weights());
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), ids.begin(), ids.end());
  const int64_t T = int64_t(prompt.size()), n = int64_t(ids.size());
  gates::GatedDenseBackend dense(nullptr, gates::GatedDenseBackend::Mode::Full);
  std::vector<torch::Tensor> out;
  torch::Tensor x = m.forward_residual(torch::tensor(all, torch::kInt64), 0, dense, &out);
  x.narrow(0, T, n).square().sum().backward();
  std::vector<torch::Tensor> norms;
  for (const torch::Tensor& a : out)
    norms.push_back(a.grad().narrow(0, T, n).to(torch::kFloat64).norm(2, -1));
  return norms;
}

}  // namespace

TEST_CASE("kvgrad: attention x ||v W_O|| x the replay's gradient norm, from the real pass",
          "[policies][kvgrad]") {
  std::unique_ptr<model::Transformer> model = load_stories();
  const model::ModelConfig& c = model->config();
  auto tok = tokenizer::Tokenizer::load(shared_dir() + "/models/stories260K/tok512.bin", 512);
  const std::vector<int64_t> prompt = story_prompt_ids();
  const std::vector<int32_t> prompt32(prompt.begin(), prompt.end());
  const int64_t T = int64_t(prompt.size()), R = c.n_heads / c.n_kv_heads, L = c.n_layers,
                K = c.n_kv_heads, sinks = 4, budget = T / 3;
  for (int64_t chunk : {int64_t(512), T / 2 + 1}) {
    INFO("chunk " << chunk);
    const std::string spec = "kvgrad:budget=" + std::to_string(budget) +
                             ",sinks=" + std::to_string(sinks) + ",chunk=" + std::to_string(chunk);
    std::vector<policy::ReconstructionChunk> plan =
        policy::make_policy(spec).policy->plan({prompt32, tok.get(), c}).reconstruction;
    REQUIRE(plan.size() == (chunk >= T ? 1u : 2u));
    int64_t longest = 0;
    for (const auto& p : plan) longest = std::max(longest, int64_t(p.ids.size()));
    PolicyRun run(*model, spec, T + longest, T);
    REQUIRE(run.policy().plan({prompt32, tok.get(), c}).reconstruction.size() == plan.size());
    run.driver().set_reconstruction(plan);
    run.feed(*model, prompt, 0);
    const int64_t prefill_steps = int64_t(run.steps().size());
    for (const auto& p : plan) {
      run.driver().set_side_pass(true);
      run.feed(*model, std::vector<int64_t>(p.ids.begin(), p.ids.end()), T);
      run.driver().set_side_pass(false);
    }
    std::vector<double> ref(size_t(L * K * T), 0.0);
    for (size_t ci = 0; ci < plan.size(); ++ci) {
      const std::vector<torch::Tensor> grad = tail_gradient_norms(*model, prompt, plan[ci].ids);
      const int64_t start = int64_t(ci) * chunk, end = std::min(T, start + chunk);
      const int64_t sink = std::min(sinks, start);
      for (int64_t l = 0; l < L; ++l) {
        const LayerInputs& pre = run.steps()[0][size_t(l)];
        const LayerInputs& side = run.steps()[size_t(prefill_steps) + ci][size_t(l)];
        const int64_t n = side.q.size(0);
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < sink; ++j) keys.push_back(j);
        for (int64_t j = start; j < end; ++j) keys.push_back(j);
        const torch::Tensor ctx =
            pre.k.to(torch::kFloat64).index_select(0, torch::tensor(keys, torch::kInt64));
        const torch::Tensor own = side.k.to(torch::kFloat64), q = side.q.to(torch::kFloat64);
        const torch::Tensor wo = model->weights()
                                     .layers[size_t(l)]
                                     .wo.to(torch::kFloat64)
                                     .t()
                                     .reshape({c.n_heads, c.head_dim, -1});
        const torch::Tensor vo = pre.v.to(torch::kFloat64)
                                     .repeat_interleave(R, 1)
                                     .permute({1, 0, 2})
                                     .matmul(wo)
                                     .norm(2, -1);  // [H, T]
        for (int64_t h = 0; h < K; ++h)
          for (int64_t g = h * R; g < (h + 1) * R; ++g)
            for (int64_t i = 0; i < n; ++i) {
              const torch::Tensor k =
                  torch::cat({ctx.select(1, h), own.select(1, h).narrow(0, 0, i + 1)});
              const torch::Tensor p = torch::softmax(k.matmul(q[i][g]) * side.scale, 0);
              const double gi = grad[size_t(l)][i].item<double>();
              for (int64_t j = sink; j < sink + (end - start); ++j) {
                const int64_t pos = keys[size_t(j)];
                double& r = ref[size_t((l * K + h) * T + pos)];
                r = std::max(r, p[j].item<double>() * vo[g][pos].item<double>() * gi);
              }
            }
      }
    }
    double top = 0;
    for (double s : ref) top = std::max(top, s);
    for (int64_t i = 0; i < L * K; ++i)
      for (int64_t p = 0; p < sinks; ++p) ref[size_t(i * T + p)] = top + 1.0;
    double worst = 0;
    int64_t n_gates = 0;
    for (const trace::GateValue& gv : run.last_gates()) {
      worst = std::max(worst, std::abs(double(gv.value) -
                                       ref[size_t((gv.layer * K + gv.kv_head) * T + gv.token)]));
      ++n_gates;
    }
    CHECK(n_gates == L * K * T);
    CHECK(top > 0);
    CHECK(worst < 1e-4 * top);
    // The L*K*budget entries kept, the sinks among them.
    int64_t total = 0;
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < K; ++h) {
        const std::set<int64_t> held = run.held(l, h);
        total += int64_t(held.size());
        for (int64_t p = 0; p < sinks; ++p) CHECK(held.count(p) == 1);
      }
    CHECK(total == L * K * budget);
  }
}

}  // namespace kvscope::test
