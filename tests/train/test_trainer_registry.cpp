// The trainer registry: every trainer described (paper, doc page that
// exists, options with help), names unique, `kvscope train --list` and
// `--explain` from it, and a method option refused by another trainer with
// the option named.
#include <catch2/catch.hpp>

#include <filesystem>
#include <set>

#include "capture/train/registry.h"
#include "core/common/input_error.h"
#include "tests/support/paths.h"

using namespace kvscope;

TEST_CASE("every trainer is described, and its doc page exists", "[train][registry]") {
  const std::vector<gates::TrainerDescriptor>& all = gates::builtin_trainers();
  REQUIRE(all.size() == 15);
  std::set<std::string> names;
  for (const gates::TrainerDescriptor& d : all) {
    INFO(d.name);
    CHECK(names.insert(d.name).second);
    CHECK_FALSE(d.summary.empty());
    CHECK_FALSE(d.paper.empty());
    CHECK_FALSE(d.writes.empty());
    CHECK(std::filesystem::exists(test::source_dir() + "/" + d.doc));
    CHECK(static_cast<bool>(d.run));
    for (const gates::ParamSpec& p : d.options) CHECK_FALSE(p.help.empty());
    CHECK(gates::find_trainer(d.name) == &d);
  }
  CHECK(gates::find_trainer("lru") == nullptr);
}

TEST_CASE("a trainer's options: defaults filled, another trainer's option refused by name",
          "[train][registry]") {
  const gates::TrainerDescriptor& kvpop = *gates::find_trainer("kvpop");
  const gates::Params p = gates::trainer_params(kvpop, {{"scorer", "mlp"}});
  CHECK(p.get_string("scorer") == "mlp");
  CHECK(p.get_int("kl_topk") == 256);
  CHECK_FALSE(p.get_bool("retrofit"));
  try {
    gates::trainer_params(*gates::find_trainer("wgkv"), {{"retrofit", "true"}});
    FAIL("no error");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()) ==
          "--retrofit: is an option of kvpop, not of wgkv (wgkv's options: --lambda)");
  }
  // Shared by two trainers: named with both.
  CHECK(gates::trainers_taking("budget") == "retention, retention-global");
  CHECK_THROWS_AS(gates::trainer_params(kvpop, {{"kl_topk", "0"}}), InputError);
  CHECK(gates::option_flag({"no_balance", gates::ParamType::Bool, "false", ""}) == "--no-balance");
}

TEST_CASE("kvscope train --list and --explain come from the registry", "[train][registry][cli]") {
  std::string out;
  REQUIRE(test::run_command(test::kvscope_exe() + " train --list", &out) == 0);
  for (const gates::TrainerDescriptor& d : gates::builtin_trainers()) {
    INFO(d.name);
    CHECK(out.find(d.name + " ") != std::string::npos);
    CHECK(out.find(d.summary) != std::string::npos);
  }
  REQUIRE(test::run_command(test::kvscope_exe() + " train --explain kvpop", &out) == 0);
  CHECK(out.find("--retrofit") != std::string::npos);
  CHECK(out.find("docs/policies/kvpop.md") != std::string::npos);
  CHECK(out.find("gamma_min") != std::string::npos);  // the --gate keys, from gate_set
  CHECK(test::run_command(test::kvscope_exe() + " train --explain lru", &out) == 2);
  CHECK(out.find("'lru' is not a trainer") != std::string::npos);
}
