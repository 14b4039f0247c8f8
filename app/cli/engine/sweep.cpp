// kvscope sweep PLAN [-o DIR]: one capture per cell of a plan, the model
// loaded once for all the cells a process runs; a results table (CSV, a row
// per finished cell, appended as each finishes) that makes the sweep
// resumable: a rerun skips the cells any table holds. A cell that fails is
// recorded with its error and the sweep goes on. --jobs, --shard and --slurm
// split the cells among processes (sweep_scale.h); every way ends by
// merging the tables into results.csv and results.parquet.
#include <unistd.h>

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>

#include "app/cli/cli_main.h"
#include "app/cli/command.h"
#include "app/cli/engine/sweep_plan.h"
#include "app/cli/engine/sweep_scale.h"
#include "capture/generate/engine.h"
#include "capture/generate/failure_text.h"
#include "capture/policy/registry.h"
#include "capture/recorder/capture_run.h"
#include "capture/recorder/causal_run.h"
#include "capture/recorder/replay.h"
#include "core/analysis/causal_search.h"
#include "core/analysis/why.h"
#include "core/common/input_error.h"
#include "core/sweep/results_table.h"
#include "core/trace/reader.h"

namespace kvscope::cli {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct SweepOptions {
  std::string plan;
  std::string output;  // default: <plan's folder>/<plan name>
  int threads = 0;
  std::string device = "cpu";  // where the captures run; not part of a cell's id
  int jobs = 1;
  std::string shard;  // "K/N": run only this shard's cells
  int slurm = 0;      // > 0: submit as a Slurm array of this many tasks
  std::vector<std::string> sbatch_options;
  bool collect = false;
  bool retry_failed = false;
};

struct CellOutcome {
  std::string status = "ok", error;
  analysis::WhyReport why;
  double kv_bytes_mean = std::nan("");
  int64_t kv_bytes_peak = 0;
  double wall_s = 0;
  int64_t kv_heads = 0;
  bool searched = false;  // the causal search ran on the cell
  std::vector<std::string> causal_set;
  int64_t causal_size = 0, causal_replays = 0;
  bool causal_minimal = false;
};

// The causal search on a cell that missed (plan key causal), beside its trace.
void causal_search_cell(const SweepPlan& plan, generate::Engine& engine,
                        const trace::TraceReader& reader, CellOutcome* out) {
  recorder::ReplaySource source = recorder::replay_source(reader, {});
  recorder::CausalRunOptions o;
  o.folder = reader.path() + ".causal";
  o.budget = plan.causal_budget;
  const recorder::CausalRun run = recorder::run_causal_search(reader, std::move(source), engine, o);
  out->searched = true;
  out->causal_replays = int64_t(run.result.replays.size());
  out->causal_set = analysis::head_names(run.result.minimal, reader.n_kv_heads());
  out->causal_size = run.result.recoverable ? int64_t(out->causal_set.size()) : -1;
  out->causal_minimal = run.result.minimal_confirmed;
}

recorder::CaptureRequest cell_request(const SweepPlan& plan, const SweepCell& cell,
                                      const generate::Engine& engine, const fs::path& trace) {
  recorder::CaptureRequest req;
  tasks::TaskPrompt task = tasks::build_task(cell.task, *engine.tokenizer, plan.chat);
  tasks::apply_query_protocol(&task, plan.query, *engine.tokenizer);
  recorder::set_task(task, &req);
  req.generation.max_new_tokens = plan.max_new;
  req.generation.prefill_chunk = plan.prefill_chunk;
  req.policy = cell.policy;
  req.levels = plan.capture;
  req.oracle = plan.oracle;
  req.output = trace.string();
  req.model_path = cell.model;
  req.tokenizer_path = plan.tokenizer;
  req.command_line = own_command_line();
  req.run_json = "{\"sweep\":\"" + plan.name + "\",\"cell\":\"" + cell.id + "\"}";
  return req;
}

// The KV bytes the cache held: the mean over decode steps, the peak over all.
void held_bytes(const trace::TraceReader& r, CellOutcome* out) {
  double sum = 0;
  int64_t decode = 0;
  for (const trace::StepRecord& s : r.steps(0, r.n_steps())) {
    out->kv_bytes_peak = std::max(out->kv_bytes_peak, s.kv_bytes);
    if (s.kind != trace::StepKind::Decode) continue;
    sum += double(s.kv_bytes);
    ++decode;
  }
  if (decode > 0) out->kv_bytes_mean = sum / double(decode);
}

CellOutcome run_cell(const SweepPlan& plan, const SweepCell& cell, generate::Engine& engine,
                     const fs::path& trace) {
  CellOutcome out;
  const auto start = Clock::now();
  try {
    recorder::run_capture(engine, cell_request(plan, cell, engine, trace));
    auto reader = trace::TraceReader::open(trace.string());
    out.why = analysis::explain_outcome(*reader, 0.1);
    held_bytes(*reader, &out);
    out.kv_heads = reader->n_kv_heads();
    // A miss the policy's losses cannot explain (it lost nothing) has no search: no columns.
    if (plan.causal && out.why.success == 0) try {
        causal_search_cell(plan, engine, *reader, &out);
      } catch (const InputError& e) {
        std::cerr << "sweep: cell " << cell.id << ": no causal search: " << e.what() << "\n";
      }
  } catch (const std::exception& e) {
    out.status = "failed";
    out.error = generate::failure_text(e);
  }
  out.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

sweep::ResultRow result_row(const SweepPlan& plan, const SweepCell& c, const CellOutcome& o,
                            const std::string& device, const std::string& trace) {
  const analysis::WhyReport& w = o.why;
  const bool ok = o.status == "ok";
  auto known = [ok](int64_t v) { return ok ? std::optional<int64_t>(v) : std::nullopt; };
  // A task without a needle (a dataset row) has no needle columns.
  const bool needle = ok && !w.needle.empty();
  auto of_needle = [needle](int64_t v) {
    return needle ? std::optional<int64_t>(v) : std::nullopt;
  };
  auto real = [](double v) { return std::isnan(v) ? std::nullopt : std::optional<double>(v); };
  sweep::ResultRow r;
  r.cell_id = c.id;
  r.model = c.model;
  r.policy = c.policy;
  r.task = c.task;
  r.task_base = c.task_base;
  r.tokens = c.length;
  r.depth = c.depth;
  r.seed = c.seed;
  r.status = o.status;
  r.success = known(w.success);
  r.expected = w.expected_answer;
  r.generated = w.generated;
  r.needle_heads_whole = of_needle(w.heads_whole_needle);
  r.needle_heads_none = of_needle(w.heads_no_needle);
  r.n_heads = known(w.n_heads);
  r.lost_mass = real(w.oracle_lost_mass);
  r.max_kl = real(w.max_kl);
  r.score = ok ? real(w.score) : std::nullopt;
  if (c.budget > 0) r.budget = c.budget;
  if (ok) r.kv_bytes_mean = real(o.kv_bytes_mean);
  if (ok) r.kv_bytes_peak = o.kv_bytes_peak;
  if (ok) r.n_kv_heads = o.kv_heads;
  if (o.searched) {
    for (const std::string& h : o.causal_set) {
      if (!r.causal_set.empty()) r.causal_set += ' ';
      r.causal_set += h;
    }
    r.causal_set_size = o.causal_size;
    r.causal_replays = o.causal_replays;
    r.causal_minimal = o.causal_minimal ? 1 : 0;
  }
  r.wall_s = o.wall_s;
  r.device = device;
  r.dtype = plan.dtype;
  r.trace = ok ? trace : "";
  r.error = o.error;
  return r;
}

// Unknown policies and tasks fail before any cell runs, naming the plan's line.
void validate_plan(const SweepPlan& plan) {
  const SweepCell first = sweep_cells(plan).front();
  for (size_t i = 0; i < plan.policies.size(); ++i) {
    const std::string key = "policies[" + std::to_string(i) + "]";
    try {
      policy::make_policy(plan.policies[i], {first.length, first.model});
    } catch (const InputError& e) {
      throw InputError(plan.where(key), key, e.what());
    }
  }
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    const std::string key = "tasks[" + std::to_string(i) + "]";
    try {
      tasks::parse_task_spec(plan.tasks[i] +
                             (plan.tasks[i].find(':') == std::string::npos ? ":" : ",") +
                             "tokens=" + std::to_string(first.length));
    } catch (const InputError& e) {
      throw InputError(plan.where(key), key, e.what());
    }
  }
}

generate::Engine open_model(const SweepPlan& plan, const std::string& model,
                            const SweepOptions& o) {
  generate::ModelOptions mo;
  mo.model = model;
  mo.tokenizer = plan.tokenizer;
  mo.device = o.device;
  mo.dtype = plan.dtype;
  mo.kv_dtype = plan.kv_dtype;
  mo.threads = o.threads;
  generate::Engine engine = generate::open_engine(mo);
  if (!engine.tokenizer)
    throw InputError(model, "tokenizer", "no tokenizer: " + engine.tokenizer_source);
  const int64_t context = engine.model->config().context_length;
  for (int64_t length : plan.lengths)
    if (context > 0 && length + plan.max_new > context)
      throw InputError(plan.where("lengths"), "lengths",
                       std::to_string(length) + " tokens + max_new " +
                           std::to_string(plan.max_new) + " exceed " + model + "'s context of " +
                           std::to_string(context));
  return engine;
}

// CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies), over which
// `--jobs N --device cuda` spreads its workers.
int visible_gpus() {
  return torch::cuda::is_available() ? int(torch::cuda::device_count()) : 0;
}

// "[=====>    ]" for done of total.
std::string progress_bar(int64_t done, int64_t total) {
  constexpr int kWidth = 20;
  const int fill = total > 0 ? int(kWidth * done / total) : kWidth;
  return "[" + std::string(size_t(fill), '=') + (fill < kWidth ? ">" : "") +
         std::string(size_t(std::max(0, kWidth - fill - 1)), ' ') + "]";
}

std::string format_seconds(double s) {
  const int64_t t = int64_t(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)(t / 60 % 60));
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%llds", (long long)t);
  return buf;
}

