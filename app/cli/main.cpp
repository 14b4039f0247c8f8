// kvscope: the command-line front end. The commands that read traces run
// here, without LibTorch; a command that runs a model (capture, train, ...)
// is handed, with the same arguments, to kvscope-engine beside this
// executable, so the user has one command and `kvscope info` starts at once.
#include "app/cli/cli_main.h"

int main(int argc, char** argv) {
  using namespace kvscope::cli;
  if (argc > 1 && is_engine_command(argv[1]) && !is_registered_here(argv[1]))
    return hand_to_engine(argv);
  return run_cli(
      argc, argv, [](const std::exception& e) { return std::string(e.what()); },
      /*stubs=*/true);
}
