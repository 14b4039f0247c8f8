#include "core/analysis/survival.h"

#include <algorithm>
#include <numeric>

namespace kvscope::analysis {

namespace {

void from_topk(const trace::TraceReader& r, int only_layer, int only_head, LastAttended* out) {
  const int64_t L = r.n_layers(), H = r.n_heads(), K = r.n_kv_heads(), k = r.layout().topk;
  const int64_t group = std::max<int64_t>(1, H / K);
  for (int64_t q = 0; q < out->tokens; ++q) {
    trace::TopkRow row = r.topk(q);
    for (int64_t l = 0; l < L; ++l) {
      if (only_layer >= 0 && l != only_layer) continue;
      for (int64_t h = 0; h < H; ++h) {
        int64_t kv = h / group;
        if (only_head >= 0 && kv != only_head) continue;
        int32_t* pos = out->position.data() + (l * K + kv) * out->tokens;
        for (int64_t i = 0; i < k; ++i) {
          int32_t j = row.index[size_t((l * H + h) * k + i)];
          if (j >= 0 && j < out->tokens) pos[j] = std::max<int32_t>(pos[j], int32_t(q));
        }
      }
    }
  }
}

void from_received(const trace::TraceReader& r, double share, int only_layer, int only_head,
                   LastAttended* out) {
  const int64_t L = r.n_layers(), K = r.n_kv_heads();
  std::vector<trace::StepRecord> steps = r.steps(0, r.n_steps());
  std::vector<size_t> order;
  for (int64_t s = 0; s < int64_t(steps.size()); ++s) {
    int32_t last_query = steps[size_t(s)].first_token + steps[size_t(s)].n_tokens - 1;
    for (int64_t l = 0; l < L; ++l) {
      if (only_layer >= 0 && l != only_layer) continue;
      for (int64_t kv = 0; kv < K; ++kv) {
        if (only_head >= 0 && kv != only_head) continue;
        trace::ReceivedRow row = r.received(s, int(l), int(kv));
        double total = std::accumulate(row.mass.begin(), row.mass.end(), 0.0);
        order.resize(row.mass.size());
        std::iota(order.begin(), order.end(), size_t(0));
        std::sort(order.begin(), order.end(),
                  [&](size_t a, size_t b) { return row.mass[a] > row.mass[b]; });
        int32_t* pos = out->position.data() + (l * K + kv) * out->tokens;
        double cum = 0;
        for (size_t i : order) {
          if (cum >= share * total || !(row.mass[i] > 0)) break;
          cum += row.mass[i];
          int32_t j = row.tokens[i];
          if (j >= 0 && j < out->tokens) pos[j] = std::max(pos[j], last_query);
        }
      }
    }
  }
}

}  // namespace

LastAttended LastAttended::read(const trace::TraceReader& reader, double mass_share, int layer,
                                int kv_head) {
  LastAttended out;
  out.layers = reader.n_layers();
  out.kv_heads = reader.n_kv_heads();
  out.tokens = reader.n_tokens();
  if (reader.layout().topk > 0) {
    out.criterion = "top-" + std::to_string(reader.layout().topk);
  } else if (reader.layout().received) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2g of received mass", mass_share);
    out.criterion = buf;
  } else {
    return out;
  }
  out.position.assign(size_t(out.layers * out.kv_heads * out.tokens), -1);
  if (reader.layout().topk > 0)
    from_topk(reader, layer, kv_head, &out);
  else
    from_received(reader, mass_share, layer, kv_head, &out);
  return out;
}

SurvivalCurve survival(const trace::HeadLifetimes& lt, const std::vector<int32_t>& fed_step,
                       const int32_t* last_attended, int64_t max_h) {
  const int64_t T = static_cast<int64_t>(fed_step.size());
  max_h = std::max<int64_t>(0, std::min(max_h, T - 1));
  SurvivalCurve c;
  std::vector<int64_t> held(size_t(max_h + 2), 0), att(size_t(max_h + 2), 0);
  auto add = [&](std::vector<int64_t>& d, int64_t lo, int64_t hi) {  // h in [lo, hi)
    hi = std::min(hi, max_h + 1);
    if (lo < hi) {
      ++d[size_t(lo)];
      --d[size_t(hi)];
    }
  };
  for (int64_t t = 0; t < T && t < int64_t(lt.admit_step.size()); ++t) {
    int32_t admit = lt.admit_step[size_t(t)], evict = lt.evict_step[size_t(t)];
    if (admit >= 0) {
      // fed_step is non-decreasing, so "held at position t + h" is one interval of h.
      auto from = fed_step.begin() + t;
      int64_t lo = std::lower_bound(from, fed_step.end(), admit) - from;
      int64_t hi = evict < 0 ? T - t : std::lower_bound(from, fed_step.end(), evict) - from;
      add(held, lo, hi);
    }
    if (last_attended && last_attended[t] >= t) add(att, 0, last_attended[t] - t + 1);
  }
  c.held.resize(size_t(max_h + 1));
  c.at_risk.resize(size_t(max_h + 1));
  if (last_attended) c.attended.resize(size_t(max_h + 1));
  int64_t run_held = 0, run_att = 0;
  for (int64_t h = 0; h <= max_h; ++h) {
    run_held += held[size_t(h)];
    run_att += att[size_t(h)];
    c.at_risk[size_t(h)] = T - h;
    double n = double(T - h);
    c.held[size_t(h)] = n > 0 ? double(run_held) / n : 0.0;
    if (last_attended) c.attended[size_t(h)] = n > 0 ? double(run_att) / n : 0.0;
  }
  return c;
}

std::vector<double> survival_at(const AllLifetimes& all, const std::vector<int32_t>& fed_step,
                                int64_t h) {
  std::vector<double> out(size_t(all.layers * all.kv_heads), 0.0);
  const int64_t T = all.n_tokens();
  if (h >= T || h < 0) return out;
  for (int64_t slot = 0; slot < all.layers * all.kv_heads; ++slot) {
    int64_t n = 0;
    for (int64_t t = 0; t + h < T; ++t) {
      size_t i = size_t(slot * T + t);
      n += held_at(all.admit[i], all.evict[i], fed_step[size_t(t + h)]) ? 1 : 0;
    }
    out[size_t(slot)] = double(n) / double(T - h);
  }
  return out;
}

}  // namespace kvscope::analysis
