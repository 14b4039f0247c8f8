// Subcommands of the `kvscope` command line. Each file under app/cli adds one
// subcommand to the CLI11 parser and returns the function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace kvscope::cli {

// Exit codes of every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   // runtime failure
inline constexpr int kExitBadInput = 2;  // bad input or usage

using Runner = std::function<int()>;

struct Command {
  CLI::App* sub = nullptr;  // the CLI11 subcommand
  Runner run;               // runs it once parsing succeeded
};

Command add_info_command(CLI::App& app);
Command add_synth_command(CLI::App& app);

}  // namespace kvscope::cli
