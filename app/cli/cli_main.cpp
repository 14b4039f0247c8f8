#include "app/cli/cli_main.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <stdexcept>
#include <vector>

#include "app/cli/command.h"
#include "core/common/input_error.h"
#include "kvscope_version.h"

namespace kvscope::cli {

namespace {

constexpr EngineCommand kEngineCommands[] = {
    {"capture", "Generate under a KV-cache policy and record a trace"},
    {"chat-template", "Print a conversation as the model's chat template renders it"},
    {"generate", "Generate text with a model (dense KV cache)"},
    {"model-info", "Describe a model file or directory"},
    {"policies", "List the KV-cache policies, their parameters and papers"},
    {"replay",
     "Re-run the capture a trace records, with interventions on the policy's decisions "
     "(restore, pin, drop, only); without them, check it reproduces the trace"},
    {"sweep",
     "Capture every cell of a plan (models x policies x tasks x lengths x depths x seeds) into "
     "traces and a results table; resumable"},
    {"why",
     "The causal search (kvscope why TRACE --causal): replays with the policy's losses restored "
     "find the smallest set of heads whose losses cost the answer"},
    {"train",
     "Train learned KV-cache gates, or calibrate or profile what a policy reads (kvscope train "
     "--list)"},
};

char** g_argv = nullptr;

}  // namespace

const EngineCommand* engine_commands_begin() {
  return std::begin(kEngineCommands);
}
const EngineCommand* engine_commands_end() {
  return std::end(kEngineCommands);
}

const char* engine_summary(const char* name) {
  for (const EngineCommand& c : kEngineCommands)
    if (std::string(c.name) == name) return c.summary;
  throw std::logic_error(std::string("engine command '") + name +
                         "' has no line in app/cli/cli_main.cpp's kEngineCommands");
}

bool is_engine_command(const std::string& name) {
  return std::any_of(std::begin(kEngineCommands), std::end(kEngineCommands),
                     [&](const EngineCommand& c) { return name == c.name; });
}

bool is_registered_here(const std::string& name) {
  const auto& registry = command_registry();
  return std::any_of(registry.begin(), registry.end(),
                     [&](const auto& entry) { return entry.first == name; });
}

int hand_to_engine(char** argv) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  const fs::path engine = (ec ? fs::path(argv[0]) : self).parent_path() / "kvscope-engine";
  execv(engine.c_str(), argv);
  std::cerr << "kvscope: error: " << argv[1] << " runs in the capture engine " << engine.string()
            << ", which could not be started: " << std::strerror(errno) << "\n";
  return kExitFailure;
}

char** invocation() {
  return g_argv;
}

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

int run_cli(int argc, char** argv, FailureText failure_text, bool stubs) {
  g_argv = argv;
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
  if (stubs)  // listed by --help; run by kvscope-engine (main.cpp hands them over before this)
    for (const EngineCommand* c = engine_commands_begin(); c != engine_commands_end(); ++c)
      if (!is_registered_here(c->name)) registry.emplace_back(c->name, nullptr);
  std::sort(registry.begin(), registry.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Command> commands;
  for (auto& [name, factory] : registry) {
    if (factory)
      commands.push_back(factory(app));
    else
      app.add_subcommand(name, engine_summary(name.c_str()))->allow_extras();
  }

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
    std::cerr << "kvscope: error: " << failure_text(e) << "\n";
    return kExitFailure;
  }
  return kExitBadInput;
}

}  // namespace kvscope::cli