std::vector<std::string> cell_ids(const std::vector<SweepCell>& cells) {
  std::vector<std::string> ids;
  for (const SweepCell& c : cells) ids.push_back(c.id);
  return ids;
}

// Merges the tables and says what this invocation added: cells run (and
// failed) since `before`, cells skipped because a table already held them.
void print_collected(const std::string& name, const fs::path& dir,
                     const std::vector<SweepCell>& cells, const std::set<std::string>& before) {
  const std::vector<sweep::ResultRow> rows = sweep::collect_results(dir.string(), cell_ids(cells));
  int64_t ran = 0, failed = 0, skipped = 0, found = 0;
  for (const sweep::ResultRow& r : rows) {
    const bool old = before.count(r.cell_id) > 0;
    skipped += old;
    ran += !old;
    failed += !old && !r.ok();
    found += r.success.value_or(0) == 1;
  }
  std::cout << "sweep " << name << ": " << ran << " cells run (" << failed << " failed), "
            << skipped << " skipped; " << rows.size() << " of " << cells.size()
            << " cells in the table, " << found
            << " found the answer; results: " << sweep::results_csv_path(dir.string()) << ", "
            << sweep::results_parquet_path(dir.string()) << "\n";
}

// Runs the cells of one shard (all cells when shard is 1/1) that are not
// `done` (held by a table), appending a row per cell to `table` as each finishes.
int64_t run_cells(const SweepPlan& plan, const std::vector<SweepCell>& cells, const fs::path& dir,
                  const Shard& shard, const SweepOptions& o, const std::set<std::string>& done,
                  const fs::path& table_path) {
  std::vector<const SweepCell*> todo;
  for (size_t i = 0; i < cells.size(); ++i)
    if (int(i % size_t(shard.count)) == shard.index && !done.count(cells[i].id))
      todo.push_back(&cells[i]);
  const std::string who = shard.count > 1 ? "shard " + o.shard + ": " : "";
  std::cerr << who << "sweep " << plan.name << ": " << cells.size() << " cells, " << done.size()
            << " already done, " << todo.size() << " to run here\n";
  fs::create_directories(dir / "traces");
  fs::create_directories(table_path.parent_path());
  // Rewritten from its complete rows: a torn last row (a killed worker) must
  // not run into the next one appended.
  sweep::write_results_csv(table_path.string(), fs::exists(table_path)
                                                    ? sweep::read_results_csv(table_path.string())
                                                    : std::vector<sweep::ResultRow>{});
  std::ofstream table(table_path, std::ios::app);
  std::string loaded;
  generate::Engine engine;
  int64_t ran = 0;
  const auto start = Clock::now();
  for (const SweepCell* c : todo) {
    if (c->model != loaded) engine = open_model(plan, c->model, o), loaded = c->model;
    const std::string trace = "traces/" + c->id + ".kvtrace.h5";
    const CellOutcome out = run_cell(plan, *c, engine, dir / trace);
    table << sweep::csv_row(result_row(plan, *c, out, o.device, trace)) << "\n" << std::flush;
    ++ran;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const double eta = elapsed / double(ran) * double(todo.size() - size_t(ran));
    std::cerr << who << progress_bar(ran, int64_t(todo.size())) << " " << ran << "/" << todo.size()
              << " " << c->id << " " << c->policy << " " << c->task << ": "
              << (out.status != "ok"     ? "FAILED (" + out.error + ")"
                  : out.why.success == 1 ? "found"
                                         : "missed")
              << " | " << format_seconds(elapsed) << " elapsed, ETA " << format_seconds(eta)
              << "\n";
  }
  return ran;
}

