#!/usr/bin/env python3
"""The Salience Forecasting Cache's evidence (docs/policies/sfc.md, "Evidence").

For every policy spec, task and seed: one `kvscope capture` (with --oracle, so
each stall carries the full cache's verdict), then from the trace:
  success      the task's expected answer is in the generation
  drr          Deferred Retention Rate (kvscope info --json, deferred_retention)
  in_time      promotions that landed from a prefetch / (those + reactive fetches)
  stalls_100   stalls (tokens fetched reactively, all heads) per 100 decode steps;
               stall_ms the modelled wait per decode step (each head's batch once)
  needed       share of stalls the oracle says were needed
  read_kib     KV bytes the attention reads per decode step (pool bytes of the
               attended tiers after the step, 16-row page granularity), KiB
  hot_frac     hot-tier (tier 0) entries / all tokens fed, mean over decode steps
Prints one JSON document: every run, and per (policy label, task) the means.

usage (from the repository root):
  bench/policies/sfc_eval.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf --chat \\
      --task 'defer:tokens=1024,distract=64' --task 'needle:tokens=1024,depth=0.3' \\
      --seeds 1-4 --policy sfc=sfc:hot=0.25 --policy h2o=h2o:heavy=128,recent=128
A policy is LABEL=SPEC; '{T}' in a spec is replaced by round(0.25 * prompt tokens)
(measured from the full-cache run of the same task and seed), '{H}' by half of it,
'{W}' by {T} - 4 (a window beside 4 sinks).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np


def parse_seeds(text):
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def capture(args, spec, task, seed, trace):
    cmd = [args.kvscope, "capture", "--model", args.model, "--policy", spec,
           "--task", f"{task},seed={seed}", "--max-new", str(args.max_new),
           "--capture", "events", "-q", "-o", trace]
    if args.oracle:
        cmd.append("--oracle")
    if args.chat:
        cmd.append("--chat")
    if args.tokenizer:
        cmd += ["--tokenizer", args.tokenizer]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sfc_eval.py: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    return r.stderr


def metrics(args, trace):
    info = json.loads(subprocess.run([args.kvscope, "info", "--json", trace],
                                     capture_output=True, text=True, check=True).stdout)
    d = info.get("deferred_retention")
    with h5py.File(trace, "r") as f:
        kind = f["steps/kind"][:]
        decode = np.flatnonzero(kind == 1)
        first_tok = f["steps/first_token"][:]
        n_tok = f["steps/n_tokens"][:]
        fed = first_tok + n_tok
        run = f["run"].attrs
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in run["tier_names"]]
        attended = (np.asarray(run["tier_attended"]) if "tier_attended" in run
                    else np.ones(len(names), np.uint8)).astype(bool)
        tb = f["occupancy/tier_bytes"][:]                 # [S, R]
        occ = f["occupancy/entries"][:]                   # [S, L, K, R]
        L, K = occ.shape[1], occ.shape[2]
        reasons = [n.decode() if isinstance(n, bytes) else str(n) for n in run["reason_names"]]
        ev_kind = f["events/kind"][:]
        ev_reason = f["events/reason"][:]
        st_step = f["stalls/step"][:] if "stalls/step" in f else np.zeros(0, np.int32)
        st_wait = f["stalls/wait_s"][:] if "stalls/wait_s" in f else np.zeros(0, np.float32)
        st_need = f["stalls/needed"][:] if "stalls/needed" in f else np.zeros(0, np.int8)
        st_head = (f["stalls/layer"][:].astype(np.int64) * K + f["stalls/kv_head"][:]
                   if "stalls/layer" in f else np.zeros(0, np.int64))
    promote = ev_kind == 5
    landed = [i for i, r in enumerate(reasons) if r.startswith("promoted: prefetch landed")]
    reactive = [i for i, r in enumerate(reasons) if r.startswith("promoted: reactive fetch")]
    n_landed = int(np.sum(promote & np.isin(ev_reason, landed)))
    n_reactive = int(np.sum(promote & np.isin(ev_reason, reactive)))
    dec = set(decode.tolist())
    in_dec = np.array([s in dec for s in st_step], bool)
    nd = max(1, len(decode))
    read = tb[decode][:, attended].sum(axis=1) if len(decode) else np.zeros(1)
    hot = occ[decode, :, :, 0].sum(axis=(1, 2)) / (L * K * fed[decode]) if len(decode) else [0]
    return {
        "success": bool(info["task"]["success"] == 1),
        "generated": info.get("generated_text", "")[:80],
        "drr": d["rate"] if d else None,
        "in_time": n_landed / (n_landed + n_reactive) if n_landed + n_reactive else None,
        "prefetched": n_landed,
        "reactive": n_reactive,
        "stalls_100": 100.0 * int(in_dec.sum()) / nd,
        # A head's reactive fetches of a step are one batch: every row of the
        # batch carries the batch's wait, so count each (step, head) once.
        "stall_ms": 1e3 * sum(dict(zip(zip(st_step[in_dec].tolist(), st_head[in_dec].tolist()),
                                       st_wait[in_dec].tolist())).values()) / nd,
        "needed": (float(np.mean(st_need[in_dec] == 1))
                   if in_dec.any() and (st_need[in_dec] >= 0).all() else None),
        "read_kib": float(np.mean(read)) / 1024.0,
        "hot_frac": float(np.mean(hot)),
        # The prompt is fed in chunks (--prefill-chunk): it ends with the last prefill step.
        "prompt_tokens": int(fed[kind == 0][-1]) if (kind == 0).any() else 0,
    }


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--kvscope", default="build/app/kvscope")
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", default="")
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--task", action="append", required=True)
    ap.add_argument("--policy", action="append", required=True, help="LABEL=SPEC")
    ap.add_argument("--seeds", default="1-4")
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--keep", default="", help="directory to keep the traces in")
    ap.add_argument("--no-oracle", dest="oracle", action="store_false",
                    help="no full-cache shadow (faster; stalls then have no 'needed' verdict)")
    args = ap.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="sfc-eval-")
    os.makedirs(work, exist_ok=True)
    runs = []
    for task in args.task:
        for seed in parse_seeds(args.seeds):
            prompt = None
            for item in args.policy:
                label, _, spec = item.partition("=")
                if any(k in spec for k in ("{T}", "{H}", "{W}")):
                    if prompt is None:  # the prompt's length, from a full-cache run
                        t = os.path.join(work, f"len-{abs(hash(task))}-{seed}.h5")
                        capture(args, "full", task, seed, t)
                        prompt = metrics(args, t)["prompt_tokens"]
                    B = round(0.25 * prompt)
                    spec = (spec.replace("{T}", str(B)).replace("{H}", str(B // 2))
                            .replace("{W}", str(B - 4)))
                trace = os.path.join(work, f"{label}-{abs(hash(task))}-{seed}.h5")
                log = capture(args, spec, task, seed, trace)
                m = metrics(args, trace)
                m.update({"label": label, "policy": spec, "task": task, "seed": seed,
                          "capture": log.strip().splitlines()[-1] if log.strip() else ""})
                runs.append(m)
                print(json.dumps({k: m[k] for k in ("label", "task", "seed", "success", "drr",
                                                    "in_time", "stalls_100", "read_kib")}),
                      file=sys.stderr)
    summary = {}
    for m in runs:
        key = m["label"] + " | " + m["task"]
        summary.setdefault(key, []).append(m)
    table = {k: {f: mean([float(r[f]) if r[f] is not None else None for r in v])
                 for f in ("success", "drr", "in_time", "stalls_100", "stall_ms", "needed",
                           "read_kib", "hot_frac")} | {"n": len(v)}
             for k, v in summary.items()}
    print(json.dumps({"runs": runs, "summary": table}, indent=1))


if __name__ == "__main__":
    main()
