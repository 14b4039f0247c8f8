#!/usr/bin/env python3
"""`--device-prefill blocked` on the CPU against the host kernel: the tensor
code a GPU runs for blocked prefill (capture/attention/blocked_attention.h) run
over the host pages, end to end through the step driver, the policies and the
recorder, on stories260K (a policy per statistic: received, last query,
observation window, pooled maps; the oracle's full cache, which takes each
head's last-query weights from the same path) and SmolLM2. Each pair of traces must pass
trace_parity.py (equal, or parted at a tie), and the blocked run must have
attended its prefill chunks that way (its note counts the layer steps), so
the check cannot pass by falling back to the host kernel (with --oracle,
the oracle's shadow too).

    blocked_prefill_parity.py KVSCOPE STORIES_DIR MODELS_DIR OUT_DIR
"""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import parity_report  # noqa: E402
import trace_parity  # noqa: E402

KVSCOPE, STORIES, MODELS, OUT = (os.path.abspath(a) for a in sys.argv[1:5])
STORIES_ARGS = ["--model", os.path.join(STORIES, "stories260K.bin"), "--tokenizer",
                os.path.join(STORIES, "tok512.bin"), "--prefill-chunk", "64", "--max-new", "32"]
SMOLLM2_ARGS = ["--model", os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf"),
                "--prefill-chunk", "128", "--max-new", "8"]
CASES = [  # (model, its arguments, task, policy, capture level[, trace_parity arguments])
    ("stories260K", STORIES_ARGS, "needle:tokens=300", "full", "received+pooled:16"),
    ("stories260K", STORIES_ARGS + ["--oracle"], "needle:tokens=300", "h2o:heavy=16,recent=16",
     "received"),
    ("stories260K", STORIES_ARGS, "needle:tokens=300", "h2o:heavy=16,recent=16", "received+pooled:16"),
    ("stories260K", STORIES_ARGS, "needle:tokens=300", "tova:budget=32", "events"),
    ("stories260K", STORIES_ARGS, "needle:tokens=300", "snapkv:budget=32,window=8", "events"),
    ("stories260K", STORIES_ARGS, "needle:tokens=300", "window:window=48", "received"),
    # Several attended tiers and an INT4 one (blocked_attention.h): SFC's hot
    # float32 and warm INT4 tiers, KVpop's sink, window and long-range tiers.
    # KVpop's scores are its learned predictor's output on the attention the
    # entries received, which the two paths sum to within 1e-6 (received
    # mass): a score of 1.7e-4 moved by 1.5e-6, so its scores get 1e-5 of
    # absolute tolerance. The events must still be equal.
    ("stories260K", STORIES_ARGS, "needle:tokens=300", "sfc:hot=0.4", "received+pooled:16"),
    ("stories260K", STORIES_ARGS, "needle:tokens=300", "kvpop", "received",
     ["--score-atol", "1e-5"]),
    ("SmolLM2-135M-Instruct", SMOLLM2_ARGS, "needle:tokens=512", "h2o:heavy=64,recent=64",
     "received+pooled:32"),
]
os.makedirs(OUT, exist_ok=True)
failed = 0
for i, (model, args, task, policy, level, *parity_args) in enumerate(CASES):
    traces, notes = {}, {}
    for way in ("kernel", "blocked"):
        traces[way] = os.path.join(OUT, f"case{i}.{way}.kvtrace.h5")
        r = subprocess.run([KVSCOPE, "capture", *args, "--task", task, "--policy", policy,
                            "--ignore-eos", "--capture", level, "--device", "cpu",
                            "--device-prefill", way, "-o", traces[way]],
                           capture_output=True, text=True)
        notes[way] = r.stderr
        if r.returncode != 0:
            print(f"FAIL {model} {policy} --device-prefill {way}: {r.stderr.strip()[-400:]}")
            failed += 1
    if len(traces) != 2 or not all(os.path.exists(t) for t in traces.values()):
        continue
    counts = [int(x) for x in
              re.findall(r"prefill on the cpu: (\d+) layer steps by blocked", notes["blocked"])]
    # one count per driver: the policy's, then the oracle's shadow
    blocked_steps = min(counts) if len(counts) == (2 if "--oracle" in args else 1) else 0
    r = subprocess.run([sys.executable, trace_parity.__file__, traces["kernel"], traces["blocked"],
                        *(parity_args[0] if parity_args else [])],
                       capture_output=True, text=True)
    result = (json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip()
              else {"passed": False, "error": r.stderr})
    result["blocked_layer_steps"] = blocked_steps
    if blocked_steps == 0:
        result["passed"] = False
        result["error"] = "no prefill chunk took the blocked path: " + notes["blocked"][-300:]
    record = {"model": model, "policy": policy,
              "capture": level + (" --oracle" if "--oracle" in args else ""), "result": result}
    failed += 0 if parity_report.report(record) else 1
# The check can fail: two different policies' traces do not pass as equal.
control = [os.path.join(OUT, f"case{i}.kernel.kvtrace.h5") for i in (2, 3)]
if all(os.path.exists(t) for t in control):
    r = subprocess.run([sys.executable, trace_parity.__file__, *control], capture_output=True, text=True)
    ok = r.returncode != 0
    print(("ok   " if ok else "FAIL ") + "trace_parity.py tells H2O's trace from TOVA's: " +
          r.stdout.strip()[-200:])
    failed += 0 if ok else 1
# ... nor a trace whose oracle rows were moved: one lost mass by 1e-3, one
# recall by two keys of k.
oracle_trace = os.path.join(OUT, "case1.kernel.kvtrace.h5")
if os.path.exists(oracle_trace):
    import h5py
    import shutil
    moved = os.path.join(OUT, "case1.moved.kvtrace.h5")
    shutil.copyfile(oracle_trace, moved)
    with h5py.File(moved, "r+") as f:
        f["/oracle/lost_mass"][3, 1, 2] += 1e-3
        k = int(f["/oracle"].attrs["recall_k"])
        f["/oracle/recall"][4, 0, 1] = (f["/oracle/recall"][4, 0, 1] * k + 2) % (k + 1) / k
    r = subprocess.run([sys.executable, trace_parity.__file__, oracle_trace, moved],
                       capture_output=True, text=True)
    ok = (r.returncode != 0 and "/oracle/lost_mass" in r.stdout and "/oracle/recall" in r.stdout)
    print(("ok   " if ok else "FAIL ") + "trace_parity.py tells moved oracle rows: " +
          r.stdout.strip()[-240:])
    failed += 0 if ok else 1
sys.exit(1 if failed else 0)
