#!/usr/bin/env python3
"""`kvscope sweep --slurm` on a real single-node Slurm (slurm_cluster.py:
munged, slurmctld and slurmd started from a temp folder): a 4-cell
stories260K plan (2 policies x 1 task x 1 length x 2 depths) run locally and
as a 2-task job array gives the same cells with the same success, generated
text and needle columns; both shards' files and the traces are written; the
sbatch options after `--` reach sbatch; with --wait the results are collected
at once, and a second --collect changes nothing; results.parquet is readable.
Without sbatch on PATH, --slurm exits 2 naming sbatch.

Exits 77 (SKIP) only where the Slurm daemons cannot start.

usage: sweep_slurm_test.py KVSCOPE SHARED_DIR SCRATCH"""
import csv
import glob
import os
import re
import shutil
import subprocess
import sys

import checks
from checks import check, finish
from slurm_cluster import single_node_slurm

KVSCOPE, SHARED, SCRATCH = (os.path.abspath(a) for a in sys.argv[1:4])
SHARED = os.path.abspath(os.environ.get("KVSCOPE_SHARED_DIR", SHARED))
STORIES = os.path.join(SHARED, "models", "stories260K")
shutil.rmtree(SCRATCH, ignore_errors=True)
os.makedirs(SCRATCH)

PLAN = os.path.join(SCRATCH, "plan.toml")
with open(PLAN, "w") as f:
    f.write(f"""[sweep]
name = "slurm"
models = ["{STORIES}/stories260K.bin"]
tokenizer = "{STORIES}/tok512.bin"
max_new = 6
policies = ["full", "streaming_llm:sinks=4,window=32"]
tasks = ["needle"]
lengths = [200]
depths = [0.2, 0.8]
""")
JOB_NAME = "kvscope-slurm-test"
SAME = ["cell_id", "model", "policy", "task", "tokens", "depth", "seed", "status", "success",
        "expected", "generated", "needle_heads_whole", "needle_heads_none", "n_heads"]


