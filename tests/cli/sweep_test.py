#!/usr/bin/env python3
"""`kvscope sweep` on stories260K: a 2 policies x 2 tasks x 2 depths plan
gives 8 traces and 8 result rows whose needle columns agree with `kvscope why`
and with the trace files (h5py); cell ids are deterministic; `--jobs 2` gives
the same table through two shard processes; results.parquet holds the same
table (read with pyarrow where the oracle environment has it); a rerun skips
finished cells, an interrupted table (rows removed, a torn last row) reruns
exactly the missing cells; a cell that fails is recorded with its error, the
sweep goes on and `--retry-failed` runs it again; a bf16 plan has cell ids
of its own and bf16 traces, and --device reaches the --jobs workers; bad plans
and options (an unknown dtype, a device the machine lacks) exit 2 naming the
plan's line or the option.

usage: sweep_test.py KVSCOPE SHARED_DIR SCRATCH"""
import csv
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

from checks import check, finish

KVSCOPE, SHARED, SCRATCH = (os.path.abspath(a) for a in sys.argv[1:4])
SHARED = os.path.abspath(os.environ.get("KVSCOPE_SHARED_DIR", SHARED))
STORIES = os.path.join(SHARED, "models", "stories260K")
shutil.rmtree(SCRATCH, ignore_errors=True)
os.makedirs(SCRATCH)


def plan(name, policies, extra=""):
    path = os.path.join(SCRATCH, name + ".toml")
    with open(path, "w") as f:
        f.write(f"""[sweep]
name = "{name}"
models = ["{STORIES}/stories260K.bin"]
tokenizer = "{STORIES}/tok512.bin"
max_new = 6
policies = {json.dumps(policies)}
tasks = ["needle", "niah:keys=2"]
lengths = [200]
depths = [0.2, 0.8]
{extra}""")
    return path


