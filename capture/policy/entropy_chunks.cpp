#include "capture/policy/entropy_chunks.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvscope::policy {

namespace {

constexpr double kEps = 1e-8;  // kvpress's EPSILON

// Normalised entropy of one chunk's scores, rebased so that none is
// negative (kvpress: x - min(x).clamp(max=0)); 0 for a single entry.
double chunk_entropy(const float* s, int64_t n) {
  if (n <= 1) return 0.0;
  float lo = *std::min_element(s, s + n);
  const double shift = std::min(0.0f, lo);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += double(s[i]) - shift;
  double h = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double p = (double(s[i]) - shift) / (total + kEps);
    h -= p * std::log(p + kEps);
  }
  return std::clamp(h / std::log(double(n)), 0.0, 1.0);
}

// torch.median: the lower of the two middle values for an even count.
double lower_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

}  // namespace

std::vector<char> entropy_gated_chunks(const std::vector<float>& scores, int64_t chunk,
                                       int64_t low, int64_t budget) {
  const int64_t T = int64_t(scores.size());
  const int64_t n_chunks = (T + chunk - 1) / chunk;
  std::vector<double> mean(static_cast<size_t>(n_chunks)), entropy(static_cast<size_t>(n_chunks));
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t b = c * chunk, e = std::min(T, b + chunk);
    mean[size_t(c)] = std::accumulate(scores.begin() + b, scores.begin() + e, 0.0) / double(e - b);
    entropy[size_t(c)] = chunk_entropy(scores.data() + b, e - b);
  }
  const double score_median = lower_median(mean), entropy_median = lower_median(entropy);
  std::vector<int64_t> order(static_cast<size_t>(n_chunks));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return mean[size_t(a)] > mean[size_t(b)]; });
  std::vector<char> keep(static_cast<size_t>(T), 0);
  for (int64_t c : order) {
    if (budget <= 0) break;
    const int64_t b = c * chunk, e = std::min(T, b + chunk);
    int64_t n = std::min(e - b, budget);
    if (mean[size_t(c)] >= score_median && entropy[size_t(c)] < entropy_median) n = std::min(n, low);
    std::vector<int64_t> idx(static_cast<size_t>(e - b));
    std::iota(idx.begin(), idx.end(), b);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t x, int64_t y) {
      return scores[size_t(x)] > scores[size_t(y)];
    });
    for (int64_t i = 0; i < n; ++i) keep[size_t(idx[size_t(i)])] = 1;
    budget -= n;
  }
  if (budget > 0) {  // leftover budget: the best entries not yet kept
    std::vector<int64_t> rest;
    for (int64_t i = 0; i < T; ++i)
      if (!keep[size_t(i)]) rest.push_back(i);
    std::stable_sort(rest.begin(), rest.end(), [&](int64_t x, int64_t y) {
      return scores[size_t(x)] > scores[size_t(y)];
    });
    for (int64_t i = 0; i < std::min<int64_t>(budget, int64_t(rest.size())); ++i)
      keep[size_t(rest[size_t(i)])] = 1;
  }
  return keep;
}

}  // namespace kvscope::policy
