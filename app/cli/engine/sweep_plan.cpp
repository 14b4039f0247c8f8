#include "app/cli/engine/sweep_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <toml.hpp>

#include "capture/policy/registry.h"
#include "capture/tasks/dataset.h"

#include "core/common/input_error.h"

namespace kvscope::cli {

namespace {

// "plan.toml:12" for the error messages.
std::string where(const std::string& path, const toml::value& v) {
  return path + ":" + std::to_string(v.location().line());
}

[[noreturn]] void bad(const std::string& path, const toml::value& v, const std::string& key,
                      const std::string& what) {
  throw InputError(where(path, v), key, what);
}

template <typename T>
T scalar(const std::string& path, const toml::value& v, const std::string& key, const char* type) {
  try {
    return toml::get<T>(v);
  } catch (const std::exception&) {
    bad(path, v, key, std::string("expected ") + type);
  }
}

// An array's values; each element's line goes to lines["key[i]"].
template <typename T>
std::vector<T> list(const std::string& path, const toml::value& v, const std::string& key,
                    const char* type, std::map<std::string, int64_t>& lines) {
  if (!v.is_array() || v.as_array().empty())
    bad(path, v, key, std::string("expected a non-empty array of ") + type);
  std::vector<T> out;
  for (const toml::value& x : v.as_array()) {
    lines[key + "[" + std::to_string(out.size()) + "]"] = x.location().line();
    out.push_back(scalar<T>(path, x, key, type));
  }
  return out;
}

// FNV-1a 64: a cell's id must not change between runs, compilers or machines.
std::string stable_id(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char buf[16];
  std::snprintf(buf, sizeof buf, "c%012llx", static_cast<unsigned long long>(h >> 16));
  return buf;
}

std::string format_depth(double d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", d);
  return buf;
}

// `rows = "A:B"` (rows A..B-1) or a list of row numbers.
std::vector<int64_t> row_list(const std::string& path, const toml::value& v,
                              std::map<std::string, int64_t>& lines) {
  if (!v.is_string()) return list<int64_t>(path, v, "rows", "integers", lines);
  const std::string s = v.as_string();
  long long a = -1, b = -1;
  char tail = 0;
  if (std::sscanf(s.c_str(), "%lld:%lld%c", &a, &b, &tail) != 2 || a < 0 || b <= a)
    bad(path, v, "rows",
        "expected \"A:B\" with 0 <= A < B (rows A to B-1) or a list, got \"" + s + "\"");
  std::vector<int64_t> out;
  for (long long r = a; r < b; ++r) out.push_back(r);
  return out;
}

std::string policy_name(const std::string& spec) {
  return spec.substr(0, std::min(spec.find(':'), spec.find('+')));
}

// Budgets are fractions (0, 1] or whole entry counts, on policies that have
// a budget parameter (full excepted: the curve's reference).
void check_budgets(const SweepPlan& p, const toml::value& sweep) {
  if (p.budgets.empty()) return;
  const std::string& path = p.path;
  for (double b : p.budgets)
    if (!(b > 0) || (b > 1 && b != std::floor(b)) || b > double(int64_t(1) << 30))
      bad(path, sweep.at("budgets"), "budgets",
          "expected fractions in (0, 1] of the prompt or whole entry counts, got " +
              format_depth(b));
  for (const std::string& spec : p.policies) {
    const std::string name = policy_name(spec);
    if (name == "full") continue;
    const policy::PolicyDescriptor* d = policy::find_policy(name);
    const bool has_budget =
        d && std::any_of(d->params.begin(), d->params.end(),
                         [](const policy::ParamSpec& ps) { return ps.name == "budget"; });
    if (d && !has_budget)
      bad(path, sweep.at("budgets"), "budgets",
          "policy '" + name + "' has no budget parameter (drop it from the plan or from budgets)");
    const std::string first = spec.substr(0, spec.find('+'));
    if (first.find("budget=") != std::string::npos)
      bad(path, sweep.at("policies"), "policies",
          "'" + spec + "': give its budget through budgets");
  }
}

}  // namespace

namespace {

toml::value read_plan(const std::string& path) {
  toml::value root;
  try {
    root = toml::parse(path);
  } catch (const std::exception& e) {
    // toml11's message names the file, line and column; keep its first line.
    std::string msg = e.what();
    throw InputError(path, "plan", "not valid TOML: " + msg.substr(0, msg.find('\n')));
  }
  if (!root.contains("sweep") || !root.at("sweep").is_table())
    throw InputError(path, "[sweep]", "the plan's keys go in a [sweep] table");
  for (const auto& [key, v] : root.as_table())
    if (key != "sweep") bad(path, v, key, "unknown table or key (expected only [sweep])");
  return root;
}

using KeyReaders = std::map<std::string, std::function<void(const toml::value&)>>;

// What each key of [sweep] sets in the plan.
KeyReaders key_readers(const std::string& path, SweepPlan& p) {
  auto text = [&](const char* key, std::string* out) {
    return [&path, key, out](const toml::value& v) {
      *out = scalar<std::string>(path, v, key, "a string");
    };
  };
  auto strings = [&](const char* key, std::vector<std::string>* out) {
    return [&path, &p, key, out](const toml::value& v) {
      *out = list<std::string>(path, v, key, "strings", p.lines);
    };
  };
  auto flag = [&](const char* key, bool* out) {
    return [&path, key, out](const toml::value& v) {
      *out = scalar<bool>(path, v, key, "true or false");
    };
  };
  auto integer = [&](const char* key, int64_t* out) {
    return [&path, key, out](const toml::value& v) {
      *out = scalar<int64_t>(path, v, key, "an integer");
    };
  };
  return {
      {"name", text("name", &p.name)},
      {"models", strings("models", &p.models)},
      {"tokenizer", text("tokenizer", &p.tokenizer)},
      {"chat", flag("chat", &p.chat)},
      {"dtype",
       [&path, &p](const toml::value& v) {
         p.dtype = scalar<std::string>(path, v, "dtype", "a string");
         if (p.dtype != "fp32" && p.dtype != "bf16" && p.dtype != "fp16")
           bad(path, v, "dtype", "\"" + p.dtype + "\" (expected fp32, bf16 or fp16)");
       }},
      {"kv_dtype",
       [&path, &p](const toml::value& v) {
         p.kv_dtype = scalar<std::string>(path, v, "kv_dtype", "a string");
         if (p.kv_dtype != "fp32" && p.kv_dtype != "bf16" && p.kv_dtype != "fp16")
           bad(path, v, "kv_dtype", "\"" + p.kv_dtype + "\" (expected fp32, bf16 or fp16)");
       }},
      {"max_new", integer("max_new", &p.max_new)},
      {"prefill_chunk", integer("prefill_chunk", &p.prefill_chunk)},
      {"capture", text("capture", &p.capture)},
      {"oracle", flag("oracle", &p.oracle)},
      {"causal", flag("causal", &p.causal)},
      {"causal_budget", integer("causal_budget", &p.causal_budget)},
      {"policies", strings("policies", &p.policies)},
      {"tasks", strings("tasks", &p.tasks)},
      {"lengths",
       [&path, &p](const toml::value& v) {
         p.lengths = list<int64_t>(path, v, "lengths", "integers", p.lines);
       }},
      {"depths",
       [&path, &p](const toml::value& v) {
         p.depths = list<double>(path, v, "depths", "numbers", p.lines);
       }},
      {"seeds",
       [&path, &p](const toml::value& v) {
         p.seeds = list<int64_t>(path, v, "seeds", "integers", p.lines);
       }},
      {"rows", [&path, &p](const toml::value& v) { p.rows = row_list(path, v, p.lines); }},
      {"budgets",
       [&path, &p](const toml::value& v) {
         p.budgets = list<double>(path, v, "budgets", "numbers", p.lines);
       }},
      {"query",
       [&path, &p](const toml::value& v) {
         p.query = scalar<std::string>(path, v, "query", "a string");
         if (p.query != "auto" && p.query != "after" && p.query != "inside")
           bad(path, v, "query", "\"" + p.query + "\" (expected auto, after or inside)");
       }},
  };
}

// Relative model paths are the plan's: a plan beside its models runs from anywhere.
void resolve_paths(SweepPlan& p) {
  const std::filesystem::path base = std::filesystem::path(p.path).parent_path();
  for (std::string& m : p.models)
    if (!m.empty() && std::filesystem::path(m).is_relative())
      m = (base / m).lexically_normal().string();
  if (!p.tokenizer.empty() && std::filesystem::path(p.tokenizer).is_relative())
    p.tokenizer = (base / p.tokenizer).lexically_normal().string();
  // A dataset task's file=, likewise (the value runs to the next comma).
  for (std::string& t : p.tasks) {
    const size_t at = t.find("file=");
    if (!tasks::is_dataset_spec(t) || at == std::string::npos) continue;
    const size_t begin = at + 5, end = std::min(t.find(',', begin), t.size());
    const std::string file = t.substr(begin, end - begin);
    if (!file.empty() && std::filesystem::path(file).is_relative())
      t.replace(begin, end - begin, (base / file).lexically_normal().string());
  }
}

void check_ranges(const SweepPlan& p, const toml::value& sweep) {
  const std::string& path = p.path;
  for (const char* required : {"models", "policies", "tasks", "lengths", "depths"})
    if (!sweep.contains(required))
      throw InputError(where(path, sweep), required, "required key missing from [sweep]");
  if (p.max_new < 1) bad(path, sweep.at("max_new"), "max_new", "expected an integer >= 1");
  if (p.causal_budget < 1)
    bad(path, sweep.at("causal_budget"), "causal_budget", "expected an integer >= 1 (replays)");
  for (double d : p.depths)
    if (!(d >= 0 && d <= 1)) bad(path, sweep.at("depths"), "depths", "expected numbers in [0, 1]");
  for (int64_t l : p.lengths)
    if (l < 64) bad(path, sweep.at("lengths"), "lengths", "expected integers >= 64 (tokens)");
  for (const std::string& t : p.tasks)
    if (t.find("tokens=") != std::string::npos || t.find("depth=") != std::string::npos ||
        t.find("seed=") != std::string::npos)
      bad(path, sweep.at("tasks"), "tasks",
          "'" + t + "': give tokens, depth and seed through lengths, depths and seeds");
  check_budgets(p, sweep);
  if (p.rows.empty()) return;
  bool any_dataset = false;
  for (const std::string& t : p.tasks) {
    any_dataset = any_dataset || tasks::is_dataset_spec(t);
    if (tasks::is_dataset_spec(t) && t.find("row=") != std::string::npos)
      bad(path, sweep.at("tasks"), "tasks", "'" + t + "': give its rows through rows");
  }
  if (!any_dataset) bad(path, sweep.at("rows"), "rows", "only dataset tasks have rows");
}

}  // namespace

SweepPlan parse_sweep_plan(const std::string& path) {
  const toml::value root = read_plan(path);
  SweepPlan p;
  p.path = path;
  const KeyReaders keys = key_readers(path, p);
  const toml::value& sweep = root.at("sweep");
  p.lines["[sweep]"] = sweep.location().line();
  for (const auto& [key, v] : sweep.as_table()) {
    p.lines[key] = v.location().line();
    const auto it = keys.find(key);
    if (it == keys.end()) {
      std::string known;
      for (const auto& k : keys) known += (known.empty() ? "" : ", ") + k.first;
      bad(path, v, key, "unknown key (expected " + known + ")");
    }
    it->second(v);
  }
  resolve_paths(p);
  check_ranges(p, sweep);
  return p;
}

std::string SweepPlan::where(const std::string& key) const {
  const auto it = lines.find(key);
  return path + ":" + std::to_string(it != lines.end() ? it->second : lines.at("[sweep]"));
}

namespace {

// A dataset task once per row of the plan's rows; any other task as it is.
std::vector<std::string> with_rows(const std::string& task, const std::vector<int64_t>& rows) {
  if (rows.empty() || !tasks::is_dataset_spec(task)) return {task};
  std::vector<std::string> out;
  for (int64_t r : rows) out.push_back(task + ",row=" + std::to_string(r));
  return out;
}

}  // namespace

std::string with_budget(const std::string& spec, double budget) {
  const size_t plus = std::min(spec.find('+'), spec.size());
  const std::string first = spec.substr(0, plus);
  return first + (first.find(':') == std::string::npos ? ":" : ",") +
         "budget=" + format_depth(budget) + spec.substr(plus);
}

namespace {

// A policy once per budget of the plan; full, or any policy when there are
// no budgets, once as given (budget 0).
std::vector<std::pair<std::string, double>> with_budgets(const std::string& spec,
                                                         const std::vector<double>& budgets) {
  if (budgets.empty() || policy_name(spec) == "full") return {{spec, 0.0}};
  std::vector<std::pair<std::string, double>> out;
  for (double b : budgets) out.emplace_back(with_budget(spec, b), b);
  return out;
}

// A dataset row has no needle to place and no seeded text: it runs once, named
// by the plan's first depth and seed (so the cells of tables written when it
// ran once per depth and seed keep their ids).
template <typename T>
std::vector<T> axis_for(const std::string& task, const std::vector<T>& axis) {
  if (!tasks::is_dataset_spec(task) || axis.empty()) return axis;
  return {axis.front()};
}

}  // namespace

std::vector<SweepCell> sweep_cells(const SweepPlan& p) {
  std::vector<SweepCell> cells;
  std::set<std::string> seen;
  for (const std::string& model : p.models)
    for (const std::string& plan_policy : p.policies)
      for (const auto& [policy, budget] : with_budgets(plan_policy, p.budgets))
        for (const std::string& dataset_task : p.tasks)
          for (const std::string& task : with_rows(dataset_task, p.rows))
            for (int64_t length : p.lengths)
              for (double depth : axis_for(task, p.depths))
                for (int64_t seed : axis_for(task, p.seeds)) {
                  SweepCell c{"", model, policy, "", task, length, depth, seed, budget};
                  c.task = task + (task.find(':') == std::string::npos ? ":" : ",") +
                           "tokens=" + std::to_string(length) + ",depth=" + format_depth(depth) +
                           ",seed=" + std::to_string(seed);
                  c.id = stable_id(model + "|" + policy + "|" + c.task + "|" + p.tokenizer + "|" +
                                   std::to_string(p.max_new) + "|" + (p.chat ? "chat" : "plain") +
                                   "|" + std::to_string(p.prefill_chunk) + "|" + p.capture + "|" +
                                   (p.oracle ? "oracle" : "") +
                                   // fp32 adds nothing: the ids of plans written before
                                   // dtype existed stay what they were.
                                   (p.dtype == "fp32" ? "" : "|" + p.dtype) +
                                   (p.kv_dtype.empty() ? "" : "|kv=" + p.kv_dtype) +
                                   (p.query == "auto" ? "" : "|query=" + p.query));
                  if (seen.insert(c.id).second) cells.push_back(c);
                }
  return cells;
}

}  // namespace kvscope::cli
