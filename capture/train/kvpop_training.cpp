#include "capture/train/kvpop_training.h"

#include <torch/torch.h>

#include <stdexcept>

#include "core/common/check.h"

namespace kvscope::gates {

namespace {

// floor(t / n) for n = decay_step: the age buckets of eq. 18 measured from
// position 0, so pbar = r - floor(t/n) log gamma (eq. 20; exact for n = 1).
torch::Tensor buckets(int64_t S, int64_t n, torch::Device device) {
  return torch::floor(torch::arange(S, torch::kFloat64) / double(n))
      .to(torch::TensorOptions().dtype(torch::kFloat32).device(device));
}

struct Ranking {
  std::vector<std::vector<int32_t>> ranks, cutoffs;  // [K][S]
};

// Static ranks and running cutoffs of every head for priorities [K, S]: a
// sequential scan, on the host whatever device the priorities are on.
Ranking rank_heads(const torch::Tensor& priority, const KvpopConfig& c) {
  torch::Tensor p = priority.detach().to(torch::kFloat32).cpu().contiguous();
  const int64_t K = p.size(0), S = p.size(1);
  Ranking r;
  for (int64_t h = 0; h < K; ++h) {
    r.ranks.push_back(kvpop::static_ranks(p.data_ptr<float>() + h * S, S));
    r.cutoffs.push_back(
        kvpop::running_cutoffs(r.ranks.back().data(), S, c.sinks, c.window, c.topk));
  }
  return r;
}

// Per head: the share of the teacher's top-k at the last query the student
// keeps too (the paper's figure 7 recall).
std::vector<double> last_query_recall(const Ranking& student, const Ranking& teacher,
                                      const KvpopConfig& c) {
  std::vector<double> out;
  for (size_t h = 0; h < student.ranks.size(); ++h) {
    const int64_t S = int64_t(student.ranks[h].size()), q = S - 1;
    int64_t both = 0, kept_t = 0;
    for (int64_t t = c.sinks; t <= q - c.window; ++t) {
      const bool tk = kvpop::kept(teacher.ranks[h][size_t(t)], teacher.cutoffs[h][size_t(q)]);
      kept_t += tk;
      both += tk && kvpop::kept(student.ranks[h][size_t(t)], student.cutoffs[h][size_t(q)]);
    }
    out.push_back(kept_t > 0 ? double(both) / double(kept_t) : 1.0);
  }
  return out;
}

}  // namespace

torch::Tensor dense_causal_lse(const torch::Tensor& q, const torch::Tensor& k, double scale,
                               int64_t block) {
  torch::NoGradGuard no_grad;
  const int64_t H = q.size(0), S = q.size(1), K = k.size(0), R = H / K;
  torch::Tensor kh = k.repeat_interleave(R, 0);
  std::vector<torch::Tensor> parts;
  for (int64_t b0 = 0; b0 < S; b0 += block) {
    const int64_t b = std::min(block, S - b0);
    torch::Tensor logits = torch::bmm(q.narrow(1, b0, b), kh.transpose(1, 2)) * scale;  // [H, b, S]
    const auto idx = torch::TensorOptions().dtype(torch::kInt64).device(q.device());
    torch::Tensor pos = torch::arange(b0, b0 + b, idx).unsqueeze(1);
    torch::Tensor future = torch::arange(S, idx).unsqueeze(0) > pos;
    parts.push_back(torch::logsumexp(logits.masked_fill(future, -INFINITY), -1));
  }
  return torch::cat(parts, 1);
}

void KvpopTrainBackend::begin_step(int64_t pos0, int64_t) {
  KVSCOPE_CHECK(pos0 == 0, "KvpopTrainBackend: one step over the whole window at position 0");
  loss.clear();
  agreement.clear();
  recall.clear();
  recall_heads.clear();
  pairs.clear();
}

torch::Tensor KvpopTrainBackend::raw_scores(const torch::Tensor& x, int64_t layer) const {
  const KvpopConfig& c = cfg_;
  if (!c.mlstm) return kvpop_mlp_scores(g_, layer, x);
  return mlstm_scores_parallel(g_, layer, x, c.delayed ? c.window : 0);
}

torch::Tensor KvpopTrainBackend::attend(const model::AttentionInputs& in) {
  if (in.sliding_window > 0)
    throw std::invalid_argument(
        "KVpop training: models with their own sliding window are not supported");
  const KvpopConfig& c = cfg_;
  const int64_t l = in.layer, S = in.q.size(0), K = in.k.size(1);
  torch::Tensor q = in.q.permute({1, 0, 2}), k = in.k.permute({1, 0, 2}),
                v = in.v.permute({1, 0, 2});
  // The scorer sees detached cached quantities (§3.3): the retention loss
  // trains the scorer only, the base learns from the distillation alone.
  torch::Tensor r = raw_scores(kvpop_inputs(in.k.detach(), in.v.detach()), l);  // [K, S]
  torch::Tensor lg = kvpop_log_gamma(g_, l);                                    // [K]
  torch::Tensor age0 = buckets(S, c.decay_step, r.device()).unsqueeze(0);       // [1, S]
  const Ranking student = rank_heads(r - age0 * lg.unsqueeze(1), c);
  kvpop::SparseAttention sa =
      kvpop::sparse_attention(q, k, v, student.ranks, student.cutoffs, c.sinks, c.window, in.scale);

  torch::Tensor tgt;
  {
    torch::NoGradGuard no_grad;
    torch::Tensor qd = q.detach().to(torch::kFloat32), kd = k.detach().to(torch::kFloat32);
    torch::Tensor lse = o_.dense_lse ? dense_causal_lse(qd, kd, in.scale) : sa.lse;
    kvpop::TargetOptions to = o_.target;
    to.scale = in.scale;
    tgt = kvpop::future_attention_target(qd, kd, lse, c.window, to);  // [K, S]
  }
  torch::Tensor lgd = lg.detach();
  const Ranking teacher = rank_heads(tgt - age0 * lgd.unsqueeze(1), c);

  // Boundary pairs of every head, gathered into one batch of examples (the
  // pairs are drawn on the host, their indices moved to the scores' device).
  const auto idx = torch::TensorOptions().dtype(torch::kInt64).device(r.device());
  std::vector<torch::Tensor> r_new, r_bnd, m_new, m_bnd, ys, heads;
  for (int64_t h = 0; h < K; ++h) {
    kvpop::BoundaryPairs bp =
        kvpop::boundary_pairs(teacher.ranks[size_t(h)].data(), S, c.sinks, c.window, c.topk,
                              o_.max_pairs, o_.seed * 1000003ULL + uint64_t(l * K + h));
    if (bp.q.empty()) continue;
    torch::Tensor tq = torch::tensor(bp.q, torch::kInt64).to(r.device()),
                  tn = torch::tensor(bp.t_new, torch::kInt64).to(r.device()),
                  tb = torch::tensor(bp.t_bnd, torch::kInt64).to(r.device());
    // Effective scores at q (eq. 5/18): r_t + floor((q - t)/n) log gamma_h.
    auto age = [&](const torch::Tensor& t) {
      return torch::floor((tq - t).to(torch::kFloat64) / double(c.decay_step)).to(torch::kFloat32);
    };
    r_new.push_back(r[h].index_select(0, tn) + age(tn) * lg[h]);
    r_bnd.push_back(r[h].index_select(0, tb) + age(tb) * lg[h]);
    m_new.push_back(tgt[h].index_select(0, tn) + age(tn) * lgd[h]);
    m_bnd.push_back(tgt[h].index_select(0, tb) + age(tb) * lgd[h]);
    ys.push_back(torch::tensor(bp.y, torch::kFloat32).to(r.device()));
    heads.push_back(torch::full({int64_t(bp.q.size())}, h, idx));
  }
  torch::Tensor layer_loss;
  double agree = 1.0;
  int64_t n_pairs = 0;
  if (ys.empty()) {
    layer_loss = r.sum() * 0.0;  // no saturated query in this window: nothing to learn here
  } else {
    torch::Tensor rn = torch::cat(r_new), rb = torch::cat(r_bnd), y = torch::cat(ys),
                  hd = torch::cat(heads);
    torch::Tensor weight = torch::ones_like(y);
    if (o_.margin_weighting)
      weight = weight * kvpop::margin_weights(y * (torch::cat(m_new) - torch::cat(m_bnd)), o_.w_min,
                                              o_.tau_w);
    if (o_.balance) weight = weight * kvpop::balance_weights(y, hd, K, o_.c_min, o_.c_max);
    layer_loss = kvpop::boundary_loss(rn, rb, y, weight, o_.tau);
    // The student keeps t_new iff its effective score is not below t_bnd's
    // (ties rank the later token first).
    torch::Tensor keeps = (rn - rb).detach() >= 0;
    agree = (keeps == (y > 0)).to(torch::kFloat64).mean().item<double>();
    n_pairs = y.size(0);
  }
  loss.push_back(layer_loss);
  agreement.push_back(agree);
  recall_heads.push_back(last_query_recall(student, teacher, c));
  double mean = 0;
  for (double x : recall_heads.back()) mean += x / double(recall_heads.back().size());
  recall.push_back(mean);
  pairs.push_back(n_pairs);
  return sa.out.permute({1, 0, 2});
}

void StreamingTrainBackend::begin_step(int64_t pos0, int64_t) {
  KVSCOPE_CHECK(pos0 == 0, "StreamingTrainBackend: one step over the whole window at position 0");
}

// The sparse attention of eq. 26 with no long-range token kept (every cutoff
// below every rank) and a protected window of W + 1: exactly sinks + window.
torch::Tensor StreamingTrainBackend::attend(const model::AttentionInputs& in) {
  if (in.sliding_window > 0)
    throw std::invalid_argument(
        "StreamingLLM+ training: models with their own sliding window are not supported");
  const int64_t S = in.q.size(0), K = in.k.size(1);
  std::vector<int32_t> identity(size_t(S), 0);
  for (int64_t t = 0; t < S; ++t) identity[size_t(t)] = int32_t(t);
  const std::vector<std::vector<int32_t>> ranks(size_t(K), identity);
  const std::vector<std::vector<int32_t>> cutoffs(
      size_t(K), std::vector<int32_t>(size_t(S), kvpop::kNoneKept));
  kvpop::SparseAttention sa = kvpop::sparse_attention(
      in.q.permute({1, 0, 2}), in.k.permute({1, 0, 2}), in.v.permute({1, 0, 2}), ranks, cutoffs,
      sinks_, window_ + 1, in.scale);
  return sa.out.permute({1, 0, 2});
}

torch::Tensor KvpopTrainBackend::mean_loss() const {
  KVSCOPE_CHECK(!loss.empty(), "KvpopTrainBackend: no layer attended");
  return torch::stack(loss).mean();
}

}  // namespace kvscope::gates