def sweep(out, *args, env=None, timeout=600):
    p = subprocess.run([KVSCOPE, "sweep", PLAN, "-o", os.path.join(SCRATCH, out), *args],
                       capture_output=True, text=True, env=env, cwd=SCRATCH, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def table(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def show(out):
    return out.strip().replace("\n", " | ")[-300:]


# The reference: the whole plan in one local process.
code, out = sweep("local")
local = table(os.path.join(SCRATCH, "local", "results.csv")) if code == 0 else []
check(code == 0 and len(local) == 4 and all(r["status"] == "ok" for r in local),
      f"the plan runs locally: 4 cells, all ok ({show(out) if code else 'exit 0'})")

# No sbatch on PATH: exit 2, sbatch named (no cluster needed).
empty = os.path.join(SCRATCH, "empty-path")
os.makedirs(empty)
code, out = sweep("no-sbatch", "--slurm", "2", env=dict(os.environ, PATH=empty))
check(code == 2 and "sbatch" in out, f"--slurm without sbatch on PATH: exit {code}: {show(out)}")

if checks.failures:   # a broken sweep is a failure, whether or not Slurm can start
    finish()

OUT = os.path.join(SCRATCH, "slurm")
with single_node_slurm() as env:
    # The cluster itself first: a failure here is Slurm's, not kvscope's.
    p = subprocess.run(["sbatch", "--wait", "--array=0-1", "--output=/dev/null", "--wrap", "true"],
                       env=env, cwd=SCRATCH, capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"the cluster runs a plain 2-task array job ({show(p.stdout + p.stderr)})")
    code, out = sweep("slurm", "--slurm", "2", "--", "--wait", f"--job-name={JOB_NAME}", env=env)
    print(out.rstrip())
    check(code == 0, f"--slurm 2 -- --wait exits 0 ({show(out)})")
    if code != 0:   # the array tasks' output, wherever the job script sent it
        for log in sorted(glob.glob(os.path.join(OUT, "**", "*.out"), recursive=True) +
                          glob.glob(os.path.join(SCRATCH, "slurm-*.out"))):
            print(f"--- {log}:\n" + "".join(open(log, errors="replace").readlines()[-15:]))
    script = os.path.join(OUT, "slurm", "sweep.sbatch")
    check(os.path.isfile(script) and "--shard" in open(script).read() and
          "'--device' 'cpu'" in open(script).read(),
          "the job script slurm/sweep.sbatch runs the shards (--shard) on the sweep's --device")
    # The controller keeps finished jobs (MinJobAge=300): the array's tasks,
    # with the name passed after `--`, each exited 0.
    listing = subprocess.run(["scontrol", "--oneliner", "show", "job"], env=env, capture_output=True,
                             text=True, timeout=30).stdout
    tasks = [j for j in listing.splitlines() if f"JobName={JOB_NAME} " in j]
    ids = {re.search(r"ArrayJobId=(\d+)", j).group(1) for j in tasks if "ArrayJobId=" in j}
    check(len(tasks) == 2 and all("JobState=COMPLETED" in j and "ExitCode=0:0" in j for j in tasks),
          f"2 array tasks named {JOB_NAME} (the sbatch option after --) completed with exit 0")
    check(len(ids) == 1 and re.search(rf"\b{next(iter(ids))}\b", out) is not None,
          f"kvscope printed the array's job id ({', '.join(sorted(ids)) or 'none'})")

shards = sorted(os.path.basename(p) for p in glob.glob(os.path.join(OUT, "shards", "results.*.csv")))
check(shards == ["results.0-of-2.csv", "results.1-of-2.csv"], f"both shards wrote their file: {shards}")
shard_rows = [r for s in shards for r in table(os.path.join(OUT, "shards", s))]
shard_ids = [r["cell_id"] for r in shard_rows]
check(len(shard_ids) == 4 and set(shard_ids) == {r["cell_id"] for r in local} and
      all(table(os.path.join(OUT, "shards", s)) for s in shards),
      "the shards split the 4 cells between them, each cell once, neither shard empty")

merged_path = os.path.join(OUT, "results.csv")
merged = table(merged_path) if os.path.exists(merged_path) else []
check(len(merged) == 4, f"--wait collected the shards into results.csv ({len(merged)} rows)")
check([r["cell_id"] for r in merged] == [r["cell_id"] for r in local],
      "the same cell ids as the local run, in plan order")
check(merged and all(r["status"] == "ok" for r in merged), "every Slurm row has status ok")
for a, b in zip(local, merged):
    diff = [k for k in SAME if a[k] != b[k]]
    check(not diff, f"{a['cell_id']} ({a['policy']}, depth {a['depth']}): success={b['success']} "
          f"generated={b['generated']!r} needle {b['needle_heads_whole']}/{b['needle_heads_none']}"
          f"/{b['n_heads']} as locally" + (f" (differs: {', '.join(diff)})" if diff else ""))
# A row's trace path is relative to the output folder (or absolute).
traces = [os.path.normpath(os.path.join(OUT, r["trace"])) for r in merged if r["trace"]]
check(len(traces) == 4 and all(os.path.isfile(t) and os.path.dirname(t) == os.path.join(OUT, "traces")
                               for t in traces), "every row's trace exists under OUT/traces/")

# --collect again: idempotent.
before = merged
code, out = sweep("slurm", "--collect")
after = table(merged_path) if os.path.exists(merged_path) else []
check(code == 0 and after == before, f"a second --collect leaves results.csv as it was ({show(out)})")

# results.parquet: the same rows.
pq = os.path.join(OUT, "results.parquet")
data = open(pq, "rb").read() if os.path.exists(pq) else b""
check(len(data) > 12 and data[:4] == b"PAR1" and data[-4:] == b"PAR1",
      f"results.parquet is a Parquet file (PAR1 at both ends, {len(data)} bytes)")
try:
    import pyarrow.parquet
except ImportError:
    print("note: pyarrow not importable by this python; results.parquet's content not checked "
          "(only its PAR1 magic)")
else:
    if data:
        t = pyarrow.parquet.read_table(pq)
        ids = [str(x) for x in t.column("cell_id").to_pylist()] if "cell_id" in t.column_names else []
        check(t.num_rows == 4 and ids == [r["cell_id"] for r in after] and
              set(SAME) <= set(t.column_names),
              f"results.parquet (pyarrow): {t.num_rows} rows, the csv's cell ids and columns")

finish()
