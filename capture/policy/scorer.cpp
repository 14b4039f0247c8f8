#include "capture/policy/scorer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "capture/policy/entropy_chunks.h"
#include "capture/policy/held_rows.h"
#include "capture/policy/policies/descriptors.h"
#include "core/common/check.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

std::vector<ParamSpec> scorer_forwarded_params() {
  std::vector<ParamSpec> out;
  std::set<std::string> seen;
  for (const ScorerDescriptor& d : builtin_scorers())
    for (const ParamSpec& s : d.params)
      if (seen.insert(s.name).second)
        out.push_back({s.name, ParamType::String, "",
                       "passed to the scorer (" + d.name + ": " + s.help + ")"});
  return out;
}

std::vector<ParamSpec> with_scorer_params(std::vector<ParamSpec> own) {
  for (const ParamSpec& s : scorer_forwarded_params()) {
    for (const ParamSpec& o : own)
      KVSCOPE_CHECK(o.name != s.name,
                    "policy parameter '" + s.name + "' is also a scorer's parameter");
    own.push_back(s);
  }
  return own;
}

std::string scorer_names() {
  std::string known;
  for (const ScorerDescriptor& s : builtin_scorers()) known += (known.empty() ? "" : ", ") + s.name;
  return known;
}

std::unique_ptr<HeadScorer> make_named_scorer(const std::string& policy, const Params& p) {
  const std::string& name = p.get_string("scorer");
  const ScorerDescriptor* d = find_scorer(name);
  if (!d)
    throw InputError("--policy", policy + ":scorer",
                     "unknown scorer '" + name + "' (known: " + scorer_names() + ")");
  std::map<std::string, std::string> given;
  for (const ParamSpec& s : scorer_forwarded_params()) {
    if (!p.was_given(s.name)) continue;
    bool takes = false;
    for (const ParamSpec& own : d->params) takes |= own.name == s.name;
    if (!takes)
      throw InputError("--policy", policy + ":" + s.name, "not a parameter of scorer " + name);
    given[s.name] = p.get_string(s.name);
  }
  return d->make(Params(name, d->params, given));
}

ScoredPolicy::ScoredPolicy(std::unique_ptr<HeadScorer> scorer, std::vector<int64_t> layer_budgets,
                           bool decode, std::string reason)
    : scorer_(std::move(scorer)),
      budgets_(std::move(layer_budgets)),
      decode_(decode),
      reason_(std::move(reason)) {}

void ScoredPolicy::setup(const PolicySetup& s) {
  Policy::setup(s);
  scorer_->setup(s);
  scores_.resize(s.model->n_layers, s.model->n_kv_heads, s.max_tokens,
                 std::numeric_limits<float>::quiet_NaN());
  if (!shape_.layer_keep.empty()) {
    if (int64_t(shape_.layer_keep.size()) != s.model->n_layers)
      throw InputError("--policy", "layer_ratios:keep",
                       "one fraction per layer expected: the model has " +
                           std::to_string(s.model->n_layers) + " layers, got " +
                           std::to_string(shape_.layer_keep.size()));
    budgets_.clear();
    for (double f : shape_.layer_keep)
      budgets_.push_back(std::max<int64_t>(1, std::llround(f * double(s.prompt_tokens))));
  } else if (shape_.pyramid_beta > 0)
    budgets_ = shape_.pyramid_whole
                   ? pyramid_budgets_kvpress(s.model->n_layers, base_budget(), protection().recent,
                                             shape_.pyramid_beta, s.prompt_tokens)
                   : pyramid_budgets(s.model->n_layers, base_budget(), protection().recent,
                                     shape_.pyramid_beta);
}

std::vector<trace::GateSpec> ScoredPolicy::gates() const {
  return {{scorer_->score_name(), scorer_->score_meaning(), "score",
           std::numeric_limits<double>::quiet_NaN(), true}};
}

std::string ScoredPolicy::budget_kind() const {
  if (!decode_) return "none";
  return shape_.adaptive ? "layer" : "head";
}

