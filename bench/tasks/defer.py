#!/usr/bin/env python3
"""The deferred-salience task (seed 004's DEFER-Bench idea) under KV-cache policies.

For each policy spec and seed: `kvscope capture --task defer:...` (the pass key
early in the prompt, D teacher-forced distractor decode steps, the forced
question, then the free answer), then `kvscope info --json` for the task's
success and the Deferred Retention Rate (core/analysis/deferred_retention.h).
Prints one JSON object: every run, and per policy the success rate and the mean
DRR over the seeds.

usage (from the repository root):
  bench/tasks/defer.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf --chat \\
      --policy full --policy h2o:heavy=64,recent=64 --tokens 1024 --distract 64 --seeds 1-8
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def parse_seeds(text):
    seeds = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            seeds.extend(range(int(a), int(b) + 1))
        else:
            seeds.append(int(part))
    return seeds


def run_one(args, policy, seed, trace):
    task = f"defer:tokens={args.tokens},distract={args.distract},seed={seed},depth={args.depth}"
    cmd = [args.kvscope, "capture", "--model", args.model, "--policy", policy, "--task", task,
           "--max-new", str(args.max_new), "--capture", "events", "-q", "-o", trace]
    if args.tokenizer:
        cmd += ["--tokenizer", args.tokenizer]
    if args.chat:
        cmd.append("--chat")
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    cap = subprocess.run(cmd, capture_output=True, text=True)
    if cap.returncode != 0:
        sys.exit(f"defer.py: {' '.join(cmd)} failed ({cap.returncode}):\n{cap.stderr}")
    info = subprocess.run([args.kvscope, "info", "--json", trace], capture_output=True, text=True)
    if info.returncode != 0:
        sys.exit(f"defer.py: kvscope info {trace} failed:\n{info.stderr}")
    j = json.loads(info.stdout)
    d = j.get("deferred_retention")
    return {
        "policy": policy,
        "seed": seed,
        "task": task,
        "success": bool(j["task"]["success"] == 1),
        "expected": j["task"]["expected_answer"],
        "generated": j["generated_text"],
        "drr": d["rate"] if d else None,
        "drr_layers": d["layer_rate"] if d else None,
        "always_available_share": d["always_available_share"] if d else None,
        "needle_tokens": d["needle_tokens"] if d else None,
        "needed_steps": d["needed_steps"] if d else None,
        "final_entries": j["cache"]["final_entries"],
        "decode_steps": j["steps"]["decode"],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvscope", default="build/app/kvscope")
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer")
    p.add_argument("--chat", action="store_true", help="chat template (instruct models)")
    p.add_argument("--policy", action="append", required=True, help="policy spec (repeatable)")
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--distract", type=int, default=64)
    p.add_argument("--depth", type=float, default=0.1)
    p.add_argument("--seeds", default="1-8", help="e.g. 1-8 or 1,3,5")
    p.add_argument("--max-new", type=int, default=12)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--traces", help="keep the traces in this directory")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args()

    tmp = None
    trace_dir = args.traces
    if not trace_dir:
        tmp = tempfile.TemporaryDirectory(prefix="kvscope-defer-")
        trace_dir = tmp.name
    os.makedirs(trace_dir, exist_ok=True)
    runs, summary = [], {}
    for pi, policy in enumerate(args.policy):
        for seed in parse_seeds(args.seeds):
            trace = os.path.join(trace_dir, f"defer-p{pi}-s{seed}.kvtrace.h5")
            r = run_one(args, policy, seed, trace)
            runs.append(r)
            print(f"{policy} seed {seed}: success {r['success']}, DRR {r['drr']:.4f}, "
                  f"generated {json.dumps(r['generated'])}", file=sys.stderr)
            if not args.traces:
                os.remove(trace)
        mine = [r for r in runs if r["policy"] == policy]
        summary[policy] = {
            "runs": len(mine),
            "success_rate": sum(r["success"] for r in mine) / len(mine),
            "mean_drr": sum(r["drr"] for r in mine) / len(mine),
            "mean_always_available_share":
                sum(r["always_available_share"] for r in mine) / len(mine),
        }
    out = {"model": args.model, "tokens": args.tokens, "distract": args.distract,
           "depth": args.depth, "chat": args.chat, "max_new": args.max_new,
           "summary": summary, "runs": runs}
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
