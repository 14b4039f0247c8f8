#include "capture/generate/sampler.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "core/common/input_error.h"

namespace kvscope::generate {

Sampler::Sampler(const SamplingOptions& o) : options_(o), rng_(o.seed) {
  if (o.greedy) return;
  if (!(o.temperature > 0) || !std::isfinite(o.temperature))
    throw InputError("", "--temperature", "must be a positive number (use --greedy for argmax)");
  if (o.top_k < 0) throw InputError("", "--top-k", "must be 0 (off) or positive");
  if (!(o.top_p > 0 && o.top_p <= 1)) throw InputError("", "--top-p", "must be in (0, 1]");
}

double Sampler::uniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

int32_t Sampler::next(const torch::Tensor& logits) {
  torch::Tensor l = logits.to(torch::kCPU, torch::kFloat32).contiguous();
  const float* x = l.data_ptr<float>();
  const int64_t V = l.numel();
  if (options_.greedy) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (x[i] > x[best]) best = i;
    return static_cast<int32_t>(best);
  }
  // Candidates by descending logit, ties by ascending id (deterministic).
  candidates_.resize(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i)
    candidates_[static_cast<size_t>(i)] = {x[i], static_cast<int32_t>(i)};
  auto order = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = candidates_.size();
  if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < keep) {
    keep = static_cast<size_t>(options_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(keep),
                      candidates_.end(), order);
  } else if (options_.top_p < 1.0) {
    std::sort(candidates_.begin(), candidates_.end(), order);
  }  // with neither cut, id order is as good as any
  // Softmax over the kept candidates at the temperature (max-subtracted).
  std::vector<double> p(keep);
  double top = candidates_[0].first;
  for (size_t i = 1; i < keep; ++i) top = std::max<double>(top, candidates_[i].first);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    p[i] = std::exp((candidates_[i].first - top) / options_.temperature);
    sum += p[i];
  }
  // Nucleus: the smallest prefix whose probability reaches top_p.
  if (options_.top_p < 1.0) {
    double cumulative = 0;
    size_t n = 0;
    while (n < keep) {
      cumulative += p[n] / sum;
      ++n;
      if (cumulative >= options_.top_p) break;
    }
    keep = n;
    sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += p[i];
  }
  double r = uniform() * sum;
  for (size_t i = 0; i < keep; ++i) {
    r -= p[i];
    if (r < 0) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace kvscope::generate