// The sweep's folder (-o, or beside the plan, named after it), created; a
// file in its place or a folder that cannot be made is bad input naming -o.
fs::path output_folder(const SweepOptions& o, const SweepPlan& plan) {
  const fs::path dir =
      o.output.empty() ? fs::path(o.plan).parent_path() / plan.name : fs::path(o.output);
  const std::string field = o.output.empty() ? "-o (default: beside the plan)" : "-o";
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw InputError(dir.string(), field,
                     "is a file; expected a folder for results.csv and traces/");
  fs::create_directories(dir, ec);
  if (ec) throw InputError(dir.string(), field, "cannot create the folder: " + ec.message());
  return dir;
}

int run_sweep(const SweepOptions& o) {
  const Shard shard = o.shard.empty() ? Shard{} : parse_shard(o.shard);
  // A missing GPU, or a dtype it cannot multiply in, is the invocation's
  // error, not every cell's. Slurm tasks check theirs where they run: a
  // login node often has no GPU.
  const bool runs_here = !o.collect && o.slurm == 0;
  const torch::Device device = runs_here ? generate::parse_device(o.device) : torch::kCPU;
  const SweepPlan plan = parse_sweep_plan(o.plan);
  const std::vector<SweepCell> cells = sweep_cells(plan);
  validate_plan(plan);
  if (runs_here) {
    try {
      (void)generate::parse_dtype(plan.dtype, device);
    } catch (const InputError& e) {
      throw InputError(plan.where("dtype"), "dtype", e.what());
    }
  }
  const fs::path dir = output_folder(o, plan);
  // What results.csv held before (--collect, --slurm: the shards' rows are
  // news) or any table held (a local run: those cells are skipped).
  std::set<std::string> before;
  if (o.collect || o.slurm > 0) {
    if (fs::exists(sweep::results_csv_path(dir.string())))
      for (const sweep::ResultRow& r :
           sweep::read_results_csv(sweep::results_csv_path(dir.string())))
        before.insert(r.cell_id);
  } else {
    before = sweep::finished_cells_in(dir.string(), !o.retry_failed);
  }
  if (o.collect) {
    print_collected(plan.name, dir, cells, before);
    return kExitOk;
  }
  const ShardWork work{o.plan, dir.string(), o.device, o.retry_failed};
  if (o.slurm > 0) {
    const int tasks = std::min<int>(o.slurm, int(cells.size()));
    const SlurmSubmission s = submit_slurm(work, tasks, o.sbatch_options);
    std::cout << "sweep " << plan.name << ": submitted Slurm job array " << s.job_id << " ("
              << tasks << " tasks, " << cells.size() << " cells)\n";
    if (!s.waited) {
      std::cout << "when it finishes: kvscope sweep " << o.plan << " -o " << dir.string()
                << " --collect\n";
      return kExitOk;
    }
    print_collected(plan.name, dir, cells, before);
    return s.sbatch_exit == 0 ? kExitOk : kExitFailure;
  }
  if (!o.shard.empty()) {
    run_cells(plan, cells, dir, shard, o, before,
              sweep::shard_csv_path(dir.string(), shard.index, shard.count));
    return kExitOk;
  }
  const int jobs = std::min<int>(o.jobs, int(cells.size()));
  const int failed_workers =
      jobs > 1
          ? run_local_jobs(work, jobs, o.threads, device.is_cuda() ? visible_gpus() : 0)
          : (run_cells(plan, cells, dir, Shard{}, o, before, sweep::results_csv_path(dir.string())),
             0);
  print_collected(plan.name, dir, cells, before);
  return failed_workers == 0 ? kExitOk : kExitFailure;
}