def sweep(path, *args):
    p = subprocess.run([KVSCOPE, "sweep", path, *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def rows(name):
    with open(os.path.join(SCRATCH, name, "results.csv")) as f:
        return list(csv.DictReader(f))


def refuse_plans(what, cases):
    """Each (extra line, message): the grid plan with that line exits 2 naming its line."""
    for extra, want in cases:
        p = plan("bad", POLICIES, extra)
        code, out = sweep(p)
        line = 1 + open(p).read().splitlines().index(extra)
        check(code == 2 and f"bad.toml:{line}: {want}" in out, f"bad {what}: {out.strip()}")


def oracle_python():
    """A python with pandas + pyarrow (the oracle environment), or None."""
    cache = os.environ.get("KVSCOPE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kvscope")
    for py in (os.environ.get("KVSCOPE_ORACLE_PYTHON"), os.path.join(cache, "oracles-current/bin/python")):
        if py and subprocess.run([py, "-c", "import pandas, pyarrow"], capture_output=True).returncode == 0:
            return py
    return None


POLICIES = ["full", "streaming_llm:sinks=4,window=32"]
code, out = sweep(plan("grid", POLICIES))
check(code == 0 and "8 cells run (0 failed), 0 skipped" in out, "a fresh sweep runs 8 cells")
table = rows("grid")
check(len(table) == 8 and len({r["cell_id"] for r in table}) == 8, "8 rows, 8 distinct cell ids")
for r in table:
    trace = os.path.join(SCRATCH, "grid", r["trace"])
    with h5py.File(trace, "r") as f:
        needle = np.flatnonzero(f["/tokens/role"][:] == 2)
        run = f["/run"].attrs
        ok = (run["policy"] == r["policy"] and str(run["expected_answer"]) == r["expected"]
              and int(f["/generation/success"][()]) == int(r["success"]) and len(needle) > 0
              and float(f["/generation/score"][()]) == float(r["score"]))
    why = json.loads(subprocess.run([KVSCOPE, "why", trace, "--json"], capture_output=True,
                                    text=True, check=True).stdout)
    ok = ok and int(r["needle_heads_whole"]) == why["heads_whole_needle"] and \
        int(r["needle_heads_none"]) == why["heads_no_needle"]
    check(ok, f"{r['cell_id']} ({r['policy']}, {r['task']}): row = trace = why")
full = [r for r in table if r["policy"] == "full"]
check(all(r["needle_heads_whole"] == r["n_heads"] for r in full), "full cache: every head keeps the needle")
early = [r for r in table if r["policy"].startswith("streaming") and r["depth"] == "0.2"]
check(len(early) == 2 and all(r["needle_heads_none"] == r["n_heads"] for r in early),
      "StreamingLLM: a needle at depth 0.2 is outside the window in every head")

# Deterministic ids: the same plan elsewhere gives the same cells.
code, _ = sweep(plan("grid", POLICIES), "-o", os.path.join(SCRATCH, "again"))
with open(os.path.join(SCRATCH, "again", "results.csv")) as f:
    again = list(csv.DictReader(f))
check(sorted(r["cell_id"] for r in again) == sorted(r["cell_id"] for r in table),
      "the same plan gives the same cell ids")

# Two local workers: the same table (same order, same outcomes) from two shards.
jobs_dir = os.path.join(SCRATCH, "jobs")
code, out = sweep(plan("grid", POLICIES), "-o", jobs_dir, "--jobs", "2")
with open(os.path.join(jobs_dir, "results.csv")) as f:
    by_jobs = list(csv.DictReader(f))
same = ["cell_id", "policy", "task", "success", "generated", "needle_heads_whole", "needle_heads_none"]
check(code == 0 and "8 cells run (0 failed)" in out and
      [[r[k] for k in same] for r in by_jobs] == [[r[k] for k in same] for r in table],
      "--jobs 2: the same rows in the same order as one process")
check(all(os.path.exists(os.path.join(jobs_dir, "shards", f"results.{k}-of-2.csv")) for k in (0, 1)),
      "--jobs 2: one table per shard")

# dtype is part of a cell (bf16 weights compute other numbers); --device is
# where the cells run and reaches every --jobs worker.
bf16_dir = os.path.join(SCRATCH, "bf16")
code, out = sweep(plan("grid", POLICIES, 'dtype = "bf16"'), "-o", bf16_dir, "--jobs", "2",
                  "--device", "cpu")
with open(os.path.join(bf16_dir, "results.csv")) as f:
    bf16 = list(csv.DictReader(f))
check(code == 0 and len(bf16) == 8 and all(r["status"] == "ok" for r in bf16),
      "a bf16 plan runs its 8 cells through two workers: " + out.strip()[-200:])
check(not {r["cell_id"] for r in bf16} & {r["cell_id"] for r in table},
      "dtype = bf16 gives other cell ids than the fp32 plan")
check(all(r["device"] == "cpu" and r["dtype"] == "bf16" for r in bf16) and
      all(r["device"] == "cpu" and r["dtype"] == "fp32" for r in table),
      "results.csv names each cell's device and dtype: " +
      str(sorted({(r["device"], r["dtype"]) for r in bf16 + table})))
for r in bf16[:2]:
    with h5py.File(os.path.join(bf16_dir, r["trace"]), "r") as f:
        run = f["/run"].attrs
        check(run["dtype"] == "bf16" and run["device"] == "cpu",
              f"{r['cell_id']}: the trace records dtype {run['dtype']}, device {run['device']}")
# A device this machine cannot have: refused before any cell or folder.
nowhere = os.path.join(SCRATCH, "nowhere")
code, out = sweep(plan("grid", POLICIES), "-o", nowhere, "--device", "cuda:999")
check(code == 2 and '--device: "cuda:999" requested but' in out and not os.path.exists(nowhere),
      "--device cuda:999 exits 2 before any cell runs: " + out.strip()[:160])

# Parquet: the same table, column by column (empty CSV numbers are nulls).
parquet = os.path.join(SCRATCH, "grid", "results.parquet")
with open(parquet, "rb") as f:
    data = f.read()
check(data[:4] == b"PAR1" and data[-4:] == b"PAR1", "results.parquet has Parquet's magic at both ends")
py = oracle_python()
if py:
    compare = """
import sys, pandas as pd
a = pd.read_parquet(sys.argv[1]); b = pd.read_csv(sys.argv[2], keep_default_na=False, dtype=str)
assert list(a.columns) == list(b.columns), (list(a.columns), list(b.columns))
assert len(a) == len(b) == 8
for c in a.columns:
    for x, y in zip(a[c], b[c]):
        same = (str(x) == y) if a[c].dtype == object else (y == "" and pd.isna(x)) or abs(float(x) - float(y)) <= 1e-6 * max(1, abs(float(y)))
        assert same, (c, x, y)
assert str(a["tokens"].dtype) == "int64" and str(a["depth"].dtype) == "float64"
print("ok")
"""
    p = subprocess.run([py, "-c", compare, parquet, os.path.join(SCRATCH, "grid", "results.csv")],
                       capture_output=True, text=True)
    check(p.returncode == 0, "pyarrow reads results.parquet as results.csv: " + (p.stdout + p.stderr).strip()[-300:])
else:
    print("SKIPPED (check): no python with pandas + pyarrow (scripts/setup-oracles): Parquet content not compared")

# Resume: finished cells are skipped; removed rows are rerun.
code, out = sweep(plan("grid", POLICIES))
check(code == 0 and "0 cells run (0 failed), 8 skipped" in out, "a rerun skips all 8 cells")
path = os.path.join(SCRATCH, "grid", "results.csv")
lines = open(path).read().splitlines()
open(path, "w").write("\n".join(lines[:-3]) + "\n")
code, out = sweep(plan("grid", POLICIES))
check(code == 0 and "3 cells run (0 failed), 5 skipped" in out, "an interrupted table reruns its 3 missing cells")
check(sorted(r["cell_id"] for r in rows("grid")) == sorted(r["cell_id"] for r in table),
      "after the resume the table holds the same 8 cells")
# A torn last row (a worker killed while writing it) is dropped and its cell rerun.
lines = open(path).read().splitlines()
open(path, "w").write("\n".join(lines[:-1]) + "\n" + lines[-1][:20])
code, out = sweep(plan("grid", POLICIES))
check(code == 0 and "1 cells run (0 failed), 7 skipped" in out and len(rows("grid")) == 8,
      "a torn last row reruns its cell")

# A cell that fails is recorded with its error and the sweep goes on: two
# cells' trace paths are taken by folders, so their captures cannot write.
blocked = os.path.join(SCRATCH, "blocked")
for r in table[:2]:
    os.makedirs(os.path.join(blocked, "traces", r["cell_id"] + ".kvtrace.h5"))
code, out = sweep(plan("grid", POLICIES), "-o", blocked)
with open(os.path.join(blocked, "results.csv")) as f:
    result = list(csv.DictReader(f))
failed = [r for r in result if r["status"] == "failed"]
check(code == 0 and len(result) == 8 and "8 cells run (2 failed)" in out,
      "a sweep with 2 failing cells finishes all 8 rows")
check(sorted(r["cell_id"] for r in failed) == sorted(r["cell_id"] for r in table[:2]) and
      all(r["error"] and r["trace"] == "" for r in failed),
      f"the failing cells are recorded with their error ({failed[0]['error'][:90] if failed else ''})")
code, out = sweep(plan("grid", POLICIES), "-o", blocked)
check(code == 0 and "0 cells run (0 failed), 8 skipped" in out, "a rerun does not retry failed cells")
shutil.rmtree(os.path.join(blocked, "traces"))
code, out = sweep(plan("grid", POLICIES), "-o", blocked, "--retry-failed")
with open(os.path.join(blocked, "results.csv")) as f:
    result = list(csv.DictReader(f))
check(code == 0 and "2 cells run (0 failed), 6 skipped" in out and len(result) == 8 and
      all(r["status"] == "ok" for r in result), "--retry-failed runs the 2 failed cells again")

# Bad plans: exit 2, the plan's line named.
refuse_plans("plan", [('colour = "red"', "colour: unknown key"),
                      ('seeds = "one"', "seeds: expected a non-empty array of integers"),
                      ('dtype = "int8"', 'dtype: "int8" (expected fp32, bf16 or fp16)')])
code, out = sweep(plan("bad", ["full", "h2o:recnt=8"]))
check(code == 2 and "bad.toml:6: policies[1]: --policy: h2o:recnt: unknown parameter" in out,
      "unknown policy parameter: " + out.strip())

for args, want in [(["--shard", "2/2"], "--shard: expected K/N with 0 <= K < N (e.g. 0/4), got '2/2'"),
                   (["--jobs", "2", "--collect"], "--jobs excludes --collect"),
                   (["--", "--time=1"], "SBATCH_OPTIONS requires --slurm")]:
    code, out = sweep(plan("grid", POLICIES), *args)
    check(code == 2 and want in out, f"bad options {args}: {out.strip()[:120]}")
env = dict(os.environ, PATH="/nonexistent")
p = subprocess.run([KVSCOPE, "sweep", plan("grid", POLICIES), "--slurm", "2"], capture_output=True,
                   text=True, env=env)
check(p.returncode == 2 and "Slurm not reachable: sbatch is not on PATH" in p.stderr,
      "--slurm without sbatch: " + p.stderr.strip())

# Dataset rows as an axis: rows = "0:3" runs a dataset task once per row (not
# once per depth and seed, which change nothing in a row), its file= relative
# to the plan, each cell scored by the task's scorer.
shutil.copy(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "resources", "datasets", "examples.jsonl"), SCRATCH)
rows_plan = os.path.join(SCRATCH, "rows.toml")
with open(rows_plan, "w") as f:
    f.write(f"""[sweep]
name = "rows"
models = ["{STORIES}/stories260K.bin"]
tokenizer = "{STORIES}/tok512.bin"
max_new = 6
policies = ["full"]
tasks = ["dataset:file=examples.jsonl,scorer=f1"]
rows = "0:3"
lengths = [300]
depths = [0.5, 0.25]
seeds = [1, 2]
""")
code, out = sweep(rows_plan)
table = rows("rows") if code == 0 else []
check(code == 0 and "3 cells run (0 failed)" in out and
      sorted(r["task"].split("row=")[1].split(",")[0] for r in table) == ["0", "1", "2"] and
      all(r["depth"] == "0.5" and r["seed"] == "1" for r in table),
      "rows = \"0:3\": one cell per row " + out.strip()[-200:])
for r in table:
    with h5py.File(os.path.join(SCRATCH, "rows", r["trace"]), "r") as f:
        scorer = json.loads(f["/run"].attrs["run_json"])["scorer"]
        check(scorer == "f1" and f["/run"].attrs["task_kind"] == "dataset" and
              0 <= float(r["score"]) <= 1, f"row cell {r['cell_id']}: scorer f1, a dataset task")
refuse_plans("rows", [('rows = "3:1"', 'rows: expected "A:B" with 0 <= A < B'),
                      ("rows = [0, 1]", "rows: only dataset tasks have rows")])

# Memory as an axis: budgets = [0.25, 0.5] runs SnapKV at each (full once),
# and the table carries the budget and the KV bytes the traces held.
budget_plan = os.path.join(SCRATCH, "budgets.toml")
with open(budget_plan, "w") as f:
    f.write(f"""[sweep]
name = "budgets"
models = ["{STORIES}/stories260K.bin"]
tokenizer = "{STORIES}/tok512.bin"
max_new = 6
policies = ["full", "snapkv:window=8"]
budgets = [0.25, 0.5]
tasks = ["needle"]
lengths = [200]
depths = [0.5]
""")
code, out = sweep(budget_plan)
table = {(r["policy"], r["budget"]): r for r in rows("budgets")} if code == 0 else {}
check(code == 0 and "3 cells run (0 failed)" in out and
      set(table) == {("full", ""), ("snapkv:window=8,budget=0.25", "0.25"),
                     ("snapkv:window=8,budget=0.5", "0.5")}, "budgets: full once, SnapKV per budget")
if len(table) == 3:
    held = [float(table[k]["kv_bytes_mean"]) for k in [("snapkv:window=8,budget=0.25", "0.25"),
                                                       ("snapkv:window=8,budget=0.5", "0.5"), ("full", "")]]
    for r in table.values():
        with h5py.File(os.path.join(SCRATCH, "budgets", r["trace"]), "r") as f:
            kind, kv = f["/steps/kind"][:], f["/steps/kv_bytes"][:]
            check(int(r["kv_bytes_peak"]) == int(kv.max()) and
                  abs(float(r["kv_bytes_mean"]) - float(kv[kind == 1].mean())) < 1e-6 * kv.max(),
                  f"{r['policy']}: kv_bytes_mean and _peak are the trace's")
    check(held[0] < held[1] < held[2], f"KV bytes grow with the budget: {held}")
    with open(os.path.join(SCRATCH, "budgets", "leaderboard.csv")) as f:
        board = {(r["press"], r["compression_ratio"]): r for r in csv.DictReader(f)}
    check(set(board) == {("full", "0"), ("snapkv:window=8", "0.75"), ("snapkv:window=8", "0.5")} and
          all(r["n"] == "1" and float(r["score"]) == 100 * float(table[k]["score"])
              for r, k in [(board[("full", "0")], ("full", "")),
                           (board[("snapkv:window=8", "0.75")], ("snapkv:window=8,budget=0.25", "0.25"))]),
          f"leaderboard.csv: kvpress's shape, one line per press and ratio {sorted(board)}")
refuse_plans("budgets", [("budgets = [0.25]", "budgets: policy 'streaming_llm' has no budget parameter"),
                         ("budgets = [1.5]",
                          "budgets: expected fractions in (0, 1] of the prompt or whole entry counts, got 1.5")])

# The causal search on every miss (causal = true): stories260K misses the
# passkey with the full cache too, so restoring every loss does not recover
# it: one replay per missed cell, causal_set_size -1; the full cache lost
# nothing and gets no search; the replays go beside the cell's trace.
causal_plan = os.path.join(SCRATCH, "causal.toml")
with open(causal_plan, "w") as f:
    f.write(f"""[sweep]
name = "causal"
models = ["{STORIES}/stories260K.bin"]
tokenizer = "{STORIES}/tok512.bin"
max_new = 6
capture = "events"
oracle = false
policies = ["full", "streaming_llm:sinks=2,window=16"]
tasks = ["needle"]
lengths = [200]
depths = [0.3]
causal = true
causal_budget = 5
""")
code, out = sweep(causal_plan)
table = {r["policy"]: r for r in rows("causal")} if code == 0 else {}
check(code == 0 and set(table) == {"full", "streaming_llm:sinks=2,window=16"}, "causal: both cells ran")
if len(table) == 2:
    s, full = table["streaming_llm:sinks=2,window=16"], table["full"]
    check(s["success"] == "0" and s["causal_set_size"] == "-1" and s["causal_replays"] == "1" and
          s["causal_set"] == "", f"causal: the miss got one replay, not recoverable ({dict(s)})")
    check(full["causal_set_size"] == "" and full["causal_replays"] == "",
          "causal: the full cache lost nothing and has no search")
    check(os.path.exists(os.path.join(SCRATCH, "causal", s["trace"] + ".causal", "causal.json")),
          "causal: the search's report lies beside the cell's trace")
refuse_plans("causal", [("causal_budget = 0", "causal_budget: expected an integer >= 1 (replays)")])

finish()
