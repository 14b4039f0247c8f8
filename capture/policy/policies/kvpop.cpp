// kvpop: KVpop (Hauzenberger et al., "KVpop: Key-Value Cache Compression with
// Predictive Online Pruning", seed 003). Every kv head keeps the first s sink
// tokens, a protected window of the w most recent tokens and a long-range
// top-k of the older ("eligible") tokens, B = s + w + k on every head (eq. 1).
// A learned scorer gives each token a raw score r (MLP on [k; v], or an mLSTM
// read out when the token leaves the window: "delayed", E.4); eligible tokens
// rank by the effective score r + floor((q - t)/n) log gamma_h (eq. 5/18).
//   step     the token q - w of each new query q leaves the window and joins
//            the eligible set; each query attends the sinks, its window and
//            the k best eligible tokens (eq. 26: the running top-k, by a
//            Fenwick tree over the ranks of the step's eligible tokens,
//            appendix C); after the layer attended, the window leavers that
//            made the top-k move to the long-range tier, the others and the
//            long-range entries that fell out of it are evicted.
// Decode is the one-query case: the leaver is kept iff it beats the worst
// long-range entry, which is then evicted. Tiers: sink, window, long-range.
// The cutoff (the k-th best effective score) is recorded per step and head
// as the series kvpop_cutoff. docs/policies/kvpop.md
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "capture/gates/kvpop_math.h"
#include "capture/gates/kvpop_scorer.h"
#include "capture/policy/budget.h"
#include "capture/policy/policies/descriptors.h"
#include "core/common/check.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

namespace kv = gates::kvpop;