int64_t ScoredPolicy::layer_budget(int64_t layer) const {
  return budgets_.size() == 1 ? budgets_[0] : budgets_[size_t(layer)];
}

// Entries a head (uniform) or a layer (adaptive: all its kv heads) may hold.
int64_t ScoredPolicy::budget() const {
  if (budgets_.empty()) return 0;
  if (shape_.adaptive) return setup_.model ? budgets_[0] * setup_.model->n_kv_heads : budgets_[0];
  return *std::max_element(budgets_.begin(), budgets_.end());
}

bool ScoredPolicy::compressing(const LayerContext& c) const {
  if (!scorer_->compresses(c)) return false;
  if (c.prefill) return shape_.prefill;
  if (!decode_) return false;
  // The cadence: every `every`-th decode step (the 1st, 2nd, ... after the
  // prompt: kvpress DecodingPress's per-layer step counter).
  const int64_t k = c.pos0 - setup_.prompt_tokens + 1;
  return shape_.every <= 1 || k % shape_.every == 0;
}

int64_t ScoredPolicy::budget_at(const LayerContext& c) const {
  if (shape_.grow > 0 && !c.prefill)
    return std::max<int64_t>(1, int64_t(std::floor(shape_.grow * double(c.tokens_fed()))));
  return layer_budget(c.layer);
}

Protection ScoredPolicy::protection() const {
  const Protection own = scorer_->protection();
  return {std::max(own.sinks, shape_.extra.sinks), std::max(own.recent, shape_.extra.recent)};
}

HeldLimit ScoredPolicy::held_limit(const LayerContext& c) const {
  if (!compressing(c)) return {};
  if (shape_.adaptive) return {-1, budget_at(c) * c.cache.n_kv_heads()};
  // Protected entries never leave: a budget below them cannot be kept.
  const Protection p = protection();
  // Whole chunks: the last kept one may overshoot the budget by chunk - 1,
  // and chunks holding protected entries stay whatever their score.
  if (shape_.chunk_shared)
    return {budget_at(c) + shape_.chunk - 1 + std::min(p.sinks, c.tokens_fed()) + p.recent, -1};
  return {std::max(budget_at(c), std::min(p.sinks, c.tokens_fed()) + p.recent), -1};
}

void ScoredPolicy::score_head(LayerContext& c, int64_t kv_head, float* score_by_pos) {
  scorer_->score(c, kv_head, score_by_pos);
  const std::vector<int32_t>& held = c.cache.positions(c.layer, kv_head, 0);
  if (shape_.chunk > 1 && !shape_.chunk_shared) {
    // ChunkKV: every entry carries its chunk's score, the mean over the
    // chunk's held entries (the paper's sum for whole chunks; a chunk already
    // cut is not penalised for its missing members).
    std::map<int64_t, std::pair<double, int64_t>> chunk;
    for (int32_t pos : held) {
      auto& [sum, n] = chunk[pos / shape_.chunk];
      sum += score_by_pos[pos];
      ++n;
    }
    for (int32_t pos : held) {
      const auto& [sum, n] = chunk[pos / shape_.chunk];
      score_by_pos[pos] = float(sum / double(n));
    }
  }
  // The latest score of every held entry; a time series every 16 steps.
  for (int32_t pos : held)
    c.decide.gate(0, c.layer, kv_head, pos, score_by_pos[pos], c.step % 16 == 0);
}

void ScoredPolicy::after_attention(LayerContext& c) {
  scorer_->observe(c);
  if (!compressing(c)) return;
  evict(c);
  if (shape_.rerotate) rerotate_held(c);
}

