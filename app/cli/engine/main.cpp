// kvscope-engine: the commands that load a model or the policy registry
// (LibTorch). Users run them as `kvscope COMMAND`; app/cli/main.cpp hands
// them over. The engine registers exactly the commands of cli_main.cpp's
// table, or refuses to start.
#include <iostream>
#include <set>
#include <string>

#include "app/cli/cli_main.h"
#include "app/cli/command.h"
#include "capture/generate/failure_text.h"

namespace {

std::string failure_text(const std::exception& e) {
  return kvscope::generate::failure_text(e);
}

// The registered commands and the table name the same set.
bool registry_matches_table() {
  using namespace kvscope::cli;
  std::set<std::string> registered, listed;
  for (const auto& entry : command_registry()) registered.insert(entry.first);
  for (const EngineCommand* c = engine_commands_begin(); c != engine_commands_end(); ++c)
    listed.insert(c->name);
  return registered == listed;
}

}  // namespace

int main(int argc, char** argv) {
  if (!registry_matches_table()) {
    std::cerr << "kvscope-engine: internal error: its commands and cli_main.cpp's table differ\n";
    return kvscope::cli::kExitFailure;
  }
  return kvscope::cli::run_cli(argc, argv, failure_text, /*stubs=*/false);
}
