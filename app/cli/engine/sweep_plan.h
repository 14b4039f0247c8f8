// A sweep plan (TOML): models x policies x tasks x lengths x depths x seeds
// (x rows for dataset tasks), one capture per cell. docs/sweeps.md documents the keys with an
// example.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvscope::cli {

struct SweepPlan {
  std::string path;  // the plan file
  std::string name = "sweep";
  std::vector<std::string> models;
  std::string tokenizer;  // optional: for llama2.c checkpoints without a tokenizer beside them
  bool chat = false;
  std::string dtype = "fp32";  // the weights' (fp32 | bf16 | fp16): part of what a cell computes
  std::string kv_dtype;        // the KV cache's rows (--kv-dtype); empty: the weights' dtype
  int64_t max_new = 16;
  int64_t prefill_chunk = 512;
  std::string capture = "received";
  bool oracle = true;
  std::vector<std::string> policies;
  std::vector<std::string> tasks;  // task specs without tokens/depth/seed (needle, niah:keys=4)
  std::vector<int64_t> lengths;
  std::vector<double> depths;
  std::vector<int64_t> seeds{1};
  // Rows of the dataset tasks' files (`rows = "0:200"` or a list); empty: each
  // dataset task's own row. Other tasks have no rows.
  std::vector<int64_t> rows;
  std::string query = "auto";  // where the tasks' questions go (kvscope capture --query)
  // The memory axis: each policy with a budget parameter runs once per value
  // (<= 1: a fraction of the prompt's tokens, else entries per head); `full`
  // runs once. Empty: the policies as given.
  std::vector<double> budgets;
  // The causal search (docs/causal.md) on every cell that missed its answer,
  // within this many replays each; its traces go beside the cell's.
  bool causal = false;
  int64_t causal_budget = 24;
  std::map<std::string, int64_t> lines;  // key -> its line in the plan, for error messages

  // "plan.toml:12" for key (the [sweep] table's line when the key is absent).
  std::string where(const std::string& key) const;
};

struct SweepCell {
  std::string id;  // "c" + 12 hex digits of a hash of everything that defines the cell
  std::string model, policy,
      task;  // task: the full spec, e.g. "needle:tokens=1000,depth=0.5,seed=1"
  std::string task_base;
  int64_t length = 0;
  double depth = 0;
  int64_t seed = 0;
  double budget = 0;  // the plan's budget for this cell's policy, 0: none
};

// `spec` with budget=`budget` on its first part ("snapkv:window=8+pyramid" ->
// "snapkv:window=8,budget=0.25+pyramid").
std::string with_budget(const std::string& spec, double budget);

// Throws InputError naming the plan file, its line and the key.
SweepPlan parse_sweep_plan(const std::string& path);
// Every cell, grouped by model (one model load per group), in plan order.
std::vector<SweepCell> sweep_cells(const SweepPlan& plan);

}  // namespace kvscope::cli
