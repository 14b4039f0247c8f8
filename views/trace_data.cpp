#include "views/trace_data.h"

#include <cassert>
#include <cmath>

#include "core/analysis/why.h"

namespace kvscope::views {

TraceData::TraceData(std::unique_ptr<trace::TraceReader> reader)
    : owned_(std::move(reader)), reader_(owned_.get()) {}

TraceData::TraceData(const trace::TraceReader& reader) : reader_(&reader) {}

bool TraceData::refresh() {
  if (!owned_) return false;
  int64_t steps = owned_->n_steps();
  bool was_complete = owned_->complete();
  owned_->refresh();
  bool grew = owned_->n_steps() != steps || owned_->complete() != was_complete;
  if (grew) drop_caches();
  return grew;
}

void TraceData::drop_caches() {
  basics_.reset();
  all_.reset();
  last_attended_.clear();
  span_mass_.clear();
}

const TraceBasics& TraceData::basics() {
  if (!basics_) {
    auto b = std::make_unique<TraceBasics>();
    b->n_steps = reader_->n_steps();
    b->n_tokens = reader_->n_tokens();
    b->tokens = reader_->tokens(0, b->n_tokens);
    b->steps = reader_->steps(0, b->n_steps);
    b->fed_step.assign(size_t(b->n_tokens), 0);
    for (size_t t = 0; t < b->tokens.size(); ++t) b->fed_step[t] = b->tokens[t].step;
    basics_ = std::move(b);
  }
  return *basics_;
}

const analysis::AllLifetimes& TraceData::all_lifetimes() {
  if (!all_)
    all_ = std::make_unique<analysis::AllLifetimes>(analysis::AllLifetimes::read(*reader_));
  return *all_;
}

const analysis::LastAttended& TraceData::last_attended(int layer, int kv_head) {
  auto key = std::make_pair(layer, kv_head);
  auto it = last_attended_.find(key);
  if (it == last_attended_.end())
    it = last_attended_.emplace(key, analysis::LastAttended::read(*reader_, 0.9, layer, kv_head))
             .first;
  return it->second;
}

const std::vector<double>& TraceData::span_mass(const std::vector<int32_t>& tokens) {
  auto it = span_mass_.find(tokens);
  if (it != span_mass_.end()) return it->second;
  const TraceBasics& b = basics();
  std::vector<double> mass(size_t(b.n_steps), NAN);
  const int64_t first = b.first_decode_step();
  if (!tokens.empty() && first >= 0)
    for (int64_t s = first; s < b.n_steps; ++s)
      mass[size_t(s)] = analysis::received_mass_on(*reader_, tokens, s);
  return span_mass_.emplace(tokens, std::move(mass)).first->second;
}

std::shared_ptr<const analysis::AttentionLod> TraceData::lod() const {
  std::lock_guard<std::mutex> lock(lod_mutex_);
  return lod_;
}

std::shared_ptr<const PartialLod> TraceData::partial_lod() const {
  std::lock_guard<std::mutex> lock(lod_mutex_);
  return partial_lod_;
}

void TraceData::set_partial_lod(std::shared_ptr<const PartialLod> partial) {
  std::lock_guard<std::mutex> lock(lod_mutex_);
  partial_lod_ = std::move(partial);
}

PartialLod::PartialLod(int64_t layers, int64_t heads)
    : layers_(layers),
      heads_(heads),
      thumbs_(size_t(layers * heads)),
      metrics_(size_t(layers * heads * analysis::kMetricCount), 0.f),
      have_(size_t(layers * heads), 0) {}

void PartialLod::add(int layer, int head, const analysis::AttentionGrid& thumbnail,
                     const std::vector<float>& metrics) {
  assert(layer >= 0 && layer < layers_ && head >= 0 && head < heads_);
  assert(metrics.size() == size_t(analysis::kMetricCount));
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t i = size_t(layer * heads_ + head);
  thumbs_[i] = thumbnail;
  std::copy(metrics.begin(), metrics.end(), metrics_.begin() + i * analysis::kMetricCount);
  done_ += have_[i] ? 0 : 1;
  have_[i] = 1;
}

int64_t PartialLod::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

bool PartialLod::get(int layer, int head, analysis::AttentionGrid* thumbnail,
                     std::vector<float>* metrics) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t i = size_t(layer * heads_ + head);
  if (!have_[i]) return false;
  *thumbnail = thumbs_[i];
  metrics->assign(metrics_.begin() + i * analysis::kMetricCount,
                  metrics_.begin() + (i + 1) * analysis::kMetricCount);
  return true;
}

void TraceData::set_lod(std::shared_ptr<const analysis::AttentionLod> lod) {
  std::lock_guard<std::mutex> lock(lod_mutex_);
  lod_ = std::move(lod);
}

}  // namespace kvscope::views
