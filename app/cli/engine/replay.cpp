// kvscope replay TRACE [--intervene SPEC]... -o OUT [--model M] [--device D]
// Re-runs the capture TRACE records (capture/recorder/replay.h) with the
// interventions applied to the policy's decisions (policy/interventions.h).
// Without interventions the replay must reproduce the original: a
// difference is a failure (exit 1) naming the first differing record.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>

#include "app/cli/cli_main.h"
#include "app/cli/command.h"
#include "app/cli/engine/replay_cli.h"
#include "capture/generate/engine.h"
#include "capture/recorder/capture_run.h"
#include "capture/recorder/replay.h"
#include "core/common/cli_checks.h"
#include "core/common/input_error.h"
#include "core/trace/reader.h"

namespace kvscope::cli {

namespace {

struct ReplayOptions {
  std::string trace;
  std::vector<std::string> interventions;
  std::string output;
  recorder::ReplayOverrides overrides;
  bool quiet = false;
};

std::string outcome_text(int8_t success, double score, double logprob, int64_t rank) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "success %s, score %s, answer log p %s (first token rank %lld)",
                success < 0 ? "-" : (success ? "yes" : "no"),
                std::isnan(score) ? "-" : std::to_string(score).substr(0, 5).c_str(),
                std::isnan(logprob) ? "-" : std::to_string(logprob).substr(0, 7).c_str(),
                static_cast<long long>(rank));
  return buf;
}

int run_replay(const ReplayOptions& o) {
  auto original = trace::TraceReader::open(o.trace);
  recorder::ReplaySource source = recorder::replay_source(*original, o.overrides);
  const policy::InterventionShape shape = recorder::intervention_shape(*original);
  for (const std::string& spec : source.recorded_interventions)
    source.request.interventions.push_back(policy::parse_intervention(spec, shape));
  for (const std::string& spec : o.interventions) {
    source.request.interventions.push_back(policy::parse_intervention(spec, shape));
    recorder::check_restores_something(*original, source.request.interventions.back());
  }
  generate::Engine engine = generate::open_engine(source.model);
  recorder::finish_replay_request(engine, &source);
  recorder::CaptureRequest& req = source.request;
  req.output = o.output;
  req.replay_of = o.trace;
  req.command_line = own_command_line();
  const recorder::CaptureResult r = recorder::run_capture(engine, req);
  for (const std::string& note : r.notes) std::cerr << "kvscope: note: " << note << "\n";
  auto replay = trace::TraceReader::open(o.output);
  if (!o.quiet) {
    std::cout << "original: "
              << outcome_text(original->task_success(), original->task_score(),
                              original->answer_logprob(), original->answer_rank())
              << "\nreplay:   "
              << outcome_text(replay->task_success(), replay->task_score(),
                              replay->answer_logprob(), replay->answer_rank())
              << "\n";
    if (replay->n_interventions() > 0)
      std::cout << "interventions changed " << replay->n_interventions()
                << " decisions (/interventions)\n";
    std::cout << "generated: " << r.generation.text << "\n";
  }
  if (!o.interventions.empty()) return kExitOk;
  const std::string diff = recorder::first_difference(*original, *replay);
  if (diff.empty()) {
    if (!o.quiet) std::cout << "the replay reproduces " << o.trace << " exactly\n";
    return kExitOk;
  }
  std::cerr << "kvscope: error: the replay without interventions differs from " << o.trace << ": "
            << diff << "\n";
  return kExitFailure;
}

Command add_replay_command(CLI::App& app) {
  auto opt = std::make_shared<ReplayOptions>();
  CLI::App* sub = app.add_subcommand("replay", engine_summary("replay"));
  sub->add_option("TRACE", opt->trace, "trace of a capture (.kvtrace.h5)")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option(
      "--intervene", opt->interventions,
      "restore:heads=L.H,...|layers=A-B|all[,from=STEP] (what the policy takes there stays), "
      "pin:tokens=needle|question|A-B[,heads=...] (those tokens stay), "
      "drop:tokens=...[,heads=...][,at=STEP] (those tokens leave), only:heads=... (the policy "
      "acts only there); repeatable (docs/causal.md)");
  sub->add_option("-o,--output", opt->output, "the replay's trace (.kvtrace.h5)")->required();
  add_replay_overrides(sub, &opt->overrides);
  sub->add_flag("-q,--quiet", opt->quiet, "print only errors");
  return {sub, [opt] {
            check_output_path(opt->output, "-o");
            return run_replay(*opt);
          }};
}

}  // namespace

KVSCOPE_REGISTER_COMMAND("replay", add_replay_command);

}  // namespace kvscope::cli
