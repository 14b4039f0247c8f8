#!/usr/bin/env python3
"""Every registered policy's cost per decode step (not a test; issue 49 item 3).

For each policy of `kvscope policies --json`, at its registry defaults (learned
policies take the model's shipped gate), runs `kvscope capture --capture none`
on the SmolLM2 needle prompt and reads the summary line: the time inside the
policy's hooks per decode step, against the model's own step (the decode step
less the policy's time), measured in the same run. The goal column is the
issue's: a learned policy (one with a `gates` parameter and no `scorer` one: a
composition such as adakv takes a learned scorer only when told to) at most
25 % of the model's step, a heuristic at most 5 %. A policy that refuses the defaults is
listed with its message; one that refuses the 512-token prefill chunk (it needs
the whole prompt in one step) is rerun with the prompt in one chunk, and says so.

  python3 bench/capture/policy_costs.py [--kvscope build/app/kvscope]
      [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--contexts 1000,4000]
      [--max-new 32] [--threads 2] [--repeats 1] [--only h2o,kvpop]
"""
import argparse
import json
import re
import statistics
import subprocess
import sys

LINE = re.compile(r"decode ([\d.]+) tokens/s, policy ([\d.]+) ms per decode step")
SKIP = {"scripted"}  # needs a TorchScript file of the user's; policy_overhead.py --scripted measures it


def registered(exe):
    out = subprocess.run([exe, "policies", "--json"], capture_output=True, text=True, check=True).stdout
    def learned(p):
        names = {q["name"] for q in p["params"]}
        return "gates" in names and "scorer" not in names
    return [(p["name"], learned(p))
            for p in json.loads(out) if p["kind"] == "policy" and p["name"] not in SKIP]


def capture(a, ctx, spec, chunk):
    cmd = [a.kvscope, "capture", "--model", a.model, "--task", f"needle:tokens={ctx},depth=0.5,seed=1",
           "--chat", "--policy", spec, "--capture", "none", "--max-new", str(a.max_new),
           "--ignore-eos", "--threads", str(a.threads), "--prefill-chunk", str(chunk), "-q"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    m = LINE.search(r.stderr)
    if r.returncode != 0 or not m:
        return None, (r.stderr.strip().splitlines() or ["no output"])[-1]
    step_ms = 1000.0 / float(m.group(1))
    return (step_ms, float(m.group(2))), ""


def measure(a, ctx, name):
    """(step ms, policy ms, note) as medians over the repeats, or (None, None, why)."""
    chunk, note = 512, ""
    runs = []
    for _ in range(a.repeats):
        r, err = capture(a, ctx, name, chunk)
        if r is None and "--prefill-chunk" in err and chunk == 512:
            chunk, note = 1 << 20, "prompt in one prefill step"
            r, err = capture(a, ctx, name, chunk)
        if r is None:
            return None, None, err.replace("|", "\\|")
        runs.append(r)
    return statistics.median(s for s, _ in runs), statistics.median(p for _, p in runs), note


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvscope", default="build/app/kvscope")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--contexts", default="1000,4000")
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--only", default="", help="comma-separated policy names")
    a = ap.parse_args()
    policies = [(n, l) for n, l in registered(a.kvscope) if not a.only or n in a.only.split(",")]
    for ctx in [int(c) for c in a.contexts.split(",")]:
        print(f"\n### {ctx}-token needle prompt, {a.max_new} new tokens, --capture none, "
              f"--threads {a.threads}, median of {a.repeats}\n")
        print("| policy | kind | decode step ms | policy ms / step | share of the model's step | goal |")
        print("|---|---|---:|---:|---:|---|")
        for name, learned in policies:
            step, pol, note = measure(a, ctx, name)
            kind = "learned" if learned else "heuristic"
            if step is None:
                print(f"| {name} | {kind} | refused: {note} | | | |", flush=True)
                continue
            share = pol / max(step - pol, 1e-9)
            goal = 0.25 if learned else 0.05
            verdict = ("met" if share <= goal else "missed") + f" (≤ {goal:.0%})"
            print(f"| {name}{' (' + note + ')' if note else ''} | {kind} | {step:.2f} | {pol:.3f} | "
                  f"{share:.1%} | {verdict} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