// kvpress's KeyRerotationPress: after a compression each head's kept keys,
// in position order, are re-rotated so that the i-th carries RoPE position i
// (a cached key rotated at p becomes R(i - p) k: the pre-RoPE key at i).
// Queries keep their own positions. The trace's /rerotations records each.
void ScoredPolicy::rerotate_held(LayerContext& c) {
  const model::ModelConfig& m = *setup_.model;
  if (!turn_back_) {
    if (!m.rope.enabled || m.learned_positions)
      throw InputError("--policy", "rerotate", "the model has no RoPE to re-rotate keys with");
    turn_back_ = std::make_unique<RopeInverse>(m);
    rope_pos_.resize(size_t(m.n_layers * m.n_kv_heads * setup_.max_tokens));
    for (size_t i = 0; i < rope_pos_.size(); ++i)
      rope_pos_[i] = int32_t(i % size_t(setup_.max_tokens));
  }
  const int64_t K = c.cache.n_kv_heads(), M = setup_.max_tokens;
  for (int64_t h = 0; h < K; ++h) {
    int32_t* rp = rope_pos_.data() + (c.layer * K + h) * M;
    const HeldRows r = held_rows(c.cache, c.layer, h);
    std::vector<int64_t> rows;  // entries to turn
    std::vector<int32_t> back;  // by how many positions backwards: R(-d) k
    for (int64_t i = 0; i < r.size(); ++i)
      if (rp[r.pos[size_t(i)]] != i)
        rows.push_back(i), back.push_back(rp[r.pos[size_t(i)]] - int32_t(i));
    if (rows.empty()) continue;
    const torch::Tensor turned =
        (*turn_back_)(r.keys.index_select(0, torch::tensor(rows)), back, c.tokens_fed())
            .contiguous();
    const int64_t hd = turned.size(1);
    for (size_t j = 0; j < rows.size(); ++j) {
      const int32_t pos = r.pos[size_t(rows[j])];
      c.decide.rerotate(c.layer, h, pos, rows[j], turned.data_ptr<float>() + int64_t(j) * hd);
      rp[pos] = int32_t(rows[j]);
    }
  }
}

void ScoredPolicy::evict(LayerContext& c) {
  if (shape_.block > 0 && c.prefill)
    evict_blocks(c);
  else if (shape_.per_chunk > 0 && c.prefill)
    evict_per_chunk(c);
  else if (shape_.chunk_shared)
    evict_shared_chunks(c);
  else if (shape_.adaptive)
    evict_adaptive(c);
  else
    evict_uniform(c);
}

// kvpress's BlockPress (the KeyDiff paper's block-wise prompt processing, in
// one pass): per head, the first `budget` prompt entries are kept, then each
// following block of `block` entries joins them and the best `budget` of the
// union stay, scored as if the union were all the head held.
void ScoredPolicy::evict_blocks(LayerContext& c) {
  const int64_t keep = budget_at(c);
  const HeadScorer::Subsets kind = scorer_->subsets();
  for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
    if (c.cache.count(c.layer, h, 0) <= keep) continue;
    float* s = scores_.at(c.layer, h);
    const HeldRows all = held_rows(c.cache, c.layer, h);
    if (kind == HeadScorer::Subsets::Entry) score_head(c, h, s);
    std::vector<int64_t> kept(all.pos.begin(), all.pos.begin() + keep);
    for (int64_t i = keep; i < all.size(); i += shape_.block) {
      std::vector<int64_t> cur = kept;
      for (int64_t j = i; j < std::min(all.size(), i + shape_.block); ++j)
        cur.push_back(all.pos[size_t(j)]);
      std::sort(cur.begin(), cur.end());
      if (kind == HeadScorer::Subsets::Set) scorer_->score_rows(c, h, subset_rows(all, cur), s);
      std::sort(cur.begin(), cur.end(), [&](int64_t a, int64_t b) {
        return s[a] != s[b] ? s[a] > s[b] : a > b;  // best first; ties keep the newer
      });
      cur.resize(size_t(keep));
      kept = std::move(cur);
    }
    std::vector<int64_t> out;
    std::set<int64_t> stay(kept.begin(), kept.end());
    for (int32_t pos : all.pos)
      if (!stay.count(pos)) out.push_back(pos);
    for (int32_t pos : all.pos) c.decide.gate(0, c.layer, h, pos, s[pos], c.step % 16 == 0);
    evict_all(c.decide, c.layer, h, out, s, 1);
  }
}

