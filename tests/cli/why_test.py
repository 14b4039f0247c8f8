#!/usr/bin/env python3
"""`kvscope why` against the trace read independently with h5py.

A StreamingLLM capture (4 sinks + 32-token window) of a needle planted at 20 %
depth of a 200-token prompt: the needle lies outside the window, so every
needle token must be named as evicted, in every (layer, kv head), with the
policy's reason, at the steps the trace's events say — and no head may read
any of it when the answer is generated. The same task under the full cache:
every head reads the whole needle and nothing is lost. A trace without a
needle is refused with exit 2.

usage: why_test.py KVSCOPE SHARED_DIR SCRATCH"""
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

from checks import check, finish

KVSCOPE, SHARED, SCRATCH = sys.argv[1:4]
SHARED = os.environ.get("KVSCOPE_SHARED_DIR", SHARED)
STORIES = os.path.join(SHARED, "models", "stories260K")
shutil.rmtree(SCRATCH, ignore_errors=True)
os.makedirs(SCRATCH)


def capture(policy, name, task="needle:tokens=200,depth=0.2,seed=3"):
    out = os.path.join(SCRATCH, name + ".kvtrace.h5")
    args = [KVSCOPE, "capture", "--model", STORIES + "/stories260K.bin", "--tokenizer",
            STORIES + "/tok512.bin", "--policy", policy, "--max-new", "8", "--capture", "received",
            "--oracle", "-q", "-o", out]
    if task:
        args += ["--task", task]
    else:
        args += ["--prompt", "Once upon a time"]
    subprocess.run(args, check=True, capture_output=True)
    return out


def why(path):
    p = subprocess.run([KVSCOPE, "why", path, "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("kvscope why failed: " + p.stdout + p.stderr)
    return json.loads(p.stdout)


def needle_evictions(path):
    """(token, layer, kv head) -> (step, reason name) of each needle token's
    evict event up to the last prefill step, straight from the file."""
    with h5py.File(path, "r") as f:
        roles = f["/tokens/role"][:]
        needle = set(np.flatnonzero(roles == 2).tolist())
        answer = int(np.flatnonzero(f["/steps/kind"][:] == 0).max())
        reasons = json.loads(f["/run"].attrs["reason_names"]) if isinstance(
            f["/run"].attrs["reason_names"], str) else [
            r.decode() if isinstance(r, bytes) else str(r) for r in f["/run"].attrs["reason_names"]]
        ev = {k: f["/events/" + k][:] for k in ("step", "layer", "kv_head", "token", "kind", "reason")}
        L, K = int(f["/run"].attrs["n_layers"]), int(f["/run"].attrs["n_kv_heads"])
    out = {}
    for i in range(len(ev["step"])):
        t = int(ev["token"][i])
        if ev["kind"][i] == 3 and t in needle and ev["step"][i] <= answer:
            out[(t, int(ev["layer"][i]), int(ev["kv_head"][i]))] = (
                int(ev["step"][i]), reasons[int(ev["reason"][i])])
    return needle, answer, L * K, out


# A needle outside StreamingLLM's window.
path = capture("streaming_llm:sinks=4,window=32", "streaming")
w = why(path)
needle, answer, heads, evicted = needle_evictions(path)
check(w["success"] == 0, "the StreamingLLM capture misses the pass key")
check(w["answer_step"] == answer, f"answer step {w['answer_step']} is the last prefill step {answer}")
check(sorted(t["token"] for t in w["needle"]) == sorted(needle),
      f"the {len(needle)} needle tokens are the trace's role-2 tokens")
named = {(l["token"], l["layer"], l["kv_head"]): (l["step"], l["reason"])
         for l in w["losses"] if l["kind"] == "evict"}
check(len(evicted) == len(needle) * heads, "h5py: every needle token evicted from every head")
check(named == evicted, f"why names exactly the {len(evicted)} needle evictions of the file, "
                        "with their steps and reasons")
check(all(t["heads_lost"] == heads and t["heads_readable"] == 0 for t in w["needle"]),
      "each needle token is lost in every head")
check(w["heads_no_needle"] == heads and w["heads_whole_needle"] == 0,
      "no head reads any needle token when the answer is generated")
check(w["verdict"].startswith("no head could read any of the"), "verdict: " + w["verdict"])
check(w["policy_needle_mass"] == 0, "the policy's answer query puts no mass on the needle")
check(w["oracle_lost_mass"] is not None and w["oracle_lost_mass"] > 0,
      "the full cache's answer query put mass on keys the policy had evicted")
text = subprocess.run([KVSCOPE, "why", path], capture_output=True, text=True).stdout
check("evict (outside sinks and window)" in text, "the text names the policy's reason")

# The full cache keeps it.
w = why(capture("full", "full"))
check(w["losses"] == [] and w["heads_whole_needle"] == heads,
      "full cache: no loss, every head reads the whole needle")
check(w["verdict"].startswith("every head could read the whole needle"), "verdict: " + w["verdict"])

# Read-time selection (Quest): the cache holds the needle; the first answer
# query reads only its selected pages. The counts must be the file's.
path = capture("quest:budget=128,page_size=16,dense_layers=2", "quest")
w = why(path)
with h5py.File(path, "r") as f:
    needle = set(np.flatnonzero(f["/tokens/role"][:] == 2).tolist())
    ev = {k: f["/events/" + k][:] for k in ("step", "layer", "kv_head", "token", "kind")}
    L, K = int(f["/run"].attrs["n_layers"]), int(f["/run"].attrs["n_kv_heads"])
step = w["answer_step"] + 1
sel = np.flatnonzero((ev["step"] == step) & (ev["kind"] == 2))  # Select events of that step
selected = sum(1 for i in sel if int(ev["token"][i]) in needle)
selective = len({(int(ev["layer"][i]), int(ev["kv_head"][i])) for i in sel})
check(w["heads_whole_needle"] == L * K and w["losses"] == [], "Quest leaves the cache whole")
check(w["selection"] is not None and w["selection"]["selective_heads"] == selective == (L - 2) * K,
      f"Quest: the {selective} heads past its 2 dense layers select")
check(w["selection"]["held_pairs"] == len(needle) * selective,
      "Quest: every (needle token, selecting head) pair held")
check(w["selection"]["selected_pairs"] == selected and 0 < selected < len(needle) * selective,
      f"Quest: {selected} needle pairs selected at step {step}, as the file's Select events say")
check("select at read time the first answer query read only" in w["verdict"], "verdict: " + w["verdict"])

# No needle: refused.
p = subprocess.run([KVSCOPE, "why", capture("full", "plain", task=None)], capture_output=True,
                   text=True)
check(p.returncode == 2 and "/tokens/role: no needle tokens" in p.stderr,
      "a trace without a needle: exit 2, " + p.stderr.strip())

finish()
