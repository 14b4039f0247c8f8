#include "capture/cache/ragged_cache.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "capture/policy/policy.h"
#include "kernels/attention.h"
#include "kernels/quant_int4.h"

namespace kvscope::cache {

namespace {
// Adds the wall time of a scope to a counter (policy hooks).
struct ScopedTimer {
  double& total;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  ~ScopedTimer() {
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};
}  // namespace

RaggedKvCache::RaggedKvCache(const model::ModelConfig& config, const Options& options,
                             policy::Policy& policy)
    : L_(config.n_layers),
      H_(config.n_heads),
      K_(config.n_kv_heads),
      R_(config.n_heads / config.n_kv_heads),
      hd_(config.head_dim),
      M_(options.max_tokens),
      page_rows_(options.page_rows),
      prompt_tokens_(options.prompt_tokens),
      policy_(policy),
      tiers_(policy.tiers()) {
  if (M_ <= 0) throw std::invalid_argument("RaggedKvCache: max_tokens must be positive");
  if (tiers_.empty() || tiers_.size() > 8) throw std::invalid_argument("RaggedKvCache: 1..8 tiers");
  for (const TierSpec& t : tiers_)
    pools_.push_back(std::make_unique<KvPool>(hd_, page_rows_, t.format));
  heads_.resize(size_t(L_ * K_));
  for (HeadState& h : heads_) {
    h.tiers.resize(tiers_.size());
    h.slot_of.assign(size_t(M_), -1);
    h.tier_of.assign(size_t(M_), -1);
  }
  stats_.resize(size_t(L_));
  StatsNeeds needs = policy_.stats_needs();
  if (needs.any())
    for (LayerStats& s : stats_) s.resize(K_, M_);
}

RaggedKvCache::~RaggedKvCache() = default;

// ---- entries ----------------------------------------------------------------

void RaggedKvCache::append(int64_t layer, int64_t kv_head, int tier, int64_t pos, const float* k,
                           const float* v) {
  HeadState& hs = head(layer, kv_head);
  HeadTier& ht = hs.tiers[size_t(tier)];
  int64_t slot = static_cast<int64_t>(ht.positions.size());
  if (slot % page_rows_ == 0)
    ht.pages.push_back(pools_[size_t(tier)]->allocate(owner_tag(layer, kv_head, tier)));
  pools_[size_t(tier)]->write_row(ht.pages[size_t(slot / page_rows_)], slot % page_rows_, k, v);
  ht.positions.push_back(static_cast<int32_t>(pos));
  hs.slot_of[size_t(pos)] = static_cast<int32_t>(slot);
  hs.tier_of[size_t(pos)] = static_cast<int8_t>(tier);
}

// Removes `pos`; the tier's last entry moves into its slot so pages stay full.
void RaggedKvCache::remove(int64_t layer, int64_t kv_head, int64_t pos) {
  HeadState& hs = head(layer, kv_head);
  int tier = hs.tier_of[size_t(pos)];
  if (tier < 0) throw std::logic_error("RaggedKvCache: removing an entry that is not held");
  HeadTier& ht = hs.tiers[size_t(tier)];
  KvPool& pool = *pools_[size_t(tier)];
  int64_t slot = hs.slot_of[size_t(pos)];
  int64_t last = static_cast<int64_t>(ht.positions.size()) - 1;
  if (slot != last) {
    pool.copy_row(ht.pages[size_t(last / page_rows_)], last % page_rows_,
                  ht.pages[size_t(slot / page_rows_)], slot % page_rows_);
    int32_t moved = ht.positions[size_t(last)];
    ht.positions[size_t(slot)] = moved;
    hs.slot_of[size_t(moved)] = static_cast<int32_t>(slot);
  }
  ht.positions.pop_back();
  hs.slot_of[size_t(pos)] = -1;
  hs.tier_of[size_t(pos)] = -1;
  if (static_cast<int64_t>(ht.positions.size()) % page_rows_ == 0) {
    pool.release(ht.pages.back());  // the page that held the last slot is empty now
    ht.pages.pop_back();
  }
}

void RaggedKvCache::relocate_page(int64_t owner, int32_t from, int32_t to) {
  int64_t tier = owner % n_tiers();
  HeadState& hs = heads_[size_t(owner / n_tiers())];
  for (int32_t& p : hs.tiers[size_t(tier)].pages)
    if (p == from) {
      p = to;
      return;
    }
}

int64_t RaggedKvCache::count(int64_t layer, int64_t kv_head, int64_t tier) const {
  return static_cast<int64_t>(head(layer, kv_head).tiers[size_t(tier)].positions.size());
}

int64_t RaggedKvCache::count(int64_t layer, int64_t kv_head) const {
  int64_t n = 0;
  for (const HeadTier& t : head(layer, kv_head).tiers)
    n += static_cast<int64_t>(t.positions.size());
  return n;
}

const std::vector<int32_t>& RaggedKvCache::positions(int64_t layer, int64_t kv_head,
                                                     int64_t tier) const {
  return head(layer, kv_head).tiers[size_t(tier)].positions;
}

int RaggedKvCache::tier_of(int64_t layer, int64_t kv_head, int64_t pos) const {
  if (pos < 0 || pos >= M_) return -1;
  return head(layer, kv_head).tier_of[size_t(pos)];
}

void RaggedKvCache::read_entry(int64_t layer, int64_t kv_head, int64_t pos, float* key,
                               float* value) const {
  const HeadState& hs = head(layer, kv_head);
  int tier = tier_of(layer, kv_head, pos);
  if (tier < 0) throw std::logic_error("RaggedKvCache: reading an entry that is not held");
  int64_t slot = hs.slot_of[size_t(pos)];
  pools_[size_t(tier)]->read_row(hs.tiers[size_t(tier)].pages[size_t(slot / page_rows_)],
                                 slot % page_rows_, key, value);
}

// ---- decisions ----------------------------------------------------------------

void RaggedKvCache::event(int64_t layer, int64_t kv_head, int64_t pos, trace::EventKind kind,
                          float score, uint16_t reason, uint8_t from, uint8_t to) {
  events_.push_back(trace::Event{static_cast<int32_t>(step_), static_cast<int16_t>(layer),
                                 static_cast<int16_t>(kv_head), static_cast<int32_t>(pos), kind,
                                 score, reason, from, to});
}

void RaggedKvCache::evict(int64_t layer, int64_t kv_head, int64_t pos, float score,
                          uint16_t reason) {
  int tier = tier_of(layer, kv_head, pos);
  if (tier < 0) throw std::logic_error("RaggedKvCache: evicting an entry that is not held");
  remove(layer, kv_head, pos);
  event(layer, kv_head, pos, trace::EventKind::Evict, score, reason, uint8_t(tier), trace::kNoTier);
}

void RaggedKvCache::move(int64_t layer, int64_t kv_head, int64_t pos, int to_tier, float score,
                         uint16_t reason) {
  int from = tier_of(layer, kv_head, pos);
  if (from < 0) throw std::logic_error("RaggedKvCache: moving an entry that is not held");
  if (from == to_tier) return;
  std::vector<float> k(static_cast<size_t>(hd_)), v(static_cast<size_t>(hd_));
  read_entry(layer, kv_head, pos, k.data(), v.data());
  remove(layer, kv_head, pos);
  append(layer, kv_head, to_tier, pos, k.data(), v.data());
  // Lower tier index = hotter.
  event(layer, kv_head, pos, to_tier > from ? trace::EventKind::Demote : trace::EventKind::Promote,
        score, reason, uint8_t(from), uint8_t(to_tier));
}

void RaggedKvCache::record_select(int64_t layer, int64_t kv_head, int64_t pos, float score,
                                  uint16_t reason) {
  int tier = tier_of(layer, kv_head, pos);
  event(layer, kv_head, pos, trace::EventKind::Select, score, reason,
        tier < 0 ? trace::kNoTier : uint8_t(tier), tier < 0 ? trace::kNoTier : uint8_t(tier));
}

void RaggedKvCache::record_gate(int32_t gate, int64_t layer, int64_t kv_head, int64_t pos,
                                float value, bool sample) {
  gates_.push_back(trace::GateValue{gate, static_cast<int16_t>(layer),
                                    static_cast<int16_t>(kv_head), static_cast<int32_t>(pos), value,
                                    sample});
}

// ---- the step -------------------------------------------------------------------

void RaggedKvCache::begin_step(int64_t pos0, int64_t n) {
  if (pos0 + n > M_)
    throw std::logic_error("RaggedKvCache: position " + std::to_string(pos0 + n) +
                           " beyond max_tokens " + std::to_string(M_));
  ++step_;
  pos0_ = pos0;
  n_ = n;
  // Statistics describe one step: clear what the last step wrote.
  for (LayerStats& s : stats_) {
    if (step_ == 0) s.window_queries = 0;
    for (auto* rows : {&s.received, &s.last_query})
      for (auto& row : *rows)
        std::fill(row.begin(), row.begin() + std::min<int64_t>(M_, pos0 + n), 0.0f);
  }
}

namespace {

// The shared statistics (LayerStats) of one kv head of a step, gathered from
// the attention weights block by block (p [R, b, mk]: queries i0.., keys k0..).
class HeadStatsSink {
 public:
  HeadStatsSink(const StatsNeeds& needs, LayerStats& st, int64_t h, int64_t R, int64_t n,
                int64_t pos0, int64_t prompt_tokens, const std::vector<int64_t>& key_pos)
      : needs_(needs),
        st_(st),
        h_(h),
        R_(R),
        n_(n),
        pos0_(pos0),
        prompt_tokens_(prompt_tokens),
        key_pos_(key_pos) {
    if (needs.received) mass_.assign(key_pos.size(), 0.0f);
    if (needs.last_query)  // keys outside the block holding the last query weigh 0
      for (int64_t pos : key_pos) st.last_query[size_t(h)][size_t(pos)] = 0.0f;
  }

