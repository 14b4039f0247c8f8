#!/usr/bin/env python3
"""Golden event streams: every policy on a fixed stories260K prompt and on a
SmolLM2 needle prompt. The decisions a policy makes (kind, step, layer, kv head,
token, tiers of every event) must not change when the policy engine changes
underneath it; tests/policies/goldens/events.json holds each case's digest and
per-kind counts, made by this script from the code before a change.

  golden_events.py KVSCOPE_EXE SHARED_DIR MODELS_DIR WORK_DIR [--update] [--only NAME]

--update rewrites the goldens (state why in the commit). Without it, a case
whose stream differs fails, and its stream is left in WORK_DIR/<case>.csv so it
can be compared with a stream from an older build.
"""
import hashlib
import json
import os
import subprocess
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDENS = os.path.join(HERE, "goldens", "events.json")
ROOT = os.path.dirname(os.path.dirname(HERE))
GATES = os.path.join(ROOT, "resources", "gates")
KINDS = ["admit", "reject", "select", "evict", "demote", "promote"]

STORIES_PROMPT = "Tom had a big dog named Max. Max liked to run in the park with"


def stories_cases(pattern):
    g = lambda name: os.path.join(GATES, "stories260K-" + name + ".safetensors")
    return [
        ("full", "full"),
        ("window", "window:window=12"),
        ("streaming_llm", "streaming_llm:sinks=2,window=10"),
        ("h2o", "h2o:heavy=6,recent=6"),
        ("h2o_sinks", "h2o:heavy=5,recent=5,sinks=2"),
        ("tova", "tova:budget=12"),
        ("tova_per_head", "tova:budget=12,mean_heads=false"),
        ("snapkv", "snapkv:budget=12,window=4,kernel=3"),
        ("snapkv_prefill", "snapkv:budget=12,window=4,kernel=3,decode=false"),
        ("pyramidkv", "pyramidkv:budget=12,window=4,kernel=3,beta=4"),
        ("knorm", "knorm:budget=12"),
        ("expected_attention", "expected_attention:budget=12,sinks=2,n_future=32,refresh=4"),
        ("adakv_snapkv", "adakv:scorer=snapkv,budget=12,window=4,kernel=3"),
        ("adakv_knorm", "adakv:scorer=knorm,budget=12,alpha=0.5"),
        ("adakv_tova", "adakv:scorer=tova,budget=12"),
        ("duo_attention", "duo_attention:pattern=" + pattern + ",threshold=0.5,sinks=2,recent=6"),
        ("quest", "quest:budget=8,page_size=4,dense_layers=1"),
        ("wgkv", "wgkv:gates=" + g("wgkv") + ",window=4"),
        ("attention_gate", "attention_gate:gates=" + g("attention-gate")),
        ("trimkv", "trimkv:gates=" + g("retention") + ",budget=10"),
        ("dbtrimkv", "dbtrimkv:gates=" + g("retention-global") + ",budget=10"),
        ("kvpop_mlp", "kvpop:gates=" + g("kvpop-mlp") + ",sinks=2,window=4,topk=6"),
        ("kvpop_mlstm", "kvpop:gates=" + g("kvpop-mlstm") + ",sinks=2,window=4,topk=6"),
    ]


def smollm_cases():
    g = lambda name: os.path.join(GATES, "SmolLM2-135M-Instruct-" + name + ".safetensors")
    return [
        ("full", "full"),
        ("streaming_llm", "streaming_llm:sinks=4,window=60"),
        ("h2o", "h2o:heavy=32,recent=32"),
        ("tova", "tova:budget=64"),
        ("snapkv", "snapkv:budget=64"),
        ("pyramidkv", "pyramidkv:budget=64"),
        ("knorm", "knorm:budget=64"),
        ("expected_attention", "expected_attention:budget=64"),
        ("adakv", "adakv:scorer=snapkv,budget=64"),
        ("quest", "quest:budget=64"),
        ("wgkv", "wgkv:gates=" + g("wgkv") + ",window=32"),
        ("dbtrimkv", "dbtrimkv:gates=" + g("retention-global") + ",budget=64"),
        ("kvpop_mlp", "kvpop:gates=" + g("kvpop-mlp") + ",budget=128"),
    ]


