// kvzip: KVzip (Kim et al., "KVzip: Query-Agnostic KV Cache Compression with
// Context Reconstruction", 2025; kvpress KVzipPress). After the prefill the
// model is asked to repeat its context: a reconstruction pass feeds
//   "\n\nRepeat the previous context exactly." + "\n" + context
// (chunked: later chunks ask to "Repeat the part of the previous context
// exactly, starting with" + the previous chunk's last 8 tokens) over the
// cache. Each context entry's score is the largest attention weight any
// reconstruction query of its kv head's group puts on it,
//   s(l, h, j) = max over queries i and query heads g of h of p_lgi(j),
// with p the softmax over the attention sinks, the chunk being reconstructed
// and the repeat tokens (kvpress's chunked scoring; the whole cache when one
// chunk holds the context). The first `sinks` positions score above all;
// the L*K*(T - budget) lowest scores over all layers and heads are evicted
// (layerwise=true: K*(T - budget) per layer), so heads keep unequal budgets.
// KVzip+ (plus=true, kvpress kvzip_plus_normalization): each weight is first
// divided by ||h_i||, the norm of query i's normalised layer input, and
// multiplied by ||v_j W_O^g||, what the entry's value writes into the
// residual stream through query head g:
//   s(l, h, j) = max over g of ||v_j W_O^g|| * max over i of p_lgi(j) / ||h_i||.
// The engine runs the pass (CapturePlan::reconstruction, StepDriver side steps);
// the pass's own entries never stay. docs/policies/kvzip.md
#include <algorithm>
#include <vector>

#include "capture/policy/policies/descriptors.h"
#include "capture/policy/policies/kvgrad_attribution.h"
#include "capture/policy/policies/kvzip_selection.h"
#include "capture/policy/policies/output_projection.h"
#include "capture/tokenizer/tokenizer.h"
#include "core/common/input_error.h"

namespace kvscope::policy {

namespace {

// kvpress's repeat prompts and its tail of the previous chunk.
constexpr const char* kFirstPrompt = "\n\nRepeat the previous context exactly.";
constexpr const char* kNextPrompt =
    "\n\nRepeat the part of the previous context exactly, starting with";
constexpr const char* kSuffix = "\n";  // kvpress's suffix for a model without a chat template
constexpr int64_t kPreviousTail = 8;

// kvpress's split of the chat template around a user message: the tokens
// before its content (the prefix, never reconstructed) and after it (the
// suffix S of the repeat prompts: the end of the turn and the assistant's
// header). False when the tokenizer has no chat template (kvpress then uses
// no prefix and S = "\n") or KVScope cannot render it.
bool chat_template_split(const tokenizer::Tokenizer& tok, std::vector<int32_t>* prefix,
                         std::vector<int32_t>* suffix) {
  if (tok.chat_template().empty()) return false;
  const std::string dummy = "dummy context", separator = "\n" + std::string(dummy.size(), '#');
  std::string text;
  try {
    text = tok.apply_chat_template({{"user", dummy + separator}}, true);
  } catch (const InputError&) {
    return false;
  }
  const size_t at = text.find(dummy + separator);
  if (at == std::string::npos) return false;
  *prefix = tok.encode(text.substr(0, at), false);
  *suffix = tok.encode(text.substr(at + dummy.size() + separator.size()), false);
  return true;
}

bool starts_with(const std::vector<int32_t>& v, const std::vector<int32_t>& head) {
  return v.size() >= head.size() && std::equal(head.begin(), head.end(), v.begin());
}

bool ends_with(const std::vector<int32_t>& v, const std::vector<int32_t>& tail) {
  return v.size() >= tail.size() && std::equal(tail.rbegin(), tail.rend(), v.rbegin());
}

struct Scored {
  float score;
  int32_t layer, head, pos;
};

// Evicted first: the lower score, then the older position, then the lower
// layer and head.
bool evict_before(const Scored& a, const Scored& b) {
  if (a.score != b.score) return a.score < b.score;
  if (a.pos != b.pos) return a.pos < b.pos;
  return a.layer != b.layer ? a.layer < b.layer : a.head < b.head;
}

}  // namespace

// The selection, apart for the unit test: scores [L][K][T] (sinks already
// lifted); returns the (layer, head, position) to evict, in eviction order.
std::vector<std::array<int32_t, 3>> kvzip_evictions(const std::vector<float>& scores, int64_t L,
                                                    int64_t K, int64_t T, int64_t budget,
                                                    bool layerwise) {
  std::vector<std::array<int32_t, 3>> out;
  if (budget >= T) return out;
  auto collect = [&](int64_t l0, int64_t l1, int64_t n_evict) {
    std::vector<Scored> all;
    for (int64_t l = l0; l < l1; ++l)
      for (int64_t h = 0; h < K; ++h)
        for (int64_t p = 0; p < T; ++p)
          all.push_back({scores[size_t((l * K + h) * T + p)], int32_t(l), int32_t(h), int32_t(p)});
    std::partial_sort(all.begin(), all.begin() + n_evict, all.end(), evict_before);
    for (int64_t i = 0; i < n_evict; ++i)
      out.push_back({all[size_t(i)].layer, all[size_t(i)].head, all[size_t(i)].pos});
  };
  if (layerwise)
    for (int64_t l = 0; l < L; ++l) collect(l, l + 1, K * (T - budget));
  else
    collect(0, L, L * K * (T - budget));
  return out;
}

void lift_sinks(std::vector<float>& scores, int64_t groups, int64_t T, int64_t sinks) {
  float top = 0;
  for (float s : scores) top = std::max(top, s);
  for (int64_t i = 0; i < groups; ++i)
    for (int64_t p = 0; p < std::min(sinks, T); ++p) scores[size_t(i * T + p)] = top + 1.0f;
}

void record_and_evict_lowest(Decisions& decide, const std::vector<float>& scores, int64_t L,
                             int64_t K, int64_t T, int64_t budget, bool layerwise) {
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < K; ++h)
      for (int64_t p = 0; p < T; ++p)
        decide.gate(0, l, h, p, scores[size_t((l * K + h) * T + p)], false);
  for (const auto& e : kvzip_evictions(scores, L, K, T, budget, layerwise))
    decide.evict(e[0], e[1], e[2], scores[size_t((e[0] * K + e[1]) * T + e[2])], 1);
}

