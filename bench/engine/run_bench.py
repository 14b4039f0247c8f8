#!/usr/bin/env python3
"""Engine benchmark driver: runs KVScope's bench_engine and the transformers
script on the same model, prompt ids and thread count, in the same run, and
prints the ratios as a Markdown table (for docs/performance.md, section
"Inference engine").

    /work/venv/bin/python bench/engine/run_bench.py \\
        --bench build/bench/engine/bench_engine \\
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf [--threads 2] [--repeats 2]
    /work/venv/bin/python bench/engine/run_bench.py --bench build/bench/engine/bench_engine \\
        --model ../shared/models/stories260K/stories260K.bin --vocab 512 --lengths 128,448

Each engine runs in its own process (so peak RSS is its own), alternating
KVScope / transformers for --repeats rounds; the table reports the best
round of each (least disturbed by other load on the machine) and every
round is kept in the JSON written next to the table.
"""
import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("{"):])


def best(rounds, n, key):
    return max(r[key] for rounds_one in rounds for r in rounds_one["runs"] if r["prompt_tokens"] == n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="path of the bench_engine executable")
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", default="512,2048")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=49152,
                    help="the model's vocabulary size (prompt ids are drawn below it)")
    ap.add_argument("--chunk", type=int, default=0,
                    help="KVScope prefill chunk (0: the whole prompt in one forward, as transformers)")
    ap.add_argument("--out", default=None, help="write all measurements as JSON here")
    a = ap.parse_args()

    rng = random.Random(1234)  # the same prompt ids for both engines
    ids = [rng.randrange(100 if a.vocab > 1000 else 3, min(49000, a.vocab))
           for _ in range(max(int(x) for x in a.lengths.split(",")))]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(ids, f)
        ids_path = f.name
    common = ["--model", a.model, "--ids", ids_path, "--lengths", a.lengths,
              "--decode", str(a.decode), "--threads", str(a.threads)]
    kv_extra = ["--chunk", str(a.chunk)]
    kv, hf = [], []
    load_before = os.getloadavg()
    for r in range(a.repeats):
        print(f"round {r + 1}/{a.repeats}: kvscope", file=sys.stderr)
        kv.append(run_json([a.bench] + common + kv_extra))
        print(f"round {r + 1}/{a.repeats}: transformers", file=sys.stderr)
        hf.append(run_json([sys.executable, os.path.join(HERE, "bench_transformers.py")] + common))
    os.unlink(ids_path)
    load_after = os.getloadavg()

    floor = min(k["decode_floor_seconds"] for k in kv)
    bw = max(k["gemv_bytes_per_second"] for k in kv)
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = [
        f"Machine: {cpu}, {os.cpu_count()} cores; "
        f"{a.threads} threads; fp32; model {os.path.basename(a.model)} "
        f"({kv[0]['parameters'] / 1e6:.1f} M parameters, {kv[0]['weight_bytes'] / 2**20:.0f} MiB of fp32 weights); "
        f"transformers {hf[0]['transformers']}, torch {hf[0]['torch']} ({hf[0]['attn_implementation']} attention); "
        f"KVScope prefill chunk {a.chunk or 'whole prompt'}; best of {a.repeats} alternating rounds (each prefill run twice, the faster kept), "
        f"{a.decode} decode steps after each prompt; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "| prompt | KVScope prefill tok/s | transformers prefill tok/s | ratio | KVScope decode tok/s | transformers decode tok/s | ratio | KVScope decode ms/token | bandwidth floor ms/token | floor / KVScope |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in [int(x) for x in a.lengths.split(",")]:
        kp, hp = best(kv, n, "prefill_tokens_per_second"), best(hf, n, "prefill_tokens_per_second")
        kd, hd = best(kv, n, "decode_tokens_per_second"), best(hf, n, "decode_tokens_per_second")
        lines.append(f"| {n} | {kp:.0f} | {hp:.0f} | {kp / hp:.2f}x | {kd:.1f} | {hd:.1f} | {kd / hd:.2f}x "
                     f"| {1000 / kd:.1f} | {1000 * floor:.1f} | {floor * kd:.0%} |")
    lines += [
        "",
        f"Matrix-vector bandwidth (fp32 GEMV, 8192x4096, {a.threads} threads, best of 5x10): "
        f"{bw / 1e9:.1f} GB/s; floor = weight bytes / bandwidth = {1000 * floor:.1f} ms per decode step.",
        f"Peak RSS: KVScope {max(k['peak_rss_mib'] for k in kv):.0f} MiB, "
        f"transformers {max(h['peak_rss_mib'] for h in hf):.0f} MiB. "
        f"Load: KVScope {min(k['load_seconds'] for k in kv):.1f} s, "
        f"transformers {min(h['load_seconds'] for h in hf):.1f} s.",
    ]
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"kvscope": kv, "transformers": hf}, f, indent=2)


if __name__ == "__main__":
    main()
