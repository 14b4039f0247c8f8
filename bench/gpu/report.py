#!/usr/bin/env python3
"""Markdown tables of one bench/gpu run (bench.jsonl + sdpa.jsonl from
run-kernels.sh) for docs/performance.md: the CUDA kernels against PyTorch's
SDPA measured in the same run on the same GPU.
usage: report.py RESULTS_DIR"""
import json
import os
import sys


def rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    d = sys.argv[1]
    ours, sdpa = rows(os.path.join(d, "bench.jsonl")), rows(os.path.join(d, "sdpa.jsonl"))
    print(f"Device: {ours[0]['device']} (sm_{ours[0]['sm']}), kernels {ours[0]['kernels']}; "
          f"anchor: torch {sdpa[0]['torch']} (CUDA {sdpa[0]['cuda']}).\n")
    anchor = {(r["phase"], r["dtype"], r["context"]): r for r in sdpa[1:]}
    print("| phase | context | KVScope kernel | ms / layer | KV bytes / layer | "
          "SDPA fp32 ms | SDPA bf16 ms | ours / SDPA fp32 | ours / SDPA bf16 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in ours[1:]:
        f32 = anchor.get((r["phase"], "float32", r["context"]), {})
        b16 = anchor.get((r["phase"], "bfloat16", r["context"]), {})

        def cell(a):
            if "ms_per_layer" in a:
                return f"{a['ms_per_layer']:.4g}"
            return "out of memory" if "out of memory" in a.get("error", "") else "-"

        def ratio(a):
            return f"{r['ms_per_layer'] / a['ms_per_layer']:.2f}x" if "ms_per_layer" in a else "-"
        what = f"{r['pages']} pages, stats: {r['stats']}"
        print(f"| {r['phase']} | {r['context']} | {what} | {r['ms_per_layer']:.4g} | "
              f"{r['kv_bytes_per_layer'] / 2**20:.0f} MiB | {cell(f32)} | {cell(b16)} | "
              f"{ratio(f32)} | {ratio(b16)} |")


if __name__ == "__main__":
    main()
