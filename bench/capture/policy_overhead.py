#!/usr/bin/env python3
"""Policy overhead per decode step, two builds in the same run (not a test).

Runs `kvscope capture --capture none` on the SmolLM2 needle prompt under each
policy with the executable before a change and after it, alternating, and
prints the time inside the policy's hooks per decode step (the summary line's
"policy X ms per decode step") and the after/before ratio of the medians.
With --scripted FILE (a TorchScript knorm scorer, e.g. written by
tests/policies/test_scripted.cpp's script), the scripted scorer's overhead is
measured against the built-in knorm of the after build in the same run.

  python3 bench/capture/policy_overhead.py --before OLD/kvscope --after build/app/kvscope \
      [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--tokens 1000] [--max-new 32] [--repeats 5]
      [--scripted knorm.pt]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

LINE = re.compile(r"policy ([\d.]+) ms per decode step")
GATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "resources", "gates")


def policies():
    g = lambda name: os.path.join(GATES, "SmolLM2-135M-Instruct-" + name + ".safetensors")
    return [("h2o", "h2o:heavy=64,recent=64"), ("snapkv", "snapkv:budget=128"),
            ("tova", "tova:budget=128"), ("wgkv", "wgkv:gates=" + g("wgkv")),
            ("dbtrimkv", "dbtrimkv:gates=" + g("retention-global") + ",budget=128")]


def policy_ms(exe, model, tokens, max_new, spec):
    cmd = [exe, "capture", "--model", model, "--task", f"needle:tokens={tokens},depth=0.5,seed=1",
           "--chat", "--policy", spec, "--capture", "none", "--max-new", str(max_new),
           "--threads", "2", "-q"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    m = LINE.search(r.stderr)
    if r.returncode != 0 or not m:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--scripted", help="a TorchScript knorm scorer: compare scripted with knorm")
    a = ap.parse_args()
    print(f"| policy | before ms/step (median of {a.repeats}) | after ms/step | after / before |")
    print("| --- | --- | --- | --- |")
    for name, spec in policies():
        before, after = [], []
        for _ in range(a.repeats):  # alternate so drift hits both alike
            before.append(policy_ms(a.before, a.model, a.tokens, a.max_new, spec))
            after.append(policy_ms(a.after, a.model, a.tokens, a.max_new, spec))
        b, f = statistics.median(before), statistics.median(after)
        print(f"| {name} | {b:.3f} | {f:.3f} | {f / b:.3f} |", flush=True)
    if a.scripted:
        knorm, scripted = [], []
        for _ in range(a.repeats):
            knorm.append(policy_ms(a.after, a.model, a.tokens, a.max_new, "knorm:budget=128"))
            scripted.append(policy_ms(a.after, a.model, a.tokens, a.max_new,
                                      f"scripted:file={a.scripted},budget=128"))
        k, s = statistics.median(knorm), statistics.median(scripted)
        print(f"\n| after build | knorm ms/step | scripted knorm ms/step | scripted / knorm |")
        print("| --- | --- | --- | --- |")
        print(f"| same run | {k:.3f} | {s:.3f} | {s / k:.2f} |", flush=True)


if __name__ == "__main__":
    main()
