// kvscope why TRACE --causal [--budget N] [-o DIR] [--json]: which heads'
// losses cost the answer. kvscope's own `why` (app/cli/trace/why.cpp) hands
// a --causal run here; the search runs in capture/recorder/causal_run.h.
// DIR (default TRACE's name + ".causal") receives every replay's trace,
// replays.csv (one line per replay) and causal.json (the report).
#include <iostream>
#include <memory>

#include "app/cli/cli_main.h"
#include "app/cli/command.h"
#include "app/cli/engine/replay_cli.h"
#include "capture/generate/engine.h"
#include "capture/recorder/causal_run.h"
#include "capture/recorder/replay.h"
#include "core/analysis/causal_search.h"
#include "core/common/input_error.h"
#include "core/trace/reader.h"

namespace kvscope::cli {

namespace {

struct CausalOptions {
  std::string trace;
  bool causal = false;
  recorder::CausalRunOptions search;
  std::string output;
  bool json = false;
  recorder::ReplayOverrides overrides;
};

int run_causal(CausalOptions o) {
  if (!o.causal)
    throw InputError("", "--causal",
                     "kvscope-engine's why runs the causal search only; `kvscope why TRACE` gives "
                     "the observational report");
  if (o.search.budget < 1)
    throw InputError("", "--budget",
                     "is " + std::to_string(o.search.budget) + " (expected >= 1 replays)");
  auto original = trace::TraceReader::open(o.trace);
  recorder::ReplaySource source = recorder::replay_source(*original, o.overrides);
  o.search.folder = o.output.empty() ? o.trace + ".causal" : o.output;
  generate::Engine engine = generate::open_engine(source.model);
  const recorder::CausalRun run =
      recorder::run_causal_search(*original, std::move(source), engine, o.search);
  if (o.json)
    std::cout << run.report.dump(2) << "\n";
  else
    std::cout << analysis::format_causal(run.result, original->n_kv_heads())
              << "replays: " << o.search.folder << "/ (replays.csv, causal.json, the traces)\n";
  return kExitOk;
}

Command add_why_causal_command(CLI::App& app) {
  auto opt = std::make_shared<CausalOptions>();
  CLI::App* sub = app.add_subcommand("why", engine_summary("why"));
  sub->add_option("TRACE", opt->trace, "trace of a --task capture (.kvtrace.h5)")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_flag("--causal", opt->causal, "run the causal search (replays)");
  sub->add_option("--budget", opt->search.budget, "replays the search may run")
      ->capture_default_str();
  sub->add_option("--fraction", opt->search.fraction,
                  "share of the log-probability gap to the full restoration that counts as "
                  "recovered")
      ->capture_default_str();
  sub->add_option("-o,--output", opt->output, "folder for the replays (default TRACE.causal)");
  sub->add_flag("--json", opt->json, "print JSON instead of text");
  sub->add_option("--kl", opt->search.kl, "as kvscope why's --kl")->capture_default_str();
  add_replay_overrides(sub, &opt->overrides);
  return {sub, [opt] { return run_causal(*opt); }};
}

}  // namespace

KVSCOPE_REGISTER_COMMAND("why", add_why_causal_command);

}  // namespace kvscope::cli