// kvpress's ChunkPress (FINCH's uniform compression): the prompt's entries,
// in position order, are cut into chunks of `per_chunk`; each chunk is scored
// on its own (as if it were all the head held) and keeps max(1, floor(n_c x
// budget / T)) of its n_c entries, so every part of the prompt keeps its
// share.
void ScoredPolicy::evict_per_chunk(LayerContext& c) {
  const int64_t keep = budget_at(c);
  const HeadScorer::Subsets kind = scorer_->subsets();
  for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
    const HeldRows all = held_rows(c.cache, c.layer, h);
    const int64_t T = all.size();
    if (T <= keep) continue;
    float* s = scores_.at(c.layer, h);
    if (kind == HeadScorer::Subsets::Entry) score_head(c, h, s);
    std::vector<int64_t> out;
    for (int64_t i = 0; i < T; i += shape_.per_chunk) {
      std::vector<int64_t> chunk;
      for (int64_t j = i; j < std::min(T, i + shape_.per_chunk); ++j)
        chunk.push_back(all.pos[size_t(j)]);
      if (kind == HeadScorer::Subsets::Set) scorer_->score_rows(c, h, subset_rows(all, chunk), s);
      const int64_t n = int64_t(chunk.size());
      const int64_t k = std::max<int64_t>(1, int64_t(double(n) * double(keep) / double(T) + 1e-9));
      std::sort(chunk.begin(), chunk.end(), [&](int64_t a, int64_t b) {
        return s[a] != s[b] ? s[a] > s[b] : a > b;  // best first; ties keep the newer
      });
      out.insert(out.end(), chunk.begin() + std::min(k, n), chunk.end());
    }
    std::sort(out.begin(), out.end());
    for (int32_t pos : all.pos) c.decide.gate(0, c.layer, h, pos, s[pos], c.step % 16 == 0);
    evict_all(c.decide, c.layer, h, out, s, 1);
  }
}

// kvpress's EntropyGatedChunkKV at the end of the prefill (entropy_chunks.h):
// the scores summed over the layer's heads, a protected entry scoring its
// head's largest score + 1 (kvpress pads the window so), the same entries
// kept by every head.
void ScoredPolicy::evict_entropy_chunks(LayerContext& c, int64_t keep) {
  const int64_t K = c.cache.n_kv_heads();
  std::vector<int32_t> pos = c.cache.positions(c.layer, 0, 0);
  std::sort(pos.begin(), pos.end());
  const Protection protect = protection();
  std::vector<float> total(pos.size(), 0.0f);
  for (int64_t h = 0; h < K; ++h) {
    float* s = scores_.at(c.layer, h);
    score_head(c, h, s);
    float top = -std::numeric_limits<float>::infinity();
    for (int32_t p : pos)
      if (!protect.protects(p, c.tokens_fed())) top = std::max(top, s[p]);
    for (size_t i = 0; i < pos.size(); ++i)
      total[i] += protect.protects(pos[i], c.tokens_fed()) ? top + 1.0f : s[pos[i]];
  }
  const std::vector<char> kept =
      entropy_gated_chunks(total, shape_.chunk, shape_.chunk_entropy, keep);
  for (int64_t h = 0; h < K; ++h) {
    std::vector<int64_t> out;
    for (size_t i = 0; i < pos.size(); ++i)
      if (!kept[i] && !protect.protects(pos[i], c.tokens_fed())) out.push_back(pos[i]);
    evict_all(c.decide, c.layer, h, out, scores_.at(c.layer, h), 1);
  }
}

