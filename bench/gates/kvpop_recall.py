#!/usr/bin/env python3
"""KVpop's figure 7 on our models: the oracle top-k retention recall per
(layer, kv head) of learned scorers. The oracle ("teacher") keeps the top-k of
the eligible tokens by their future attention computed with the dense
normalisers (exact, eq. 2-3, --target-lse dense); the recall is the share of
the oracle's top-k at the window's last query that the scorer keeps too, at
the same budget (s sinks + w window + k), averaged over held-out windows.

It runs `kvscope train --evaluate GATES` for each scorer and budget, on the
held-out tail of the training text (the last 10 %; the scorer never trained
on it), and writes one JSON with the per-head recalls and their summary.

usage: kvpop_recall.py --kvscope build/app/kvscope --model models/SmolLM2-135M-Instruct.Q4_1.gguf
         --data out/gates/debian-docs.txt --seq-len 2048 --budget 512 --budget 256
         --scorer mlp=resources/gates/SmolLM2-135M-Instruct-kvpop-mlp.safetensors [...]
         [--windows 4] [--threads 2] --out results.json
"""
import argparse
import json
import subprocess
import sys
import time

import numpy as np


def evaluate(args, kind, path, budget, sinks, window):
    topk = budget - sinks - window
    policy = ["--policy", "kvpop", "--scorer", "mlstm" if "mlstm" in kind else "mlp"]
    cmd = [args.kvscope, "train", *policy, "--evaluate", path, "--model", args.model, "--data", args.data,
           "--seq-len", str(args.seq_len), "--eval-windows", str(args.windows), "--threads", str(args.threads),
           "--target-lse", "dense", "--gate", f"sinks={sinks}", "--gate", f"window={window}",
           "--gate", f"topk={topk}", "-q"]
    if args.tokenizer:
        cmd += ["--tokenizer", args.tokenizer]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"evaluate failed ({kind} at B={budget}): {r.stderr[-2000:]}")
    out = json.loads(r.stdout)
    out["seconds"] = time.time() - t0
    out["command"] = " ".join(cmd)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvscope", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", default="")
    ap.add_argument("--data", required=True)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--budget", type=int, action="append", required=True, help="B = s + w + k per head")
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--scorer", action="append", required=True, help="NAME=GATES (NAME with 'mlstm' for mLSTM)")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    results = {"command": " ".join(sys.argv), "rows": []}
    print("%-24s %6s %7s %7s %7s %7s %9s" % ("scorer", "B", "recall", "q25", "median", "q75", "agreement"))
    for budget in args.budget:
        for item in args.scorer:
            name, path = item.split("=", 1)
            r = evaluate(args, name, path, budget, args.sinks, args.window)
            heads = np.array(r["recall_per_head"]).ravel()
            row = {"scorer": name, "gates": path, "budget": budget, "compression": 1 - budget / args.seq_len,
                   "recall_mean": float(heads.mean()), "recall_quartiles": [float(x) for x in np.percentile(heads, [25, 50, 75])],
                   "recall_per_layer": r["recall_per_layer"], "recall_per_head": r["recall_per_head"],
                   "agreement": r["agreement"], "kl_top256": r["kl"], "seconds": r["seconds"], "command": r["command"]}
            results["rows"].append(row)
            q = row["recall_quartiles"]
            print("%-24s %6d %7.3f %7.3f %7.3f %7.3f %9.3f" % (name, budget, row["recall_mean"], q[0], q[1], q[2],
                                                             r["agreement"]), flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
