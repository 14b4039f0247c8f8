// kvscope sweep PLAN [-o DIR]: one capture per cell of a plan, the model
// loaded once for all the cells that use it; a results table (CSV, a row per
// finished cell, appended as each finishes) that makes the sweep resumable:
// a rerun skips the cells it already holds. A cell that fails is recorded
// with its error and the sweep goes on.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>

#include "app/cli/command.h"
#include "app/cli/sweep_plan.h"
#include "capture/generate/engine.h"
#include "capture/policy/registry.h"
#include "capture/recorder/capture_run.h"
#include "core/analysis/why.h"
#include "core/common/input_error.h"
#include "core/trace/reader.h"

namespace kvscope::cli {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct SweepOptions {
  std::string plan;
  std::string output;  // default: <plan's folder>/<plan name>
  int threads = 0;
};

const char* const kColumns =
    "cell_id,model,policy,task,tokens,depth,seed,status,success,expected,generated,"
    "needle_heads_whole,needle_heads_none,n_heads,lost_mass,max_kl,wall_s,trace,error";

std::string csv(const std::string& field) {
  if (field.find_first_of(",\"\n\r") == std::string::npos) return field;
  std::string out = "\"";
  for (char c : field) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string num(double x) {
  if (std::isnan(x)) return "";
  std::ostringstream o;
  o << x;
  return o.str();
}

// Cell ids already in the results table (its first column).
std::set<std::string> finished_cells(const fs::path& results) {
  std::set<std::string> done;
  std::ifstream in(results);
  std::string line;
  std::getline(in, line);  // header
  // A row starts with its id, "c" + 12 hex digits; other lines continue a
  // quoted field (generated text with a newline).
  while (std::getline(in, line)) {
    const std::string id = line.substr(0, line.find(','));
    if (id.size() == 13 && id[0] == 'c' &&
        id.find_first_not_of("0123456789abcdef", 1) == std::string::npos)
      done.insert(id);
  }
  return done;
}

struct CellOutcome {
  std::string status = "ok", error;
  analysis::WhyReport why;
  double wall_s = 0;
};

recorder::CaptureRequest cell_request(const SweepPlan& plan, const SweepCell& cell,
                                      const generate::Engine& engine, const fs::path& trace) {
  recorder::CaptureRequest req;
  recorder::set_task(tasks::build_task(cell.task, *engine.tokenizer, plan.chat), &req);
  req.generation.max_new_tokens = plan.max_new;
  req.generation.prefill_chunk = plan.prefill_chunk;
  req.policy = cell.policy;
  req.levels = plan.capture;
  req.oracle = plan.oracle;
  req.output = trace.string();
  req.model_path = cell.model;
  req.command_line = own_command_line();
  req.run_json = "{\"sweep\":\"" + plan.name + "\",\"cell\":\"" + cell.id + "\"}";
  return req;
}

CellOutcome run_cell(const SweepPlan& plan, const SweepCell& cell, generate::Engine& engine,
                     const fs::path& trace) {
  CellOutcome out;
  const auto start = Clock::now();
  try {
    recorder::run_capture(engine, cell_request(plan, cell, engine, trace));
    auto reader = trace::TraceReader::open(trace.string());
    out.why = analysis::explain_retrieval(*reader, 0.1);
  } catch (const std::exception& e) {
    out.status = "failed";
    out.error = e.what();
  }
  out.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

std::string result_row(const SweepCell& c, const CellOutcome& o, const fs::path& trace) {
  const analysis::WhyReport& w = o.why;
  const bool ok = o.status == "ok";
  std::ostringstream r;
  r << c.id << ',' << csv(c.model) << ',' << csv(c.policy) << ',' << csv(c.task) << ',' << c.length
    << ',' << num(c.depth) << ',' << c.seed << ',' << o.status << ','
    << (ok ? std::to_string(int(w.success)) : "") << ',' << csv(w.expected_answer) << ','
    << csv(w.generated) << ',' << (ok ? std::to_string(w.heads_whole_needle) : "") << ','
    << (ok ? std::to_string(w.heads_no_needle) : "") << ',' << (ok ? std::to_string(w.n_heads) : "")
    << ',' << num(w.oracle_lost_mass) << ',' << num(w.max_kl) << ',' << num(o.wall_s) << ','
    << csv(ok ? trace.string() : "") << ',' << csv(o.error);
  return r.str();
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

generate::Engine open_model(const SweepPlan& plan, const std::string& model, int threads) {
  generate::ModelOptions mo;
  mo.model = model;
  mo.tokenizer = plan.tokenizer;
  mo.threads = threads;
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

int run_sweep(const SweepOptions& o) {
  const SweepPlan plan = parse_sweep_plan(o.plan);
  const std::vector<SweepCell> cells = sweep_cells(plan);
  validate_plan(plan);
  const fs::path dir =
      o.output.empty() ? fs::path(o.plan).parent_path() / plan.name : fs::path(o.output);
  fs::create_directories(dir / "traces");
  const fs::path results = dir / "results.csv";
  const std::set<std::string> done = finished_cells(results);
  if (!fs::exists(results)) std::ofstream(results) << kColumns << "\n";
  std::ofstream table(results, std::ios::app);
  int64_t todo = 0;
  for (const SweepCell& c : cells) todo += !done.count(c.id);
  std::cerr << "sweep " << plan.name << ": " << cells.size() << " cells, " << done.size()
            << " already in " << results.string() << ", " << todo << " to run\n";
  std::string loaded;
  generate::Engine engine;
  int64_t ran = 0, failed = 0;
  const auto start = Clock::now();
  for (const SweepCell& c : cells) {
    if (done.count(c.id)) continue;
    if (c.model != loaded) engine = open_model(plan, c.model, o.threads), loaded = c.model;
    const fs::path trace = dir / "traces" / (c.id + ".kvtrace.h5");
    const CellOutcome out = run_cell(plan, c, engine, trace);
    table << result_row(c, out, trace) << "\n" << std::flush;
    ++ran;
    failed += out.status != "ok";
    const double per_cell =
        std::chrono::duration<double>(Clock::now() - start).count() / double(ran);
    std::cerr << "[" << ran << "/" << todo << "] " << c.id << " " << c.policy << " " << c.task
              << ": "
              << (out.status != "ok"     ? "FAILED (" + out.error + ")"
                  : out.why.success == 1 ? "found"
                                         : "missed")
              << " | ETA " << int64_t(per_cell * double(todo - ran) + 0.5) << " s\n";
  }
  std::cout << "sweep " << plan.name << ": " << ran << " cells run (" << failed << " failed), "
            << done.size() << " skipped; results: " << results.string() << "\n";
  return kExitOk;
}

Command add_sweep_command(CLI::App& app) {
  auto opt = std::make_shared<SweepOptions>();
  CLI::App* sub = app.add_subcommand(
      "sweep",
      "Capture every cell of a plan (models x policies x tasks x lengths x depths x "
      "seeds) into traces and a results table; resumable");
  sub->add_option("PLAN", opt->plan, "plan file (TOML, docs/sweeps.md)")->required();
  sub->add_option("-o,--output", opt->output,
                  "folder for results.csv and traces/ (default: beside the plan, named after it)");
  sub->add_option("--threads", opt->threads, "CPU threads (0: one per core)")
      ->capture_default_str();
  return {sub, [opt] { return run_sweep(*opt); }};
}

}  // namespace

KVSCOPE_REGISTER_COMMAND("sweep", add_sweep_command);

}  // namespace kvscope::cli
