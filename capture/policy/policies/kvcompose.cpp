// kvcompose: KVCompose (Akulov et al., "KVCompose: Efficient Structured KV
// Cache Compression with Composite Tokens", 2025, arXiv 2509.05165; kvpress
// KVComposePress). After the prefill the model reads its prompt a second time
// (a reconstruction pass that feeds the prompt again over the cache, as
// kvpress's forward over the context ids does) and each prompt entry is
// scored by the attention the repeat's queries give it:
//   a(l, g, j) = max over repeat queries i of p_lgi(j)      (task=max; or mean)
//   s(l, h, j) = mean over query heads g of h of a(l, g, j)  (group=mean; or max)
//   s(l, h, j) += mean over kv heads h' of s(l, h', j)       (mean_across_heads)
// Each head's scores sorted in decreasing order are its "composite" slots:
// slot r of a layer stands for the r-th best entry of every head. The slot's
// score is the mean over heads of their r-th best score (head=mean); layer 0's
// slots take the largest score any layer has at that rank. The L*budget best
// slots of all layers decide how many entries each layer keeps (structured:
// every head of a layer keeps the same count, at least max(1, floor)); with
// structured=false the L*K*budget best per-head slots decide a count per head.
// Each head keeps its `count` best entries, wherever they are: per-head memory
// is freed (kvpress's structured variant stacks them into a dense tensor).
// docs/policies/kvcompose.md
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "capture/policy/policies/descriptors.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

// kvpress's lower bound: the first `floor` slots of every head and layer are
// lifted above every score.
constexpr float kLift = 1e9f;

// Ranked best first: the higher value, then the lower index (kvpress's topk
// leaves ties to its kernel; KVScope fixes them).
std::vector<int64_t> best_first(const std::vector<float>& v) {
  std::vector<int64_t> order(v.size());
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return v[size_t(a)] > v[size_t(b)]; });
  return order;
}

// The `n` best slots of `slots` ([groups][T] flattened) counted per group.
std::vector<int64_t> count_best(const std::vector<float>& slots, int64_t groups, int64_t T,
                                int64_t n) {
  std::vector<int64_t> counts(size_t(groups), 0);
  const std::vector<int64_t> order = best_first(slots);
  for (int64_t i = 0; i < std::min<int64_t>(n, int64_t(order.size())); ++i)
    ++counts[size_t(order[size_t(i)] / T)];
  return counts;
}

}  // namespace

std::vector<int64_t> kvcompose_counts(const std::vector<float>& scores, int64_t L, int64_t K,
                                      int64_t T, int64_t budget, bool structured, bool head_max,
                                      int64_t floor) {
  // Each head's scores, best first: its composite slots.
  std::vector<float> sorted(scores.size());
  for (int64_t i = 0; i < L * K; ++i) {
    std::copy(scores.begin() + i * T, scores.begin() + (i + 1) * T, sorted.begin() + i * T);
    std::sort(sorted.begin() + i * T, sorted.begin() + (i + 1) * T, std::greater<float>());
  }
  const int64_t lifted = std::min(floor, T);
  if (!structured) {
    for (int64_t i = 0; i < L * K; ++i)
      for (int64_t r = 0; r < lifted; ++r) sorted[size_t(i * T + r)] += kLift;
    return count_best(sorted, L * K, T, L * K * budget);
  }
  // The layer's slot r: the mean (or max) over its heads of their r-th best.
  std::vector<float> per_layer(size_t(L * T));
  for (int64_t l = 0; l < L; ++l)
    for (int64_t r = 0; r < T; ++r) {
      float acc = head_max ? -INFINITY : 0.0f;
      for (int64_t h = 0; h < K; ++h) {
        const float s = sorted[size_t((l * K + h) * T + r)];
        acc = head_max ? std::max(acc, s) : acc + s;
      }
      per_layer[size_t(l * T + r)] =
          (head_max ? acc : acc / float(K)) + (r < lifted ? kLift : 0.0f);
    }
  for (int64_t r = 0; r < T; ++r)  // layer 0 keeps the most (kvpress)
    for (int64_t l = 1; l < L; ++l)
      per_layer[size_t(r)] = std::max(per_layer[size_t(r)], per_layer[size_t(l * T + r)]);
  std::vector<int64_t> layer_counts = count_best(per_layer, L, T, L * budget);
  std::vector<int64_t> counts(size_t(L * K));
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < K; ++h)
      counts[size_t(l * K + h)] =
          std::min(T, std::max(layer_counts[size_t(l)], std::max<int64_t>(1, floor)));
  return counts;
}

