#include "core/trace/synthetic.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/common/memory_limit.h"

namespace kvscope::trace {

namespace {

// SplitMix64: a deterministic hash of the coordinates of a value.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

float unit(uint64_t seed, int64_t a, int64_t b, int64_t c, int64_t d) {
  uint64_t h =
      mix(seed ^ mix(uint64_t(a) ^ mix(uint64_t(b) ^ mix(uint64_t(c) ^ mix(uint64_t(d))))));
  return static_cast<float>((h >> 40) + 1) / static_cast<float>(1ull << 24);  // (0, 1]
}

struct Synth {
  const SyntheticSpec& spec;
  int64_t L, H, K, T, P, group, chunk;

  explicit Synth(const SyntheticSpec& s)
      : spec(s),
        L(s.layers),
        H(s.heads),
        K(s.kv_heads),
        T(s.prompt_tokens + s.decode_steps),
        P(s.prompt_tokens),
        group(s.heads / s.kv_heads),
        chunk(s.prefill_chunk > 0 ? s.prefill_chunk : std::max<int64_t>(1, s.prompt_tokens)) {}

  int64_t prefill_steps() const { return (P + chunk - 1) / chunk; }
  int64_t n_steps() const { return prefill_steps() + spec.decode_steps; }
  int64_t step_first(int64_t s) const {
    return s < prefill_steps() ? s * chunk : P + (s - prefill_steps());
  }
  int64_t step_end(int64_t s) const {
    return s < prefill_steps() ? std::min(P, (s + 1) * chunk) : step_first(s) + 1;
  }

  int64_t window(int64_t l, int64_t k) const { return synthetic_window(spec, l, k); }

  // Is key j held by head (l, k) when n tokens have been fed (tier 0 or 1)?
  int tier_of(int64_t l, int64_t k, int64_t j, int64_t n) const {
    if (j >= n) return -1;
    int64_t w = window(l, k);
    if (j < spec.sinks || j >= n - w) return 0;
    if (spec.tiers > 1 && j >= n - 2 * w) return 1;
    return -1;
  }

  // Does head (l, k) read key j when n tokens have been fed (held in an
  // attended tier)?
  bool attended(int64_t l, int64_t k, int64_t j, int64_t n) const {
    const int tier = tier_of(l, k, j, n);
    return tier == 0 || (tier == 1 && spec.cold_attended);
  }

