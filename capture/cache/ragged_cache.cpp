#include "capture/cache/ragged_cache.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "core/common/check.h"
#include "kernels/attention.h"
#include "kernels/quant_int4.h"

namespace kvscope::cache {

RaggedKvCache::RaggedKvCache(const model::ModelConfig& config, const Options& options,
                             std::vector<TierSpec> tiers)
    : L_(config.n_layers),
      H_(config.n_heads),
      K_(config.n_kv_heads),
      R_(config.n_heads / config.n_kv_heads),
      hd_(config.head_dim),
      M_(options.max_tokens),
      page_rows_(options.page_rows),
      tiers_(std::move(tiers)) {
  if (M_ <= 0) throw std::invalid_argument("RaggedKvCache: max_tokens must be positive");
  if (tiers_.empty() || tiers_.size() > 8) throw std::invalid_argument("RaggedKvCache: 1..8 tiers");
  if (!is_float_format(options.kv_format))
    throw std::invalid_argument("RaggedKvCache: kv_format must be F32, BF16 or F16");
  int64_t narrow_keys = 0;
  for (TierSpec& t : tiers_) {
    if (t.format == RowFormat::F32) t.format = options.kv_format;
    if (!(t.key_prune_ratio >= 0 && t.key_prune_ratio < 1))
      throw std::invalid_argument("RaggedKvCache: tier '" + t.name +
                                  "': key_prune_ratio must be in [0, 1)");
    const int64_t width = hd_ - static_cast<int64_t>(double(hd_) * t.key_prune_ratio);
    if (width < hd_ && narrow_keys > 0 && width != narrow_keys)
      throw std::invalid_argument("RaggedKvCache: tiers that prune key channels must keep as many");
    if (width < hd_) narrow_keys = width;
    pools_.push_back(std::make_unique<KvPool>(hd_, page_rows_, t.format, 64, width));
  }
  heads_.resize(size_t(L_ * K_));
  for (HeadState& h : heads_) {
    h.tiers.resize(tiers_.size());
    h.slot_of.assign(size_t(M_), -1);
    h.tier_of.assign(size_t(M_), -1);
  }
}

RaggedKvCache::~RaggedKvCache() = default;

// ---- entries ----------------------------------------------------------------

void RaggedKvCache::append(int64_t layer, int64_t kv_head, int tier, int64_t pos, const float* k,
                           const float* v) {
  KVSCOPE_CHECK(pos >= 0 && pos < M_, "RaggedKvCache: position beyond max_tokens");
  KVSCOPE_CHECK(tier >= 0 && tier < n_tiers(), "RaggedKvCache: no such tier");
  HeadState& hs = head(layer, kv_head);
  KVSCOPE_CHECK(hs.tier_of[size_t(pos)] < 0, "RaggedKvCache: appending a position the head holds");
  HeadTier& ht = hs.tiers[size_t(tier)];
  int64_t slot = static_cast<int64_t>(ht.positions.size());
  if (slot % page_rows_ == 0)
    ht.pages.push_back(pools_[size_t(tier)]->allocate(owner_tag(layer, kv_head, tier)));
  write_slot(hs, size_t(tier), ht.pages[size_t(slot / page_rows_)], slot % page_rows_, k, v);
  ht.positions.push_back(static_cast<int32_t>(pos));
  hs.slot_of[size_t(pos)] = static_cast<int32_t>(slot);
  hs.tier_of[size_t(pos)] = static_cast<int8_t>(tier);
}

// Removes `pos`; the tier's last entry moves into its slot so pages stay full.
void RaggedKvCache::remove(int64_t layer, int64_t kv_head, int64_t pos) {
  HeadState& hs = head(layer, kv_head);
  int tier = tier_of(layer, kv_head, pos);
  KVSCOPE_CHECK(tier >= 0, "RaggedKvCache: removing an entry that is not held");
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

int64_t RaggedKvCache::attended_count(int64_t layer, int64_t kv_head) const {
  int64_t n = 0;
  for (size_t t = 0; t < tiers_.size(); ++t)
    if (tiers_[t].attended)
      n += static_cast<int64_t>(head(layer, kv_head).tiers[t].positions.size());
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
  KVSCOPE_CHECK(tier >= 0, "RaggedKvCache: reading an entry that is not held");
  int64_t slot = hs.slot_of[size_t(pos)];
  read_slot(hs, size_t(tier), hs.tiers[size_t(tier)].pages[size_t(slot / page_rows_)],
            slot % page_rows_, key, value);
}

void RaggedKvCache::write_slot(const HeadState& hs, size_t tier, int32_t page, int64_t r,
                               const float* k, const float* v) {
  KvPool& pool = *pools_[tier];
  if (!narrow(tier)) return pool.write_row(page, r, k, v);
  KVSCOPE_CHECK(int64_t(hs.key_channels.size()) == pool.key_dim(),
                "RaggedKvCache: writing to tier '" + tiers_[tier].name +
                    "' before the head's key channels were set");
  thread_local std::vector<float> kept;
  kept.resize(hs.key_channels.size());
  for (size_t i = 0; i < kept.size(); ++i) kept[i] = k[hs.key_channels[i]];
  pool.write_row(page, r, kept.data(), v);
}

void RaggedKvCache::read_slot(const HeadState& hs, size_t tier, int32_t page, int64_t r, float* k,
                              float* v) const {
  const KvPool& pool = *pools_[tier];
  if (!narrow(tier)) return pool.read_row(page, r, k, v);
  thread_local std::vector<float> kept;
  kept.resize(size_t(pool.key_dim()));
  pool.read_row(page, r, kept.data(), v);
  std::fill(k, k + hd_, 0.0f);
  for (size_t i = 0; i < kept.size(); ++i) k[hs.key_channels[i]] = kept[i];
}

// Rows of one tier of one head as decode segments, read in place (float32 or
// 16-bit rows, which the kernel widens); copied into a float32 scratch buffer
// (dequantised, or keys widened back to head_dim) for INT4 or pruned keys.
void RaggedKvCache::tier_segments(const HeadState& hs, size_t tier,
                                  std::vector<kernels::Segment>* segs,
                                  std::vector<float>* scratch) const {
  const KvPool& pool = *pools_[tier];
  const std::vector<int32_t>& pages = hs.tiers[tier].pages;
  const int64_t count = int64_t(hs.tiers[tier].positions.size()), P = page_rows_;
  if (is_float_format(pool.format()) && !narrow(tier)) {
    const kernels::RowType type = row_type(pool.format());
    for (int64_t r = 0; r < count; r += P)
      segs->push_back({pool.row_data(pages[size_t(r / P)], 0, 0),
                       pool.row_data(pages[size_t(r / P)], 1, 0), std::min(P, count - r), hd_,
                       type});
    return;
  }
  scratch->resize(size_t(count * hd_ * 2));
  float* k = scratch->data();
  float* v = k + count * hd_;
  for (int64_t r = 0; r < count; ++r)
    read_slot(hs, tier, pages[size_t(r / P)], r % P, k + r * hd_, v + r * hd_);
  segs->push_back({k, v, count, hd_});
}

void RaggedKvCache::set_key_channels(int64_t layer, int64_t kv_head,
                                     std::vector<int32_t> channels) {
  HeadState& hs = head(layer, kv_head);
  int64_t width = 0;
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (!narrow(t)) continue;
    width = pools_[t]->key_dim();
    KVSCOPE_CHECK(hs.tiers[t].positions.empty(),
                  "RaggedKvCache: key channels changed while tier '" + tiers_[t].name +
                      "' holds entries read through them");
  }
  KVSCOPE_CHECK(width != 0, "RaggedKvCache: no tier prunes key channels");
  KVSCOPE_CHECK(int64_t(channels.size()) == width,
                "RaggedKvCache: " + std::to_string(channels.size()) +
                    " key channels set, the pruned tiers keep " + std::to_string(width));
  for (size_t i = 0; i < channels.size(); ++i)
    KVSCOPE_CHECK(
        channels[i] >= 0 && channels[i] < hd_ && (i == 0 || channels[i] > channels[i - 1]),
        "RaggedKvCache: key channels must ascend within 0..head_dim - 1");
  hs.key_channels = std::move(channels);
}

void RaggedKvCache::rewrite(int64_t layer, int64_t kv_head, int64_t pos, const float* k,
                            const float* v) {
  HeadState& hs = head(layer, kv_head);
  const int tier = tier_of(layer, kv_head, pos);
  KVSCOPE_CHECK(tier >= 0, "RaggedKvCache: rewriting an entry that is not held");
  const int64_t slot = hs.slot_of[size_t(pos)];
  const int32_t page = hs.tiers[size_t(tier)].pages[size_t(slot / page_rows_)];
  std::vector<float> key(static_cast<size_t>(hd_)), value(static_cast<size_t>(hd_));
  read_slot(hs, size_t(tier), page, slot % page_rows_, key.data(), value.data());
  write_slot(hs, size_t(tier), page, slot % page_rows_, k ? k : key.data(), v ? v : value.data());
}

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

torch::Tensor RaggedKvCache::attend_head(int64_t layer, int64_t kv_head, const torch::Tensor& q,
                                         int64_t q_pos0, double scale, int64_t sliding_window,
                                         const torch::Tensor* mask,
                                         const std::vector<int64_t>& key_pos,
                                         const kernels::BlockSink* sink) const {
  const int64_t n = q.size(1);
  const HeadState& hs = head(layer, kv_head);
  const int64_t m = static_cast<int64_t>(key_pos.size());

  if (n == 1 && mask == nullptr) {
    // Decode: read the pages in place.
    std::vector<kernels::Segment> segs;
    std::vector<std::vector<float>> scratch(tiers_.size());
    for (size_t t = 0; t < tiers_.size(); ++t)
      if (tiers_[t].attended) tier_segments(hs, t, &segs, &scratch[t]);
    torch::Tensor out = torch::empty({R_, 1, hd_}, torch::kFloat32);
    std::vector<float> probs(sink ? size_t(R_ * m) : 0);
    kernels::attention_decode_segments(q.data_ptr<float>(), R_, hd_, segs, key_pos.data(), q_pos0,
                                       scale, sliding_window, out.data_ptr<float>(),
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
      read_slot(hs, t, ht.pages[size_t(slot / page_rows_)], slot % page_rows_,
                k.data_ptr<float>() + row * hd_, v.data_ptr<float>() + row * hd_);
  }
  const torch::Tensor pos = torch::tensor(key_pos, torch::kInt64);
  return kernels::attention_multi(q, k, v, pos, q_pos0, scale, sliding_window, nullptr, mask, sink);
}

void RaggedKvCache::compact() {
  for (size_t t = 0; t < pools_.size(); ++t)
    pools_[t]->shrink_if_sparse(
        [this](int64_t owner, int32_t from, int32_t to) { relocate_page(owner, from, to); });
}

void RaggedKvCache::mirror_to(torch::Device device) {
  for (size_t t = 0; t < tiers_.size(); ++t)
    if (tiers_[t].attended && !narrow(t)) pools_[t]->mirror_to(device);
}

std::vector<int> RaggedKvCache::whole_key_tiers() const {
  std::vector<int> tiers;
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (!tiers_[t].attended) continue;
    if (narrow(t)) return {};
    tiers.push_back(int(t));
  }
  return tiers;
}

int RaggedKvCache::whole_row_tier() const {
  int tier = -1;
  for (size_t t = 0; t < tiers_.size(); ++t) {
    if (!tiers_[t].attended) continue;
    if (tier >= 0) return -1;
    tier = static_cast<int>(t);
  }
  if (tier < 0 || !is_float_format(pools_[size_t(tier)]->format()) || narrow(size_t(tier)))
    return -1;
  return tier;
}

int RaggedKvCache::device_tier() const {
  const int tier = whole_row_tier();
  return tier >= 0 && pools_[size_t(tier)]->mirrored() ? tier : -1;
}

// ---- sizes ------------------------------------------------------------------------

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