  void block(const float* p, int64_t b, int64_t mk, int64_t i0, int64_t k0) {
    const int64_t* kp = key_pos_.data() + k0;
    if (needs_.received) kernels::sum_rows_add(p, R_ * b, mk, mass_.data() + k0);
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

  // Received mass: the mean over the step's queries and the group's heads.
  void finish() {
    if (!needs_.received) return;
    std::vector<float>& rec = st_.received[size_t(h_)];
    const float norm = 1.0f / float(R_ * n_);
    for (size_t j = 0; j < key_pos_.size(); ++j) rec[size_t(key_pos_[j])] = mass_[j] * norm;
  }

 private:
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
};

// Rows [0, count) of one tier of one head as decode segments, or copied into
// a scratch buffer when the tier is not float32.
void tier_segments(const KvPool& pool, const std::vector<int32_t>& pages, int64_t count,
                   std::vector<kernels::Segment>* segs, std::vector<float>* scratch) {
  const int64_t P = pool.page_rows(), hd = pool.head_dim();
  if (pool.format() == RowFormat::F32) {
    for (int64_t r = 0; r < count; r += P)
      segs->push_back({pool.row(pages[size_t(r / P)], 0, 0), pool.row(pages[size_t(r / P)], 1, 0),
                       std::min(P, count - r), hd});
    return;
  }
  scratch->resize(size_t(count * hd * 2));
  float* k = scratch->data();
  float* v = k + count * hd;
  for (int64_t r = 0; r < count; ++r)
    pool.read_row(pages[size_t(r / P)], r % P, k + r * hd, v + r * hd);
  segs->push_back({k, v, count, hd});
}

}  // namespace

void FullMatrixObserver::on_attention_begin(int64_t layer, int64_t kv_head, int64_t R, int64_t n,
                                            int64_t m, const int64_t* key_pos, int64_t q_pos0) {
  layer_ = layer, kv_head_ = kv_head, R_ = R, n_ = n, m_ = m, q_pos0_ = q_pos0;
  key_pos_ = key_pos;
  probs_.assign(size_t(R * n * m), 0.0f);
}

void FullMatrixObserver::on_attention_block(const float* p, int64_t b, int64_t mk, int64_t i0,
                                            int64_t k0) {
  for (int64_t r = 0; r < R_; ++r)
    for (int64_t i = 0; i < b; ++i)
      std::copy(p + (r * b + i) * mk, p + (r * b + i + 1) * mk,
                probs_.data() + (r * n_ + i0 + i) * m_ + k0);
}

void FullMatrixObserver::on_attention_end() {
  on_attention(layer_, kv_head_, probs_.data(), R_, n_, m_, key_pos_, q_pos0_);
}

void RaggedKvCache::attended_positions(int64_t layer, int64_t kv_head,
                                       std::vector<int64_t>* key_pos) const {
  const HeadState& hs = head(layer, kv_head);
  key_pos->clear();
  for (size_t t = 0; t < tiers_.size(); ++t)
    if (tiers_[t].attended)
      for (int32_t p : hs.tiers[t].positions) key_pos->push_back(p);
}

torch::Tensor RaggedKvCache::attend_head(const model::AttentionInputs& in, int64_t h,
                                         const torch::Tensor* mask,
                                         const std::vector<int64_t>& key_pos,
                                         const kernels::BlockSink* sink) {
  const int64_t n = in.q.size(0);
  const HeadState& hs = head(in.layer, h);
  const int64_t m = static_cast<int64_t>(key_pos.size());
  torch::Tensor q = in.q.narrow(1, h * R_, R_).permute({1, 0, 2}).to(torch::kFloat32).contiguous();

  if (n == 1 && mask == nullptr) {
    // Decode: read the pages in place.
    std::vector<kernels::Segment> segs;
    std::vector<std::vector<float>> scratch(tiers_.size());
    for (size_t t = 0; t < tiers_.size(); ++t)
      if (tiers_[t].attended)
        tier_segments(*pools_[t], hs.tiers[t].pages, int64_t(hs.tiers[t].positions.size()), &segs,
                      &scratch[t]);
    torch::Tensor out = torch::empty({R_, 1, hd_}, torch::kFloat32);
    std::vector<float> probs(sink ? size_t(R_ * m) : 0);
    kernels::attention_decode_segments(q.data_ptr<float>(), R_, hd_, segs, key_pos.data(), in.pos0,
                                       in.scale, in.sliding_window, out.data_ptr<float>(),
                                       sink ? probs.data() : nullptr);
    if (sink) (*sink)(probs.data(), 1, m, 0, 0);
    return out;
  }
  // Several queries (or a selection mask): gather the entries, one BLAS product.
  torch::Tensor k = torch::empty({m, hd_}, torch::kFloat32),
                v = torch::empty({m, hd_}, torch::kFloat32);
  int64_t row = 0;
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (!tiers_[t].attended) continue;
    const HeadTier& ht = hs.tiers[t];
    for (int64_t slot = 0; slot < int64_t(ht.positions.size()); ++slot, ++row)
      pools_[t]->read_row(ht.pages[size_t(slot / page_rows_)], slot % page_rows_,
                          k.data_ptr<float>() + row * hd_, v.data_ptr<float>() + row * hd_);
  }
  const torch::Tensor pos = torch::tensor(key_pos, torch::kInt64);
  return kernels::attention_multi(q, k, v, pos, in.pos0, in.scale, in.sliding_window, nullptr, mask,
                                  sink);
}

torch::Tensor RaggedKvCache::attend(const model::AttentionInputs& in) {
  const int64_t l = in.layer, n = in.q.size(0);
  const bool prefill = pos0_ < prompt_tokens_;
  const bool prompt_complete = pos0_ + n >= prompt_tokens_;

  // 1. Admission.
  std::vector<policy::Admission> decisions(static_cast<size_t>(K_ * n));
  policy::AdmitContext ac{l, step_, pos0_, n, prefill, in, *this, decisions};
  {
    ScopedTimer t{policy_seconds_};
    policy_.admit(ac);
  }

  // 2. Write the new entries (rejected ones too: the step's queries see them).
  torch::Tensor kn = in.k.to(torch::kFloat32).contiguous(),
                vn = in.v.to(torch::kFloat32).contiguous();
  for (int64_t h = 0; h < K_; ++h)
    for (int64_t i = 0; i < n; ++i) {
      const policy::Admission& d = decisions[size_t(h * n + i)];
      int tier = d.reject ? 0 : d.tier;
      append(l, h, tier, pos0_ + i, kn.data_ptr<float>() + (i * K_ + h) * hd_,
             vn.data_ptr<float>() + (i * K_ + h) * hd_);
      if (!d.reject)
        event(l, h, pos0_ + i, trace::EventKind::Admit, d.score, d.reason, trace::kNoTier,
              uint8_t(tier));
    }

  // 3. Selection.
  std::vector<std::vector<int64_t>> candidates(static_cast<size_t>(K_));
  std::vector<torch::Tensor> masks(static_cast<size_t>(K_));
  for (int64_t h = 0; h < K_; ++h)
    for (size_t t = 0; t < tiers_.size(); ++t)
      if (tiers_[t].attended)
        for (int32_t p : head(l, h).tiers[t].positions) candidates[size_t(h)].push_back(p);
  policy::SelectContext sc{l, step_, pos0_, n, prefill, in, *this, candidates, masks};
  {
    ScopedTimer t{policy_seconds_};
    policy_.select(sc);
  }

  // 4. Attention, one kv head at a time, with the statistics asked for.
  const StatsNeeds needs = policy_.stats_needs();
  const bool observe = observer_ && observer_->wants_probs(l);
  const bool want_probs = needs.any() || observe;
  LayerStats& st = stats_[size_t(l)];
  torch::Tensor out = torch::empty({n, H_, hd_}, torch::kFloat32);
  std::vector<int64_t> key_pos;
  for (int64_t h = 0; h < K_; ++h) {
    torch::Tensor& mask = masks[size_t(h)];
    if (mask.defined()) {  // a query always sees its own key
      for (int64_t i = 0; i < n; ++i) {
        auto it = std::find(candidates[size_t(h)].begin(), candidates[size_t(h)].end(), pos0_ + i);
        if (it != candidates[size_t(h)].end()) mask[i][it - candidates[size_t(h)].begin()] = true;
      }
    }
    attended_positions(l, h, &key_pos);
    const int64_t m = static_cast<int64_t>(key_pos.size());
    HeadStatsSink stats(needs, st, h, R_, n, pos0_, prompt_tokens_, key_pos);
    if (observe) observer_->on_attention_begin(l, h, R_, n, m, key_pos.data(), pos0_);
    const kernels::BlockSink sink = [&](const float* p, int64_t b, int64_t mk, int64_t i0,
                                        int64_t k0) {
      stats.block(p, b, mk, i0, k0);
      if (observe) observer_->on_attention_block(p, b, mk, i0, k0);
    };
    torch::Tensor oh =
        attend_head(in, h, mask.defined() ? &mask : nullptr, key_pos, want_probs ? &sink : nullptr);
    out.narrow(1, h * R_, R_).copy_(oh.permute({1, 0, 2}));
    stats.finish();
    if (observe) observer_->on_attention_end();
  }

  // 5. Rejected entries leave once the step's queries have read them.
  for (int64_t h = 0; h < K_; ++h)
    for (int64_t i = 0; i < n; ++i) {
      const policy::Admission& d = decisions[size_t(h * n + i)];
      if (!d.reject) continue;
      remove(l, h, pos0_ + i);
      event(l, h, pos0_ + i, trace::EventKind::Reject, d.score, d.reason, trace::kNoTier,
            trace::kNoTier);
    }

  // 6. Eviction and placement.
  policy::LayerContext lc{l, step_, pos0_, n, prefill, prompt_complete, in, *this, st};
  {
    ScopedTimer t{policy_seconds_};
    policy_.after_attention(lc);
  }
  return out.to(in.q.scalar_type());
}

void RaggedKvCache::end_step() {
  policy::StepContext sc{step_, pos0_, n_, pos0_ < prompt_tokens_, pos0_ + n_ >= prompt_tokens_,
                         *this};
  {
    ScopedTimer t{policy_seconds_};
    policy_.end_step(sc);
  }
  for (size_t t = 0; t < pools_.size(); ++t)
    pools_[t]->shrink_if_sparse(
        [this](int64_t owner, int32_t from, int32_t to) { relocate_page(owner, from, to); });
}

// ---- what the recorder reads ------------------------------------------------------

std::vector<trace::Event> RaggedKvCache::take_events() {
  return std::exchange(events_, {});
}
std::vector<trace::GateValue> RaggedKvCache::take_gates() {
  return std::exchange(gates_, {});
}

std::vector<int32_t> RaggedKvCache::occupancy() const {
  std::vector<int32_t> occ(size_t(L_ * K_ * n_tiers()));
  for (int64_t l = 0; l < L_; ++l)
    for (int64_t h = 0; h < K_; ++h)
      for (int64_t t = 0; t < n_tiers(); ++t)
        occ[size_t((l * K_ + h) * n_tiers() + t)] = static_cast<int32_t>(count(l, h, t));
  return occ;
}

std::vector<int64_t> RaggedKvCache::tier_bytes() const {
  std::vector<int64_t> b;
  for (const auto& p : pools_) b.push_back(p->bytes_in_use());
  return b;
}

int64_t RaggedKvCache::entries() const {
  int64_t n = 0;
  for (int64_t l = 0; l < L_; ++l)
    for (int64_t h = 0; h < K_; ++h) n += count(l, h);
  return n;
}

int64_t RaggedKvCache::bytes_in_use() const {
  int64_t b = 0;
  for (const auto& p : pools_) b += p->bytes_in_use();
  return b;
}

int64_t RaggedKvCache::bytes_reserved() const {
  int64_t b = 0;
  for (const auto& p : pools_) b += p->bytes_reserved();
  return b;
}

}  // namespace kvscope::cache
