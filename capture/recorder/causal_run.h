// The causal search run on a real capture (`kvscope why --causal`, a sweep
// plan's `causal = true`): the observational ranking from the trace, the
// search of core/analysis/causal_search.h over replays of it
// (replay.h), every replay's trace and replays.csv in a folder, and the
// report that becomes causal.json (docs/causal.md).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "capture/generate/engine.h"
#include "capture/recorder/replay.h"
#include "core/analysis/causal_search.h"
#include "core/trace/reader.h"

namespace kvscope::recorder {

struct CausalRunOptions {
  std::string folder;  // receives the replays' traces, replays.csv and causal.json
  int64_t budget = 48;
  double fraction = 0.9;
  double kl = 0.1;  // as kvscope why's: the observational report it ranks heads by
};

struct CausalRun {
  analysis::CausalResult result;
  nlohmann::json report;  // what causal.json holds
};

// `engine` runs the trace's model (replay_source's ModelOptions); `source`
// as replay_source made it. Throws InputError naming the trace when there is
// nothing to search: no expected answer, or a policy that lost nothing.
CausalRun run_causal_search(const trace::TraceReader& original, ReplaySource source,
                            generate::Engine& engine, const CausalRunOptions& options);

}  // namespace kvscope::recorder
