#include "capture/recorder/causal_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "capture/recorder/capture_run.h"
#include "core/analysis/why.h"
#include "core/common/input_error.h"

namespace kvscope::recorder {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

nlohmann::json value(double x) {
  return std::isnan(x) ? nlohmann::json() : nlohmann::json(x);
}

nlohmann::json effect_json(const analysis::ReplayEffect& e) {
  return {{"logprob", value(e.logprob)},
          {"rank", e.rank},
          {"success", e.success},
          {"score", value(e.score)}};
}

// The observational ranking: needle tokens (else entries) each head lost,
// and where it lost anything at all.
void rank_heads(const trace::TraceReader& r, const analysis::WhyReport& w,
                analysis::CausalQuery* q) {
  const int64_t K = r.n_kv_heads();
  q->layers = r.n_layers();
  q->kv_heads = K;
  q->head_score.assign(size_t(q->layers * K), 0.0);
  q->lost.assign(size_t(q->layers * K), 0);
  std::vector<double> entries(q->head_score.size(), 0.0);
  for (const trace::Event& e : r.events(0, r.n_events())) {
    if (!analysis::readable_loss(r, e)) continue;
    q->lost[size_t(e.layer * K + e.kv_head)] = 1;
    entries[size_t(e.layer * K + e.kv_head)] += 1;
  }
  for (const analysis::NeedleLoss& l : w.losses)
    q->head_score[size_t(l.layer * K + l.kv_head)] += 1;
  if (w.losses.empty()) q->head_score = entries;
}

class ReplayRunner {
 public:
  ReplayRunner(ReplaySource& source, generate::Engine& engine, const trace::TraceReader& original,
               fs::path dir)
      : source_(source),
        engine_(engine),
        original_(original),
        shape_(intervention_shape(original)),
        dir_(std::move(dir)) {
    csv_.open(dir_ / "replays.csv");
    if (!csv_) throw InputError((dir_ / "replays.csv").string(), "-o", "cannot be written");
    csv_ << "replay,label,interventions,heads_restored,answer_logprob,answer_rank,success,score,"
            "seconds,trace\n";
  }

  analysis::ReplayEffect operator()(const analysis::ReplayRequest& rq) {
    const int64_t K = original_.n_kv_heads();
    std::vector<std::string> specs = {"restore:heads=" + policy::head_list_text(rq.restore, K)};
    if (!rq.drop.empty())
      specs.push_back("drop:tokens=needle,heads=" + policy::head_list_text(rq.drop, K));
    CaptureRequest req = source_.request;
    for (const std::string& s : specs)
      req.interventions.push_back(policy::parse_intervention(s, shape_));
    char name[32];
    std::snprintf(name, sizeof name, "replay-%03d.kvtrace.h5", index_);
    req.output = (dir_ / name).string();
    req.replay_of = original_.path();
    const auto start = Clock::now();
    const CaptureResult r = run_capture(engine_, req);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    seconds_.push_back(seconds);
    analysis::ReplayEffect e;
    e.logprob = r.answer_logprob;
    e.rank = r.answer_rank;
    e.success = req.expected_answer.empty() ? -1 : int8_t(r.success ? 1 : 0);
    e.score = req.expected_answer.empty() ? std::nan("") : r.score;
    std::string joined;
    for (const std::string& s : specs) {
      if (!joined.empty()) joined += ' ';
      joined += s;
    }
    int64_t heads = 0;
    for (uint8_t x : rq.restore) heads += x;
    csv_ << index_ << ",\"" << rq.label << "\",\"" << joined << "\"," << heads << ","
         << (std::isnan(e.logprob) ? "" : std::to_string(e.logprob)) << "," << e.rank << ","
         << int(e.success) << "," << (std::isnan(e.score) ? "" : std::to_string(e.score)) << ","
         << seconds << "," << name << "\n";
    csv_.flush();
    files_.push_back(name);
    specs_.push_back(joined);
    ++index_;
    return e;
  }

  const std::vector<double>& seconds() const { return seconds_; }
  const std::vector<std::string>& files() const { return files_; }
  const std::vector<std::string>& specs() const { return specs_; }

