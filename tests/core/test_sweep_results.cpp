// The sweep results table (core/sweep): CSV round trip with the fields a
// generated text can hold, tables read by their header's names (older ones
// without task_base), torn last rows dropped, malformed fields named, the
// merge of shard tables (plan order, ok beats failed), and the Parquet file's
// framing (its content is checked with pyarrow by tests/cli/sweep_test.py).
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/common/input_error.h"
#include "core/sweep/results_table.h"
#include "tests/support/paths.h"

using namespace kvscope;
using sweep::ResultRow;

namespace {

ResultRow row(const std::string& id, const std::string& status, const std::string& generated) {
  ResultRow r;
  r.cell_id = id;
  r.model = "m.gguf";
  r.policy = "h2o:heavy=8,recent=8";
  r.task = "niah:keys=2,tokens=200,depth=0.5,seed=1";
  r.task_base = "niah:keys=2";
  r.tokens = 200;
  r.depth = 0.5;
  r.seed = 1;
  r.status = status;
  if (status == "ok") {
    r.success = 1;
    r.needle_heads_whole = 3;
    r.n_heads = 4;
    r.max_kl = 0.25;
    r.trace = "traces/" + id + ".kvtrace.h5";
  } else {
    r.error = "boom, \"quoted\"";
  }
  r.expected = "123";
  r.generated = generated;
  r.wall_s = 1.5;
  r.device = "cuda:1";
  r.dtype = "bf16";
  return r;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("results table: CSV round trip keeps quotes, commas and newlines") {
  const std::string dir = test::temp_dir();
  const std::string path = dir + "/results.csv";
  const std::vector<ResultRow> rows = {row("c000000000001", "ok", "a, \"b\"\nline two"),
                                       row("c000000000002", "failed", "")};
  sweep::write_results_csv(path, rows);
  const std::vector<ResultRow> back = sweep::read_results_csv(path);
  REQUIRE(back.size() == 2);
  CHECK(back[0].generated == "a, \"b\"\nline two");
  CHECK(back[0].needle_survival() == Approx(0.75));
  CHECK(back[0].max_kl == 0.25);
  CHECK(back[1].error == "boom, \"quoted\"");
  CHECK(back[0].device == "cuda:1");
  CHECK(back[0].dtype == "bf16");
  CHECK(!back[1].success.has_value());  // a failed cell's metrics are unknown, not 0
  CHECK(!back[1].max_kl.has_value());
  CHECK(std::isnan(back[1].needle_survival()));
  CHECK(sweep::csv_row(back[0]) == sweep::csv_row(rows[0]));
}

TEST_CASE("results table: read by header names, a torn last row is dropped, bad fields named") {
  const std::string dir = test::temp_dir();
  const std::string path = dir + "/results.csv";
  // An older table: no task_base column, columns in another order.
  std::ofstream(path)
      << "task,cell_id,model,policy,tokens,depth,seed,status,success,expected,generated,"
         "needle_heads_whole,needle_heads_none,n_heads,lost_mass,max_kl,wall_s,trace,error\n"
      << "\"needle:tokens=200,depth=0.2,seed=1\",c000000000003,m,full,200,0.2,1,ok,1,7,x 7,4,0,4,"
         ",0,0.1,traces/c000000000003.kvtrace.h5,\n"
      << "\"needle:tokens=200,depth=0.8,seed=1\",c0000000";  // torn: no newline
  const std::vector<ResultRow> rows = sweep::read_results_csv(path);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].cell_id == "c000000000003");
  CHECK(rows[0].task_base == "needle");
  CHECK(rows[0].depth == 0.2);
  CHECK_FALSE(rows[0].score);     // older than the score column
  CHECK(rows[0].device.empty());  // and than device and dtype: unknown, not guessed
  CHECK(rows[0].dtype.empty());
  std::ofstream(path)
      << sweep::csv_header() << "\n"
      << "c000000000004,m,full,needle,two hundred,0.2,1,ok,1,,,,,,,,,,,needle,1,cpu,fp32,,,,,,,,\n";
  try {
    sweep::read_results_csv(path);
    FAIL("a malformed integer was read");
  } catch (const InputError& e) {
    CHECK(std::string(e.what()) == path + ":2: tokens: expected an integer, got 'two hundred'");
  }
  std::ofstream(path) << "cell_id,model\nc1,m\n";
  CHECK_THROWS_WITH(sweep::read_results_csv(path), path + ":1: header: column 'policy' missing");
}

