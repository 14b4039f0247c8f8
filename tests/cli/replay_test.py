#!/usr/bin/env python3
"""`kvscope replay` and `kvscope why --causal` on real captures.

1. Exactness: for every policy family of the golden catalogue on a stories260K
   needle task, and for H2O on a SmolLM2 needle task, a replay without
   interventions reproduces the original trace: the command itself compares
   tokens, steps, events and the oracle and exits 1 naming the first
   difference; this test also compares the files with h5py.
2. restore:all from step 0 on a StreamingLLM capture generates what the full
   cache generates, and its answer log-probability is the full cache's.
3. What a replay records: the kept tier and the interventions' reasons in
   /run, the interventions and the original in run_json, one /interventions
   row per changed decision; a replay of that replay reproduces it.
4. The causal search runs within its budget and writes its report, the CSV of
   every replay and the replays' traces.
5. Bad input: exit 2 naming the spec part and the range.

usage: replay_test.py KVSCOPE SHARED_DIR MODELS_DIR SCRATCH [--quick]

--quick (the sanitizer stage): four families and no SmolLM2; the policies'
code runs under the sanitizers in their own tests, the replay's here."""
import csv
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

from checks import check, finish

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "policies"))
import golden_events  # noqa: E402

KVSCOPE, SHARED, MODELS, SCRATCH = sys.argv[1:5]
QUICK = "--quick" in sys.argv[5:]
SHARED = os.environ.get("KVSCOPE_SHARED_DIR", SHARED)
MODELS = os.environ.get("KVSCOPE_MODELS_DIR", MODELS)
STORIES = os.path.join(SHARED, "models", "stories260K")
SMOL = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
shutil.rmtree(SCRATCH, ignore_errors=True)
os.makedirs(SCRATCH)
ENV = {**os.environ, **golden_events.DETERMINISTIC_ENV}
STORIES_ARGS = ["--model", STORIES + "/stories260K.bin", "--tokenizer", STORIES + "/tok512.bin",
                "--task", "needle:tokens=200,depth=0.2,seed=3", "--max-new", "8"]


def run(args, code=0):
    p = subprocess.run([KVSCOPE, *args], capture_output=True, text=True, env=ENV)
    if code is not None and p.returncode != code:
        sys.exit(f"exit {p.returncode} (wanted {code}): kvscope {' '.join(args)}\n{p.stdout}{p.stderr}")
    return p


def capture(model_args, policy, name, extra=()):
    out = os.path.join(SCRATCH, name + ".kvtrace.h5")
    run(["capture", *model_args, "--policy", policy, "--threads", "1", "-q", *extra, "-o", out])
    return out


def contents(path):
    with h5py.File(path, "r") as f:
        ev = {k: f["/events/" + k][:] for k in ("step", "layer", "kv_head", "token", "kind",
                                                  "reason", "from_tier", "to_tier")}
        return {"tokens": f["/tokens/id"][:].tolist(), "roles": f["/tokens/role"][:].tolist(),
                "events": {k: v.tolist() for k, v in ev.items()},
                "logprob": float(f["/generation/answer_logprob"][()]),
                "success": int(f["/generation/success"][()]),
                "run_json": json.loads(f["/run"].attrs["run_json"]),
                "tiers": [t.decode() if isinstance(t, bytes) else str(t)
                          for t in f["/run"].attrs["tier_names"]],
                "reasons": [t.decode() if isinstance(t, bytes) else str(t)
                            for t in f["/run"].attrs["reason_names"]],
                "interventions": {k: f["/interventions/" + k][:].tolist()
                                  for k in ("step", "layer", "kv_head", "token", "action")}}


def generated(c):
    return [t for t, r in zip(c["tokens"], c["roles"]) if r == 1]


# 1. Exactness over the policy families (the golden catalogue's, one spec each).
pattern = os.path.join(SCRATCH, "heads.tsv")
with open(pattern, "w") as out:
    for l in range(5):
        out.write("\t".join("0.9" if (l + h) % 2 else "0.1" for h in range(4)) + "\n")
skip = {"h2o_sinks", "tova_per_head", "snapkv_prefill", "adakv_knorm", "adakv_tova", "kvpop_mlstm"}
cases = [(n, s) for n, s in golden_events.stories_cases(pattern) if n not in skip]
if QUICK:
    cases = [c for c in cases if c[0] in ("full", "streaming_llm", "h2o", "quest")]
for name, spec in cases:
    original = capture(STORIES_ARGS, spec, "stories-" + name,
                       ["--capture", "events", "--oracle"] if name == "h2o" else [])
    replay = os.path.join(SCRATCH, "stories-" + name + ".replay.kvtrace.h5")
    p = run(["replay", original, "-o", replay], code=None)
    check(p.returncode == 0 and "reproduces" in p.stdout,
          f"stories260K {name}: the replay reproduces the capture (exit {p.returncode}: "
          f"{(p.stdout + p.stderr)[-300:]})")
    a, b = contents(original), contents(replay)
    check(a["tokens"] == b["tokens"] and a["events"] == b["events"],
          f"stories260K {name}: h5py reads the same tokens and events in both files")
    check(not b["interventions"]["step"], f"stories260K {name}: no /interventions rows")

if QUICK:
    pass
