// The one registry of trainers, by name (`kvscope train --policy NAME`): the
// shape of the policy registry. `kvscope train --list`, `--explain NAME` and
// the command's options come from it; a trainer is its file, its descriptor
// function (trainers.h) and its line in registry.cpp's list
// (docs/architecture.md, "Adding things").
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "capture/policy/params.h"
#include "capture/train/train_options.h"

namespace kvscope::gates {

using policy::Params;
using policy::ParamSpec;
using policy::ParamType;

// What a trainer learns from.
enum class TrainInput {
  Text,    // windows of --data / --generate text under --model
  Traces,  // full-cache traces (--traces); --model is optional, the traces name it
};

// What -o is.
enum class TrainOutput {
  File,       // a new file: the command checks its directory before the run
  Directory,  // a directory the trainer makes (duo-attention's pattern)
  Checked,    // a file whose form the trainer checks itself (streaming-plus's model)
};

struct TrainerDescriptor {
  std::string name;     // --policy NAME
  std::string summary;  // one line
  std::string paper;    // citation of the paper whose objective it trains
  std::string doc;      // docs/... page with the objective and its settings
  TrainInput input = TrainInput::Text;
  TrainOutput output = TrainOutput::File;
  std::string writes;     // what -o becomes and what lands beside it, in words
  std::string gate_keys;  // the --gate key=value hyperparameters it reads, comma-separated
  // The method's own options, each `--NAME` on the command line (underscores
  // as dashes; a Bool is a flag). Two trainers may share an option only with
  // the same type and range.
  std::vector<ParamSpec> options;
  // Runs the trainer: `o` holds the shared options, `p` the method's own
  // (defaults filled in); throws InputError for what the user can fix.
  using Run = std::function<TrainResult(TrainOptions o, const Params& p)>;
  Run run;
};

const std::vector<TrainerDescriptor>& builtin_trainers();
// nullptr when no trainer has that name.
const TrainerDescriptor* find_trainer(const std::string& name);
// Runs the trainer `name` as `kvscope train --policy NAME` does, with its
// own options given as text by name ("lambda" -> "0.2"); throws InputError
// for an unknown name or option.
TrainResult run_trainer(const std::string& name, const TrainOptions& o,
                        const std::map<std::string, std::string>& options = {});
// The trainer's own options from `given` (by name, as text) with the
// defaults of the rest; throws InputError naming the option ("--retrofit")
// for one the trainer does not take, and its value for one out of range.
Params trainer_params(const TrainerDescriptor& d, const std::map<std::string, std::string>& given);
// The trainers that take an option (by ParamSpec name), comma-separated.
std::string trainers_taking(const std::string& option);
// The known names, comma-separated (for messages).
std::string trainer_names();
// `kvscope train --explain NAME`: the descriptor in words.
std::string explain_trainer(const TrainerDescriptor& d);
// The --gate keys of gate kinds, from their defaults (gate_set.cpp), joined.
std::string hyper_keys(const std::vector<GateKind>& kinds);
// The command-line spelling of an option: "no_balance" -> "--no-balance".
std::string option_flag(const ParamSpec& spec);

}  // namespace kvscope::gates