namespace {

class KvcomposePolicy : public Policy {
 public:
  struct Options {
    int64_t budget = 0, floor = 0;
    bool structured = true, task_max = true, group_max = false, head_max = false;
    bool v_norm = false, mean_across_heads = true;
  };
  explicit KvcomposePolicy(const Options& o) : o_(o) {}

  std::vector<std::string> reason_names() const override {
    return {"new token", "below its head's composite-token count"};
  }
  std::vector<trace::GateSpec> gates() const override {
    return {{"kvcompose",
             "KVCompose score: the attention the prompt's second reading gave the entry (" +
                 std::string(o_.task_max ? "max" : "mean") + " over queries, " +
                 (o_.group_max ? "max" : "mean") + " over the group's heads" +
                 (o_.v_norm ? ", x ||v||" : "") +
                 (o_.mean_across_heads ? ", plus the layer's mean over kv heads" : "") + ")",
             "probability"}};
  }
  cache::StatsNeeds stats_needs() const override {
    cache::StatsNeeds n;
    if (o_.task_max) {
      n.peak = true;
      n.peak_per_query_head = !o_.group_max;
    } else if (o_.group_max) {
      n.received_per_query_head = true;  // the mean over the queries, per query head
    } else {
      n.received = true;  // the mean over the queries and the group's heads
    }
    return n;
  }
  std::string budget_kind() const override { return "global"; }
  int64_t budget() const override {
    if (!setup_.model) return o_.budget;
    return o_.budget * setup_.model->n_kv_heads * setup_.model->n_layers;
  }
  std::vector<PartKind> kinds() const override { return {PartKind::Eviction}; }
  std::string describe() const override {
    return std::string("the prompt read a second time, attention per entry; ") +
           (o_.structured ? "composite tokens: one count per layer" : "one count per head") +
           " from the L*" + (o_.structured ? "" : "K*") + "budget best ranks of all layers";
  }

  bool plans_capture() const override { return true; }
  CapturePlan plan(const PlanInputs& in) override {
    if (in.prompt.empty()) throw InputError("--policy", "kvcompose", "the prompt is empty");
    // One step holding the whole prompt again; its queries' softmax is over
    // the whole cache and their own tokens (kvpress's eager attention).
    CapturePlan p;
    p.reconstruction.push_back({in.prompt, {}});
    return p;
  }

  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    T_ = s.prompt_tokens;
    scores_.assign(size_t(s.model->n_layers * s.model->n_kv_heads * T_), 0.0f);
  }

  void after_attention(LayerContext& c) override {
    if (c.reconstruction < 0) return;
    const int64_t K = c.cache.n_kv_heads(), R = c.cache.n_heads() / K, hd = c.cache.head_dim();
    std::vector<float> key(static_cast<size_t>(hd)), value(static_cast<size_t>(hd));
    for (int64_t h = 0; h < K; ++h) {
      float* row = scores_.data() + (c.layer * K + h) * T_;
      for (int64_t p = 0; p < T_; ++p) row[p] = entry_score(c.stats, h, R, p);
      if (!o_.v_norm) continue;
      for (int64_t p = 0; p < T_; ++p) {
        c.cache.read_entry(c.layer, h, p, key.data(), value.data());
        double sq = 0;
        for (float x : value) sq += double(x) * x;
        row[p] *= float(std::sqrt(sq));
      }
    }
  }

