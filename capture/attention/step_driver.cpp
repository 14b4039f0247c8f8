#include "capture/attention/step_driver.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include "capture/attention/blocked_attention.h"
#include "capture/attention/device_attention.h"
#include "core/common/check.h"
#include "kernels/row_convert.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace kvscope::policy {

using cache::LayerStats;
using cache::StatsNeeds;

namespace {

// Adds the wall time of a scope to a counter (policy hooks).
struct ScopedTimer {
  double& total;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  ~ScopedTimer() {
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

// The shared statistics (LayerStats) of one kv head of a step, gathered from
// the attention weights block by block (p [R, b, mk]: queries i0.., keys k0..).
class HeadStatsSink {
 public:
  HeadStatsSink(const StatsNeeds& needs, LayerStats& st, int64_t h, int64_t R, int64_t n,
                int64_t pos0, int64_t prompt_tokens, const std::vector<int64_t>& key_pos,
                const std::vector<std::pair<int64_t, int64_t>>* softmax_keys = nullptr,
                const std::vector<float>* row_scale = nullptr)
      : needs_(needs),
        st_(st),
        h_(h),
        R_(R),
        n_(n),
        pos0_(pos0),
        prompt_tokens_(prompt_tokens),
        key_pos_(key_pos),
        row_scale_(row_scale) {
    if (needs.received) mass_.assign(key_pos.size(), 0.0f);
    if (needs.received_per_query_head) head_mass_.assign(size_t(R) * key_pos.size(), 0.0f);
    if (needs.peak) {
      for (int64_t g = 0; g < (needs.peak_per_query_head ? R : 1); ++g)
        for (int64_t pos : key_pos) st.peak[size_t(peak_row(g))][size_t(pos)] = 0.0f;
      if (softmax_keys && !softmax_keys->empty()) {
        in_subset_.resize(key_pos.size());
        for (size_t j = 0; j < key_pos.size(); ++j) {
          bool in = key_pos[j] >= pos0;  // the step's own tokens
          for (const auto& range : *softmax_keys)
            in = in || (key_pos[j] >= range.first && key_pos[j] < range.second);
          in_subset_[j] = in ? 1 : 0;
        }
      }
    }
    if (needs.last_query)  // keys outside the block holding the last query weigh 0
      for (int64_t pos : key_pos) st.last_query[size_t(h)][size_t(pos)] = 0.0f;
  }

  void block(const float* p, int64_t b, int64_t mk, int64_t i0, int64_t k0) {
    const int64_t* kp = key_pos_.data() + k0;
    if (needs_.received) kernels::sum_rows_add(p, R_ * b, mk, mass_.data() + k0);
    if (needs_.received_per_query_head)  // rows r * b .. r * b + b - 1 are query head r's
      for (int64_t r = 0; r < R_; ++r)
        kernels::sum_rows_add(p + r * b * mk, b, mk,
                              head_mass_.data() + size_t(r) * key_pos_.size() + size_t(k0));
    if (needs_.peak) peak_block(p, b, mk, i0, k0);
    if (needs_.last_query && i0 <= n_ - 1 && n_ - 1 < i0 + b) {
      std::vector<float>& lq = st_.last_query[size_t(h_)];
      for (int64_t j = 0; j < mk; ++j) lq[size_t(kp[j])] = group_mean(p, b, mk, n_ - 1 - i0, j);
    }
    if (needs_.observation_window > 0) {
      std::vector<float>& win = st_.window[size_t(h_)];
      const int64_t w0 = prompt_tokens_ - needs_.observation_window;
      for (int64_t i = 0; i < b; ++i) {
        const int64_t qp = pos0_ + i0 + i;
        if (qp < w0 || qp >= prompt_tokens_) continue;
        if (h_ == 0) ++st_.window_queries;
        for (int64_t j = 0; j < mk; ++j) win[size_t(kp[j])] += group_mean(p, b, mk, i, j);
      }
    }
  }

  // Per key the largest weight of any query of the block and head of the
  // group (or per query head); with a softmax subset each query's row is
  // first divided by its mass on the subset (a block holds every key a query
  // of it sees), and by the query's row scale when given.
  void peak_block(const float* p, int64_t b, int64_t mk, int64_t i0, int64_t k0) {
    const int64_t* kp = key_pos_.data() + k0;
    for (int64_t row = 0; row < R_ * b; ++row) {
      std::vector<float>& peak = st_.peak[size_t(peak_row(row / b))];
      const float* w = p + row * mk;
      float scale = row_scale_ ? (*row_scale_)[size_t(i0 + row % b)] : 1.0f;
      if (!in_subset_.empty()) {
        double z = 0;
        for (int64_t j = 0; j < mk; ++j)
          if (in_subset_[size_t(k0 + j)]) z += w[j];
        scale = z > 0 ? float(scale / z) : 0.0f;
      }
      for (int64_t j = 0; j < mk; ++j) {
        float& x = peak[size_t(kp[j])];
        x = std::max(x, w[j] * scale);
      }
    }
  }

  // Received mass: the mean over the step's queries and the group's heads
  // (and per query head, the mean over the step's queries).
  void finish() {
    if (needs_.received) {
      std::vector<float>& rec = st_.received[size_t(h_)];
      const float norm = 1.0f / float(R_ * n_);
      for (size_t j = 0; j < key_pos_.size(); ++j) rec[size_t(key_pos_[j])] = mass_[j] * norm;
    }
    if (needs_.received_per_query_head)
      for (int64_t r = 0; r < R_; ++r) {
        std::vector<float>& rec = st_.received_by_query_head[size_t(h_ * R_ + r)];
        const float* mass = head_mass_.data() + size_t(r) * key_pos_.size();
        for (size_t j = 0; j < key_pos_.size(); ++j) rec[size_t(key_pos_[j])] = mass[j] / float(n_);
      }
  }

 private:
  // The peak row of query head r of the group: per kv head, or per query head.
  int64_t peak_row(int64_t r) const { return needs_.peak_per_query_head ? h_ * R_ + r : h_; }

  // Weight of key j for query i of the block, averaged over the group's heads.
  float group_mean(const float* p, int64_t b, int64_t mk, int64_t i, int64_t j) const {
    float s = 0;
    for (int64_t r = 0; r < R_; ++r) s += p[(r * b + i) * mk + j];
    return s / float(R_);
  }

  const StatsNeeds& needs_;
  LayerStats& st_;
  int64_t h_, R_, n_, pos0_, prompt_tokens_;
  const std::vector<int64_t>& key_pos_;
  std::vector<float> mass_;
  std::vector<float> head_mass_;         // [R][m] with received_per_query_head
  std::vector<uint8_t> in_subset_;       // [m]: key j in the renormalisation subset
  const std::vector<float>* row_scale_;  // [n] per query of the step, or null
};

// The step's inputs on the host (policies and the host kernels read them
// through data pointers): the five copies are queued without waiting and the
// device is synchronised once, one wait per layer instead of five.
model::AttentionInputs on_host(model::AttentionInputs in) {
  if (in.k.device().is_cpu()) return in;
  const bool cuda = in.k.device().is_cuda();
  for (torch::Tensor* t : {&in.hidden, &in.q, &in.k_pre_rope, &in.k, &in.v})
    if (t->defined()) *t = t->to(torch::kCPU, /*non_blocking=*/true);
  if (cuda) torch::cuda::synchronize();
  return in;
}

// What a policy is handed: k and v, and of the queries, the layer's input
// and the keys before RoPE only what it declared (StatsNeeds::query, hidden,
// key_pre_rope; KVzip+'s norms read the input too), on the host. The others
// stay undefined on every device: on a GPU they are never copied, and a
// policy that reads one undeclared fails in the CPU tests too.
// The keys and values come as the cache stores them (a float32 model's rows
// rounded to a 16-bit --kv-dtype): a policy scores what a deployed cache
// holds, and what it scores is what the attention reads.
model::AttentionInputs policy_inputs(const model::AttentionInputs& in, const StatsNeeds& needs,
                                     cache::RowFormat kv_format) {
  model::AttentionInputs given = in;
  if (!needs.query) given.q = torch::Tensor();
  if (!needs.reads_hidden()) given.hidden = torch::Tensor();
  if (!needs.key_pre_rope) given.k_pre_rope = torch::Tensor();
  given = on_host(std::move(given));
  const torch::ScalarType stored = kernels::scalar_type_of(cache::row_type(kv_format));
  for (torch::Tensor* t : {&given.k, &given.v})
    if (stored != torch::kFloat32 && t->scalar_type() != stored)
      *t = t->to(stored).to(t->scalar_type());
  return given;
}

}  // namespace

std::vector<cache::TierSpec> StepDriver::tiers_of(const Policy& policy, const Options& options) {
  std::vector<cache::TierSpec> tiers = policy.tiers();
  // Full precision (F32 declares it: stored at --kv-dtype), attended.
  if (options.interventions && options.interventions->keeps_any())
    tiers.push_back({"kept", cache::RowFormat::F32, true});
  return tiers;
}

std::vector<std::string> StepDriver::reason_names_of(const Policy& policy, const Options& options) {
  std::vector<std::string> names = policy.reason_names();
  if (options.interventions && !options.interventions->empty()) {
    names.push_back("kept by intervention");
    names.push_back("dropped by intervention");
  }
  return names;
}

StepDriver::StepDriver(const model::ModelConfig& config, const Options& options, Policy& policy,
                       const std::string& name)
    : options_(options),
      policy_(policy),
      cache_(config, {options.page_rows, options.max_tokens, options.kv_format},
             tiers_of(policy, options)),
      decide_(cache_, name, uint16_t(policy.reason_names().size()), int32_t(policy.gates().size()),
              int32_t(policy.series().size())),
      needs_(policy.stats_needs()),
      L_(config.n_layers),
      K_(config.n_kv_heads),
      H_(config.n_heads),
      R_(config.n_heads / config.n_kv_heads),
      hd_(config.head_dim) {
  if (cache_.n_tiers() < 1 || cache_.n_tiers() > 8)
    throw std::invalid_argument("StepDriver: a policy declares 1..8 tiers");
  if (const Interventions* iv = options.interventions; iv && !iv->empty()) {
    KVSCOPE_CHECK(iv->kv_heads() == K_, "StepDriver: interventions for another model shape");
    const auto reasons = uint16_t(policy.reason_names().size());
    kept_tier_ = iv->keeps_any() ? int(cache_.n_tiers() - 1) : -1;
    decide_.set_interventions(iv, kept_tier_, reasons, uint16_t(reasons + 1));
  }
  stats_.resize(size_t(L_));
  if (needs_.any())
    for (LayerStats& s : stats_) {
      s.resize(K_, options.max_tokens);
      if (needs_.peak)
        s.peak.assign(size_t(needs_.peak_per_query_head ? H_ : K_),
                      std::vector<float>(size_t(options.max_tokens), 0.0f));
      if (needs_.received_per_query_head)
        s.received_by_query_head.assign(size_t(H_),
                                        std::vector<float>(size_t(options.max_tokens), 0.0f));
    }
}

void StepDriver::use_device(torch::Device device, cache::DevicePrefill prefill) {
  prefill_ = prefill;
  if (!device.is_cuda()) {
    if (prefill == cache::DevicePrefill::Blocked) blocked_tiers_ = cache_.whole_key_tiers();
    return;
  }
  if (!cache::device_attention_compiled()) return;
  cache_.mirror_to(device);
  device_tier_ = cache_.device_tier();
  // Several attended tiers or an INT4 one: the kernels read one float32
  // tier, the blocked path any whole-key tiers.
  if (device_tier_ < 0) blocked_tiers_ = cache_.whole_key_tiers();
}

bool StepDriver::set_side_pass(bool on) {
  side_ = on;
  return true;
}

bool StepDriver::set_probe_pass(bool on) {
  KVSCOPE_CHECK(!side_, "StepDriver: a probe inside a side pass");
  probe_ = on;
  return true;
}

void StepDriver::begin_step(int64_t pos0, int64_t n) {
  if (probe_) {  // no step of the sequence: the step count and the policy stay where they are
    KVSCOPE_CHECK(pos0 + n <= options_.max_tokens,
                  "StepDriver: a probe beyond max_tokens " + std::to_string(options_.max_tokens));
    probe_pos0_ = pos0;
    return;
  }
  KVSCOPE_CHECK(pos0 + n <= options_.max_tokens,
                "StepDriver: position " + std::to_string(pos0 + n) + " beyond max_tokens " +
                    std::to_string(options_.max_tokens));
  ++step_;
  pos0_ = pos0;
  n_ = n;
  if (side_) {
    ++side_index_;
    KVSCOPE_CHECK(
        side_index_ < int64_t(plan_.size()) && n == int64_t(plan_[size_t(side_index_)].ids.size()),
        "StepDriver: a side step that is no chunk of the policy's reconstruction pass");
  }
  decide_.begin_step(step_, pos0, n);
  // Statistics describe one step: clear what the last step wrote.
  for (LayerStats& s : stats_) {
    if (step_ == 0) s.window_queries = 0;
    for (auto* rows : {&s.received, &s.last_query, &s.peak})
      for (auto& row : *rows)
        std::fill(row.begin(), row.begin() + std::min<int64_t>(options_.max_tokens, pos0 + n),
                  0.0f);
  }
}

// New entries are written (rejected ones too: the step's queries see them)
// and their admissions recorded.
void StepDriver::write_new_entries(const model::AttentionInputs& in,
                                   const std::vector<Admission>& adm) {
  const int64_t n = in.k.size(0);
  torch::Tensor kn = in.k.to(torch::kFloat32).contiguous(),
                vn = in.v.to(torch::kFloat32).contiguous();
  for (int64_t h = 0; h < K_; ++h)
    for (int64_t i = 0; i < n; ++i) {
      const Admission& d = adm[size_t(h * n + i)];
      const int tier = d.reject ? 0 : d.tier;
      decide_.write(in.layer, h, pos0_ + i, tier, kn.data_ptr<float>() + (i * K_ + h) * hd_,
                    vn.data_ptr<float>() + (i * K_ + h) * hd_);
      if (!d.reject) decide_.admit(in.layer, h, pos0_ + i, tier, d.score, d.reason);
    }
}

// Attention, one kv head at a time, with the statistics asked for, over the
// attended entries as the selection saw them (`key_pos`: it cannot move them).
torch::Tensor StepDriver::attend_heads(const model::AttentionInputs& in,
                                       const torch::Tensor& queries,
                                       const std::vector<std::vector<int64_t>>& key_pos_by_head,
                                       std::vector<torch::Tensor>& masks) {
  const int64_t l = in.layer, n = queries.size(0);
  const bool observe = observer_ && observer_->wants_probs(l);
  // `peak` and the per-query-head mass are for reconstruction steps only
  // (attend_side).
  StatsNeeds needs = needs_;
  needs.peak = needs.received_per_query_head = false;
  const bool want_probs = needs.any() || observe;
  ++host_layers_;
  LayerStats& st = stats_[size_t(l)];
  torch::Tensor out = torch::empty({n, H_, hd_}, torch::kFloat32);
  for (int64_t h = 0; h < K_; ++h) {
    const std::vector<int64_t>& key_pos = key_pos_by_head[size_t(h)];
    torch::Tensor& mask = masks[size_t(h)];
    if (mask.defined()) {  // a query always sees its own key
      for (int64_t i = 0; i < n; ++i) {
        auto it = std::find(key_pos.begin(), key_pos.end(), pos0_ + i);
        if (it != key_pos.end()) mask[i][it - key_pos.begin()] = true;
      }
    }
    const int64_t m = static_cast<int64_t>(key_pos.size());
    HeadStatsSink stats(needs, st, h, R_, n, pos0_, options_.prompt_tokens, key_pos);
    if (observe) observer_->on_attention_begin(l, h, R_, n, m, key_pos.data(), pos0_);
    const kernels::BlockSink sink = [&](const float* p, int64_t b, int64_t mk, int64_t i0,
                                        int64_t k0) {
      stats.block(p, b, mk, i0, k0);
      if (observe) observer_->on_attention_block(p, b, mk, i0, k0);
    };
    torch::Tensor q =
        queries.narrow(1, h * R_, R_).permute({1, 0, 2}).to(torch::kFloat32).contiguous();
    torch::Tensor oh =
        cache_.attend_head(l, h, q, in.pos0, in.scale, in.sliding_window,
                           mask.defined() ? &mask : nullptr, key_pos, want_probs ? &sink : nullptr);
    out.narrow(1, h * R_, R_).copy_(oh.permute({1, 0, 2}));
    stats.finish();
    if (observe) observer_->on_attention_end();
  }
  return out;
}

// Whether the layer's statistics are all this step needs of its weights: no
// selection mask, no observer that wants the weights themselves.
bool StepDriver::statistics_suffice(int64_t layer, const std::vector<torch::Tensor>& masks) const {
  for (const torch::Tensor& m : masks)
    if (m.defined()) return false;
  return !observer_ || !observer_->wants_probs(layer) || !observer_->needs_weights(layer);
}

cache::DeviceStatsWanted StepDriver::wanted_statistics(int64_t l, int64_t n) const {
  const bool observe = observer_ && observer_->wants_probs(l);
  cache::DeviceStatsWanted want;
  want.received = needs_.received || (observe && observer_->wants_mass(l));
  want.last_query = needs_.last_query;
  want.last_query_by_head = observe && observer_->wants_last_query(l);
  if (observe) want.pooled_block = observer_->pooled_block(l);
  if (needs_.observation_window > 0) {
    const int64_t w0 = options_.prompt_tokens - needs_.observation_window;
    want.window_begin = std::clamp<int64_t>(w0 - pos0_, 0, n);
    want.window_end = std::clamp<int64_t>(options_.prompt_tokens - pos0_, 0, n);
  }
  return want;
}

// The same statistics as HeadStatsSink gathers from the weights, from each
// row's received weight, into the layer's stats and the observer.
torch::Tensor StepDriver::take_statistics(int64_t l, int64_t n,
                                          const cache::DeviceStatsWanted& want,
                                          const cache::DeviceLayerAttention& r) {
  const bool observe = observer_ && observer_->wants_probs(l);
  LayerStats& st = stats_[size_t(l)];
  const bool window = want.window_end > want.window_begin;
  const float per_query = 1.0f / float(R_ * n), per_head = 1.0f / float(R_);
  for (int64_t h = 0; h < K_; ++h) {
    const int64_t b = r.row_begin[size_t(h)], e = r.row_begin[size_t(h + 1)];
    for (int64_t j = b; j < e; ++j) {
      const size_t pos = size_t(r.key_pos[size_t(j)]);
      if (needs_.received) st.received[size_t(h)][pos] = r.received[size_t(j)] * per_query;
      if (needs_.last_query) st.last_query[size_t(h)][pos] = r.last_query[size_t(j)] * per_head;
      if (window) st.window[size_t(h)][pos] += r.window[size_t(j)] * per_head;
    }
    if (observe) {
      observer_->on_attention_begin(l, h, R_, n, e - b, r.key_pos.data() + b, pos0_);
      if (observer_->wants_mass(l)) observer_->on_attention_mass(r.received.data() + b);
      if (want.last_query_by_head)
        observer_->on_attention_last_query(r.last_query_by_head.data() + R_ * b);
      if (want.pooled_block > 0) {
        const size_t head = size_t(h * R_ * r.q_blocks * r.n_blocks);
        observer_->on_attention_pooled(r.pooled_sum.data() + head, r.pooled_max.data() + head,
                                       r.q_blocks, r.n_blocks);
      }
      observer_->on_attention_end();
    }
  }
  if (window) st.window_queries += want.window_end - want.window_begin;
  return r.out;
}

// The layer on the device kernels.
torch::Tensor StepDriver::attend_on_device(const model::AttentionInputs& in) {
  const int64_t l = in.layer, n = in.q.size(0);
  const cache::DeviceStatsWanted want = wanted_statistics(l, n);
  const cache::DeviceLayerAttention r = cache::attend_layer_on_device(
      cache_, l, device_tier_, in.q, pos0_, in.scale, in.sliding_window, want, prefill_);
  ++device_layers_;
  return take_statistics(l, n, want, r);
}

// The layer by query blocks of matrix products (attention/blocked_attention.h)
// over the pages of blocked_tiers_: on a GPU their mirrors (layers the
// kernels cannot read: several tiers, INT4), on the CPU the host pages
// (--device-prefill blocked, prefill chunks).
torch::Tensor StepDriver::attend_blocked(const model::AttentionInputs& in) {
  const int64_t l = in.layer, n = in.q.size(0);
  const bool on_device = !in.q.device().is_cpu();
  std::vector<torch::Tensor> pages;
  for (int t : blocked_tiers_) {
    cache::KvPool& pool = cache_.pool(t);
    if (on_device) pool.sync_mirror();
    pages.push_back(on_device ? pool.mirror_pages() : pool.host_pages());
  }
  const cache::DeviceStatsWanted want = wanted_statistics(l, n);
  const cache::DeviceLayerAttention r = cache::attend_layer_blocked(
      cache_, l, blocked_tiers_, pages, in.q, pos0_, in.scale, in.sliding_window, want);
  ++blocked_layers_;
  return take_statistics(l, n, want, r);
}

// A reconstruction step's layer: its tokens are written for its own queries
// only (no admission, no selection, no events), attended with the statistics
// the policy asked for (the observer does not see them: they are no sequence
// tokens), removed again, and then the policy's after_attention scores.
torch::Tensor StepDriver::attend_side(const model::AttentionInputs& in) {
  const int64_t l = in.layer, n = in.q.size(0);
  const ReconstructionChunk& chunk = plan_[size_t(side_index_)];
  torch::Tensor kn = in.k.to(torch::kFloat32).contiguous(),
                vn = in.v.to(torch::kFloat32).contiguous();
  for (int64_t h = 0; h < K_; ++h)
    for (int64_t i = 0; i < n; ++i)
      decide_.write(l, h, pos0_ + i, 0, kn.data_ptr<float>() + (i * K_ + h) * hd_,
                    vn.data_ptr<float>() + (i * K_ + h) * hd_);
  LayerStats& st = stats_[size_t(l)];
  torch::Tensor out = torch::empty({n, H_, hd_}, torch::kFloat32);
  std::vector<int64_t> key_pos;
  std::vector<float> over_norm;  // KVzip+: 1 / ||h_i|| per query
  if (needs_.peak_over_hidden_norm) {
    const torch::Tensor inv = in.hidden.to(torch::kFloat32).norm(2, -1).reciprocal().contiguous();
    over_norm.assign(inv.data_ptr<float>(), inv.data_ptr<float>() + n);
  }
  for (int64_t h = 0; h < K_; ++h) {
    cache_.attended_positions(l, h, &key_pos);
    HeadStatsSink stats(needs_, st, h, R_, n, pos0_, options_.prompt_tokens, key_pos,
                        &chunk.softmax_keys, over_norm.empty() ? nullptr : &over_norm);
    const kernels::BlockSink sink = [&](const float* p, int64_t b, int64_t mk, int64_t i0,
                                        int64_t k0) { stats.block(p, b, mk, i0, k0); };
    torch::Tensor q =
        in.q.narrow(1, h * R_, R_).permute({1, 0, 2}).to(torch::kFloat32).contiguous();
    torch::Tensor oh = cache_.attend_head(l, h, q, in.pos0, in.scale, in.sliding_window, nullptr,
                                          key_pos, needs_.any() ? &sink : nullptr);
    out.narrow(1, h * R_, R_).copy_(oh.permute({1, 0, 2}));
    stats.finish();
  }
  for (int64_t h = 0; h < K_; ++h)
    for (int64_t i = n - 1; i >= 0; --i) cache_.remove(l, h, pos0_ + i);
  LayerContext lc{l, step_, pos0_, n, false, true, in, cache_, decide_, st, side_index_};
  {
    ScopedTimer t{policy_seconds_};
    policy_.after_attention(lc);
  }
  return out.to(in.q.scalar_type());
}

// A probe step's layer: its tokens are written for its own queries, attended
// on the host over what the cache holds (no statistics, no observer, no
// policy) and removed again.
torch::Tensor StepDriver::attend_probe(const model::AttentionInputs& in) {
  const int64_t l = in.layer, n = in.q.size(0);
  torch::Tensor kn = in.k.to(torch::kFloat32).contiguous(),
                vn = in.v.to(torch::kFloat32).contiguous();
  for (int64_t h = 0; h < K_; ++h)
    for (int64_t i = 0; i < n; ++i)
      cache_.append(l, h, 0, probe_pos0_ + i, kn.data_ptr<float>() + (i * K_ + h) * hd_,
                    vn.data_ptr<float>() + (i * K_ + h) * hd_);
  torch::Tensor out = torch::empty({n, H_, hd_}, torch::kFloat32);
  std::vector<int64_t> key_pos;
  for (int64_t h = 0; h < K_; ++h) {
    cache_.attended_positions(l, h, &key_pos);
    torch::Tensor q =
        in.q.narrow(1, h * R_, R_).permute({1, 0, 2}).to(torch::kFloat32).contiguous();
    torch::Tensor oh = cache_.attend_head(l, h, q, in.pos0, in.scale, in.sliding_window, nullptr,
                                          key_pos, nullptr);
    out.narrow(1, h * R_, R_).copy_(oh.permute({1, 0, 2}));
  }
  for (int64_t h = 0; h < K_; ++h)
    for (int64_t i = n - 1; i >= 0; --i) cache_.remove(l, h, probe_pos0_ + i);
  return out.to(in.q.scalar_type());
}

// A replay's drops at this layer: after the policy's own decisions, the
// dropped tokens leave the heads their drop names.
void StepDriver::apply_drops(const LayerContext& c) {
  const Interventions* iv = options_.interventions;
  if (!iv) return;
  for (int64_t h = 0; h < K_; ++h) {
    if (!iv->drops_at(c.step, c.layer, h)) continue;
    for (size_t i = 0; i < iv->list().size(); ++i) {
      const Intervention& d = iv->list()[i];
      if (d.kind != InterventionKind::Drop || c.step < d.from_step || !d.covers(c.layer, h, K_))
        continue;
      for (int32_t t : d.token_list) {
        if (t >= c.tokens_fed()) break;
        decide_.drop(c.layer, h, t, int(i));
      }
    }
  }
}

torch::Tensor StepDriver::attend(const model::AttentionInputs& in_any) {
  const torch::Device device = in_any.q.device();
  if (probe_) return attend_probe(on_host(in_any)).to(device);
  if (side_) return attend_side(on_host(in_any)).to(device);
  const model::AttentionInputs in = policy_inputs(in_any, needs_, options_.kv_format);
  const int64_t l = in.layer, n = in_any.q.size(0);
  const bool prefill = pos0_ < options_.prompt_tokens;
  const bool prompt_complete = pos0_ + n >= options_.prompt_tokens;

  // 1. Admission, 2. write.
  std::vector<Admission> adm(static_cast<size_t>(K_ * n));
  AdmitContext ac{l, step_, pos0_, n, prefill, in, cache_, decide_, adm};
  {
    ScopedTimer t{policy_seconds_};
    policy_.admit(ac);
  }
  write_new_entries(in, adm);

  // 3. Selection over the attended entries.
  std::vector<std::vector<int64_t>> candidates(static_cast<size_t>(K_));
  std::vector<torch::Tensor> masks(static_cast<size_t>(K_));
  for (int64_t h = 0; h < K_; ++h) cache_.attended_positions(l, h, &candidates[size_t(h)]);
  SelectContext sc{l, step_, pos0_, n, prefill, in, cache_, decide_, candidates, masks};
  decide_.lock_storage(true);
  {
    ScopedTimer t{policy_seconds_};
    policy_.select(sc);
  }
  decide_.lock_storage(false);
  for (int64_t h = 0; h < K_; ++h) {
    const torch::Tensor& mask = masks[size_t(h)];
    if (mask.defined() && (mask.dim() != 2 || mask.size(0) != n ||
                           mask.size(1) != int64_t(candidates[size_t(h)].size()) ||
                           mask.scalar_type() != torch::kBool))
      decide_.fail("select", l, h, pos0_,
                   "a selection mask must be bool [" + std::to_string(n) + ", " +
                       std::to_string(candidates[size_t(h)].size()) + "]");
  }

  // 4. Attention: the device kernels and the blocked path read the model's
  // own tensors (on the CPU those are the host's), the host kernels the
  // queries on the host (copied here when the policy did not ask for them).
  torch::Tensor out;
  const bool suffice = statistics_suffice(l, masks);
  if (device.is_cuda() && device_tier_ >= 0 && suffice)
    out = attend_on_device(in_any);
  else if (!blocked_tiers_.empty() && (device.is_cuda() || n > 1) && suffice)
    out = attend_blocked(in_any);
  else
    out = attend_heads(in, in.q.defined() ? in.q : in_any.q.to(torch::kCPU), candidates, masks);

  // 5. Rejected entries leave once the step's queries have read them.
  for (int64_t h = 0; h < K_; ++h)
    for (int64_t i = 0; i < n; ++i) {
      const Admission& d = adm[size_t(h * n + i)];
      if (d.reject) decide_.reject(l, h, pos0_ + i, d.score, d.reason);
    }

  // 6. Eviction and placement.
  LayerContext lc{
      l, step_, pos0_, n, prefill, prompt_complete, in, cache_, decide_, stats_[size_t(l)]};
  {
    ScopedTimer t{policy_seconds_};
    policy_.after_attention(lc);
  }
  apply_drops(lc);
  check_limits(lc);
  return out.to(device, in_any.q.scalar_type());
}

void StepDriver::check_limits(const LayerContext& c) const {
  const HeldLimit limit = policy_.held_limit(c);
  if (limit.per_head < 0 && limit.per_layer < 0) return;
  int64_t layer_total = 0;
  for (int64_t h = 0; h < K_; ++h) {
    // What interventions keep is not the policy's to count.
    const int64_t held = cache_.attended_count(c.layer, h) -
                         (kept_tier_ >= 0 ? cache_.count(c.layer, h, kept_tier_) : 0);
    layer_total += held;
    if (limit.per_head >= 0 && held > limit.per_head)
      decide_.fail("evict", c.layer, h, c.pos0 + c.n - 1,
                   "the head holds " + std::to_string(held) +
                       " entries after eviction, over its budget of " +
                       std::to_string(limit.per_head));
  }
  if (limit.per_layer >= 0 && layer_total > limit.per_layer)
    decide_.fail("evict", c.layer, -1, c.pos0 + c.n - 1,
                 "the layer holds " + std::to_string(layer_total) +
                     " entries after eviction, over its budget of " +
                     std::to_string(limit.per_layer));
}

void StepDriver::end_step() {
  if (probe_) return;
  StepContext sc{
      step_,  pos0_,   n_,    pos0_ < options_.prompt_tokens, pos0_ + n_ >= options_.prompt_tokens,
      cache_, decide_, stats_};
  if (side_) {
    sc.prefill = false;
    sc.prompt_complete = true;
    sc.reconstruction = side_index_;
    sc.reconstruction_chunks = int64_t(plan_.size());
  }
  {
    ScopedTimer t{policy_seconds_};
    policy_.end_step(sc);
  }
  cache_.compact();
}

}  // namespace kvscope::policy
