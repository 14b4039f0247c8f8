#!/usr/bin/env python3
"""`kvscope sweep` on stories260K: a 2 policies x 2 tasks x 2 depths plan
gives 8 traces and 8 result rows whose needle columns agree with `kvscope why`
and with the trace files (h5py); cell ids are deterministic; a rerun skips
finished cells and an interrupted table (rows removed) reruns exactly the
missing cells; a cell that fails is recorded with its error and the sweep goes
on; bad plans exit 2 naming the plan's line.

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


POLICIES = ["full", "streaming_llm:sinks=4,window=32"]
code, out = sweep(plan("grid", POLICIES))
check(code == 0 and "8 cells run (0 failed), 0 skipped" in out, "a fresh sweep runs 8 cells")
table = rows("grid")
check(len(table) == 8 and len({r["cell_id"] for r in table}) == 8, "8 rows, 8 distinct cell ids")
for r in table:
    with h5py.File(r["trace"], "r") as f:
        needle = np.flatnonzero(f["/tokens/role"][:] == 2)
        run = f["/run"].attrs
        ok = (run["policy"] == r["policy"] and str(run["expected_answer"]) == r["expected"]
              and int(f["/generation/success"][()]) == int(r["success"]) and len(needle) > 0)
    why = json.loads(subprocess.run([KVSCOPE, "why", r["trace"], "--json"], capture_output=True,
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

# Bad plans: exit 2, the plan's line named.
for extra, want in [('colour = "red"', "colour: unknown key"),
                    ('seeds = "one"', "seeds: expected a non-empty array of integers")]:
    p = plan("bad", POLICIES, extra)
    code, out = sweep(p)
    line = 1 + open(p).read().splitlines().index(extra)
    check(code == 2 and f"bad.toml:{line}: {want}" in out, f"bad plan: {out.strip()}")
code, out = sweep(plan("bad", ["full", "h2o:recnt=8"]))
check(code == 2 and "bad.toml:6: policies[1]: --policy: h2o:recnt: unknown parameter" in out,
      "unknown policy parameter: " + out.strip())

finish()
