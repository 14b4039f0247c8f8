#include "capture/policy/policies/kvgrad_attribution.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "capture/model/transformer.h"
#include "core/common/check.h"

namespace kvscope::policy {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The context of one (layer, kv head) as the cache holds it, position order.
struct HeldContext {
  std::vector<int64_t> pos;
  torch::Tensor keys, values;  // [m, hd] float32
};

HeldContext read_context(const cache::RaggedKvCache& cache, int64_t layer, int64_t h) {
  HeldContext c;
  cache.attended_positions(layer, h, &c.pos);
  std::sort(c.pos.begin(), c.pos.end());
  const int64_t m = int64_t(c.pos.size()), hd = cache.head_dim();
  c.keys = torch::empty({m, hd}, torch::kFloat32);
  c.values = torch::empty({m, hd}, torch::kFloat32);
  for (int64_t j = 0; j < m; ++j)
    cache.read_entry(layer, h, c.pos[size_t(j)], c.keys[j].data_ptr<float>(),
                     c.values[j].data_ptr<float>());
  return c;
}

// Attention over the cached context (constant) and the replay's own tokens
// (causal, differentiable), as the model's forward reads them; keeps A, the
// weights of KVzip's chunked softmax on the chunk's positions, per layer.
class ReplayBackend : public model::AttentionBackend {
 public:
  ReplayBackend(const cache::RaggedKvCache& cache, const KvgradChunk& chunk)
      : cache_(cache), chunk_(chunk) {}

  // The replay runs where the model is (--device cuda: its weights are on
  // the GPU); the held context is read from the host pages and moved there.
  torch::Tensor attend(const model::AttentionInputs& in) override {
    const int64_t n = in.q.size(0), H = in.q.size(1), K = in.k.size(1), R = H / K;
    const torch::Device dev = in.q.device();
    const auto flags = torch::TensorOptions().dtype(torch::kBool).device(dev);
    std::vector<torch::Tensor> out_heads;
    torch::Tensor a = torch::zeros({H, n, chunk_.end - chunk_.start}, torch::kFloat32);
    const torch::Tensor own_causal = torch::ones({n, n}, flags).tril();
    for (int64_t h = 0; h < K; ++h) {
      HeldContext ctx = read_context(cache_, in.layer, h);
      const int64_t m = int64_t(ctx.pos.size());
      torch::Tensor k = torch::cat({ctx.keys.to(dev, in.k.scalar_type()), in.k.select(1, h)});
      torch::Tensor v = torch::cat({ctx.values.to(dev, in.v.scalar_type()), in.v.select(1, h)});
      torch::Tensor q = in.q.narrow(1, h * R, R).transpose(0, 1);  // [R, n, hd]
      torch::Tensor logits = torch::matmul(q, k.t()).to(torch::kFloat32) * in.scale;
      const torch::Tensor visible = torch::cat({torch::ones({n, m}, flags), own_causal}, 1);
      logits = logits.masked_fill(visible.logical_not(), -kInf);  // [R, n, m + n]
      out_heads.push_back(torch::matmul(torch::softmax(logits, -1).to(v.scalar_type()), v));
      a.narrow(0, h * R, R).copy_(chunk_weights(logits.detach(), ctx.pos));
    }
    weights.push_back(a);
    return torch::cat(out_heads, 0).transpose(0, 1);  // [n, H, hd]
  }

  std::vector<torch::Tensor> weights;  // per layer A [H, n, end - start], on the host

 private:
  // The softmax over the sinks, the chunk and the replay's own tokens, read
  // on the chunk's positions: [R, n, end - start].
  torch::Tensor chunk_weights(const torch::Tensor& logits, const std::vector<int64_t>& pos) const {
    const int64_t sinks = std::min(chunk_.sinks, chunk_.start), m = int64_t(pos.size());
    std::vector<uint8_t> hide(size_t(logits.size(2)), 0);
    std::vector<int64_t> chunk_col;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t p = pos[size_t(j)];
      const bool in_chunk = p >= chunk_.start && p < chunk_.end;
      hide[size_t(j)] = !(in_chunk || p < sinks);
      if (in_chunk) chunk_col.push_back(j);
    }
    KVSCOPE_CHECK(int64_t(chunk_col.size()) == chunk_.end - chunk_.start,
                  "kvgrad: the cache lost context entries before the replay");
    const torch::Tensor hidden =
        torch::from_blob(hide.data(), {int64_t(hide.size())}, torch::kUInt8)
            .to(logits.device(), torch::kBool);
    return torch::softmax(logits.masked_fill(hidden, -kInf), -1)
        .index_select(2, torch::tensor(chunk_col, torch::kInt64).to(logits.device()));
  }

  const cache::RaggedKvCache& cache_;
  const KvgradChunk& chunk_;
};

}  // namespace

void kvgrad_chunk_scores(const model::ModelConfig& config, const model::ModelWeights& weights,
                         const cache::RaggedKvCache& cache, const KvgradChunk& chunk,
                         const std::vector<torch::Tensor>& wo, int64_t T, float* scores) {
  // The capture runs in inference mode; the attribution needs a graph. A
  // model object of its own: its RoPE tables are made here, not in
  // inference mode (inference tensors cannot be saved for backward).
  c10::InferenceMode off(false);
  torch::AutoGradMode grad_on(true);
  model::Transformer m(config, weights);
  ReplayBackend replay(cache, chunk);
  std::vector<int64_t> ids(chunk.ids.begin(), chunk.ids.end());
  std::vector<torch::Tensor> attention_out;
  torch::Tensor x =
      m.forward_residual(torch::tensor(ids, torch::kInt64), chunk.pos0, replay, &attention_out);
  x.to(torch::kFloat32).square().sum().backward();

  torch::NoGradGuard no_grad;
  const int64_t L = config.n_layers, K = config.n_kv_heads, H = config.n_heads, R = H / K;
  const int64_t span = chunk.end - chunk.start;
  for (int64_t l = 0; l < L; ++l) {
    const torch::Tensor g =
        attention_out[size_t(l)].grad().to(torch::kCPU, torch::kFloat32).norm(2, -1);  // [n]
    const torch::Tensor a = replay.weights[size_t(l)] * g.view({1, -1, 1});  // [H, n, span]
    const torch::Tensor best_query = std::get<0>(a.max(1));                  // [H, span]
    for (int64_t h = 0; h < K; ++h) {
      HeldContext ctx = read_context(cache, l, h);
      torch::Tensor values = torch::zeros({span, cache.head_dim()}, torch::kFloat32);
      for (size_t j = 0; j < ctx.pos.size(); ++j) {
        const int64_t p = ctx.pos[j];
        if (p >= chunk.start && p < chunk.end)
          values[p - chunk.start].copy_(ctx.values[int64_t(j)]);
      }
      // ||v_p W_O^g|| per query head g of the group: [R, span].
      const torch::Tensor vnorm =
          values.unsqueeze(0).matmul(wo[size_t(l)].narrow(0, h * R, R)).norm(2, -1);
      const torch::Tensor s =
          std::get<0>((best_query.narrow(0, h * R, R) * vnorm).max(0)).contiguous();  // [span]
      std::copy_n(s.data_ptr<float>(), span, scores + (l * K + h) * T + chunk.start);
    }
  }
}

}  // namespace kvscope::policy
