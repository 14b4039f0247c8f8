#include "core/analysis/why.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <sstream>

#include "core/common/input_error.h"

namespace kvscope::analysis {

namespace {

using trace::EventKind;
using trace::TokenRole;

struct Needle {
  std::vector<int32_t> tokens;         // ascending
  std::map<int32_t, size_t> index_of;  // token -> index in tokens
};

Needle find_needle(const trace::TraceReader& r) {
  Needle n;
  const std::vector<uint8_t> roles = r.token_roles(0, r.n_tokens());
  for (size_t t = 0; t < roles.size(); ++t)
    if (roles[t] == static_cast<uint8_t>(TokenRole::Needle)) {
      n.index_of[int32_t(t)] = n.tokens.size();
      n.tokens.push_back(int32_t(t));
    }
  if (n.tokens.empty())
    throw InputError(r.path(), "/tokens/role",
                     "no needle tokens (role 2): why explains retrieval tasks; capture with "
                     "--task needle or --task defer");
  return n;
}

// The last prefill step: its last query's logits gave the first answer token.
int64_t find_answer_step(const trace::TraceReader& r, std::vector<trace::StepRecord>* steps) {
  *steps = r.steps(0, r.n_steps());
  int64_t answer = -1;
  for (size_t s = 0; s < steps->size(); ++s)
    if ((*steps)[s].kind == trace::StepKind::Prefill) answer = int64_t(s);
  return answer;
}

bool attended(const trace::TraceReader& r, uint8_t tier) {
  const std::vector<uint8_t>& a = r.tier_attended();
  return a.empty() || (tier < a.size() && a[tier] != 0);
}

// Replays the needle's events up to the answer step: which (head, token)
// pairs could still be read, and every loss on the way.
struct Replay {
  std::vector<uint8_t> readable;  // [layer][kv head][needle index]
  std::vector<NeedleLoss> losses;
};

Replay replay_needle(const trace::TraceReader& r, const Needle& needle,
                     const trace::StepRecord& answer) {
  const int64_t K = r.n_kv_heads(), N = int64_t(needle.tokens.size());
  Replay out;
  out.readable.assign(size_t(r.n_layers() * K * N), 0);
  const std::vector<trace::Event> events = r.events(0, answer.event_begin + answer.event_count);
  const std::vector<std::string>& reasons = r.run().reason_names;
  for (const trace::Event& e : events) {
    const auto it = needle.index_of.find(e.token);
    if (it == needle.index_of.end()) continue;
    uint8_t& readable = out.readable[size_t((e.layer * K + e.kv_head) * N) + it->second];
    if (e.kind == EventKind::Admit || e.kind == EventKind::Promote)
      readable = attended(r, e.to_tier);
    const char* loss = readable_loss(r, e);
    if (!loss) continue;
    readable = 0;
    NeedleLoss l;
    l.step = e.step, l.layer = e.layer, l.kv_head = e.kv_head, l.token = e.token, l.kind = loss;
    l.reason = e.reason < reasons.size() ? reasons[e.reason] : "reason " + std::to_string(e.reason);
    l.score = std::isnan(e.score) ? kNoValue : double(e.score);
    out.losses.push_back(l);
  }
  return out;
}

// The policy's cutoff at each loss, from a series named like one.
void attach_cutoffs(const trace::TraceReader& r, int64_t answer_step, WhyReport& w) {
  int series = -1;
  for (size_t i = 0; i < r.series().size(); ++i)
    if (r.series()[i].name.find("cutoff") != std::string::npos) series = int(i);
  if (series < 0) return;
  w.cutoff_series = r.series()[size_t(series)].name;
  std::map<std::pair<int, int>, std::vector<float>> by_head;
  for (NeedleLoss& l : w.losses) {
    auto& values = by_head[{l.layer, l.kv_head}];
    if (values.empty()) values = r.series_head(series, l.layer, l.kv_head, 0, answer_step + 1);
    const float v = values[size_t(l.step)];
    l.cutoff = std::isnan(v) ? kNoValue : double(v);
  }
}

void summarise_needle(const trace::TraceReader& r, const Needle& needle, const Replay& replay,
                      WhyReport& w) {
  const int64_t heads = w.n_heads, N = int64_t(needle.tokens.size());
  const std::vector<trace::TokenRecord> recs =
      r.tokens(needle.tokens.front(), needle.tokens.back() + 1);
  for (int64_t i = 0; i < N; ++i) {
    const trace::TokenRecord& t = recs[size_t(needle.tokens[size_t(i)] - needle.tokens.front())];
    NeedleToken nt;
    nt.token = needle.tokens[size_t(i)];
    nt.position = t.position;
    nt.text = t.text;
    for (int64_t h = 0; h < heads; ++h) nt.heads_readable += replay.readable[size_t(h * N + i)];
    nt.heads_lost = int32_t(heads) - nt.heads_readable;
    w.needle.push_back(nt);
  }
  for (const NeedleLoss& l : replay.losses) {
    NeedleToken& nt = w.needle[needle.index_of.at(l.token)];
    if (nt.first_loss_step < 0) nt.first_loss_step = l.step;
  }
  for (int64_t h = 0; h < heads; ++h) {
    int64_t readable = 0;
    for (int64_t i = 0; i < N; ++i) readable += replay.readable[size_t(h * N + i)];
    w.heads_whole_needle += readable == N;
    w.heads_no_needle += readable == 0;
  }
}

// Read-time selection at the first decode step: in the heads whose query
// selected (a head without Select events read everything, e.g. Quest's
// dense layers), the held needle pairs it read.
void attach_selection(const trace::TraceReader& r, const Needle& needle, const Replay& replay,
                      WhyReport& w) {
  const int64_t step = w.answer_step + 1;
  if (step >= r.n_steps()) return;
  const int64_t N = int64_t(needle.tokens.size()), K = r.n_kv_heads();
  const std::vector<trace::Event> events = r.step_events(step);
  std::vector<uint8_t> selective(size_t(w.n_heads), 0);
  for (const trace::Event& e : events)
    if (e.kind == EventKind::Select) selective[size_t(e.layer * K + e.kv_head)] = 1;
  for (int64_t h = 0; h < w.n_heads; ++h) {
    if (!selective[size_t(h)]) continue;
    w.selective_heads += 1;
    for (int64_t i = 0; i < N; ++i) w.needle_held_pairs += replay.readable[size_t(h * N + i)];
  }
  w.selects = w.selective_heads > 0;
  for (const trace::Event& e : events) {
    const auto it = needle.index_of.find(e.token);
    if (e.kind == EventKind::Select && it != needle.index_of.end() &&
        replay.readable[size_t((e.layer * K + e.kv_head) * N) + it->second])
      ++w.needle_selected_pairs;
  }
}

void attach_oracle(const trace::TraceReader& r, const std::vector<trace::StepRecord>& steps,
                   WhyReport& w) {
  if (!r.layout().oracle) return;
  const int64_t first_decode = w.answer_step + 1;
  if (first_decode < r.n_steps()) {
    const std::vector<float> lost = r.oracle_lost_mass(first_decode);
    double sum = 0;
    for (float x : lost) sum += x;
    w.oracle_lost_mass = lost.empty() ? kNoValue : sum / double(lost.size());
  }
  const std::vector<float> kl = r.oracle_kl(w.answer_step, r.n_steps());
  for (size_t i = 0; i < kl.size(); ++i)
    if (std::isnan(w.max_kl) || kl[i] > w.max_kl)
      w.max_kl = kl[i], w.max_kl_step = w.answer_step + int64_t(i);
  for (size_t i = 0; i < kl.size(); ++i) {
    if (!(kl[i] > w.kl_threshold)) continue;
    w.divergence_step = w.answer_step + int64_t(i);
    w.divergence_kl = kl[i];
    const size_t next = size_t(w.divergence_step + 1);  // the step fed what these logits gave
    if (next < steps.size())
      w.divergence_token = r.tokens(steps[next].first_token, steps[next].first_token + 1)[0].text;
    break;
  }
}

std::string verdict(const WhyReport& w) {
  const int64_t N = int64_t(w.needle.size());
  std::ostringstream v;
  if (w.heads_no_needle == w.n_heads) {
    const NeedleLoss* first = w.losses.empty() ? nullptr : &w.losses.front();
    v << "no head could read any of the " << N << " needle tokens when the answer was generated";
    if (first)
      v << ": the policy removed them (first: " << first->kind << " of token " << first->token
        << " at step " << first->step << ", layer " << first->layer << ", kv head "
        << first->kv_head << ", reason " << first->reason << ")";
  } else if (w.selects && w.needle_selected_pairs < w.needle_held_pairs) {
    v << "the cache held the needle, but in the " << w.selective_heads
      << " heads that select at read time the first answer query read only "
      << w.needle_selected_pairs << " of " << w.needle_held_pairs
      << " held (needle token, kv head) pairs";
  } else if (w.heads_whole_needle == w.n_heads) {
    v << "every head could read the whole needle when the answer was generated: the cache did not "
         "lose it";
    if (w.success == 0)
      v << (w.policy_name == "full"
                ? "; the full cache missed too: the model does not answer this task"
                : "; the miss lies elsewhere (compare with a full-cache capture)");
  } else {
    v << "the needle was partly lost: " << w.heads_whole_needle << " of " << w.n_heads
      << " heads could read all " << N << " needle tokens when the answer was generated, "
      << w.heads_no_needle << " none";
  }
  return v.str();
}

}  // namespace

namespace {

// The report's outcome part, any trace: the run, the generation, its score.
WhyReport outcome_of(const trace::TraceReader& r, double kl_threshold,
                     std::vector<trace::StepRecord>* steps) {
  WhyReport w;
  w.trace = r.path();
  w.policy = r.run().policy;
  w.policy_name = r.run().policy_name;
  w.task = r.run().task_kind;
  w.expected_answer = r.run().expected_answer;
  w.generated = r.generated_text();
  w.success = r.task_success();
  w.score = r.task_score();
  w.kl_threshold = kl_threshold;
  w.n_heads = r.n_layers() * r.n_kv_heads();
  w.answer_step = find_answer_step(r, steps);
  if (w.answer_step < 0)
    throw InputError(r.path(), "/steps/kind", "no prefill step: the trace holds no answer step");
  return w;
}

}  // namespace

WhyReport explain_outcome(const trace::TraceReader& r, double kl_threshold) {
  const std::vector<uint8_t> roles = r.token_roles(0, r.n_tokens());
  if (std::count(roles.begin(), roles.end(), uint8_t(TokenRole::Needle)) > 0)
    return explain_retrieval(r, kl_threshold);
  std::vector<trace::StepRecord> steps;
  WhyReport w = outcome_of(r, kl_threshold, &steps);
  attach_oracle(r, steps, w);
  return w;
}

WhyReport explain_retrieval(const trace::TraceReader& r, double kl_threshold) {
  const Needle needle = find_needle(r);
  std::vector<trace::StepRecord> steps;
  WhyReport w = outcome_of(r, kl_threshold, &steps);
  const Replay replay = replay_needle(r, needle, steps[size_t(w.answer_step)]);
  w.losses = replay.losses;
  summarise_needle(r, needle, replay, w);
  attach_cutoffs(r, w.answer_step, w);
  attach_selection(r, needle, replay, w);
  w.policy_needle_mass = received_mass_on(r, needle.tokens, w.answer_step + 1);
  attach_oracle(r, steps, w);
  w.verdict = verdict(w);
  return w;
}

namespace {

std::string number(double x, int precision = 4) {
  if (std::isnan(x)) return "n/a";
  std::ostringstream o;
  o << std::setprecision(precision) << x;
  return o.str();
}

// One layer's losses in a line: how many (token, head) pairs, the step
// range, the reasons, and the scores against the cutoff.
std::string layer_losses(const WhyReport& w, const std::vector<const NeedleLoss*>& losses) {
  int32_t s0 = losses.front()->step, s1 = s0;
  std::map<std::string, int> reasons;
  double lo = INFINITY, hi = -INFINITY, cut_lo = INFINITY, cut_hi = -INFINITY;
  for (const NeedleLoss* l : losses) {
    s0 = std::min(s0, l->step), s1 = std::max(s1, l->step);
    ++reasons[l->kind + " (" + l->reason + ")"];
    if (!std::isnan(l->score)) lo = std::min(lo, l->score), hi = std::max(hi, l->score);
    if (!std::isnan(l->cutoff))
      cut_lo = std::min(cut_lo, l->cutoff), cut_hi = std::max(cut_hi, l->cutoff);
  }
  std::ostringstream o;
  o << losses.size() << " (token, kv head) pairs lost at steps " << s0 << ".." << s1 << ":";
  for (const auto& [name, count] : reasons) o << " " << count << "x " << name;
  if (lo <= hi) o << "; scores " << number(lo) << ".." << number(hi);
  if (cut_lo <= cut_hi)
    o << " vs cutoff " << number(cut_lo) << ".." << number(cut_hi) << " (" << w.cutoff_series
      << ")";
  return o.str();
}

// The losses layer by layer; consecutive layers with the same line fold
// into one ("layers 0..29: ... each").
void format_losses(const WhyReport& w, std::ostringstream& o) {
  std::map<int32_t, std::vector<const NeedleLoss*>> by_layer;
  for (const NeedleLoss& l : w.losses) by_layer[l.layer].push_back(&l);
  std::vector<std::pair<int32_t, std::string>> lines;
  for (const auto& [layer, losses] : by_layer) lines.emplace_back(layer, layer_losses(w, losses));
  for (size_t a = 0; a < lines.size();) {
    size_t b = a + 1;
    while (b < lines.size() && lines[b].second == lines[a].second &&
           lines[b].first == lines[b - 1].first + 1)
      ++b;
    if (b - a == 1)
      o << "  layer " << lines[a].first << ": " << lines[a].second << "\n";
    else
      o << "  layers " << lines[a].first << ".." << lines[b - 1].first
        << ", each: " << lines[a].second << "\n";
    a = b;
  }
}

}  // namespace

std::string partial_answers(int8_t success, double score) {
  if (success != 0 || !(score > 0)) return "";
  return std::to_string(std::lround(score * 100)) + " % of the answers found";
}

const char* readable_loss(const trace::TraceReader& r, const trace::Event& e) {
  switch (e.kind) {
    case EventKind::Evict: return "evict";
    case EventKind::Reject: return "reject";
    case EventKind::Demote: return attended(r, e.to_tier) ? nullptr : "demote";
    default: return nullptr;
  }
}

std::string format_why(const WhyReport& w) {
  std::ostringstream o;
  o << "trace    " << w.trace << "\n";
  o << "policy   " << w.policy << "\n";
  o << "task     " << (w.task.empty() ? "none" : w.task) << ", expected \"" << w.expected_answer
    << "\", generated \"" << w.generated << "\": "
    << (w.success == 1   ? "found"
        : w.success == 0 ? "MISSED"
                         : "no verdict");
  const std::string partial = partial_answers(w.success, w.score);
  if (!partial.empty()) o << " (" << partial << ")";
  o << "\n";
  // Several planted facts (vt, cwe, multi-value niah): " ... " between them.
  std::string text;
  int64_t pieces = 1;
  for (size_t i = 0; i < w.needle.size(); ++i) {
    if (i > 0 && w.needle[i].token != w.needle[i - 1].token + 1) text += " ... ", ++pieces;
    text += w.needle[i].text;
  }
  o << "needle   " << w.needle.size() << " tokens (" << w.needle.front().token << ".."
    << w.needle.back().token << (pieces > 1 ? ", " + std::to_string(pieces) + " pieces" : "")
    << "): \"" << text << "\"\n";
  o << "verdict  " << w.verdict << "\n\n";
  o << "After the prompt (step " << w.answer_step
    << ", the last prefill step), when the answer is generated, of " << w.n_heads
    << " (layer, kv head) pairs " << w.heads_whole_needle << " could read the whole needle, "
    << w.heads_no_needle << " none of it.\n";
  o << "Losses up to then (" << w.losses.size() << "):\n";
  format_losses(w, o);
  if (w.selects)
    o << "Read-time selection at the first answer token's query (step " << w.answer_step + 1
      << "): in the " << w.selective_heads << " heads that selected, " << w.needle_selected_pairs
      << " of " << w.needle_held_pairs << " held (needle token, kv head) pairs read; the other "
      << w.n_heads - w.selective_heads << " heads read everything they held.\n";
  o << "\nAttention at the answer:\n";
  o << "  policy's received mass on the needle at the first answer token's query (step "
    << w.answer_step + 1 << ", mean over kv heads): " << number(w.policy_needle_mass) << "\n";
  o << "  full cache's attention on keys the policy no longer held, same query (oracle lost "
       "mass, mean over query heads): "
    << number(w.oracle_lost_mass) << "\n";
  o << "  first divergence from the full cache (KL > " << number(w.kl_threshold) << "): ";
  if (w.divergence_step < 0)
    o << (std::isnan(w.oracle_lost_mass) ? "n/a (no oracle: capture with --oracle)" : "none");
  else
    o << "step " << w.divergence_step << ", KL " << number(w.divergence_kl) << ", next token \""
      << w.divergence_token << "\"";
  if (!std::isnan(w.max_kl))
    o << "; largest KL " << number(w.max_kl) << " at step " << w.max_kl_step;
  o << "\n";
  return o.str();
}

double received_mass_on(const trace::TraceReader& r, const std::vector<int32_t>& tokens,
                        int64_t step) {
  if (!r.layout().received || step < 0 || step >= r.n_steps()) return kNoValue;
  double total = 0;
  for (int l = 0; l < r.n_layers(); ++l)
    for (int k = 0; k < r.n_kv_heads(); ++k) {
      const trace::ReceivedRow row = r.received(step, l, k);
      for (size_t i = 0; i < row.tokens.size(); ++i)
        if (std::binary_search(tokens.begin(), tokens.end(), int32_t(row.tokens[i])))
          total += row.mass[i];
    }
  return total / double(r.n_layers() * r.n_kv_heads());
}

}  // namespace kvscope::analysis