TEST_CASE("results table: shard tables merge in plan order, ok beats failed, Parquet framed") {
  const std::string dir = test::temp_dir() + "/sweep";
  std::filesystem::create_directories(dir + "/shards");
  sweep::write_results_csv(sweep::results_csv_path(dir),
                           {row("c000000000002", "failed", ""), row("c000000000009", "ok", "z")});
  sweep::write_results_csv(sweep::shard_csv_path(dir, 0, 2), {row("c000000000002", "ok", "y")});
  sweep::write_results_csv(sweep::shard_csv_path(dir, 1, 2), {row("c000000000001", "ok", "x")});
  CHECK(sweep::finished_cells_in(dir, false) ==
        std::set<std::string>{"c000000000001", "c000000000002", "c000000000009"});
  const std::vector<ResultRow> merged =
      sweep::collect_results(dir, {"c000000000001", "c000000000002"});
  REQUIRE(merged.size() == 3);
  CHECK(merged[0].cell_id == "c000000000001");
  CHECK(merged[1].cell_id == "c000000000002");
  CHECK(merged[1].ok());                        // the retry that succeeded replaced the failure
  CHECK(merged[2].cell_id == "c000000000009");  // not in the plan: kept, after
  CHECK(sweep::read_results_csv(sweep::results_csv_path(dir)).size() == 3);
  CHECK(sweep::collect_results(dir, {"c000000000001", "c000000000002"}).size() == 3);
  const std::string parquet = slurp(sweep::results_parquet_path(dir));
  REQUIRE(parquet.size() > 16);
  CHECK(parquet.substr(0, 4) == "PAR1");
  CHECK(parquet.substr(parquet.size() - 4) == "PAR1");
  // The footer length (4 bytes before the trailing magic) stays inside the file.
  uint32_t footer = 0;
  for (int i = 0; i < 4; ++i)
    footer |= uint32_t(uint8_t(parquet[parquet.size() - 8 + size_t(i)])) << (8 * i);
  CHECK(footer > 0);
  CHECK(footer < parquet.size() - 12);
  CHECK(parquet.find("needle_heads_whole") != std::string::npos);
}

TEST_CASE("results table: a dataset's rows are one dataset on the leaderboard") {
  const auto with = [](const std::string& task_base, const std::string& policy,
                       std::optional<double> budget, double score) {
    ResultRow r = row("c", "ok", "");
    r.task_base = task_base;
    r.policy = policy;
    r.budget = budget;
    r.score = score;
    return r;
  };
  CHECK(sweep::dataset_of(with("dataset:file=d.jsonl,scorer=f1,row=3", "full", {}, 1)) ==
        "dataset:file=d.jsonl,scorer=f1");
  CHECK(sweep::dataset_of(with("dataset:row=3,file=d.jsonl,question=1", "full", {}, 1)) ==
        "dataset:file=d.jsonl");
  CHECK(sweep::dataset_of(with("niah:keys=2", "full", {}, 1)) == "niah:keys=2");
  CHECK(sweep::dataset_of(with("dataset:file=row=.jsonl", "full", {}, 1)) ==
        "dataset:file=row=.jsonl");
  CHECK(sweep::press_of(with("x", "snapkv:window=8,budget=0.25+pyramid", 0.25, 1)) ==
        "snapkv:window=8+pyramid");
  const std::string dir = test::temp_dir(), path = sweep::leaderboard_csv_path(dir);
  sweep::write_leaderboard_csv(
      path, {with("dataset:file=d.jsonl,scorer=f1,row=0", "snapkv:budget=0.25", 0.25, 1),
             with("dataset:file=d.jsonl,scorer=f1,row=1", "snapkv:budget=0.25", 0.25, 0.5),
             with("dataset:file=d.jsonl,scorer=f1,row=2", "snapkv:budget=0.25", 0.25, 0)});
  CHECK(slurp(path) ==
        "model,dataset,press,compression_ratio,score,n\n"
        "m.gguf,\"dataset:file=d.jsonl,scorer=f1\",snapkv,0.75,50,3\n");
}