  void end_step(StepContext& c) override {
    if (c.reconstruction < 0 || c.reconstruction != c.reconstruction_chunks - 1) return;
    const int64_t L = c.cache.n_layers(), K = c.cache.n_kv_heads();
    if (o_.mean_across_heads) add_head_mean(L, K);
    const std::vector<int64_t> counts =
        kvcompose_counts(scores_, L, K, T_, o_.budget, o_.structured, o_.head_max, o_.floor);
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < K; ++h) {
        const std::vector<float> row(scores_.begin() + (l * K + h) * T_,
                                     scores_.begin() + (l * K + h + 1) * T_);
        for (int64_t p = 0; p < T_; ++p) c.decide.gate(0, l, h, p, row[size_t(p)], false);
        const std::vector<int64_t> order = best_first(row);
        for (size_t i = size_t(counts[size_t(l * K + h)]); i < order.size(); ++i)
          c.decide.evict(l, h, order[i], row[size_t(order[i])], 1);
      }
  }

 private:
  // The repeat's attention on prompt entry p of kv head h.
  float entry_score(const cache::LayerStats& st, int64_t h, int64_t R, int64_t p) const {
    if (!o_.task_max && !o_.group_max) return st.received[size_t(h)][size_t(p)];
    if (!o_.task_max) {  // the largest of the group's heads' means over the queries
      float best = 0;
      for (int64_t r = 0; r < R; ++r)
        best = std::max(best, st.received_by_query_head[size_t(h * R + r)][size_t(p)]);
      return best;
    }
    if (o_.group_max) return st.peak[size_t(h)][size_t(p)];
    float sum = 0;  // in kvpress's order: the group's heads one after another
    for (int64_t r = 0; r < R; ++r) sum += st.peak[size_t(h * R + r)][size_t(p)];
    return sum / float(R);
  }

  // kvpress's add_mean_across_heads: each position's mean over the layer's
  // kv heads is added to every head's score.
  void add_head_mean(int64_t L, int64_t K) {
    for (int64_t l = 0; l < L; ++l)
      for (int64_t p = 0; p < T_; ++p) {
        float sum = 0;
        for (int64_t h = 0; h < K; ++h) sum += scores_[size_t((l * K + h) * T_ + p)];
        const float mean = sum / float(K);
        for (int64_t h = 0; h < K; ++h) scores_[size_t((l * K + h) * T_ + p)] += mean;
      }
  }

  Options o_;
  int64_t T_ = 0;
  std::vector<float> scores_;  // [L][K][T]
};

bool aggregation_is_max(const Params& p, const std::string& name) {
  const std::string& v = p.get_string(name);
  if (v != "max" && v != "mean")
    throw InputError("--policy", "kvcompose:" + name, "'max' or 'mean' expected, got '" + v + "'");
  return v == "max";
}

}  // namespace

PolicyDescriptor kvcompose_descriptor() {
  return {"kvcompose",
          "read the prompt a second time and score each entry by the attention it gets; "
          "composite tokens set one count per layer from the best ranks of all layers",
          "Akulov et al., KVCompose: Efficient Structured KV Cache Compression with Composite "
          "Tokens, 2025 (kvpress KVComposePress)",
          "docs/policies/kvcompose.md",
          {{"budget", ParamType::Int, "256",
            "entries kept per (layer, kv head) on average: L*K*budget in all (a fraction of the "
            "prompt: budget=0.25)",
            1},
           {"structured", ParamType::Bool, "true",
            "one count per layer, the same for its heads (composite tokens); false: one count per "
            "head"},
           {"task", ParamType::String, "max",
            "how the repeat's queries are aggregated per entry: max or mean (kvpress agg_task)"},
           {"group", ParamType::String, "mean",
            "how a kv head's query heads are aggregated: mean or max (kvpress agg_group)"},
           {"head", ParamType::String, "mean",
            "how a layer's heads make a composite slot's score: mean or max (kvpress agg_head)"},
           {"v_norm", ParamType::Bool, "false",
            "multiply each score by the entry's ||v|| (kvpress add_v_norm)"},
           {"mean_across_heads", ParamType::Bool, "true",
            "add each position's mean over the layer's kv heads to every head's score"},
           {"floor", ParamType::Int, "0",
            "the first floor ranks of every head and layer are always kept (kvpress "
            "keep_token_lower_bound)",
            0}},
          [](const Params& p) -> std::unique_ptr<Policy> {
            KvcomposePolicy::Options o;
            o.budget = p.get_int("budget");
            o.floor = p.get_int("floor");
            o.structured = p.get_bool("structured");
            o.task_max = aggregation_is_max(p, "task");
            o.group_max = aggregation_is_max(p, "group");
            o.head_max = aggregation_is_max(p, "head");
            o.v_norm = p.get_bool("v_norm");
            o.mean_across_heads = p.get_bool("mean_across_heads");
            return std::make_unique<KvcomposePolicy>(o);
          }};
}

}  // namespace kvscope::policy
