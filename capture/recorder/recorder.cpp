#include "capture/recorder/recorder.h"

#include <algorithm>
#include <numeric>

#include "kernels/attention.h"

namespace kvscope::recorder {

Recorder::Recorder(policy::StepDriver& driver, const tokenizer::Tokenizer* tokenizer,
                   const CaptureLevels& levels, std::string prompt_text)
    : driver_(driver),
      tokenizer_(tokenizer),
      levels_(levels),
      prompt_text_(std::move(prompt_text)),
      L_(driver.cache().n_layers()),
      H_(driver.cache().n_heads()),
      K_(driver.cache().n_kv_heads()),
      R_(driver.cache().n_heads() / driver.cache().n_kv_heads()),
      M_(driver.cache().max_tokens()) {
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

void Recorder::on_attention_begin(int64_t layer, int64_t kv_head, int64_t /*R: the cache's, R_*/,
                                  int64_t n, int64_t m, const int64_t* key_pos, int64_t q_pos0) {
  cur_ = Head{layer, kv_head, n, m, q_pos0, key_pos, dense_.size()};
  if (track_attended_) {
    if (attended_.empty()) attended_.assign(size_t(L_ * K_), std::vector<uint8_t>(size_t(M_), 0));
    std::vector<uint8_t>& bits = attended_[size_t(layer * K_ + kv_head)];
    std::fill(bits.begin(), bits.end(), 0);
    for (int64_t j = 0; j < m; ++j) bits[size_t(key_pos[j])] = 1;
  }
  if (levels_.received) {
    received_row_ = trace::ReceivedRow{int16_t(layer), int16_t(kv_head), {}, {}};
    received_row_.tokens.assign(key_pos, key_pos + m);
    received_row_.mass.assign(size_t(m), 0.0f);
  }
  for (size_t d = 0; d < levels_.dense.size(); ++d) {
    auto [dl, dh] = levels_.dense[d];
    if (dl != layer || dh / R_ != kv_head) continue;
    for (int64_t i = 0; i < n; ++i)
      dense_.push_back({int32_t(d), int32_t(q_pos0 + i), std::vector<float>(size_t(M_), 0.0f)});
  }
}

void Recorder::on_attention_block(const float* p, int64_t b, int64_t mk, int64_t i0, int64_t k0) {
  if (levels_.received) kernels::sum_rows_add(p, R_ * b, mk, received_row_.mass.data() + k0);
  if (levels_.pooled_block > 0) pool(p, b, mk, i0, k0);
  if (dense_.size() > cur_.first_dense) dense_block(p, b, mk, i0, k0);
  if (levels_.topk > 0) topk_block(p, b, mk, i0, k0);
}

bool Recorder::needs_weights(int64_t) const {
  return !levels_.dense.empty() || levels_.topk > 0;
}

void Recorder::on_attention_mass(const float* mass) {
  if (!levels_.received) return;
  for (size_t j = 0; j < received_row_.mass.size(); ++j) received_row_.mass[j] += mass[j];
}

void Recorder::on_attention_end() {
  if (!levels_.received) return;
  const float norm = 1.0f / float(R_ * cur_.n);
  for (float& x : received_row_.mass) x *= norm;
  received_.push_back(std::move(received_row_));
}

void Recorder::dense_block(const float* p, int64_t b, int64_t mk, int64_t i0, int64_t k0) {
  // This head's dense rows: per captured query head, n rows in query order.
  size_t row = cur_.first_dense;
  for (size_t d = 0; d < levels_.dense.size(); ++d) {
    auto [dl, dh] = levels_.dense[d];
    if (dl != cur_.layer || dh / R_ != cur_.kv_head) continue;
    const int64_t r = dh % R_;
    for (int64_t i = 0; i < b; ++i) {
      std::vector<float>& weight = dense_[row + size_t(i0 + i)].weight;
      const float* w = p + (r * b + i) * mk;
      for (int64_t j = 0; j < mk; ++j) weight[size_t(cur_.key_pos[k0 + j])] = w[j];
    }
    row += size_t(cur_.n);
  }
}

void Recorder::topk_block(const float* p, int64_t b, int64_t mk, int64_t i0, int64_t k0) {
  // Keys outside the block weigh 0 for its queries: never among the top.
  const int64_t k = levels_.topk;
  const int64_t* key_pos = cur_.key_pos + k0;
  std::vector<int64_t> order(static_cast<size_t>(mk));
  for (int64_t i = 0; i < b; ++i) {
    const int64_t token = cur_.q_pos0 + i0 + i;
    trace::TopkRow& row = topk_[token];
    if (row.index.empty()) {
      row.token = int32_t(token);
      row.index.assign(size_t(L_ * H_ * k), -1);
      row.weight.assign(size_t(L_ * H_ * k), 0.0f);
    }
    for (int64_t r = 0; r < R_; ++r) {
      const float* w = p + (r * b + i) * mk;
      std::iota(order.begin(), order.end(), 0);
      const int64_t top = std::min(k, mk);
      std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int64_t x, int64_t y) {
        return w[x] > w[y] || (w[x] == w[y] && key_pos[x] < key_pos[y]);
      });
      const int64_t base = ((cur_.layer * H_) + cur_.kv_head * R_ + r) * k;
      for (int64_t t = 0; t < top; ++t) {
        row.index[size_t(base + t)] = static_cast<int32_t>(key_pos[order[size_t(t)]]);
        row.weight[size_t(base + t)] = w[order[size_t(t)]];
      }
    }
  }
}

