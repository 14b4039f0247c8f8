// The results table of a sweep (docs/sweeps.md): one row per finished cell.
// Written as CSV while the sweep runs (a row appended and flushed per cell,
// so a killed sweep keeps what it finished) and as Parquet when it is
// collected; read back by resume, --collect, the GUI's sweep view and tools.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace kvscope::sweep {

struct ResultRow {
  std::string cell_id, model, policy, task, task_base;
  std::optional<int64_t> tokens, seed;
  std::optional<double> depth;
  std::string status;  // "ok" or "failed"
  std::optional<int64_t> success;
  std::string expected, generated;
  // (layer, kv head) pairs that could read the whole needle / none of it when
  // the answer was generated, out of n_heads (from `kvscope why`).
  std::optional<int64_t> needle_heads_whole, needle_heads_none, n_heads;
  std::optional<double> lost_mass, max_kl, wall_s;
  // Share of the expected answers found (RULER's string_match_all score; for a
  // one-answer task 1 or 0, like success).
  std::optional<double> score;
  // Where the cell ran (cpu, cuda, cuda:N) and the weights' precision (fp32,
  // bf16, fp16): wall_s means nothing without them, and a resumed sweep can
  // mix devices. Empty in tables written before these columns.
  std::string device, dtype;
  // The plan's budget for the cell's policy (a fraction of the prompt or
  // entries per head; unknown: no budget axis) and the KV cache bytes the
  // trace records held: the mean over decode steps and the peak over all.
  std::optional<double> budget, kv_bytes_mean;
  std::optional<int64_t> kv_bytes_peak;
  // The causal search on a missed cell (plan key causal): the minimal set of
  // (layer, kv head) whose restored losses recover the answer ("L.H" items
  // joined by spaces; empty: none found), its size (unknown: not searched,
  // -1: restoring every loss does not recover it) and the replays it ran.
  std::string causal_set;
  std::optional<int64_t> causal_set_size, causal_replays;
  // 1: the set is minimal (every removal was tried); 0: the budget ran out
  // first and the set is the smallest recovering one the search saw.
  std::optional<int64_t> causal_minimal;
  std::optional<int64_t> n_kv_heads;  // the model's kv heads per layer (n_heads / it: layers)
  std::string trace;                  // relative to the results table's folder
  std::string error;

  bool ok() const { return status == "ok"; }
  // Share of heads that held the whole needle (NaN when unknown).
  double needle_survival() const;
};

// One column of the table: its name and how to read or write it in a row.
struct ResultColumn {
  enum class Kind { Text, Integer, Real };
  const char* name;
  Kind kind;
  std::string ResultRow::*text = nullptr;
  std::optional<int64_t> ResultRow::*integer = nullptr;
  std::optional<double> ResultRow::*real = nullptr;
  // Added after the first tables were written: optional when reading (older
  // tables lack it; the reader derives or leaves it unknown).
  bool added_later = false;
};

// The columns in file order.
const std::vector<ResultColumn>& result_columns();

// The CSV header line and one row (no newline), RFC 4180 quoting.
std::string csv_header();
std::string csv_row(const ResultRow& row);

// Reads a results CSV by its header's names (columns added later are
// optional, unknown ones ignored, so older and newer tables both read).
// Throws InputError naming the file, line and column of a malformed field.
std::vector<ResultRow> read_results_csv(const std::string& path);

// Writes the rows to path atomically (a temporary file renamed into place),
// so a reader never sees half a table.
void write_results_csv(const std::string& path, const std::vector<ResultRow>& rows);
// The same table as Parquet (same columns and types; unknown numbers null).
void write_results_parquet(const std::string& path, const std::vector<ResultRow>& rows);

// The cell's policy spec without the budget=B the plan gave its first part
// (sweep_plan.cpp's with_budget): "snapkv:window=8,budget=0.25+pyramid" ->
// "snapkv:window=8+pyramid"; the spec itself for a cell without a budget.
std::string press_of(const ResultRow& r);

// The cell's task without the dataset row (and question) the plan's `rows`
// gave it: the rows of a dataset are its samples, so the leaderboard and the
// memory curve average over them ("dataset:file=F,scorer=f1,row=3" ->
// "dataset:file=F,scorer=f1"). Other tasks: task_base.
std::string dataset_of(const ResultRow& r);

// The table in the shape of the kvpress leaderboard (model, dataset, press,
// compression_ratio, score): one line per (model, dataset_of, policy, budget) with
// the mean score x 100 over its ok cells and their count. compression_ratio is
// kvpress's (the share of the prompt dropped): 1 - budget for a fraction,
// 1 - budget / tokens for entries, 0 without a budget; press is the policy
// spec without the budget the plan gave it.
void write_leaderboard_csv(const std::string& path, const std::vector<ResultRow>& rows);
std::string leaderboard_csv_path(const std::string& dir);

// A sweep's output folder: results.csv, shards/results.K-of-N.csv (one per
// worker of `--jobs` or Slurm array task), traces/.
std::string results_csv_path(const std::string& dir);
std::string results_parquet_path(const std::string& dir);
std::string shard_csv_path(const std::string& dir, int shard, int shards);

// Every row in results.csv and the shard files, one per cell: a cell that
// finished ok in any file wins over a failed attempt, otherwise the first
// seen. Ordered as plan_order (cell ids), rows of cells not in it after.
std::vector<ResultRow> gather_results(const std::string& dir,
                                      const std::vector<std::string>& plan_order);
// Cells with a row in any of the folder's tables (failed ones only when
// count_failed: a retry runs them again).
std::set<std::string> finished_cells_in(const std::string& dir, bool count_failed);
// Rewrites results.csv, results.parquet and leaderboard.csv from gather_results. Shard files
// stay (a worker may still append); merging again is idempotent.
std::vector<ResultRow> collect_results(const std::string& dir,
                                       const std::vector<std::string>& plan_order);

}  // namespace kvscope::sweep