constexpr int kSink = 0, kWindow = 1, kLongRange = 2;
constexpr uint16_t kNewToken = 0, kSinkReason = 1, kKept = 2, kDropped = 3, kDisplaced = 4;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The budget as given on the spec (-1: the scorer file's).
struct KvpopSpec {
  std::string gates, kind;
  int64_t sinks = -1, window = -1, topk = -1, budget = 0;
  double compression = 0;
};

// One head's decisions of a step, made at selection, applied after attention.
struct HeadPlan {
  std::vector<int64_t> keep_exits, drop;  // window leavers kept; entries to evict
  std::vector<float> keep_score, drop_score;
  float cutoff = kNaN;
};

class KvpopPolicy : public Policy {
 public:
  explicit KvpopPolicy(KvpopSpec spec) : spec_(std::move(spec)) {}
  std::vector<PartKind> kinds() const override {
    return {PartKind::Admission, PartKind::Selection, PartKind::Eviction, PartKind::Placement};
  }

  void setup(const PolicySetup& s) override;
  std::vector<cache::TierSpec> tiers() const override {
    return {{"sink", cache::RowFormat::F32, true},
            {"window", cache::RowFormat::F32, true},
            {"long-range", cache::RowFormat::F32, true}};
  }
  std::vector<std::string> reason_names() const override {
    return {"new token (window)", "sink", "kept: above cutoff", "evicted at boundary: below cutoff",
            "displaced: fell below cutoff"};
  }
  std::vector<trace::GateSpec> gates() const override {
    return {
        {"kvpop_score",
         "KVpop learned importance r of the token (MLP on [k; v], or the mLSTM read out when the "
         "token leaves the window); ranking adds floor((q - t)/n) log gamma_h",
         "log future attention (learned)", std::numeric_limits<double>::quiet_NaN(), false}};
  }
  std::vector<trace::SeriesSpec> series() const override {
    return {{"kvpop_cutoff",
             "effective score of the k-th best long-range entry after the step (the keep/evict "
             "boundary); NaN while fewer than k tokens compete",
             "log future attention (learned)"}};
  }
  std::string budget_kind() const override { return "head"; }
  int64_t budget() const override { return cfg_.sinks + cfg_.window + cfg_.topk; }
  HeldLimit held_limit(const LayerContext&) const override { return {budget(), -1}; }
  std::vector<std::pair<std::string, double>> resolved_params() const override {
    return {{"sinks", double(cfg_.sinks)},
            {"window", double(cfg_.window)},
            {"topk", double(cfg_.topk)},
            {"budget", double(budget())}};
  }
  std::string describe() const override {
    return std::string("KVpop, ") + (cfg_.mlstm ? "mLSTM" : "MLP") + " scorer" +
           (cfg_.mlstm ? (cfg_.delayed ? " (delayed readout)" : " (immediate readout)") : "") +
           ": " + std::to_string(cfg_.sinks) + " sinks + window " + std::to_string(cfg_.window) +
           " + long-range top-" + std::to_string(cfg_.topk);
  }

  void admit(AdmitContext& c) override;
  void select(SelectContext& c) override;
  void after_attention(LayerContext& c) override;

 private:
  void resolve_budget(const PolicySetup& s);
  void score_mlstm(AdmitContext& c, const torch::Tensor& x);
  void set_score(Decisions& d, int64_t layer, int64_t h, int64_t pos, float r) {
    raw_.at(layer, h)[pos] = r;
    d.gate(0, layer, h, pos, r, false);
  }
  // r + floor((q - t)/n) log gamma_h: the effective score at query q (eq. 18).
  float effective(int64_t layer, int64_t h, int64_t t, int64_t q) const {
    const double age = double((q - t) / cfg_.decay_step);
    return float(double(raw_.at(layer, h)[t]) + age * log_gamma_[size_t(layer * K_ + h)]);
  }
  HeadPlan plan_head(const SelectContext& c, int64_t h, torch::Tensor* mask) const;

  KvpopSpec spec_;
  gates::GateSet gates_;
  gates::KvpopConfig cfg_;
  int64_t K_ = 0;
  std::vector<double> log_gamma_;          // [L * K]
  HeadScores raw_;                         // r per position, NaN until scored
  std::vector<gates::MlstmState> state_;   // per layer
  std::vector<torch::Tensor> query_ring_;  // per layer [K, w, F]: read features of the window
  std::vector<HeadPlan> plans_;            // this layer's, per head
};

void KvpopPolicy::resolve_budget(const PolicySetup& s) {
  if (spec_.sinks >= 0) cfg_.sinks = spec_.sinks;
  if (spec_.window >= 0) cfg_.window = spec_.window;
  if (spec_.topk >= 0) cfg_.topk = spec_.topk;
  int64_t B = spec_.budget;
  if (spec_.compression > 0)
    B = std::max<int64_t>(1,
                          int64_t(std::llround((1.0 - spec_.compression) * double(s.max_tokens))));
  if (B > 0) {
    cfg_.topk = B - cfg_.sinks - cfg_.window;
    if (cfg_.topk < 1)
      throw InputError("--policy", spec_.compression > 0 ? "kvpop:compression" : "kvpop:budget",
                       "the budget B = " + std::to_string(B) +
                           " leaves no long-range top-k beside " + std::to_string(cfg_.sinks) +
                           " sinks and a window of " + std::to_string(cfg_.window) +
                           " (expected B > s + w)");
  }
  if (cfg_.window < 1)
    throw InputError("--policy", "kvpop:window", "a window of at least 1 expected");
  if (budget() > s.max_tokens)
    throw InputError("--policy", "kvpop:topk",
                     "s + w + k = " + std::to_string(cfg_.sinks) + " + " +
                         std::to_string(cfg_.window) + " + " + std::to_string(cfg_.topk) + " = " +
                         std::to_string(budget()) + " is larger than the context (" +
                         std::to_string(s.max_tokens) +
                         " tokens): nothing would be evicted (expected B <= the context)");
}

void KvpopPolicy::setup(const PolicySetup& s) {
  Policy::setup(s);
  gates_ = gates::load_gates(spec_.gates, *s.model);
  cfg_ = gates::kvpop_config(gates_);
  const std::string file_kind = cfg_.mlstm ? "mlstm" : "mlp";
  if (spec_.kind != "auto" && spec_.kind != file_kind)
    throw InputError(spec_.gates, "policy",
                     "kvpop:kind=" + spec_.kind + " asks for a " + spec_.kind +
                         " scorer; this file holds a kvpop-" + file_kind + " scorer");
  const nlohmann::json& base = gates_.meta.value("base_model", nlohmann::json::object());
  if (base.is_object() && base.contains("name") && base["name"].is_string() &&
      base["name"].get<std::string>() != s.model->name)
    throw InputError(spec_.gates, "base_model.name",
                     "the scorer was trained for " + base["name"].get<std::string>() +
                         ", not for " + s.model->name + " (expected a scorer of this model)");
  resolve_budget(s);
  K_ = s.model->n_kv_heads;
  const int64_t L = s.model->n_layers;
  raw_.resize(L, K_, s.max_tokens, kNaN);
  log_gamma_.resize(size_t(L * K_));
  torch::NoGradGuard no_grad;
  for (int64_t l = 0; l < L; ++l) {
    torch::Tensor lg = gates::kvpop_log_gamma(gates_, l).to(torch::kFloat64).contiguous();
    for (int64_t h = 0; h < K_; ++h) log_gamma_[size_t(l * K_ + h)] = lg.data_ptr<double>()[h];
  }
  if (cfg_.mlstm) {
    const int64_t P = int64_t(gates_.hyper("proj"));
    for (int64_t l = 0; l < L; ++l) {  // one tensor each: the ring is written in place
      state_.push_back(gates::mlstm_initial_state(K_, 2 * P, P));
      query_ring_.push_back(torch::zeros({K_, cfg_.window, 2 * P}));
    }
  }
}

void KvpopPolicy::admit(AdmitContext& c) {
  torch::NoGradGuard no_grad;
  for (int64_t h = 0; h < K_; ++h)
    for (int64_t i = 0; i < c.n; ++i)
      c.at(h, i) = c.pos0 + i < cfg_.sinks ? Admission{kSink, false, kNoScore, kSinkReason}
                                           : Admission{kWindow, false, kNoScore, kNewToken};
  torch::Tensor x = gates::kvpop_inputs(c.in.k, c.in.v);  // [K, n, 2hd]
  if (cfg_.mlstm) return score_mlstm(c, x);
  torch::Tensor r = gates::kvpop_mlp_scores(gates_, c.layer, x).contiguous();
  for (int64_t h = 0; h < K_; ++h)
    for (int64_t i = 0; i < c.n; ++i)
      set_score(c.decide, c.layer, h, c.pos0 + i, r.data_ptr<float>()[h * c.n + i]);
}

// The memory takes each new token in order; the delayed readout scores the
// token that token pushes out of the window (u = p - w) from the memory that
// has seen everything up to p (eq. 41); the immediate one scores p itself.
void KvpopPolicy::score_mlstm(AdmitContext& c, const torch::Tensor& x) {
  gates::MlstmTokens tok = gates::mlstm_tokens(gates_, c.layer, x);
  gates::MlstmState& st = state_[size_t(c.layer)];
  torch::Tensor& ring = query_ring_[size_t(c.layer)];  // [K, w, F]
  const int64_t w = cfg_.window, F = ring.size(2);
  KVSCOPE_CHECK(tok.q.is_contiguous() && ring.is_contiguous(), "kvpop: query features layout");
  const float* tq = tok.q.data_ptr<float>();  // [K, n, F]
  float* rq = ring.data_ptr<float>();
  std::vector<float> q(static_cast<size_t>(K_ * F)), r(static_cast<size_t>(K_));
  for (int64_t i = 0; i < c.n; ++i) {
    const int64_t p = c.pos0 + i, u = cfg_.delayed ? p - w : p;
    gates::mlstm_write(st, tok, i);
    if (u >= 0) {
      for (int64_t h = 0; h < K_; ++h) {
        const float* src = cfg_.delayed ? rq + (h * w + u % w) * F : tq + (h * c.n + i) * F;
        std::copy_n(src, F, q.data() + h * F);
      }
      gates::mlstm_read_scores(gates_, c.layer, st, q.data(), r.data());
      for (int64_t h = 0; h < K_; ++h) set_score(c.decide, c.layer, h, u, r[size_t(h)]);
    }
    for (int64_t h = 0; h < K_; ++h)  // after the read: u shares p's slot
      std::copy_n(tq + (h * c.n + i) * F, F, rq + (h * w + p % w) * F);
  }
}

// The running top-k of one head over the step's queries (appendix C): the
// eligible tokens (held, s <= t <= last - w) rank once by their effective
// score at the step's last query (for n = 1 the same order as at every
// query, eq. 19-20); a Fenwick tree over ranks gives each query's cutoff as
// its leavers join. Hidden from query q: eligible tokens ranked below its cutoff.
HeadPlan KvpopPolicy::plan_head(const SelectContext& c, int64_t h, torch::Tensor* mask) const {
  const std::vector<int64_t>& cand = c.candidates[size_t(h)];
  const int64_t last = c.pos0 + c.n - 1, s = cfg_.sinks, w = cfg_.window;
  std::vector<int64_t> elig;  // indices into cand
  std::vector<float> prio;
  for (size_t j = 0; j < cand.size(); ++j)
    if (cand[j] >= s && cand[j] <= last - w) {
      elig.push_back(int64_t(j));
      prio.push_back(effective(c.layer, h, cand[j], last));
    }
  HeadPlan plan;
  auto leaves_window = [&](int64_t t) { return c.cache.tier_of(c.layer, h, t) == kWindow; };
  if (int64_t(elig.size()) <= cfg_.topk) {  // nothing to evict: every leaver is kept
    for (size_t e = 0; e < elig.size(); ++e)
      if (leaves_window(cand[size_t(elig[e])])) {
        plan.keep_exits.push_back(cand[size_t(elig[e])]);
        plan.keep_score.push_back(prio[e]);
      }
    return plan;
  }
  const std::vector<int32_t> rank = kv::static_ranks(prio.data(), int64_t(prio.size()));
  // Eligible before the step's first query in position order, then one leaver per query.
  std::vector<size_t> order(elig.size());
  for (size_t e = 0; e < order.size(); ++e) order[e] = e;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return cand[size_t(elig[a])] < cand[size_t(elig[b])]; });
  kv::Fenwick tree(int64_t(elig.size()));
  size_t next = 0;
  std::vector<int32_t> cutoff(size_t(c.n), kv::kAllKept);
  for (int64_t i = 0; i < c.n; ++i) {
    while (next < order.size() && cand[size_t(elig[order[next]])] <= c.pos0 + i - w)
      tree.insert(rank[order[next++]]);
    if (tree.count() >= cfg_.topk) cutoff[size_t(i)] = tree.find_by_prefix_count(cfg_.topk);
  }
  if (mask) {
    // Built only when it hides something: a decode step's tensor ops per
    // head cost more than the plan (docs/performance.md).
    torch::Tensor m;
    for (size_t e = 0; e < elig.size(); ++e) {
      const int64_t t = cand[size_t(elig[e])];
      for (int64_t i = std::max<int64_t>(0, t + w - c.pos0); i < c.n; ++i) {
        if (kv::kept(rank[e], cutoff[size_t(i)])) continue;
        if (!m.defined()) m = torch::ones({c.n, int64_t(cand.size())}, torch::kBool);
        m.data_ptr<bool>()[i * int64_t(cand.size()) + elig[e]] = false;
      }
    }
    *mask = m;
  }
  const int32_t final_cut = cutoff[size_t(c.n - 1)];
  for (size_t e = 0; e < elig.size(); ++e) {
    const int64_t t = cand[size_t(elig[e])];
    if (!kv::kept(rank[e], final_cut)) {
      plan.drop.push_back(t);
      plan.drop_score.push_back(prio[e]);
    } else if (leaves_window(t)) {
      plan.keep_exits.push_back(t);
      plan.keep_score.push_back(prio[e]);
    }
    if (rank[e] == final_cut) plan.cutoff = prio[e];
  }
  return plan;
}