namespace {

// Keys of one pooled key block that sit next to each other in the cache's
// order: [j0, j1), the earliest position among them first_pos.
struct KeyRun {
  int64_t kb, j0, j1, first_pos;
};

// The cache holds keys mostly in position order, so a block's keys form a
// few runs: the pooling loops then read weights sequentially, without a
// division per weight.
std::vector<KeyRun> key_runs(const int64_t* key_pos, int64_t m, int64_t B) {
  std::vector<KeyRun> runs;
  for (int64_t j = 0; j < m; ++j) {
    const int64_t kb = key_pos[j] / B;
    if (!runs.empty() && runs.back().kb == kb && runs.back().j1 == j) {
      runs.back().j1 = j + 1;
      runs.back().first_pos = std::min(runs.back().first_pos, key_pos[j]);
    } else {
      runs.push_back({kb, j, j + 1, key_pos[j]});
    }
  }
  return runs;
}

}  // namespace

// The open pooled block (current layer, query block qb); the first kv head
// of a step counts the causal pairs of its queries qpos0 .. last_qpos with
// each key block (once per layer, not per head).
Recorder::PooledBlock& Recorder::pooled_block_for(int64_t qb, int64_t qpos0, int64_t last_qpos) {
  const int64_t B = levels_.pooled_block;
  PooledBlock& blk = open_blocks_[{cur_.layer, qb}];
  if (blk.sum.empty()) {
    blk.sum.assign(size_t(H_ * KB_), 0.0f);
    blk.max.assign(size_t(H_ * KB_), 0.0f);
    blk.pairs.assign(size_t(KB_), 0.0);
  }
  if (cur_.kv_head == 0)
    for (int64_t qpos = qpos0; qpos <= last_qpos; ++qpos)
      for (int64_t kb = 0; kb <= qb && kb < KB_; ++kb)
        blk.pairs[size_t(kb)] += double(std::clamp<int64_t>(qpos - kb * B + 1, 0, B));
  return blk;
}

// A device layer's pooled weights of the current head (sum / max
// [R, q_blocks, n_blocks], the kernels' layout): added as pool() adds the
// weights' own.
void Recorder::on_attention_pooled(const float* sum, const float* max, int64_t q_blocks,
                                   int64_t n_blocks) {
  const int64_t B = levels_.pooled_block, last = cur_.q_pos0 + cur_.n - 1;
  const int64_t nb = std::min(n_blocks, KB_);
  for (int64_t qi = 0; qi < q_blocks; ++qi) {
    const int64_t qb = cur_.q_pos0 / B + qi;
    const int64_t first_q = std::max(cur_.q_pos0, qb * B), last_q = std::min(last, qb * B + B - 1);
    if (first_q > last_q) continue;
    PooledBlock& blk = pooled_block_for(qb, first_q, last_q);
    for (int64_t r = 0; r < R_; ++r) {
      const float* s = sum + (r * q_blocks + qi) * n_blocks;
      const float* x = max + (r * q_blocks + qi) * n_blocks;
      float* dst_sum = blk.sum.data() + (cur_.kv_head * R_ + r) * KB_;
      float* dst_max = blk.max.data() + (cur_.kv_head * R_ + r) * KB_;
      for (int64_t kb = 0; kb < nb; ++kb) {
        dst_sum[kb] += s[kb];
        dst_max[kb] = std::max(dst_max[kb], x[kb]);
      }
    }
  }
}

