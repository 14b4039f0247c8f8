// kvscope policies [--json | --markdown] [--explain SPEC]: the listing is the
// engine's own output embedded at build time (policy_catalogue.h), so listing
// the policies loads no LibTorch; --explain builds the policy, which only the
// engine can, and is handed to it.
#include <iostream>
#include <memory>

#include "app/cli/catalogue/policy_catalogue.h"
#include "app/cli/cli_main.h"
#include "app/cli/command.h"
#include "app/cli/policies_options.h"

namespace kvscope::cli {

namespace {

Command add_policies_command(CLI::App& app) {
  auto o = std::make_shared<PoliciesOptions>();
  CLI::App* sub = add_policies_subcommand(app, *o);
  return {sub, [o] {
            if (!o->explain.empty()) return hand_to_engine(invocation());
            std::cout << (o->markdown ? kPolicyCatalogueMarkdown
                          : o->json   ? kPolicyCatalogueJson
                                      : kPolicyCatalogueText);
            return kExitOk;
          }};
}

}  // namespace

KVSCOPE_REGISTER_COMMAND("policies", add_policies_command);

}  // namespace kvscope::cli
