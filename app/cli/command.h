// Subcommands of the `kvscope` command line. Each file under app/cli defines
// one subcommand and registers it with KVSCOPE_REGISTER_COMMAND; main() parses,
// runs the chosen one and maps failures to exit codes.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

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

using CommandFactory = Command (*)(CLI::App&);

// The command as typed (Linux: /proc/self/cmdline, arguments joined by
// spaces), for /run command_line and gate metadata.
std::string own_command_line();

// Registered factories, in registration order (sorted by name in --help).
std::vector<std::pair<std::string, CommandFactory>>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(const char* name, CommandFactory factory) {
    command_registry().emplace_back(name, factory);
  }
};

#define KVSCOPE_REGISTER_COMMAND(name, factory) \
  static const ::kvscope::cli::CommandRegistrar kvscope_command_registrar_##factory(name, factory)

}  // namespace kvscope::cli
