#!/usr/bin/env python3
"""The causal search on a real model where the answer provably depends on
known heads: stories260K with the attention output projection (wo) of every
query head zeroed except those of two kv heads, so nothing the other heads
attend reaches the residual stream. Under StreamingLLM (a tiny window:
every head loses most of the prompt) the generation parts from the full
cache's; the search, given the full cache's continuation as the expected
answer, must name only planted heads, and restoring what it names must be
exactly the full restoration (the other heads' losses cannot matter). The
unmodified model is the control: its heads all reach the residual stream,
and its search names heads the planted model does not restrict.

usage: causal_planted_test.py KVSCOPE SHARED_DIR SCRATCH"""
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

from checks import check, finish

KVSCOPE, SHARED, SCRATCH = sys.argv[1:4]
SHARED = os.environ.get("KVSCOPE_SHARED_DIR", SHARED)
STORIES = os.path.join(SHARED, "models", "stories260K")
shutil.rmtree(SCRATCH, ignore_errors=True)
os.makedirs(SCRATCH)
PLANTED = [(1, 2), (3, 0)]  # (layer, kv head)
PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play in the park with "
          "her red ball. One day, she saw a big dog near the tree. The dog was very friendly and "
          "wanted to play too. Lily threw the ball and the dog ran after it.")


def planted_model(path):
    with open(os.path.join(STORIES, "stories260K.bin"), "rb") as f:
        header = f.read(28)
        data = np.frombuffer(f.read(), dtype=np.float32).copy()
    dim, hidden, L, H, K, vocab, seq = struct.unpack("7i", header)
    hd, group = dim // H, H // K
    wo = abs(vocab) * dim + L * dim + L * H * hd * dim + 2 * L * K * hd * dim
    w = data[wo:wo + L * dim * H * hd].reshape(L, dim, H * hd)
    for layer in range(L):
        for h in range(H):
            if (layer, h // group) not in PLANTED:
                w[layer, :, h * hd:(h + 1) * hd] = 0
    with open(path, "wb") as f:
        f.write(header)
        f.write(data.tobytes())
    return L, K


def run(args):
    p = subprocess.run([KVSCOPE, *args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"kvscope {' '.join(args)}: exit {p.returncode}\n{p.stdout}{p.stderr}")
    return p.stdout


def search(model, name):
    common = ["--model", model, "--tokenizer", os.path.join(STORIES, "tok512.bin"), "--prompt",
              PROMPT, "--max-new", "8", "--threads", "1", "-q"]
    full = os.path.join(SCRATCH, name + "-full.kvtrace.h5")
    run(["capture", *common, "--policy", "full", "-o", full])
    answer = run(["info", full, "--json"])
    answer = json.loads(answer)["generated_text"]  # as generated: "\nThere. She ..."
    trace = os.path.join(SCRATCH, name + ".kvtrace.h5")
    run(["capture", *common, "--policy", "streaming_llm:sinks=1,window=8", "--expect", answer,
         "-o", trace])
    return trace, json.loads(run(["why", trace, "--causal", "--budget", "60", "--json"]))


def replay_logprob(trace, spec):
    out = trace + ".replay.kvtrace.h5"
    run(["replay", trace, "--intervene", spec, "-o", out, "--threads", "1", "-q"])
    return json.loads(run(["info", out, "--json"]))["task"]["answer_logprob"]


model = os.path.join(SCRATCH, "planted.bin")
L, K = planted_model(model)
trace, r = search(model, "planted")
names = {f"{l}.{k}" for l, k in PLANTED}
found = set(r["minimal_set"])
check(r["recoverable"], f"restoring every loss recovers the full cache's continuation "
      f"(log p {r['original']['logprob']:.3f} -> {r['full_restoration']['logprob']:.3f})")
check(r["minimal_confirmed"], f"the search finished within its budget ({r['replays']} replays)")
check(found and found <= names, f"the minimal set {sorted(found)} holds only planted heads {sorted(names)}")
both = replay_logprob(trace, "restore:heads=" + ",".join(sorted(names)))
check(abs(both - r["full_restoration"]["logprob"]) < 1e-4,
      f"restoring the planted heads alone is the full restoration (log p {both:.5f} vs "
      f"{r['full_restoration']['logprob']:.5f})")
others = replay_logprob(trace, "only:heads=" + ",".join(sorted(names)))
check(abs(others - r["original"]["logprob"]) < 1e-4,
      f"the policy acting only in the planted heads (only:) costs what it costs everywhere "
      f"(log p {others:.5f} vs {r['original']['logprob']:.5f})")
layers = {l["layer"]: l["restore_alone"]["logprob"] for l in r["layers"]}
for layer in range(L):
    if layer not in {l for l, _ in PLANTED} and layer in layers:
        check(abs(layers[layer] - r["original"]["logprob"]) < 1e-4,
              f"restoring layer {layer} alone (no planted head) changes nothing "
              f"({layers[layer]:.5f} vs {r['original']['logprob']:.5f})")

_, control = search(os.path.join(STORIES, "stories260K.bin"), "control")
check(not control["recoverable"] or not set(control["minimal_set"]) <= names or
      set(control["minimal_set"]) != found,
      f"the unmodified model's search is not the planted answer ({control['minimal_set']})")
finish()
