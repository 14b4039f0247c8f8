#!/usr/bin/env python3
"""The KV cache's width side by side: KVScope's decode with fp32 and bf16
(and fp16) caches on the same fp32 model, prompt and threads, alternating
rounds, best round kept; KV bytes as the caches hold them. Printed as one
Markdown table (docs/performance.md, "KV cache width"), headed by the CPU model
and its flags.

    python3 bench/engine/kv_dtype_bench.py --bench build/bench/engine/bench_engine \\
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf --lengths 2048,8000 --threads 2

The dense cache of `kvscope generate` (bench_engine): decode reads the 16-bit
rows in place through the CPU decode kernel, which widens each value as it
reads it; prefill multiplies float32 copies. The ragged cache of `kvscope
capture` reads its pages with the same kernel.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run_bench import cpu_description, run_json  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="path of the bench_engine executable")
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", default="2048,8000")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--kv-dtypes", default="fp32,bf16")
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--out", default=None, help="write all measurements as JSON here")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    kinds = a.kv_dtypes.split(",")
    model_name, flags, cores = cpu_description()
    rng = random.Random(1234)
    ids = [rng.randrange(100, min(49000, a.vocab)) for _ in range(max(lengths))]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(ids, f)
        ids_path = f.name
    runs = {k: [] for k in kinds}
    load_before = os.getloadavg()
    for r in range(a.repeats):
        for k in kinds:
            print(f"round {r + 1}/{a.repeats}: --kv-dtype {k}", file=sys.stderr)
            runs[k].append(run_json([a.bench, "--model", a.model, "--ids", ids_path, "--lengths",
                                     a.lengths, "--decode", str(a.decode), "--threads",
                                     str(a.threads), "--chunk", "512", "--kv-dtype", k]))
    os.unlink(ids_path)
    load_after = os.getloadavg()

    def best(k, n, key):
        return max(x[key] for run in runs[k] for x in run["runs"] if x["prompt_tokens"] == n)

    def kv_bytes(k, n):
        return next(x["kv_bytes"] for x in runs[k][0]["runs"] if x["prompt_tokens"] == n)

    base = kinds[0]
    lines = [
        f"CPU: **{model_name}**, {cores} cores; flags: {' '.join(flags) or 'none of the listed'}.",
        "",
        f"{a.threads} threads; fp32 weights, model {os.path.basename(a.model)}; KVScope's dense "
        f"cache (bench_engine), prefill chunk 512; {a.decode} greedy decode steps after the "
        f"prompt; best of {a.repeats} alternating rounds; load average {load_before[0]:.1f} "
        f"before, {load_after[0]:.1f} after; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "| prompt | KV cache | KV MiB | decode tok/s | decode ms/step | vs " + base + " |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for n in lengths:
        d0 = best(base, n, "decode_tokens_per_second")
        for k in kinds:
            d = best(k, n, "decode_tokens_per_second")
            lines.append(f"| {n} | {k} | {kv_bytes(k, n) / 2**20:.0f} | {d:.1f} | {1000 / d:.1f} | "
                         f"{d / d0:.2f}x |")
    lines += ["", "KV MiB: the dense cache's buffers for prompt + decode positions, all layers."]
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"cpu": {"model": model_name, "flags": flags, "cores": cores}, "runs": runs},
                      f, indent=2)


if __name__ == "__main__":
    main()