  // Synthetic attention of query head h at query q over the keys its kv head
  // reads right after q was fed; weights favour sinks and recent keys.
  std::vector<std::pair<int32_t, float>> attention(int64_t l, int64_t h, int64_t q) const {
    int64_t k = h / group;
    std::vector<std::pair<int32_t, float>> row;
    double z = 0;
    for (int64_t j = 0; j <= q; ++j) {
      if (!attended(l, k, j, q + 1)) continue;
      float w = unit(spec.seed, l, h, q, j) * (j < spec.sinks ? 4.0f : 1.0f) *
                (1.0f + 2.0f / static_cast<float>(1 + q - j));
      row.emplace_back(static_cast<int32_t>(j), w);
      z += w;
    }
    for (auto& [j, w] : row) w = static_cast<float>(w / z);
    return row;
  }
};

void add_head_events(const Synth& sy, int64_t l, int64_t k, int32_t step, int64_t a, int64_t b,
                     StepData* sd) {
  const SyntheticSpec& spec = sy.spec;
  int64_t w = sy.window(l, k);
  auto ev = [&](int64_t j, EventKind kind, uint8_t from, uint8_t to, uint16_t reason) {
    sd->events.push_back(Event{step, static_cast<int16_t>(l), static_cast<int16_t>(k),
                               static_cast<int32_t>(j), kind, synthetic_gate(spec, l, k, j), reason,
                               from, to});
  };
  for (int64_t j = a; j < b; ++j) ev(j, EventKind::Admit, kNoTier, 0, j < spec.sinks ? 2 : 0);
  // Keys leaving the hot window: previous last fed a-1, now b-1.
  for (int64_t j = std::max(spec.sinks, a - w); j < b - w; ++j) {
    if (j < 0) continue;
    if (spec.tiers > 1)
      ev(j, EventKind::Demote, 0, 1, 1);
    else
      ev(j, EventKind::Evict, 0, kNoTier, 1);
  }
  if (spec.tiers > 1)
    for (int64_t j = std::max(spec.sinks, a - 2 * w); j < b - 2 * w; ++j)
      if (j >= 0) ev(j, EventKind::Evict, 1, kNoTier, 1);
}

float pooled_pattern(const SyntheticSpec& spec, int64_t l, int64_t h, int64_t qb, int64_t kb) {
  if (kb > qb) return 0.0f;
  float base = kb == 0 ? 0.3f : (kb == qb ? 0.2f : 0.02f / static_cast<float>(1 + qb - kb));
  return base * (0.5f + 0.5f * unit(spec.seed, l, h, qb, kb));
}

}  // namespace

int64_t synthetic_window(const SyntheticSpec& spec, int64_t layer, int64_t kv_head) {
  return spec.window + ((layer * spec.kv_heads + kv_head) % 4) * 4;
}

int32_t synthetic_step_of_token(const SyntheticSpec& spec, int64_t token) {
  Synth sy(spec);
  if (token < sy.P) return static_cast<int32_t>(token / sy.chunk);
  return static_cast<int32_t>(sy.prefill_steps() + (token - sy.P));
}

int32_t synthetic_admit_step(const SyntheticSpec& spec, int64_t token) {
  return synthetic_step_of_token(spec, token);
}

int32_t synthetic_evict_step(const SyntheticSpec& spec, int64_t layer, int64_t kv_head,
                             int64_t token) {
  if (token < spec.sinks) return -1;
  int64_t w = synthetic_window(spec, layer, kv_head) * (spec.tiers > 1 ? 2 : 1);
  int64_t trigger = token + w;  // feeding this token pushes `token` out
  int64_t total = spec.prompt_tokens + spec.decode_steps;
  if (trigger >= total) return -1;
  return synthetic_step_of_token(spec, trigger);
}

float synthetic_gate(const SyntheticSpec& spec, int64_t layer, int64_t kv_head, int64_t token) {
  return unit(spec.seed, layer, kv_head, token, 7);
}

float synthetic_series(const SyntheticSpec& spec, int64_t step, int64_t layer, int64_t kv_head) {
  if ((step + layer + kv_head) % 3 == 0) return std::numeric_limits<float>::quiet_NaN();
  return unit(spec.seed, step, layer, kv_head, 11);
}

std::vector<StallRow> synthetic_stalls(const SyntheticSpec& spec, int64_t step) {
  std::vector<StallRow> out;
  Synth sy(spec);
  if (spec.tiers < 2 || spec.cold_attended || step < sy.prefill_steps()) return out;
  const int64_t fed = sy.step_end(step);
  for (int64_t l = 0; l < sy.L; ++l)
    for (int64_t k = 0; k < sy.K; ++k) {
      if ((step + 3 * l + k) % 5 != 0) continue;
      std::vector<int64_t> cold;
      for (int64_t j = 0; j < fed; ++j)
        if (sy.tier_of(l, k, j, fed) == 1) cold.push_back(j);
      if (cold.empty()) continue;
      StallRow row;
      row.step = static_cast<int32_t>(step);
      row.layer = static_cast<int16_t>(l);
      row.kv_head = static_cast<int16_t>(k);
      row.token = static_cast<int32_t>(cold[size_t(step) % cold.size()]);
      row.wait_s = 0.0005f + 0.001f * unit(spec.seed, step, l, k, 13);
      row.needed =
          spec.oracle ? int8_t(unit(spec.seed, step, l, k, 17) < 0.6f ? 1 : 0) : int8_t(-1);
      out.push_back(row);
    }
  return out;
}

SyntheticCapture::SyntheticCapture(const SyntheticSpec& spec) : spec_(spec) {
  Synth sy(spec_);
  RunInfo& run = run_;
  run.model.name = "synthetic";
  run.model.path = "(synthetic)";
  run.model.architecture = "synthetic";
  run.model.n_layers = spec.layers;
  run.model.layer_window = spec.layer_windows;
  run.model.n_heads = spec.heads;
  run.model.n_kv_heads = spec.kv_heads;
  run.model.head_dim = 16;
  run.model.vocab_size = 1000;
  run.model.context_length = sy.T;
  run.policy =
      "synthetic:sinks=" + std::to_string(spec.sinks) + ",window=" + std::to_string(spec.window);
  run.policy_name = "synthetic";
  run.policy_params_json = "{\"sinks\":" + std::to_string(spec.sinks) +
                           ",\"window\":" + std::to_string(spec.window) + "}";
  run.budget_kind = "head";
  run.budget = spec.sinks + spec.window;
  run.seed = spec.seed;
  run.capture_levels = "events";
  run.tier_names =
      spec.tiers > 1 ? std::vector<std::string>{"hot", "cold"} : std::vector<std::string>{"hot"};
  run.tier_attended.assign(run.tier_names.size(), 1);
  if (spec.tiers > 1 && !spec.cold_attended) run.tier_attended[1] = 0;
  run.reason_names = {"new token", "outside window", "sink"};

  CaptureLayout& layout = layout_;
  layout.max_tokens = sy.T;
  layout.received = spec.received;
  layout.pooled_block = spec.pooled_block;
  layout.topk = spec.topk;
  layout.oracle = spec.oracle;
  layout.oracle_recall_k = 8;
  if (spec.dense)
    layout.dense_heads = {{0, 0}, {int32_t(spec.layers - 1), int32_t(spec.heads - 1)}};
  if (spec.gates) {
    layout.gates.push_back({"synthetic_gate", "deterministic score in (0, 1]", "1", 0.5, false});
    layout.gates.push_back({"forecast", "time-varying synthetic forecast", "1", NAN, true});
  }
  if (spec.series)
    layout.series.push_back({"cutoff", "synthetic per-head cutoff in (0, 1], NaN holes", "1"});
  if (spec.received) run.capture_levels += ",received";
  if (spec.pooled_block > 0) run.capture_levels += ",pooled";
  if (spec.topk > 0) run.capture_levels += ",topk:" + std::to_string(spec.topk);
  if (spec.dense) run.capture_levels += ",dense";
  if (spec.oracle) run.capture_levels += ",oracle";

  // Sizes inside the advertised ranges can still multiply past the machine:
  // refuse before allocating (token texts ~48 bytes each, the writer's share).
  const int64_t fed = spec.prefill_chunk > 0 ? std::min(spec.prefill_chunk, sy.P) : sy.P;
  const double bytes =
      double(sy.T) * 48 + TraceWriter::estimate_memory_bytes(run, layout, sy.T, fed, {});
  check_fits_in_memory("", "--layers x --kv-heads x tokens", bytes,
                       std::to_string(spec.layers) + " layers x " + std::to_string(spec.kv_heads) +
                           " kv heads x " + std::to_string(sy.T) + " tokens");
  texts_.resize(static_cast<size_t>(sy.T));
  for (int64_t t = 0; t < sy.T; ++t) {
    texts_[size_t(t)] = (t < sy.P ? " p" : " g") + std::to_string(t);
    if (t < sy.P) run.prompt += texts_[size_t(t)];
  }
}

int64_t SyntheticCapture::n_steps() const {
  return Synth(spec_).n_steps();
}

namespace {

// A step's tokens [a, b): ids, roles, texts and prompt offsets.
void add_tokens(const Synth& sy, const SyntheticSpec& spec, const std::vector<std::string>& texts,
                int64_t a, int64_t b, int32_t step, StepData* sd) {
  int64_t prompt_offset = 0;
  for (int64_t t = 0; t < std::min(a, sy.P); ++t) prompt_offset += int64_t(texts[size_t(t)].size());
  for (int64_t t = a; t < b; ++t) {
    TokenRecord tr;
    tr.id = static_cast<int32_t>(t % 1000);
    tr.position = static_cast<int32_t>(t);
    tr.role = t < sy.P ? (t == 0 ? TokenRole::Template : TokenRole::Prompt) : TokenRole::Generated;
    if (t >= spec.needle_begin && t < spec.needle_begin + spec.needle_tokens && t < sy.P)
      tr.role = TokenRole::Needle;
    if (t < sy.P && t >= sy.P - spec.question_tokens) tr.role = TokenRole::Question;
    tr.step = step;
    tr.text = texts[size_t(t)];
    if (t < sy.P) {
      tr.prompt_offset = prompt_offset;
      prompt_offset += static_cast<int64_t>(tr.text.size());
    } else {
      sd->generated_text += tr.text;
    }
    sd->tokens.push_back(tr);
  }
}

// Events, occupancy per tier and gate values of each head; the entries and
// bytes they add up to.
void add_heads(const Synth& sy, const SyntheticSpec& spec, int64_t R, int64_t a, int64_t b,
               int64_t s, StepData* sd) {
  const int32_t step = static_cast<int32_t>(s);
  sd->occupancy.assign(size_t(sy.L * sy.K * R), 0);
  sd->tier_bytes.assign(size_t(R), 0);
  for (int64_t l = 0; l < sy.L; ++l) {
    for (int64_t k = 0; k < sy.K; ++k) {
      add_head_events(sy, l, k, step, a, b, sd);
      for (int64_t j = 0; j < b; ++j) {
        int tier = sy.tier_of(l, k, j, b);
        if (tier >= 0) ++sd->occupancy[size_t((l * sy.K + k) * R + tier)];
      }
      for (int64_t j = a; j < b; ++j)
        if (spec.gates) {
          sd->gates.push_back(GateValue{0, int16_t(l), int16_t(k), int32_t(j),
                                        synthetic_gate(spec, l, k, j), false});
          sd->gates.push_back(
              GateValue{1, int16_t(l), int16_t(k), int32_t(j), unit(spec.seed, l, k, j, s), true});
        }
    }
  }
  for (int64_t i = 0; i < sy.L * sy.K; ++i)
    for (int64_t r = 0; r < R; ++r) {
      int64_t n = sd->occupancy[size_t(i * R + r)];
      sd->step.entries += n;
      sd->tier_bytes[size_t(r)] += n * 2 * 16 * 4;
    }
  sd->step.kv_bytes = std::accumulate(sd->tier_bytes.begin(), sd->tier_bytes.end(), int64_t(0));
}

void add_received(const Synth& sy, int64_t a, int64_t b, StepData* sd) {
  for (int64_t l = 0; l < sy.L; ++l)
    for (int64_t k = 0; k < sy.K; ++k) {
      std::vector<double> mass(size_t(b), 0.0);
      for (int64_t q = a; q < b; ++q)
        for (int64_t h = k * sy.group; h < (k + 1) * sy.group; ++h)
          for (auto [j, w] : sy.attention(l, h, q)) mass[size_t(j)] += w;
      ReceivedRow row{int16_t(l), int16_t(k), {}, {}};
      double norm = double((b - a) * sy.group);
      for (int64_t j = 0; j < b; ++j)
        if (sy.attended(l, k, j, b)) {
          row.tokens.push_back(int32_t(j));
          row.mass.push_back(static_cast<float>(mass[size_t(j)] / norm));
        }
      sd->received.push_back(std::move(row));
    }
}

void add_pooled(const Synth& sy, const SyntheticSpec& spec, int64_t a, int64_t b, StepData* sd) {
  const int64_t bsz = spec.pooled_block, KB = (sy.T + bsz - 1) / bsz;
  for (int64_t qb = a / bsz; qb <= (b - 1) / bsz; ++qb)
    for (int64_t l = 0; l < sy.L; ++l) {
      PooledRow row;
      row.layer = int16_t(l);
      row.query_block = int32_t(qb);
      row.max.resize(size_t(sy.H * KB));
      row.mean.resize(size_t(sy.H * KB));
      for (int64_t h = 0; h < sy.H; ++h)
        for (int64_t kb = 0; kb < KB; ++kb) {
          float m = pooled_pattern(spec, l, h, qb, kb);
          row.mean[size_t(h * KB + kb)] = m;
          row.max[size_t(h * KB + kb)] = std::min(1.0f, 3.0f * m);
        }
      sd->pooled.push_back(std::move(row));
    }
}

// Dense rows of the layout's heads and top-k rows of every head, per query.
void add_dense_topk(const Synth& sy, const SyntheticSpec& spec, const CaptureLayout& layout,
                    int64_t a, int64_t b, StepData* sd) {
  for (int64_t q = a; q < b; ++q) {
    for (size_t d = 0; d < layout.dense_heads.size(); ++d) {
      DenseRow row{int32_t(d), int32_t(q), std::vector<float>(size_t(sy.T), 0.0f)};
      for (auto [j, w] : sy.attention(layout.dense_heads[d].first, layout.dense_heads[d].second, q))
        row.weight[size_t(j)] = w;
      sd->dense.push_back(std::move(row));
    }
    if (spec.topk <= 0) continue;
    TopkRow row;
    row.token = int32_t(q);
    for (int64_t l = 0; l < sy.L; ++l)
      for (int64_t h = 0; h < sy.H; ++h) {
        auto att = sy.attention(l, h, q);
        std::stable_sort(att.begin(), att.end(),
                         [](auto& x, auto& y) { return x.second > y.second; });
        for (int64_t i = 0; i < spec.topk; ++i) {
          bool have = i < int64_t(att.size());
          row.index.push_back(have ? att[size_t(i)].first : -1);
          row.weight.push_back(have ? att[size_t(i)].second : 0.0f);
        }
      }
    sd->topk.push_back(std::move(row));
  }
}

void add_oracle(const Synth& sy, const SyntheticSpec& spec, int64_t s, StepData* sd) {
  sd->has_oracle = true;
  sd->oracle.kl = 0.001f * unit(spec.seed, s, 0, 0, 1);
  for (int64_t l = 0; l < sy.L; ++l)
    for (int64_t h = 0; h < sy.H; ++h)
      sd->oracle.lost_mass.push_back(0.05f * unit(spec.seed, s, l, h, 2));
  for (int64_t l = 0; l < sy.L; ++l)
    for (int64_t k = 0; k < sy.K; ++k)
      sd->oracle.recall.push_back(1.0f - 0.2f * unit(spec.seed, s, l, k, 3));
}

}  // namespace

StepData SyntheticCapture::step(int64_t s) const {
  const SyntheticSpec& spec = spec_;
  Synth sy(spec);
  const int64_t R = spec.tiers > 1 ? 2 : 1;
  const int64_t a = sy.step_first(s), b = sy.step_end(s);
  StepData sd;
  sd.step.kind = s < sy.prefill_steps() ? StepKind::Prefill : StepKind::Decode;
  sd.step.first_token = static_cast<int32_t>(a);
  sd.step.n_tokens = static_cast<int32_t>(b - a);
  sd.step.t_start_s = 0.01 * double(s);
  sd.step.wall_s = 0.01;
  add_tokens(sy, spec, texts_, a, b, static_cast<int32_t>(s), &sd);
  add_heads(sy, spec, R, a, b, s, &sd);
  if (spec.series)
    for (int64_t l = 0; l < sy.L; ++l)
      for (int64_t k = 0; k < sy.K; ++k) sd.series.push_back(synthetic_series(spec, s, l, k));
  sd.stalls = synthetic_stalls(spec, s);
  if (spec.received) add_received(sy, a, b, &sd);
  if (spec.pooled_block > 0) add_pooled(sy, spec, a, b, &sd);
  add_dense_topk(sy, spec, layout_, a, b, &sd);
  if (spec.oracle) add_oracle(sy, spec, s, &sd);
  return sd;
}

int64_t write_synthetic_trace(const std::string& path, const SyntheticSpec& spec,
                              TraceWriter::Options options, int64_t stop_after_steps) {
  SyntheticCapture capture(spec);
  auto writer = TraceWriter::create(path, capture.run(), capture.layout(), std::move(options));
  for (int64_t s = 0; s < capture.n_steps(); ++s) {
    if (stop_after_steps >= 0 && s >= stop_after_steps) return s;
    writer->append_step(capture.step(s));
  }
  writer->close(GenerationSummary{});
  return capture.n_steps();
}

}  // namespace kvscope::trace