// kvpress's ChunkKV: the layer's heads keep the same chunks of `chunk`
// consecutive positions. A chunk's score is the mean over its held positions
// of the scores summed over the heads; a chunk holding a protected entry
// always stays (kvpress's scorers give those the top score). When the prompt
// is in, the top max(1, floor(chunks x budget / T)) chunks stay (kvpress's
// count, T the entries held); later, whenever the heads hold more than the
// budget, the lowest chunks leave whole until they fit.
void ScoredPolicy::evict_shared_chunks(LayerContext& c) {
  const int64_t K = c.cache.n_kv_heads(), keep = budget_at(c), size = shape_.chunk;
  const std::vector<int32_t>& held0 = c.cache.positions(c.layer, 0, 0);
  const int64_t T = int64_t(held0.size());
  if (T <= keep) return;
  if (c.prefill && shape_.chunk_entropy > 0) return evict_entropy_chunks(c, keep);
  const Protection protect = protection();
  std::map<int64_t, std::pair<double, int64_t>> chunks;  // chunk -> (score sum, held count)
  std::set<int64_t> pinned;
  for (int64_t h = 0; h < K; ++h) {
    float* s = scores_.at(c.layer, h);
    score_head(c, h, s);
    for (int32_t pos : c.cache.positions(c.layer, h, 0)) {
      auto& [sum, n] = chunks[pos / size];
      sum += s[pos];
      if (h == 0) ++n;
      if (protect.protects(pos, c.tokens_fed())) pinned.insert(pos / size);
    }
  }
  std::vector<std::pair<double, int64_t>> order;  // (score, chunk), best first
  for (const auto& [chunk, sn] : chunks)
    order.push_back({pinned.count(chunk) ? std::numeric_limits<double>::infinity()
                                         : sn.first / double(sn.second),
                     chunk});
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;  // ties keep the newer
  });
  std::set<int64_t> leave;
  if (c.prefill) {
    const int64_t kept =
        std::max<int64_t>(1, int64_t(double(order.size()) * double(keep) / double(T)));
    for (size_t i = size_t(kept); i < order.size(); ++i)
      if (!std::isinf(order[i].first)) leave.insert(order[i].second);
  } else {
    int64_t held = T;
    for (size_t i = order.size(); i-- > 0 && held > keep;) {
      if (std::isinf(order[i].first)) break;
      leave.insert(order[i].second);
      held -= chunks[order[i].second].second;
    }
  }
  for (int64_t h = 0; h < K; ++h) {
    std::vector<int64_t> out;
    for (int32_t pos : c.cache.positions(c.layer, h, 0))
      if (leave.count(pos / size)) out.push_back(pos);
    std::sort(out.begin(), out.end());
    evict_all(c.decide, c.layer, h, out, scores_.at(c.layer, h), 1);
  }
}

void ScoredPolicy::evict_uniform(LayerContext& c) {
  const int64_t keep = budget_at(c);
  const Protection protect = protection();
  for (int64_t h = 0; h < c.cache.n_kv_heads(); ++h) {
    if (c.cache.count(c.layer, h, 0) <= keep) continue;
    float* s = scores_.at(c.layer, h);
    score_head(c, h, s);
    if (shape_.merge) {
      const std::vector<int64_t> out = lowest_to_budget(c.decide, c.layer, h, keep, protect, s);
      merge_on_evict(c, h, out, shape_.merge_options);
      evict_all(c.decide, c.layer, h, out, s, 1);
    } else {
      evict_to_budget(c.decide, c.layer, h, keep, protect, s, 1);
    }
  }
}