Command add_sweep_command(CLI::App& app) {
  auto opt = std::make_shared<SweepOptions>();
  CLI::App* sub = app.add_subcommand("sweep", engine_summary("sweep"));
  sub->add_option("PLAN", opt->plan, "plan file (TOML, docs/sweeps.md)")->required();
  sub->add_option("-o,--output", opt->output,
                  "folder for results.csv and traces/ (default: beside the plan, named after it)");
  sub->add_option("--threads", opt->threads,
                  "CPU threads (0: OMP_NUM_THREADS if set, else one per core; split among --jobs)")
      ->capture_default_str();
  sub->add_option("--device", opt->device,
                  "cpu, cuda or cuda:N: where every cell's capture runs (each --jobs worker and "
                  "Slurm task loads the models there)")
      ->capture_default_str();
  CLI::Option* jobs =
      sub->add_option("--jobs", opt->jobs, "local worker processes (each loads each model once)")
          ->check(CLI::Range(1, 256))
          ->capture_default_str();
  CLI::Option* shard = sub->add_option(
      "--shard", opt->shard,
      "run only shard K/N: cells i with i % N == K (what --jobs and --slurm start)");
  CLI::Option* slurm =
      sub->add_option("--slurm", opt->slurm,
                      "submit the cells as a Slurm job array of N tasks; sbatch options go after "
                      "'--' (with --wait, the results are collected when it returns)")
          ->check(CLI::Range(1, 100000));
  CLI::Option* collect = sub->add_flag(
      "--collect", opt->collect, "merge the shard tables into results.csv and results.parquet");
  sub->add_flag("--retry-failed", opt->retry_failed, "run cells recorded as failed again");
  sub->add_option("SBATCH_OPTIONS", opt->sbatch_options, "after '--': options for sbatch")
      ->needs(slurm);
  jobs->excludes(shard)->excludes(slurm)->excludes(collect);
  shard->excludes(slurm)->excludes(collect);
  slurm->excludes(collect);
  return {sub, [opt] { return run_sweep(*opt); }};
}

}  // namespace

KVSCOPE_REGISTER_COMMAND("sweep", add_sweep_command);

}  // namespace kvscope::cli
