// The options every command that replays a trace takes (kvscope replay,
// kvscope why --causal): where the model is now, where to run, the threads,
// and whether another KVScope version's trace may be replayed.
#pragma once

#include <CLI/CLI.hpp>

#include "capture/recorder/replay.h"

namespace kvscope::cli {

inline void add_replay_overrides(CLI::App* sub, recorder::ReplayOverrides* o) {
  sub->add_option("--model", o->model, "the model, when it is no longer at /run model_path");
  sub->add_option("--device", o->device, "cpu, cuda or cuda:N (default cpu)");
  sub->add_option("--threads", o->threads,
                  "compute threads (0: OMP_NUM_THREADS if set, else one per core)")
      ->check(CLI::Range(0, 1024));
  sub->add_flag("--any-version", o->any_version, "replay a trace another KVScope version made");
}

}  // namespace kvscope::cli