namespace {

class KvzipPolicy : public Policy {
 public:
  explicit KvzipPolicy(KvzipOptions o)
      : name_(o.name),
        budget_(o.budget),
        sinks_(o.sinks),
        chunk_(o.chunk),
        prefix_(o.prefix),
        layerwise_(o.layerwise),
        plus_(o.plus),
        chat_(o.chat),
        grad_(o.grad),
        restore_(o.restore) {}

  // The prefix and the question tail the pass used (the chat template's when
  // the prompt was built with it).
  std::vector<std::pair<std::string, double>> resolved_params() const override {
    return {{"prefix", double(context_begin_)}, {"question", double(question_)}};
  }

  std::vector<std::string> reason_names() const override {
    return {"new token", grad_ ? "lowest context-reconstruction attribution"
                               : "lowest context-reconstruction attention"};
  }
  std::vector<trace::GateSpec> gates() const override {
    if (grad_)
      return {{"kvgrad",
               "KVgrad score: the largest attention weight x ||v W_O|| x ||d Phi / d a|| over the "
               "context-reconstruction queries and the group's query heads, Phi the squared norm "
               "of the last residual stream (sinks: above every score)",
               "probability x ||v W_O|| x gradient norm"}};
    if (plus_)
      return {{"kvzip",
               "KVzip+ score: the largest attention weight a context-reconstruction query of the "
               "head's group put on the entry, over the query's ||h||, times ||v W_O|| of that "
               "query head (sinks: above every score)",
               "probability x ||v W_O|| / ||h||"}};
    return {{"kvzip",
             "KVzip score: the largest attention weight a context-reconstruction query of the "
             "head's group put on the entry (sinks: above every score)",
             "probability"}};
  }
  cache::StatsNeeds stats_needs() const override {
    cache::StatsNeeds n;
    if (grad_) return n;  // the attribution recomputes its weights
    n.peak = true;
    n.peak_per_query_head = n.peak_over_hidden_norm = plus_;
    return n;
  }
  std::string budget_kind() const override { return layerwise_ ? "layer" : "global"; }
  int64_t budget() const override {
    if (!setup_.model) return budget_;
    return budget_ * setup_.model->n_kv_heads * (layerwise_ ? 1 : setup_.model->n_layers);
  }
  std::vector<PartKind> kinds() const override { return {PartKind::Eviction}; }
  std::string describe() const override {
    return "context reconstruction after the prefill (" + std::to_string(chunk_) +
           "-token chunks), max " +
           (grad_ ? "attention x ||v W_O|| x gradient norm (KVgrad)" : "attention") + " per entry" +
           (plus_ ? " x ||v W_O|| / ||h|| (KVzip+)" : "") + ", " +
           (layerwise_ ? "K*budget per layer" : "L*K*budget over all layers and heads");
  }

  bool plans_capture() const override { return true; }
  CapturePlan plan(const PlanInputs& in) override {
    CapturePlan p;
    p.reconstruction = reconstruction(in.prompt, in.tokenizer);
    p.at = question_ > 0 ? T_full_ - question_ : -1;
    return p;
  }