def events_csv(trace):
    with h5py.File(trace, "r") as f:
        assert f["run/complete"][()] == 1, trace + ": capture not complete"
        cols = [f["events/" + c][:].astype(np.int64)
                for c in ("kind", "step", "layer", "kv_head", "token", "from_tier", "to_tier")]
    lines = ["kind,step,layer,kv_head,token,from_tier,to_tier"]
    lines += [",".join(str(int(x)) for x in row) for row in zip(*cols)]
    return "\n".join(lines) + "\n", np.bincount(cols[0], minlength=len(KINDS))


# The same numbers on every x86-64 CPU with AVX2 (the CPUs this runs on differ:
# Intel Xeons and AMD EPYCs): MKL and ATen's kernels take their AVX2 code
# paths (KVScope's own kernels have only an AVX2 clone), one thread. Measured
# on an AMD EPYC (Zen 4) against goldens from an Intel Xeon: 31 of 33 streams
# equal bit for bit; SmolLM2 knorm and expected_attention differed. Every
# difference that other rounding provoked here (MKL_CBWR=COMPATIBLE) only
# reordered one head's evictions within a step, so evictions are recorded in
# position order (capture/policy/budget.cpp) and a stream is its decisions.
DETERMINISTIC_ENV = {"MKL_CBWR": "AVX2,STRICT", "ATEN_CPU_CAPABILITY": "avx2"}


def run_case(exe, model_args, spec, trace):
    cmd = [exe, "capture", *model_args, "--policy", spec, "--threads", "1", "-q", "-o", trace]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **DETERMINISTIC_ENV})
    if r.returncode != 0:
        sys.exit("failed: " + " ".join(cmd) + "\n" + r.stderr)


def main():
    exe, shared, models, work = sys.argv[1:5]
    update = "--update" in sys.argv
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    shared = os.environ.get("KVSCOPE_SHARED_DIR") or shared
    models = os.environ.get("KVSCOPE_MODELS_DIR") or models
    os.makedirs(work, exist_ok=True)
    # DuoAttention's head pattern for stories260K (5 layers x 4 kv heads): alternate.
    pattern = os.path.join(work, "heads.tsv")
    with open(pattern, "w") as out:
        for l in range(5):
            out.write("\t".join("0.9" if (l + h) % 2 else "0.1" for h in range(4)) + "\n")
    stories = os.path.join(shared, "models", "stories260K")
    suites = [("stories260K", ["--model", os.path.join(stories, "stories260K.bin"),
                               "--tokenizer", os.path.join(stories, "tok512.bin"),
                               "--prompt", STORIES_PROMPT, "--max-new", "24"], stories_cases(pattern))]
    smol = os.path.join(models, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if os.path.exists(smol):
        suites.append(("smollm2", ["--model", smol, "--task", "needle:tokens=300,depth=0.5,seed=1",
                                   "--chat", "--max-new", "6"], smollm_cases()))
    elif not update:
        sys.exit(smol + " is missing: run scripts/fetch-models (or set KVSCOPE_MODELS_DIR)")
    goldens = json.load(open(GOLDENS)) if os.path.exists(GOLDENS) else {}
    failed = []
    for suite, model_args, cases in suites:
        for name, spec in cases:
            case = suite + "/" + name
            if only and only not in case:
                continue
            trace = os.path.join(work, case.replace("/", "_") + ".kvtrace.h5")
            run_case(exe, model_args, spec, trace)
            csv, counts = events_csv(trace)
            got = {"spec": spec.replace(GATES + "/", "resources/gates/").replace(pattern, "heads.tsv"),
                   "sha256": hashlib.sha256(csv.encode()).hexdigest(),
                   "counts": {k: int(c) for k, c in zip(KINDS, counts) if c}}
            if update:
                goldens[case] = got
                print("updated", case, got["counts"])
                continue
            want = goldens.get(case)
            if want is None:
                failed.append(case + ": no golden (run with --update and say why)")
            elif want["sha256"] != got["sha256"]:
                path = os.path.join(work, case.replace("/", "_") + ".csv")
                open(path, "w").write(csv)
                failed.append(f"{case}: events differ (want {want['counts']}, got {got['counts']}; stream in {path})")
            else:
                print("same", case, got["counts"])
    if update:
        os.makedirs(os.path.dirname(GOLDENS), exist_ok=True)
        with open(GOLDENS, "w") as out:
            json.dump(goldens, out, indent=1, sort_keys=True)
            out.write("\n")
    if failed:
        sys.exit("golden event streams differ:\n  " + "\n  ".join(failed))


if __name__ == "__main__":
    main()
