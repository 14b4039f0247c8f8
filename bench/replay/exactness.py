#!/usr/bin/env python3
"""Replays without interventions against their originals, for every SmolLM2
case of the golden catalogue (tests/policies/golden_events.py: the needle task
at 300 tokens, chat template, 6 new tokens) — what tests/cli/replay_test.py
checks on stories260K in CI, on the real model here. Prints one line per
policy: whether `kvscope replay` reproduced the trace, and the seconds of the
capture and of the replay.

  /usr/bin/python3 bench/replay/exactness.py build/app/kvscope models/SmolLM2-135M-Instruct.Q4_1.gguf OUT_DIR
"""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "policies"))
import golden_events  # noqa: E402

kvscope, model, out = sys.argv[1:4]
os.makedirs(out, exist_ok=True)
env = {**os.environ, **golden_events.DETERMINISTIC_ENV}
args = ["--model", model, "--task", "needle:tokens=300,depth=0.5,seed=1", "--chat", "--max-new", "6",
        "--threads", "1", "-q"]
failed = 0
for name, spec in golden_events.smollm_cases():
    trace = os.path.join(out, name + ".kvtrace.h5")
    t0 = time.time()
    subprocess.run([kvscope, "capture", *args, "--policy", spec, "-o", trace], check=True,
                   capture_output=True, env=env)
    t1 = time.time()
    p = subprocess.run([kvscope, "replay", trace, "-o", trace + ".replay.h5", "--threads", "1"],
                       capture_output=True, text=True, env=env)
    t2 = time.time()
    ok = p.returncode == 0 and "reproduces" in p.stdout
    failed += not ok
    print(f"{name:20s} {'reproduced' if ok else 'DIFFERS: ' + p.stderr.strip()[-200:]}"
          f"  capture {t1 - t0:.1f} s, replay {t2 - t1:.1f} s", flush=True)
sys.exit(1 if failed else 0)