void Recorder::pool(const float* p, int64_t b, int64_t mk, int64_t i0, int64_t k0) {
  const int64_t B = levels_.pooled_block, kv_head = cur_.kv_head;
  const std::vector<KeyRun> runs = key_runs(cur_.key_pos + k0, mk, B);
  std::vector<float> col_sum(static_cast<size_t>(mk)), col_max(static_cast<size_t>(mk));
  for (int64_t g0 = 0; g0 < b;) {
    // Queries g0 .. g1 - 1 of the block share one query block qb: their rows
    // are first reduced per key (sequential, vectorised), then per key run.
    const int64_t qpos0 = cur_.q_pos0 + i0 + g0, qb = qpos0 / B;
    const int64_t g1 = std::min(b, g0 + (qb + 1) * B - qpos0),
                  last_qpos = cur_.q_pos0 + i0 + g1 - 1;
    PooledBlock& blk = pooled_block_for(qb, qpos0, last_qpos);
    for (int64_t r = 0; r < R_; ++r) {
      std::fill(col_sum.begin(), col_sum.end(), 0.0f);
      std::fill(col_max.begin(), col_max.end(), 0.0f);
      for (int64_t i = g0; i < g1; ++i) {
        const float* w = p + (r * b + i) * mk;
        for (int64_t j = 0; j < mk; ++j) {
          col_sum[size_t(j)] += w[j];
          col_max[size_t(j)] = col_max[size_t(j)] < w[j] ? w[j] : col_max[size_t(j)];
        }
      }
      float* sum = blk.sum.data() + (kv_head * R_ + r) * KB_;
      float* mx = blk.max.data() + (kv_head * R_ + r) * KB_;
      for (const KeyRun& run : runs) {
        if (run.first_pos > last_qpos) continue;  // keys after every query: weight 0 (causal)
        float s = 0, x = mx[run.kb];
        for (int64_t j = run.j0; j < run.j1; ++j) {
          s += col_sum[size_t(j)];
          x = std::max(x, col_max[size_t(j)]);
        }
        sum[run.kb] += s;
        mx[run.kb] = x;
      }
    }
    g0 = g1;
  }
}

trace::TokenRole Recorder::role_of(int32_t id) const {
  return tokenizer_ && tokenizer_->is_special(id) ? trace::TokenRole::Template
                                                  : trace::TokenRole::Prompt;
}

// The step's header: its kind, its tokens and its time since the last step.
trace::StepData Recorder::open_step_data(trace::StepKind kind, int64_t pos0,
                                         int32_t n_tokens) const {
  auto now = std::chrono::steady_clock::now();
  trace::StepData sd;
  sd.step.kind = kind;
  sd.step.first_token = static_cast<int32_t>(pos0);
  sd.step.n_tokens = n_tokens;
  sd.step.t_start_s = std::chrono::duration<double>(last_ - start_).count();
  sd.step.wall_s = std::chrono::duration<double>(now - last_).count();
  return sd;
}

// What the policy did this step, and the cache it left.
void Recorder::take_policy_record(trace::StepData& sd) {
  sd.events = driver_.take_events();
  sd.gates = driver_.take_gates();
  sd.series = driver_.take_series();
  sd.stalls = driver_.take_stalls();
  sd.merges = driver_.take_merges();
  sd.rerotations = driver_.take_rerotations();
  sd.key_channels = driver_.take_key_channels();
  sd.interventions = driver_.take_interventions();
  sd.occupancy = driver_.cache().occupancy();
  sd.tier_bytes = driver_.cache().tier_bytes();
  sd.step.entries = driver_.cache().entries();
  sd.step.kv_bytes = driver_.cache().bytes_in_use();
}

trace::StepData Recorder::finish_step(int64_t pos0, const std::vector<int32_t>& ids, bool prefill,
                                      int32_t sampled, bool forced) {
  trace::StepData sd = open_step_data(prefill ? trace::StepKind::Prefill : trace::StepKind::Decode,
                                      pos0, int32_t(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) {
    trace::TokenRecord t;
    t.id = ids[i];
    t.position = static_cast<int32_t>(pos0 + int64_t(i));
    t.step = static_cast<int32_t>(driver_.step());
    if (is_inserted(ids[i])) {
      t.text = inserted_names_[size_t(ids[i] - inserted_first_)];
      t.role = trace::TokenRole::Template;
      sd.tokens.push_back(std::move(t));
      continue;
    }
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
      // A teacher-forced token is text the task supplied, not the model's.
      t.role = forced ? role_of(ids[i]) : trace::TokenRole::Generated;
    }
    sd.tokens.push_back(std::move(t));
  }
  take_policy_record(sd);
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
  if (decoder_ && (prefill || forced) && !(ids.size() > 0 && is_inserted(ids[0])))
    decoder_->prime(ids);
  if (decoder_ && sampled >= 0 && !tokenizer_->is_special(sampled))
    sd.generated_text = decoder_->push(sampled);
  last_ = std::chrono::steady_clock::now();
  return sd;
}

trace::StepData Recorder::finish_reconstruction_step(int64_t pos0,
                                                     const std::vector<int32_t>& ids) {
  trace::StepData sd = open_step_data(trace::StepKind::Reconstruction, pos0, 0);
  const int32_t step = static_cast<int32_t>(driver_.step());
  for (size_t i = 0; i < ids.size(); ++i)
    sd.reconstruction.push_back({step, static_cast<int32_t>(pos0 + int64_t(i)), ids[i]});
  take_policy_record(sd);
  last_ = std::chrono::steady_clock::now();
  return sd;
}

std::string Recorder::finish_text() {
  return decoder_ ? decoder_->finish() : std::string();
}

}  // namespace kvscope::recorder
