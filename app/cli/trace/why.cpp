// kvscope why TRACE [--json] [--kl X]: why a retrieval task failed (or held).
// With --causal the run goes to kvscope-engine (app/cli/engine/why_causal.cpp):
// the causal search replays the capture.
#include <nlohmann/json.hpp>

#include <cmath>
#include <iostream>
#include <memory>

#include "app/cli/cli_main.h"
#include "app/cli/command.h"
#include "core/analysis/why.h"
#include "core/common/input_error.h"
#include "core/trace/reader.h"

namespace kvscope::cli {

namespace {

struct WhyOptions {
  std::string trace;
  bool json = false;
  double kl = 0.1;
  bool causal = false;  // the rest is the engine's (why_causal.cpp)
  int64_t budget = 48;
  double fraction = 0.9;
  std::string output, model, device;
  int threads = 0;
  bool any_version = false;
};

nlohmann::json value(double x) {
  return std::isnan(x) ? nlohmann::json() : nlohmann::json(x);
}

nlohmann::json why_json(const analysis::WhyReport& w) {
  nlohmann::json j;
  j["trace"] = w.trace;
  j["policy"] = w.policy;
  j["task"] = w.task;
  j["expected_answer"] = w.expected_answer;
  j["generated"] = w.generated;
  j["success"] = w.success;
  j["score"] = value(w.score);
  j["verdict"] = w.verdict;
  j["n_heads"] = w.n_heads;
  j["answer_step"] = w.answer_step;
  j["heads_whole_needle"] = w.heads_whole_needle;
  j["heads_no_needle"] = w.heads_no_needle;
  for (const analysis::NeedleToken& t : w.needle)
    j["needle"].push_back({{"token", t.token},
                           {"position", t.position},
                           {"text", t.text},
                           {"heads_readable", t.heads_readable},
                           {"heads_lost", t.heads_lost},
                           {"first_loss_step", t.first_loss_step}});
  j["losses"] = nlohmann::json::array();
  for (const analysis::NeedleLoss& l : w.losses)
    j["losses"].push_back({{"step", l.step},
                           {"layer", l.layer},
                           {"kv_head", l.kv_head},
                           {"token", l.token},
                           {"kind", l.kind},
                           {"reason", l.reason},
                           {"score", value(l.score)},
                           {"cutoff", value(l.cutoff)}});
  j["cutoff_series"] = w.cutoff_series;
  j["selection"] = w.selects ? nlohmann::json{{"selective_heads", w.selective_heads},
                                              {"held_pairs", w.needle_held_pairs},
                                              {"selected_pairs", w.needle_selected_pairs}}
                             : nlohmann::json();
  j["policy_needle_mass"] = value(w.policy_needle_mass);
  j["oracle_lost_mass"] = value(w.oracle_lost_mass);
  j["kl_threshold"] = w.kl_threshold;
  j["max_kl"] = w.max_kl_step < 0
                    ? nlohmann::json()
                    : nlohmann::json{{"step", w.max_kl_step}, {"kl", value(w.max_kl)}};
  j["divergence"] = w.divergence_step < 0 ? nlohmann::json()
                                          : nlohmann::json{{"step", w.divergence_step},
                                                           {"kl", value(w.divergence_kl)},
                                                           {"token", w.divergence_token}};
  return j;
}

int run_why(const WhyOptions& o) {
  if (!(o.kl >= 0)) throw InputError("", "--kl", "must be a number >= 0 (nats)");
  if (o.causal) {
    if (o.budget < 1)
      throw InputError("", "--budget",
                       "is " + std::to_string(o.budget) + " (expected >= 1 replays)");
    return hand_to_engine(invocation());
  }
  for (const auto& [given, name] : {std::pair{o.output.empty(), "-o"},
                                    {o.model.empty(), "--model"},
                                    {o.device.empty(), "--device"}})
    if (!given) throw InputError("", name, "belongs to the causal search: add --causal");
  auto reader = trace::TraceReader::open(o.trace);
  const analysis::WhyReport w = analysis::explain_retrieval(*reader, o.kl);
  if (o.json)
    std::cout << why_json(w).dump(2) << "\n";
  else
    std::cout << analysis::format_why(w);
  return kExitOk;
}

Command add_why_command(CLI::App& app) {
  auto opt = std::make_shared<WhyOptions>();
  CLI::App* sub = app.add_subcommand(
      "why", "Explain a retrieval task's outcome: what the policy did to the needle, and when");
  sub->add_option("TRACE", opt->trace, "trace of a --task capture (.kvtrace.h5)")->required();
  sub->add_flag("--json", opt->json, "print JSON instead of text");
  sub->add_option("--kl", opt->kl,
                  "KL(full || policy) in nats above which the policy has diverged (needs --oracle)")
      ->capture_default_str();
  sub->add_flag("--causal", opt->causal,
                "the causal search: replay the capture with the policy's losses restored in sets "
                "of heads, to find the smallest set that recovers the answer (kvscope-engine; "
                "docs/causal.md)");
  sub->add_option("--budget", opt->budget, "--causal: replays the search may run")
      ->capture_default_str();
  sub->add_option("--fraction", opt->fraction,
                  "--causal: share of the log-probability gap to the full restoration that "
                  "counts as recovered")
      ->capture_default_str();
  sub->add_option("-o,--output", opt->output,
                  "--causal: folder for the replays' traces, replays.csv and causal.json "
                  "(default TRACE.causal)");
  sub->add_option("--model", opt->model, "--causal: the model, when it moved from /run model_path");
  sub->add_option("--device", opt->device, "--causal: cpu, cuda or cuda:N (default cpu)");
  sub->add_option("--threads", opt->threads, "--causal: compute threads")
      ->check(CLI::Range(0, 1024));
  sub->add_flag("--any-version", opt->any_version,
                "--causal: replay a trace another KVScope version made");
  return {sub, [opt] { return run_why(*opt); }};
}

}  // namespace

KVSCOPE_REGISTER_COMMAND("why", add_why_command);

}  // namespace kvscope::cli