 private:
  ReplaySource& source_;
  generate::Engine& engine_;
  const trace::TraceReader& original_;
  const policy::InterventionShape shape_;  // read once: the trace's roles and sizes
  fs::path dir_;
  std::ofstream csv_;
  int index_ = 0;
  std::vector<double> seconds_;
  std::vector<std::string> files_, specs_;
};

nlohmann::json result_json(const std::string& trace, const analysis::CausalResult& c, int64_t L,
                           int64_t K, const ReplayRunner& runner) {
  const std::vector<double>& seconds = runner.seconds();
  auto file = [&](int64_t i) {
    return i >= 0 && i < int64_t(runner.files().size()) ? nlohmann::json(runner.files()[size_t(i)])
                                                        : nlohmann::json();
  };
  nlohmann::json j;
  j["trace"] = trace;
  j["budget"] = c.budget;
  j["replays"] = c.replays.size();
  j["budget_exhausted"] = c.budget_exhausted;
  j["original"] = effect_json(c.original);
  j["full_restoration"] = effect_json(c.full);
  j["recoverable"] = c.recoverable;
  j["threshold_logprob"] = value(c.threshold);
  j["minimal_set"] = analysis::head_names(c.minimal, K);
  j["minimal_confirmed"] = c.minimal_confirmed;
  j["minimal_effect"] = effect_json(c.minimal_effect);
  j["minimal_trace"] = file(c.minimal_replay);
  j["n_layers"] = L;
  j["kv_heads"] = K;
  j["heads"] = nlohmann::json::array();
  for (const analysis::HeadEffect& e : c.head_effects)
    j["heads"].push_back({{"layer", e.layer},
                          {"kv_head", e.kv_head},
                          {"restore_alone", e.has_restore ? effect_json(e.restore) : nullptr},
                          {"restore_trace", file(e.restore_replay)},
                          {"dropped_from_full", e.has_drop ? effect_json(e.drop) : nullptr},
                          {"drop_trace", file(e.drop_replay)}});
  j["layers"] = nlohmann::json::array();
  for (const analysis::HeadEffect& e : c.layer_effects)
    j["layers"].push_back({{"layer", e.layer},
                           {"restore_alone", e.has_restore ? effect_json(e.restore) : nullptr},
                           {"restore_trace", file(e.restore_replay)}});
  j["replay_list"] = nlohmann::json::array();
  for (size_t i = 0; i < c.replays.size(); ++i)
    j["replay_list"].push_back(
        {{"label", c.replays[i].request.label},
         {"interventions", i < runner.specs().size() ? runner.specs()[i] : ""},
         {"effect", effect_json(c.replays[i].effect)},
         {"recovered", c.replays[i].recovered},
         {"seconds", i < seconds.size() ? seconds[i] : 0.0},
         {"trace", file(int64_t(i))}});
  double total = 0;
  for (double s : seconds) total += s;
  j["seconds_total"] = total;
  j["seconds_per_replay"] =
      seconds.empty() ? nlohmann::json() : nlohmann::json(total / seconds.size());
  j["words"] = analysis::format_causal(c, K);
  return j;
}

}  // namespace

CausalRun run_causal_search(const trace::TraceReader& original, ReplaySource source,
                            generate::Engine& engine, const CausalRunOptions& o) {
  if (o.budget < 1)
    throw InputError("", "--budget", "is " + std::to_string(o.budget) + " (expected >= 1 replays)");
  if (!(o.fraction > 0 && o.fraction <= 1))
    throw InputError("", "--fraction", "expected a share in (0, 1]");
  if (source.request.expected_answer.empty())
    throw InputError(original.path(), "/run expected_answer",
                     "is empty: the search measures the expected answer (a --task or --expect "
                     "capture)");
  const policy::InterventionShape shape = intervention_shape(original);
  for (const std::string& spec : source.recorded_interventions)
    source.request.interventions.push_back(policy::parse_intervention(spec, shape));
  analysis::CausalQuery q;
  rank_heads(original, analysis::explain_outcome(original, o.kl), &q);
  if (std::none_of(q.lost.begin(), q.lost.end(), [](uint8_t x) { return x != 0; }))
    throw InputError(original.path(), "/events",
                     "the policy evicted, rejected or offloaded nothing: there is nothing to "
                     "restore");
  q.has_needle = !shape.needle.empty();
  q.budget = o.budget;
  q.fraction = o.fraction;
  q.original = {original.answer_logprob(), original.answer_rank(), original.task_success(),
                original.task_score()};
  std::error_code ec;
  fs::create_directories(o.folder, ec);
  if (ec) throw InputError(o.folder, "-o", "cannot be created: " + ec.message());
  finish_replay_request(engine, &source);
  ReplayRunner runner(source, engine, original, o.folder);
  CausalRun run;
  run.result = analysis::causal_search(
      q, [&runner](const analysis::ReplayRequest& rq) { return runner(rq); });
  run.report =
      result_json(original.path(), run.result, original.n_layers(), original.n_kv_heads(), runner);
  std::ofstream(fs::path(o.folder) / "causal.json") << run.report.dump(2) << "\n";
  return run;
}

}  // namespace kvscope::recorder
