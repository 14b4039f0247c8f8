// The loop both executables run: parse, run the one subcommand given, map
// failures to exit codes. `kvscope` holds the commands that read traces
// (app/cli/trace, app/cli/gui) and hands the ones that run a model to
// `kvscope-engine` (app/cli/engine), so reading a trace never loads LibTorch.
#pragma once

#include <exception>
#include <string>

namespace kvscope::cli {

// One engine command: its name and the line `kvscope --help` shows for it.
struct EngineCommand {
  const char* name;
  const char* summary;
};

// The commands kvscope-engine runs, in the order `--help` lists them. The
// engine's subcommands take their summaries from here (engine_summary), and
// the engine checks at start that it registers exactly these.
const EngineCommand* engine_commands_begin();
const EngineCommand* engine_commands_end();
// The summary of engine command `name`; throws std::logic_error for a name
// the table lacks (a command registered without its line here).
const char* engine_summary(const char* name);
bool is_engine_command(const std::string& name);
// Whether this executable registered `name` itself (kvscope lists the
// policies from its embedded catalogue; the engine has the command too).
bool is_registered_here(const std::string& name);

// Replaces this process with kvscope-engine beside this executable, with the
// same arguments (argv[0] kept, so the trace's command line is what the user
// typed). Returns kExitFailure, the reason printed, only when that fails.
int hand_to_engine(char** argv);
// The argv run_cli was given (for a command that hands itself over).
char** invocation();

// Text of a runtime failure for "kvscope: error: ..." (the engine names
// LibTorch's errors without their backtraces; the trace commands use what()).
using FailureText = std::string (*)(const std::exception&);

// Builds the CLI from command_registry() (plus, for kvscope, a stub per
// engine command so that --help lists them), parses and runs. `stubs`: add
// the stubs of the engine commands not registered here.
int run_cli(int argc, char** argv, FailureText failure_text, bool stubs);

}  // namespace kvscope::cli