elif os.path.exists(SMOL):
    smol_args = ["--model", SMOL, "--task", "needle:tokens=300,depth=0.5,seed=1", "--chat",
                 "--max-new", "6"]
    original = capture(smol_args, "h2o:heavy=32,recent=32", "smol-h2o")
    replay = os.path.join(SCRATCH, "smol-h2o.replay.kvtrace.h5")
    p = run(["replay", original, "-o", replay], code=None)
    check(p.returncode == 0 and "reproduces" in p.stdout,
          f"SmolLM2 h2o: the replay reproduces the capture ({(p.stdout + p.stderr)[-300:]})")
    check(not np.isnan(contents(original)["logprob"]), "SmolLM2 h2o: the answer log p is measured")
else:
    check(False, SMOL + " is missing: run scripts/fetch-models")

# 2. restore:all from step 0 is the full cache.
streaming = capture(STORIES_ARGS, "streaming_llm:sinks=2,window=16", "streaming")
full = capture(STORIES_ARGS, "full", "full")
restored = os.path.join(SCRATCH, "streaming.restore-all.kvtrace.h5")
run(["replay", streaming, "--intervene", "restore:all", "-o", restored])
s, f, r = contents(streaming), contents(full), contents(restored)
check(generated(r) == generated(f), f"restore:all generates the full cache's tokens "
      f"({generated(r)} vs {generated(f)})")
check(abs(r["logprob"] - f["logprob"]) < 1e-3,
      f"restore:all's answer log p {r['logprob']:.5f} is the full cache's {f['logprob']:.5f}")
check(generated(s) != generated(f) or abs(s["logprob"] - f["logprob"]) > 1e-3,
      "the StreamingLLM run differs from the full cache (else the check above proves nothing)")

# 3. What a replay records.
check(r["tiers"][-1] == "kept" and r["reasons"][-2:] == ["kept by intervention",
                                                         "dropped by intervention"],
      f"the replay's tiers {r['tiers']} end with kept, its reasons with the interventions' two")
check(r["run_json"].get("interventions") == ["restore:all"] and
      r["run_json"].get("replay_of") == streaming, "run_json names the interventions and the original")
evicted = sum(1 for k in s["events"]["kind"] if k == 3)
check(len(r["interventions"]["step"]) == evicted and set(r["interventions"]["action"]) == {0},
      f"one 'kept' row per eviction of the original ({len(r['interventions']['step'])} vs {evicted})")
again = os.path.join(SCRATCH, "streaming.restore-all.again.kvtrace.h5")
p = run(["replay", restored, "-o", again], code=None)
check(p.returncode == 0 and "reproduces" in p.stdout,
      "a replay of the replay applies its interventions again and reproduces it")
dropped = os.path.join(SCRATCH, "full.drop.kvtrace.h5")
run(["replay", full, "--intervene", "drop:tokens=needle,heads=0-2", "-o", dropped])
d = contents(dropped)
needle = [i for i, role in enumerate(f["roles"]) if role == 2]
check(len(d["interventions"]["step"]) == len(needle) * 3 * 4 and set(d["interventions"]["action"]) == {1},
      f"drop on the full cache: one 'dropped' row per needle token and head of layers 0-2")

# 4. The causal search.
out = os.path.join(SCRATCH, "causal")
p = run(["why", streaming, "--causal", "--budget", "10", "-o", out, "--json"])
report = json.loads(p.stdout)
rows = list(csv.DictReader(open(os.path.join(out, "replays.csv"))))
check(1 <= report["replays"] <= 10 and len(rows) == report["replays"],
      f"the search ran {report['replays']} replays within its budget of 10, each a CSV row")
check(all(os.path.exists(os.path.join(out, row["trace"])) for row in rows),
      "every replay's trace is in the folder")
check(rows[0]["interventions"].startswith("restore:heads="), "the first replay restores every loss")
check(abs(float(rows[0]["answer_logprob"]) - f["logprob"]) < 1e-3,
      "restoring every loss measures the full cache's log p")
check(json.load(open(os.path.join(out, "causal.json")))["replays"] == report["replays"],
      "causal.json is the printed report")

# 5. Bad input.
def refused(args, words):
    p = run(args, code=None)
    check(p.returncode == 2 and words in p.stderr,
          f"kvscope {' '.join(args[:4])}: exit {p.returncode}, '{words}' in: {p.stderr.strip()[-240:]}")

bad = os.path.join(SCRATCH, "bad.kvtrace.h5")
refused(["replay", streaming, "--intervene", "restore:heads=5.0", "-o", bad],
        "the trace's model has 5 layers (0-4)")
refused(["replay", streaming, "--intervene", "pin:tokens=9999", "-o", bad], "'9999'")
refused(["replay", full, "--intervene", "restore:all", "-o", bad], "there is nothing to restore")
refused(["why", streaming, "--causal", "--budget", "0"], "--budget: is 0 (expected >= 1 replays)")
old = os.path.join(SCRATCH, "old.kvtrace.h5")
shutil.copy(streaming, old)
with h5py.File(old, "r+") as h:
    j = json.loads(h["/run"].attrs["run_json"])
    del j["replay"]
    h["/run"].attrs["run_json"] = json.dumps(j)
refused(["replay", old, "-o", bad], "/run run_json replay: absent")
check(not os.path.exists(bad), "no trace is left by a refused replay")

finish()
