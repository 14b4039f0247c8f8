// kvscope: the command-line front end. Parses, dispatches to one subcommand
// and maps failures to exit codes (0 ok, 1 runtime failure, 2 bad input).
#include <algorithm>
#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

#include "app/cli/command.h"
#include "capture/generate/failure_text.h"
#include "core/common/input_error.h"
#include "kvscope_version.h"

namespace kvscope::cli {
std::string own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), out;
  for (char ch : all) out += ch == '\0' ? ' ' : ch;
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::vector<std::pair<std::string, CommandFactory>>& command_registry() {
  static std::vector<std::pair<std::string, CommandFactory>> registry;
  return registry;
}
}  // namespace kvscope::cli

int main(int argc, char** argv) {
  using namespace kvscope::cli;
  CLI::App app{"KVScope: a microscope for LLM KV-cache policies", "kvscope"};
  app.set_version_flag("--version", std::string("kvscope ") + KVSCOPE_VERSION_STRING);
  app.require_subcommand(1);
  // Usage errors read like every other error: "kvscope: error: --option: why".
  app.failure_message([](const CLI::App* failed, const CLI::Error& e) {
    std::string out = std::string("kvscope: error: ") + e.what() + "\n";
    if (failed && failed->get_help_ptr())
      out += "Run with " + failed->get_help_ptr()->get_name() + " for more information.\n";
    return out;
  });
  auto registry = command_registry();
  std::sort(registry.begin(), registry.end());
  std::vector<Command> commands;
  for (auto& [name, factory] : registry) commands.push_back(factory(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? kExitOk : kExitBadInput;
  }
  try {
    for (Command& command : commands)
      if (command.sub->parsed()) return command.run();
  } catch (const kvscope::InputError& e) {
    std::cerr << "kvscope: error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    // A runtime failure: LibTorch's text without its backtrace, running out
    // of memory said with what is there (capture/generate/failure_text.h).
    std::cerr << "kvscope: error: " << kvscope::generate::failure_text(e) << "\n";
    return kExitFailure;
  }
  return kExitBadInput;
}
