#include "capture/recorder/recorder.h"

#include <algorithm>
#include <numeric>

#include "kernels/attention.h"

namespace kvscope::recorder {

Recorder::Recorder(cache::RaggedKvCache& cache, const tokenizer::Tokenizer* tokenizer,
                   const CaptureLevels& levels, std::string prompt_text)
    : cache_(cache),
      tokenizer_(tokenizer),
      levels_(levels),
      prompt_text_(std::move(prompt_text)),
      L_(cache.n_layers()),
      H_(cache.n_heads()),
      K_(cache.n_kv_heads()),
      R_(cache.n_heads() / cache.n_kv_heads()),
      M_(cache.max_tokens()) {
  if (tokenizer_) decoder_ = std::make_unique<tokenizer::StreamDecoder>(*tokenizer_);
  if (levels_.pooled_block > 0) KB_ = (M_ + levels_.pooled_block - 1) / levels_.pooled_block;
  start_ = last_ = std::chrono::steady_clock::now();
}

bool Recorder::wants_probs(int64_t) const {
  return track_attended_ || levels_.received || levels_.pooled_block > 0 ||
         !levels_.dense.empty() || levels_.topk > 0;
}

const std::vector<uint8_t>& Recorder::attended(int64_t layer, int64_t kv_head) const {
  return attended_[size_t(layer * K_ + kv_head)];
}

void Recorder::on_attention(int64_t layer, int64_t kv_head, const float* p, int64_t R, int64_t n,
                            int64_t m, const int64_t* key_pos, int64_t q_pos0) {
  if (track_attended_) {
    if (attended_.empty()) attended_.assign(size_t(L_ * K_), std::vector<uint8_t>(size_t(M_), 0));
    std::vector<uint8_t>& bits = attended_[size_t(layer * K_ + kv_head)];
    std::fill(bits.begin(), bits.end(), 0);
    for (int64_t j = 0; j < m; ++j) bits[size_t(key_pos[j])] = 1;
  }
  if (levels_.received) {
    trace::ReceivedRow row{int16_t(layer), int16_t(kv_head), {}, {}};
    row.tokens.resize(size_t(m));
    row.mass.resize(size_t(m));
    const float norm = 1.0f / float(R * n);
    kernels::sum_rows(p, R * n, m, row.mass.data());
    for (int64_t j = 0; j < m; ++j) {
      row.tokens[size_t(j)] = static_cast<int32_t>(key_pos[j]);
      row.mass[size_t(j)] *= norm;
    }
    received_.push_back(std::move(row));
  }
  if (levels_.pooled_block > 0) pool(layer, kv_head, p, R, n, m, key_pos, q_pos0);
  for (size_t d = 0; d < levels_.dense.size(); ++d) {
    auto [dl, dh] = levels_.dense[d];
    if (dl != layer || dh / R != kv_head) continue;
    int64_t r = dh % R;
    for (int64_t i = 0; i < n; ++i) {
      trace::DenseRow row{int32_t(d), int32_t(q_pos0 + i), std::vector<float>(size_t(M_), 0.0f)};
      for (int64_t j = 0; j < m; ++j) row.weight[size_t(key_pos[j])] = p[(r * n + i) * m + j];
      dense_.push_back(std::move(row));
    }
  }
  if (levels_.topk > 0) {
    const int64_t k = levels_.topk;
    std::vector<int64_t> order(static_cast<size_t>(m));
    for (int64_t i = 0; i < n; ++i) {
      trace::TopkRow& row = topk_[q_pos0 + i];
      if (row.index.empty()) {
        row.token = int32_t(q_pos0 + i);
        row.index.assign(size_t(L_ * H_ * k), -1);
        row.weight.assign(size_t(L_ * H_ * k), 0.0f);
      }
      for (int64_t r = 0; r < R; ++r) {
        const float* w = p + (r * n + i) * m;
        std::iota(order.begin(), order.end(), 0);
        int64_t top = std::min(k, m);
        std::partial_sort(order.begin(), order.begin() + top, order.end(),
                          [&](int64_t a, int64_t b) {
                            return w[a] > w[b] || (w[a] == w[b] && key_pos[a] < key_pos[b]);
                          });
        int64_t base = ((layer * H_) + kv_head * R + r) * k;
        for (int64_t t = 0; t < top; ++t) {
          row.index[size_t(base + t)] = static_cast<int32_t>(key_pos[order[size_t(t)]]);
          row.weight[size_t(base + t)] = w[order[size_t(t)]];
        }
      }
    }
  }
}

void Recorder::pool(int64_t layer, int64_t kv_head, const float* p, int64_t R, int64_t n, int64_t m,
                    const int64_t* key_pos, int64_t q_pos0) {
  const int64_t B = levels_.pooled_block;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t qpos = q_pos0 + i, qb = qpos / B;
    PooledBlock& blk = open_blocks_[{layer, qb}];
    if (blk.sum.empty()) {
      blk.sum.assign(size_t(H_ * KB_), 0.0f);
      blk.max.assign(size_t(H_ * KB_), 0.0f);
      blk.pairs.assign(size_t(KB_), 0.0);
    }
    if (kv_head == 0)  // causal pairs of this query with each key block, counted once
      for (int64_t kb = 0; kb <= qb && kb < KB_; ++kb)
        blk.pairs[size_t(kb)] += double(std::clamp<int64_t>(qpos - kb * B + 1, 0, B));
    for (int64_t r = 0; r < R; ++r) {
      const float* w = p + (r * n + i) * m;
      float* sum = blk.sum.data() + (kv_head * R + r) * KB_;
      float* mx = blk.max.data() + (kv_head * R + r) * KB_;
      for (int64_t j = 0; j < m; ++j) {
        int64_t kb = key_pos[j] / B;
        sum[kb] += w[j];
        mx[kb] = std::max(mx[kb], w[j]);
      }
    }
  }
}

