// The options of `policies`, declared once for its two homes: kvscope's
// catalogue (app/cli/catalogue/policies.cpp) and kvscope-engine's
// (app/cli/engine/policies.cpp), which --explain is handed to.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "app/cli/cli_main.h"

namespace kvscope::cli {

struct PoliciesOptions {
  bool json = false;
  bool markdown = false;
  std::string explain;        // a spec: print its composed parts
  int64_t prompt_tokens = 0;  // with explain: what a fraction budget refers to
};

inline CLI::App* add_policies_subcommand(CLI::App& app, PoliciesOptions& o) {
  CLI::App* sub = app.add_subcommand("policies", engine_summary("policies"));
  sub->add_flag("--json", o.json, "print JSON");
  sub->add_flag("--markdown", o.markdown, "print the index tables of docs/policies/README.md");
  sub->add_option("--explain", o.explain,
                  "print the parts a policy spec composes (SPEC as for --policy)");
  sub->add_option("--prompt-tokens", o.prompt_tokens,
                  "with --explain: the prompt length a fraction budget (budget=0.25) refers to");
  return sub;
}

}  // namespace kvscope::cli