void KvpopPolicy::select(SelectContext& c) {
  plans_.assign(size_t(K_), HeadPlan{});
  for (int64_t h = 0; h < K_; ++h) {
    torch::Tensor mask;
    plans_[size_t(h)] = plan_head(c, h, &mask);
    // A decode query that hides nothing needs no mask (the leaver is kept
    // and nothing was over k, or the loser is evicted after attention either way).
    if (mask.defined()) c.masks[size_t(h)] = mask;
  }
}

void KvpopPolicy::after_attention(LayerContext& c) {
  for (int64_t h = 0; h < K_; ++h) {
    const HeadPlan& p = plans_[size_t(h)];
    for (size_t i = 0; i < p.keep_exits.size(); ++i)
      c.decide.move(c.layer, h, p.keep_exits[i], kLongRange, p.keep_score[i], kKept);
    for (size_t i = 0; i < p.drop.size(); ++i) {
      const int64_t t = p.drop[i];
      const bool leaver = c.cache.tier_of(c.layer, h, t) == kWindow;
      c.decide.evict(c.layer, h, t, p.drop_score[i], leaver ? kDropped : kDisplaced);
    }
    c.decide.series(0, c.layer, h, p.cutoff);
  }
}

}  // namespace

PolicyDescriptor kvpop_descriptor() {
  PolicyDescriptor d = {
      "kvpop",
      "learned fixed-budget top-k: sinks + window + long-range top-k by a learned scorer (MLP, or "
      "mLSTM with delayed readout)",
      "Hauzenberger et al., KVpop: Key-Value Cache Compression with Predictive Online Pruning, "
      "seed 003",
      "docs/policies/kvpop.md",
      {{"gates", ParamType::String, "", "scorer file (kind kvpop-mlp or kvpop-mlstm)"},
       {"kind", ParamType::String, "auto", "scorer kind the file must hold: auto, mlp or mlstm"},
       {"sinks", ParamType::Int, "-1", "s, sink tokens (-1: the scorer file's)", -1},
       {"window", ParamType::Int, "-1", "w, protected recent window (-1: the scorer file's)", -1},
       {"topk", ParamType::Int, "-1", "k, long-range top-k (-1: the scorer file's)", -1},
       {"budget", ParamType::Int, "0", "B = s + w + k per head; sets k (0: unused)", 0},
       {"compression", ParamType::Float, "0",
        "fraction of the context removed: B = (1 - compression) * (prompt + max new); sets k (0: "
        "unused)",
        0, 0.999}},
      [](const Params& p) {
        KvpopSpec s{p.get_string("gates"),     p.get_string("kind"), p.get_int("sinks"),
                    p.get_int("window"),       p.get_int("topk"),    p.get_int("budget"),
                    p.get_float("compression")};
        if (s.kind != "auto" && s.kind != "mlp" && s.kind != "mlstm")
          throw InputError("--policy", "kvpop:kind",
                           "'" + s.kind + "' (expected auto, mlp or mlstm)");
        if (s.gates.empty())
          throw InputError("--policy", "kvpop:gates",
                           "a scorer file is required (e.g. "
                           "kvpop:gates=resources/gates/<model>-kvpop-mlstm.safetensors)");
        if (s.budget > 0 && s.compression > 0)
          throw InputError("--policy", "kvpop:budget", "give budget or compression, not both");
        if (s.window == 0)
          throw InputError("--policy", "kvpop:window", "a window of at least 1 expected");
        return std::make_unique<KvpopPolicy>(std::move(s));
      }};
  d.gate_kinds = {"kvpop-mlstm", "kvpop-mlp"};
  return d;
}

}  // namespace kvscope::policy