// Ada-KV: the layer keeps its budget x kv heads highest-scored entries
// wherever they are, after every head's safeguard of floor(alpha x budget)
// (protected entries first). docs/policies/adakv.md
void ScoredPolicy::evict_adaptive(LayerContext& c) {
  const int64_t K = c.cache.n_kv_heads(), per_head = budget_at(c);
  int64_t held = 0;
  for (int64_t h = 0; h < K; ++h) held += c.cache.count(c.layer, h, 0);
  if (held <= per_head * K) return;

  int64_t safe = int64_t(std::floor(shape_.alpha * double(per_head)));
  if (shape_.alpha > 0) safe = std::max<int64_t>(safe, 1);
  const Protection protect = protection();
  struct Entry {
    float score;
    int64_t head, pos;
  };
  auto better = [](const Entry& a, const Entry& b) {  // kept first; ties keep the newer
    if (a.score != b.score) return a.score > b.score;
    if (a.pos != b.pos) return a.pos > b.pos;
    return a.head < b.head;
  };
  std::vector<Entry> pool;
  int64_t guaranteed = 0;
  for (int64_t h = 0; h < K; ++h) {
    float* s = scores_.at(c.layer, h);
    score_head(c, h, s);
    std::vector<Entry> mine;
    int64_t protected_count = 0;
    for (int32_t pos : c.cache.positions(c.layer, h, 0)) {
      if (protect.protects(pos, c.tokens_fed()))
        ++protected_count;
      else
        mine.push_back({s[pos], h, pos});
    }
    std::sort(mine.begin(), mine.end(), better);
    // The safeguard counts the protected entries first (they outrank all).
    const int64_t own =
        std::min<int64_t>(int64_t(mine.size()), std::max<int64_t>(0, safe - protected_count));
    guaranteed += protected_count + own;
    pool.insert(pool.end(), mine.begin() + own, mine.end());
  }
  const int64_t room = std::max<int64_t>(0, per_head * K - guaranteed);
  std::sort(pool.begin(), pool.end(), better);
  std::vector<std::vector<int64_t>> leave(static_cast<size_t>(K));
  for (size_t i = size_t(std::min<int64_t>(room, int64_t(pool.size()))); i < pool.size(); ++i)
    leave[size_t(pool[i].head)].push_back(pool[i].pos);
  for (int64_t h = 0; h < K; ++h) {
    std::sort(leave[size_t(h)].begin(), leave[size_t(h)].end());
    evict_all(c.decide, c.layer, h, leave[size_t(h)], scores_.at(c.layer, h), 1);
  }
}

std::string ScoredPolicy::describe() const {
  std::ostringstream o;
  const Protection p = protection();
  o << "scorer " << (scorer_name_.empty() ? scorer_->score_name() : scorer_name_) << " (score "
    << scorer_->score_name() << ")";
  if (shape_.adaptive)
    o << "; allocator adaptive over the layer's heads (AdaKV, alpha " << shape_.alpha
      << "), budget " << base_budget() << " per head on average";
  else if (!shape_.layer_keep.empty() || shape_.pyramid_beta > 0)
    o << "; allocator per layer (" << (shape_.pyramid_beta > 0 ? "pyramid" : "layer ratios")
      << "), mean budget " << base_budget() << " per head";
  else
    o << "; allocator uniform, budget " << base_budget() << " per head";
  if (shape_.block > 0) o << "; the prompt compressed in blocks of " << shape_.block;
  if (shape_.per_chunk > 0)
    o << "; each prompt chunk of " << shape_.per_chunk << " keeps its share";
  if (shape_.merge) o << "; leaving values merged into the most similar survivor";
  if (shape_.rerotate) o << "; kept keys re-rotated to positions 0..n-1";
  if (shape_.chunk > 1)
    o << "; kept by chunks of " << shape_.chunk
      << (shape_.chunk_shared ? ", the same chunks for the layer's heads" : "");
  o << "; cadence " << (shape_.prefill ? "prefill end" : "")
    << (shape_.prefill && decode_ ? " and " : "")
    << (decode_ ? "every " + std::to_string(shape_.every) + " decode step(s)" : "")
    << (!shape_.prefill && !decode_ ? "never" : "");
  if (shape_.grow > 0) o << "; at decode the budget is " << shape_.grow << " of the tokens fed";
  o << "; protected: " << p.sinks << " sinks, " << p.recent << " recent";
  return o.str();
}

}  // namespace kvscope::policy
