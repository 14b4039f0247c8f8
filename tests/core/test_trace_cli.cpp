// `kvscope info` end to end: summaries, --json, --check, and exit codes
// (0 ok, 2 bad input).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fstream>

#include "tests/core/trace_test_util.h"
#include "tests/support/paths.h"

using kvscope::test::kvscope_exe;
using kvscope::test::run_command;

TEST_CASE("kvscope info summarises and validates a trace", "[cli]") {
  std::string dir = kvscope::test::temp_dir();
  std::string path = kvscope::test::write_small_trace(dir, "t.kvtrace.h5", 2, 5);
  std::string out;
  REQUIRE(run_command(kvscope_exe() + " info " + path, &out) == 0);
  CHECK_THAT(out, Catch::Contains("complete  yes"));
  CHECK_THAT(out, Catch::Contains("synthetic:sinks=2,window=8"));
  CHECK_THAT(out, Catch::Contains("series    cutoff\n"));

  REQUIRE(run_command(kvscope_exe() + " info --json " + path + " 2>/dev/null", &out) == 0);
  nlohmann::json j = nlohmann::json::parse(out);
  CHECK(j["model"]["n_layers"] == 3);
  CHECK(j["complete"] == true);
  CHECK(j["tiers"] == nlohmann::json::array({"hot", "cold"}));
  CHECK(j["events"]["by_kind"]["demote"].get<int>() > 0);
  REQUIRE(j["series"].size() == 1);
  CHECK(j["series"][0]["name"] == "cutoff");
  CHECK(j["series"][0]["units"] == "1");

  REQUIRE(run_command(kvscope_exe() + " info --check " + path, &out) == 0);
  CHECK_THAT(out, Catch::StartsWith("OK: " + path + " is a valid KVScope trace v1 (complete"));
  REQUIRE(run_command(kvscope_exe() + " info --check --json " + path + " 2>/dev/null", &out) == 0);
  CHECK(nlohmann::json::parse(out)["valid"] == true);
}

TEST_CASE("kvscope exit codes for bad input", "[cli]") {
  std::string dir = kvscope::test::temp_dir();
  std::string out;
  CHECK(run_command(kvscope_exe() + " --version", &out) == 0);
  CHECK_THAT(out, Catch::StartsWith("kvscope "));
  CHECK(run_command(kvscope_exe() + " no-such-command", &out) == 2);
  CHECK(run_command(kvscope_exe() + " info", &out) == 2);
  CHECK(run_command(kvscope_exe() + " info " + dir + "/missing.h5", &out) == 2);
  CHECK_THAT(out, Catch::Contains("missing.h5: cannot open: No such file or directory"));
  std::ofstream(dir + "/junk.h5") << "junk";
  CHECK(run_command(kvscope_exe() + " info --check " + dir + "/junk.h5", &out) == 2);
  CHECK_THAT(out, Catch::Contains("not an HDF5 file"));
  CHECK_THAT(out, Catch::Contains("INVALID"));
  CHECK(run_command(kvscope_exe() + " synth --layers 0 -o " + dir + "/x.h5", &out) == 2);
}
