// The scale-out arithmetic of kvscope sweep (app/cli/engine/sweep_scale.h): which
// device each --jobs worker captures on, what a shard process is told, and
// the --shard syntax. The processes themselves run in sweep_test.py and
// sweep_slurm_test.py.
#include <catch2/catch.hpp>

#include <algorithm>

#include "app/cli/engine/sweep_scale.h"
#include "core/common/input_error.h"

using namespace kvscope;
using namespace kvscope::cli;

TEST_CASE("sweep --jobs --device cuda spreads the workers over the visible GPUs") {
  // Four workers on two GPUs: two each, alternating, none left idle.
  CHECK(worker_device("cuda", 0, 2) == "cuda:0");
  CHECK(worker_device("cuda", 1, 2) == "cuda:1");
  CHECK(worker_device("cuda", 2, 2) == "cuda:0");
  CHECK(worker_device("cuda", 3, 2) == "cuda:1");
  CHECK(worker_device("cuda", 5, 8) == "cuda:5");
  // One GPU (or none seen here): "cuda" as asked, so the trace says "cuda".
  CHECK(worker_device("cuda", 3, 1) == "cuda");
  CHECK(worker_device("cuda", 3, 0) == "cuda");
  // A pinned GPU and the CPU are every worker's as given.
  CHECK(worker_device("cuda:1", 0, 4) == "cuda:1");
  CHECK(worker_device("cuda:1", 3, 4) == "cuda:1");
  CHECK(worker_device("cpu", 2, 4) == "cpu");
}

TEST_CASE("a shard process is told the plan, folder, shard, threads and device") {
  ShardWork work{"plan.toml", "out", "cuda:1", true};
  const std::vector<std::string> args = shard_arguments(work, "4", "1/3");
  const std::vector<std::string> expected = {
      "sweep",     "plan.toml", "-o",       "out",    "--shard",       "1/3",
      "--threads", "4",         "--device", "cuda:1", "--retry-failed"};
  CHECK(args == expected);
  work.retry_failed = false;
  const std::vector<std::string> plain = shard_arguments(work, "4", "1/3");
  CHECK(std::find(plain.begin(), plain.end(), "--retry-failed") == plain.end());
}

TEST_CASE("sweep shards: --shard K/N takes 0 <= K < N and names anything else") {
  const Shard s = parse_shard("2/5");
  CHECK(s.index == 2);
  CHECK(s.count == 5);
  for (const char* bad : {"5/5", "-1/3", "1/0", "1-3", "1/3x", "", "a/b"})
    CHECK_THROWS_WITH(parse_shard(bad), std::string("--shard: expected K/N with 0 <= K < N (e.g. "
                                                    "0/4), got '") +
                                            bad + "'");
}
