// KVzip and KVzip+ scores of a read-back as training targets (kvzip_targets.h).
#include "capture/train/kvzip_targets.h"

#include <limits>

#include "capture/policy/policies/output_projection.h"
#include "capture/tokenizer/tokenizer.h"
#include "capture/train/train_options.h"
#include "core/common/check.h"
#include "core/common/input_error.h"

namespace kvscope::gates {

// The read-back runs where the model is (the dense cache in float32 on the
// host, where the shared kernels want it; in the model's dtype on a GPU); the
// targets and the inputs they pair with come back to the host, where the
// fits and KVzip's selection read them.
KvzipTargets::KvzipTargets(const model::ModelConfig& c, const model::ModelWeights& w,
                           int64_t window, int64_t repeat, bool plus)
    : dense_(c, 2 * window + repeat, w.embed.device(),
             generate::DenseKvCache::readback_dtype(w.embed.device(), w.embed.scalar_type())),
      T_(window),
      P_(repeat),
      plus_(plus) {
  if (plus_)
    wo_ = policy::per_head_output_projections(&w, c.n_heads, c.head_dim, "kvzap", w.embed.device());
  for (int64_t l = 0; l < c.n_layers; ++l) {
    xtx.push_back(torch::zeros({c.hidden_size + 1, c.hidden_size + 1}, torch::kFloat64));
    xty.push_back(torch::zeros({c.hidden_size + 1, c.n_kv_heads}, torch::kFloat64));
  }
}

torch::Tensor KvzipTargets::attend(const model::AttentionInputs& in) {
  const int64_t N = 2 * T_ + P_;
  KVSCOPE_CHECK(in.pos0 == 0 && in.q.size(0) == N,
                "KvzipTargets: one step feeds the whole window + repeat + window");
  torch::Tensor x = in.hidden.to(torch::kFloat32).narrow(0, 0, T_).cpu();  // [T, D]
  torch::Tensor y = targets(in).cpu();                                     // [T, K]
  torch::Tensor x1 = torch::cat({x, torch::ones({T_, 1})}, 1).to(torch::kFloat64);
  const size_t l = size_t(in.layer);
  xtx[l] += x1.t().mm(x1);
  xty[l] += x1.t().mm(y.to(torch::kFloat64));
  if (keep_samples) {
    xs.push_back(x.clone());
    ys.push_back(y);
  }
  return dense_.attend(in);
}

torch::Tensor step_probabilities(const model::AttentionInputs& in, int64_t q0, int64_t nq) {
  const int64_t N = in.q.size(0), H = in.q.size(1), K = in.k.size(1), R = H / K;
  torch::Tensor q = in.q.to(torch::kFloat32).narrow(0, q0, nq).permute({1, 0, 2});  // [H,nq,hd]
  torch::Tensor k =
      in.k.to(torch::kFloat32).repeat_interleave(R, 1).permute({1, 2, 0});  // [H,hd,N]
  torch::Tensor logits = q.bmm(k) * in.scale;                               // [H,nq,N]
  // Query i (at q0 + i) sees keys j <= q0 + i, within the model's window.
  const auto idx = torch::TensorOptions().dtype(torch::kInt64).device(in.q.device());
  torch::Tensor qpos = torch::arange(q0, q0 + nq, idx).unsqueeze(1),
                kpos = torch::arange(N, idx).unsqueeze(0);
  torch::Tensor hidden = kpos > qpos;
  if (in.sliding_window > 0) hidden = hidden | (kpos <= qpos - in.sliding_window);
  logits.masked_fill_(hidden.unsqueeze(0), -std::numeric_limits<float>::infinity());
  return torch::softmax(logits, -1);
}

torch::Tensor KvzipTargets::targets(const model::AttentionInputs& in) const {
  const int64_t K = in.k.size(1), R = in.q.size(1) / K;
  torch::Tensor p = step_probabilities(in, T_ + P_, T_).narrow(2, 0, T_);  // [H, T q, T keys]
  if (!plus_) return p.amax(1).view({K, R, T_}).amax(1).t().contiguous();
  torch::Tensor h_norm = in.hidden.to(torch::kFloat32).narrow(0, T_ + P_, T_).norm(2, -1);
  torch::Tensor peak = (p / h_norm.view({1, T_, 1})).amax(1);  // [H, T keys]
  torch::Tensor v = in.v.to(torch::kFloat32).narrow(0, 0, T_).repeat_interleave(R, 1);
  torch::Tensor wov = v.permute({1, 0, 2}).bmm(wo_[size_t(in.layer)]).norm(2, -1);  // [H, T]
  torch::Tensor s = (peak * wov).view({K, R, T_}).amax(1);                          // [K, T]
  return s.log().t().contiguous();
}

int64_t kvzip_window_start(int64_t w, int64_t window, int64_t begin, int64_t end) {
  const int64_t span = end - begin - window;
  return begin + (span <= 0 ? 0 : (w * window) % (span + 1));
}

torch::Tensor kvzip_read_back(const std::vector<int32_t>& ids, int64_t start, int64_t window,
                              const std::vector<int32_t>& repeat) {
  std::vector<int64_t> out(ids.begin() + start, ids.begin() + start + window);
  out.insert(out.end(), repeat.begin(), repeat.end());
  out.insert(out.end(), ids.begin() + start, ids.begin() + start + window);
  return torch::tensor(out, torch::kInt64);
}

ReadBackSource open_read_back(const TrainOptions& o, const std::string& policy) {
  ReadBackSource s{generate::open_engine(o.model), {}, {}};
  if (!s.engine.tokenizer)
    throw InputError("--tokenizer", "",
                     policy + " needs the model's tokenizer for its repeat prompt");
  DataOptions d = o.data;
  d.window = o.seq_len;
  d.seed = o.seed;
  s.data = load_training_data(s.engine, d);
  s.repeat = s.engine.tokenizer->encode(kKvzipRepeatPrompt, false);
  return s;
}

void feed_read_backs(ReadBackSource& s, KvzipTargets& rec, int64_t window, int64_t windows,
                     bool held_out) {
  torch::NoGradGuard no_grad;
  const int64_t begin = held_out ? s.data.train_end : 0;
  const int64_t end = held_out ? int64_t(s.data.ids.size()) : s.data.train_end;
  for (int64_t w = 0; w < windows; ++w) {
    rec.reset();
    s.engine.model->forward(
        kvzip_read_back(s.data.ids, kvzip_window_start(w, window, begin, end), window, s.repeat), 0,
        rec, false);
  }
}

void stack_samples(const KvzipTargets& rec, int64_t layers, std::vector<torch::Tensor>* x,
                   std::vector<torch::Tensor>* y) {
  const int64_t windows = int64_t(rec.xs.size()) / layers;
  x->clear();
  y->clear();
  for (int64_t l = 0; l < layers; ++l) {
    std::vector<torch::Tensor> xl, yl;
    for (int64_t w = 0; w < windows; ++w) {
      xl.push_back(rec.xs[size_t(w * layers + l)]);
      yl.push_back(rec.ys[size_t(w * layers + l)]);
    }
    x->push_back(torch::cat(xl));
    y->push_back(torch::cat(yl));
  }
}

}  // namespace kvscope::gates