trace::TokenRole Recorder::role_of(int32_t id) const {
  return tokenizer_ && tokenizer_->is_special(id) ? trace::TokenRole::Template
                                                  : trace::TokenRole::Prompt;
}

trace::StepData Recorder::finish_step(int64_t pos0, const std::vector<int32_t>& ids, bool prefill,
                                      int32_t sampled) {
  auto now = std::chrono::steady_clock::now();
  trace::StepData sd;
  sd.step.kind = prefill ? trace::StepKind::Prefill : trace::StepKind::Decode;
  sd.step.first_token = static_cast<int32_t>(pos0);
  sd.step.n_tokens = static_cast<int32_t>(ids.size());
  sd.step.t_start_s = std::chrono::duration<double>(last_ - start_).count();
  sd.step.wall_s = std::chrono::duration<double>(now - last_).count();
  for (size_t i = 0; i < ids.size(); ++i) {
    trace::TokenRecord t;
    t.id = ids[i];
    t.position = static_cast<int32_t>(pos0 + int64_t(i));
    t.step = static_cast<int32_t>(cache_.step());
    t.text = tokenizer_ ? tokenizer_->token_bytes(ids[i]) : std::string();
    if (prefill) {
      t.role = role_of(ids[i]);
      // Map the piece back into the prompt text; pieces the template or the
      // tokenizer added (e.g. a dummy-prefix space) may not be found.
      size_t at =
          t.text.empty() ? std::string::npos : prompt_text_.find(t.text, size_t(prompt_offset_));
      if (at != std::string::npos && at <= size_t(prompt_offset_) + 8) {
        t.prompt_offset = static_cast<int64_t>(at);
        prompt_offset_ = static_cast<int64_t>(at + t.text.size());
      }
    } else {
      t.role = trace::TokenRole::Generated;
    }
    sd.tokens.push_back(std::move(t));
  }
  sd.events = cache_.take_events();
  sd.gates = cache_.take_gates();
  sd.occupancy = cache_.occupancy();
  sd.tier_bytes = cache_.tier_bytes();
  sd.step.entries = cache_.entries();
  sd.step.kv_bytes = cache_.bytes_in_use();
  sd.received = std::move(received_);
  received_.clear();
  sd.dense = std::move(dense_);
  dense_.clear();
  for (auto& [token, row] : topk_) sd.topk.push_back(std::move(row));
  topk_.clear();
  if (levels_.pooled_block > 0) {
    const int64_t fed = pos0 + int64_t(ids.size());
    for (auto it = open_blocks_.begin(); it != open_blocks_.end();) {
      auto [layer, qb] = it->first;
      PooledBlock& blk = it->second;
      trace::PooledRow row{int16_t(layer), int32_t(qb), blk.max, blk.sum};
      for (int64_t h = 0; h < H_; ++h)
        for (int64_t kb = 0; kb < KB_; ++kb) {
          double pairs = blk.pairs[size_t(kb)];
          float& mean = row.mean[size_t(h * KB_ + kb)];
          mean = pairs > 0 ? float(double(mean) / pairs) : 0.0f;
        }
      sd.pooled.push_back(std::move(row));
      // A block whose queries have all been fed will not change again.
      if ((qb + 1) * levels_.pooled_block <= fed)
        it = open_blocks_.erase(it);
      else
        ++it;
    }
  }
  // The prompt primes the stream decoder (a SentencePiece decode strips its
  // first space: the first generated token alone would lose its own).
  if (decoder_ && prefill) decoder_->prime(ids);
  if (decoder_ && sampled >= 0 && !tokenizer_->is_special(sampled))
    sd.generated_text = decoder_->push(sampled);
  last_ = std::chrono::steady_clock::now();
  return sd;
}

std::string Recorder::finish_text() {
  return decoder_ ? decoder_->finish() : std::string();
}

}  // namespace kvscope::recorder