  // The pass's chunks; sets where the context starts and ends.
  std::vector<ReconstructionChunk> reconstruction(const std::vector<int32_t>& prompt,
                                                  const tokenizer::Tokenizer* tokenizer) {
    const int64_t T = int64_t(prompt.size());
    if (prefix_ >= T)
      throw InputError("--policy", name_ + ":prefix",
                       "'" + std::to_string(prefix_) + "' is outside [0, " + std::to_string(T - 1) +
                           "] (the prompt has " + std::to_string(T) +
                           " tokens and the context after the prefix cannot be empty)");
    if (!tokenizer)
      throw InputError("--policy", name_,
                       "the context-reconstruction prompt needs the model's tokenizer");
    const std::vector<int32_t> first = tokenizer->encode(kFirstPrompt, false),
                               next = tokenizer->encode(kNextPrompt, false);
    std::vector<int32_t> suffix = tokenizer->encode(kSuffix, false);
    // A prompt built with the chat template (--chat): its template prefix is
    // no context, its generation prompt (S) is the question's place, and S
    // ends the repeat prompts (kvpress with a chat template).
    std::vector<int32_t> template_prefix, template_suffix;
    int64_t begin = prefix_, end_of_context = T;
    if (chat_ && chat_template_split(*tokenizer, &template_prefix, &template_suffix) &&
        starts_with(prompt, template_prefix) && ends_with(prompt, template_suffix) &&
        int64_t(template_prefix.size() + template_suffix.size()) < T) {
      begin = std::max<int64_t>(prefix_, int64_t(template_prefix.size()));
      end_of_context = T - int64_t(template_suffix.size());
      suffix = template_suffix;
    }
    if (begin >= end_of_context)
      throw InputError("--policy", name_ + ":prefix",
                       "'" + std::to_string(prefix_) +
                           "' leaves no context between the chat "
                           "template's prefix and its generation prompt");
    context_begin_ = begin;
    question_ = T - end_of_context;
    T_full_ = T;
    std::vector<ReconstructionChunk> chunks;
    for (int64_t start = begin; start < end_of_context; start += chunk_) {
      const int64_t end = std::min(end_of_context, start + chunk_);
      ReconstructionChunk c;
      c.ids = start == begin ? first : next;
      if (start > begin)  // the previous chunk's last tokens
        c.ids.insert(c.ids.end(),
                     prompt.begin() + std::max({begin, start - kPreviousTail, start - chunk_}),
                     prompt.begin() + start);
      c.ids.insert(c.ids.end(), suffix.begin(), suffix.end());
      c.ids.insert(c.ids.end(), prompt.begin() + start, prompt.begin() + end);
      c.softmax_keys = {{0, std::min(sinks_, start)}, {start, end}};
      chunk_ids_.push_back(c.ids);
      chunks.push_back(std::move(c));
      windows_.push_back({start, end});
    }
    return chunks;
  }

  void setup(const PolicySetup& s) override {
    Policy::setup(s);
    T_ = s.prompt_tokens;
    scores_.assign(size_t(s.model->n_layers * s.model->n_kv_heads * T_), 0.0f);
    if (plus_ || grad_)
      wo_ = per_head_output_projections(s.weights, s.model->n_heads, s.model->head_dim,
                                        grad_ ? name_ : name_ + ":plus");
  }

  void after_attention(LayerContext& c) override {
    if (c.reconstruction < 0) return;
    const auto& [start, end] = windows_.at(size_t(c.reconstruction));
    if (grad_) {  // every layer's scores from one replay with autograd, at layer 0
      if (c.layer == 0)
        kvgrad_chunk_scores(*setup_.model, *setup_.weights, c.cache,
                            {chunk_ids_.at(size_t(c.reconstruction)), c.pos0, sinks_, start, end},
                            wo_, T_, scores_.data());
      return;
    }
    const int64_t K = c.cache.n_kv_heads();
    for (int64_t h = 0; h < K; ++h) {
      float* row = scores_.data() + (c.layer * K + h) * T_;
      if (plus_) {
        plus_scores(c, h, start, end, row);
        continue;
      }
      const std::vector<float>& peak = c.stats.peak[size_t(h)];
      for (int64_t p = start; p < end; ++p) row[p] = peak[size_t(p)];
    }
  }

  // KVzip+: max over the group's query heads g of ||v_p W_O^g|| x the peak of g
  // (its weights already divided by ||h_i||).
  void plus_scores(const LayerContext& c, int64_t h, int64_t start, int64_t end, float* row) const {
    const int64_t R = c.cache.n_heads() / c.cache.n_kv_heads(), hd = c.cache.head_dim();
    torch::Tensor values = torch::empty({end - start, hd}, torch::kFloat32);
    std::vector<float> key(static_cast<size_t>(hd));
    for (int64_t p = start; p < end; ++p)
      c.cache.read_entry(c.layer, h, p, key.data(), values[p - start].data_ptr<float>());
    const torch::Tensor wo = wo_[size_t(c.layer)].narrow(0, h * R, R);  // [R, hd, D]
    const torch::Tensor norms = values.unsqueeze(0).matmul(wo).norm(2, -1).contiguous();  // [R, m]
    const float* nv = norms.data_ptr<float>();
    for (int64_t p = start; p < end; ++p) {
      float best = 0;
      for (int64_t r = 0; r < R; ++r)
        best = std::max(
            best, c.stats.peak[size_t(h * R + r)][size_t(p)] * nv[r * (end - start) + (p - start)]);
      row[p] = best;
    }
  }

  void end_step(StepContext& c) override {
    // The pass runs before a chat prompt's generation prompt is fed (kvpress
    // compresses the context before the question): the selection is over the
    // n context positions fed before it, and the generation prompt joins after it.
    const int64_t n = T_full_ - question_;
    const bool pass_ends = c.reconstruction >= 0 && c.reconstruction == c.reconstruction_chunks - 1;
    const bool restore_ends = c.reconstruction < 0 && c.pos0 == n && c.n == restore_;
    if (restore_ > 0 ? !restore_ends : !pass_ends) return;
    const int64_t L = c.cache.n_layers(), K = c.cache.n_kv_heads();
    lift_sinks(scores_, L * K, T_, sinks_);
    std::vector<float> fed(size_t(L * K * n));
    for (int64_t i = 0; i < L * K; ++i)
      std::copy_n(scores_.begin() + i * T_, n, fed.begin() + i * n);
    record_and_evict_lowest(c.decide, fed, L, K, n, budget_ - restore_, layerwise_);
  }

 private:
  std::string name_;
  int64_t budget_, sinks_, chunk_, prefix_;
  bool layerwise_, plus_, chat_, grad_;
  int64_t restore_;
  // Set by plan(): where the context starts, the prompt's tokens after it (a
  // chat prompt's generation prompt), the prompt's length.
  int64_t context_begin_ = 0, question_ = 0, T_full_ = 0;
  std::vector<torch::Tensor> wo_;  // KVzip+: per layer W_O as [H, hd, D]
  int64_t T_ = 0;
  std::vector<float> scores_;                                 // [L][K][T]
  mutable std::vector<std::pair<int64_t, int64_t>> windows_;  // per chunk: the context it scores
  mutable std::vector<std::vector<int32_t>> chunk_ids_;       // per chunk: the ids it feeds
};

}  // namespace

std::unique_ptr<Policy> make_kvzip_policy(const KvzipOptions& options) {
  return std::make_unique<KvzipPolicy>(options);
}

std::vector<ParamSpec> kvzip_params(const std::string& chunk_default) {
  return {{"budget", ParamType::Int, "256",
           "entries kept per (layer, kv head) on average: L*K*budget in all (a fraction of the "
           "prompt: budget=0.25)",
           1},
          {"sinks", ParamType::Int, "4", "first positions never evicted (kvpress n_sink)", 0},
          {"chunk", ParamType::Int, chunk_default,
           "context tokens reconstructed per forward step (kvpress chunk_size)", 1},
          {"prefix", ParamType::Int, "0",
           "tokens at the prompt's start that are not context (kvpress: the chat template's "
           "prefix); never reconstructed, scored 0",
           0},
          {"layerwise", ParamType::Bool, "false",
           "each layer keeps K*budget (kvpress layerwise) instead of one ranking over all "
           "layers"},
          {"chat", ParamType::Bool, "true",
           "a prompt built with the chat template (--chat): its template prefix is no context, "
           "its generation prompt stays and ends the repeat prompts (kvpress's default)"}};
}

KvzipOptions kvzip_options(const Params& p, const std::string& name) {
  KvzipOptions o;
  o.name = name;
  o.budget = p.get_int("budget");
  o.sinks = p.get_int("sinks");
  o.chunk = p.get_int("chunk");
  o.prefix = p.get_int("prefix");
  o.layerwise = p.get_bool("layerwise");
  o.chat = p.get_bool("chat");
  return o;
}

PolicyDescriptor kvzip_descriptor() {
  std::vector<ParamSpec> params = kvzip_params("2048");
  params.push_back({"plus", ParamType::Bool, "false",
                    "KVzip+ (kvpress kvzip_plus_normalization): weights over the query's ||h||, "
                    "times the value's ||v W_O||"});
  return {"kvzip",
          "score each context entry by the attention it gets while the model repeats the "
          "context (a second forward pass after the prefill); evict the lowest over all heads",
          "Kim et al., KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction, "
          "2025 (kvpress KVzipPress)",
          "docs/policies/kvzip.md",
          params,
          [](const Params& p) -> std::unique_ptr<Policy> {
            KvzipOptions o = kvzip_options(p, "kvzip");
            o.plus = p.get_bool("plus");
            return make_kvzip_policy(o);
          }};
}

}  // namespace kvscope::policy
