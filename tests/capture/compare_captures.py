#!/usr/bin/env python3
"""Captures made by two builds are the same files, timing aside.

    compare_captures.py record KVSCOPE DIR [--only TEXT]   # the reference, from the build before
    compare_captures.py check  KVSCOPE DIR [--only TEXT]   # this build against DIR's reference

`record` captures the catalogue below with one `kvscope` and keeps the traces
in DIR with a manifest; `check` captures the same cases with another `kvscope`
into DIR/check and compares each pair with trace_identity.py (objects,
storage, byte layout, values; only times may differ). Exit 1 when any pair
differs or a case that ran before fails now.

The catalogue: every registered policy on stories260K (its defaults,
budget=32 where it has a budget: the cuda parity's catalogue), each capture
level and the oracle, the trace tables that only some policies fill
(/stalls, /merges, /rerotations, /key_channels, /reconstruction, inserted
tokens), SmolLM2 tasks with their spans and forced tokens when the model is
present, and `kvscope synth`. A refactoring of the writer, the recorder, the
capture or the policy framework must leave all of them as they were.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cuda_capture_parity as parity  # noqa: E402  (its catalogue and prompt)
import trace_identity  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
GATES = os.path.join(ROOT, "resources", "gates")
DETERMINISTIC_ENV = {"MKL_CBWR": "AVX2,STRICT", "ATEN_CPU_CAPABILITY": "avx2"}

# Capture levels and the oracle, and the policies behind the optional tables.
EXTRA_STORIES = [
    ("levels-dense-topk", "h2o:heavy=16,recent=16", ["--capture", "received+dense:1.0,2.1+topk:4"]),
    ("levels-none-oracle", "tova:budget=32", ["--capture", "events", "--oracle"]),
    ("oracle-pooled", "snapkv:budget=32,window=8", ["--capture", "received+pooled:8", "--oracle"]),
    ("merge", "knorm:budget=32+merge", []),
    ("rerotate", "knorm:budget=32+rerotate", []),
    ("sfc-oracle", "sfc:hot=0.4", ["--oracle"]),
    ("composite", "wgkv+quest:budget=32", []),
    ("kvzip-oracle", "kvzip:budget=32", ["--oracle"]),
    ("restorekv-oracle", "restorekv:budget=32", ["--oracle"]),
    ("sampled", "h2o:heavy=16,recent=16", ["--temperature", "0.8", "--seed", "7"]),
]
SMOL_CASES = [
    ("needle-h2o", ["--task", "needle:tokens=400,depth=0.5,seed=1", "--chat"], "h2o:heavy=64,recent=64"),
    ("needle-snapkv-oracle", ["--task", "needle:tokens=400,depth=0.3,seed=2", "--chat", "--oracle"],
     "snapkv:budget=96"),
    ("niah-sfc", ["--task", "niah:keys=2,tokens=400,seed=3", "--chat"], "sfc:hot=0.4"),
    ("defer-kvpop", ["--task", "defer:tokens=300,distract=16,seed=1", "--chat"], "kvpop:budget=128"),
    ("vt-full", ["--task", "vt:chains=1,hops=2,tokens=300,seed=1"], "full"),
]


def stories_cases(kvscope):
    models = os.path.join(os.environ.get("KVSCOPE_SHARED_DIR", os.path.join(ROOT, "..", "shared")),
                          "models", "stories260K")
    base = ["--model", os.path.join(models, "stories260K.bin"),
            "--tokenizer", os.path.join(models, "tok512.bin"), "--prompt", parity.PROMPT,
            "--max-new", "48", "--ignore-eos", "--threads", "1", "-q"]
    cases = []
    for spec in parity.catalogue(kvscope):
        chunk = "512" if spec.split(":")[0] in parity.WHOLE_PROMPT else "64"
        name = "stories-" + spec.split(":")[0]
        cases.append((name, base + ["--prefill-chunk", chunk, "--policy", spec,
                                    "--capture", "received+pooled:16"], True))
    for name, spec, extra in EXTRA_STORIES:
        cmd = base + ["--prefill-chunk", "64", "--policy", spec]
        if "--capture" not in extra:
            cmd += ["--capture", "received"]
        cases.append(("stories-" + name, cmd + extra, False))
    return cases


def smol_cases():
    models = os.environ.get("KVSCOPE_MODELS_DIR", os.path.join(ROOT, "models"))
    smol = os.path.join(models, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(smol):
        print(f"note: {smol} is missing, the SmolLM2 cases are left out")
        return []
    return [("smol-" + name, ["--model", smol, *task, "--policy", spec, "--max-new", "8",
                              "--threads", "1", "-q", "--capture", "received+pooled:32"], False)
            for name, task, spec in SMOL_CASES]


def run(kvscope, case, out):
    name, args, optional = case
    if name == "synth":
        cmd = [kvscope, "synth", "-o", out, "--layers", "3", "--heads", "4", "--kv-heads", "2",
               "--prompt-tokens", "300", "--seed", "5"]
    else:
        cmd = [kvscope, "capture", *args, "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **DETERMINISTIC_ENV})
    return r.returncode, r.stderr.strip()[-300:]


def main():
    if len(sys.argv) < 4 or sys.argv[1] not in ("record", "check"):
        sys.exit(__doc__)
    mode, kvscope, top = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    cases = stories_cases(kvscope) + smol_cases() + [("synth", [], False)]
    if only:
        cases = [c for c in cases if only in c[0]]
    manifest_path = os.path.join(top, "manifest.json")
    if mode == "record":
        os.makedirs(top, exist_ok=True)
        manifest = {}
        for case in cases:
            rc, err = run(kvscope, case, os.path.join(top, case[0] + ".kvtrace.h5"))
            manifest[case[0]] = {"rc": rc, "args": case[1]}
            print(("ok   " if rc == 0 else f"rc={rc} ") + case[0] + ("" if rc == 0 else ": " + err))
            if rc != 0 and not case[2]:
                sys.exit(f"{case[0]} failed with the reference build")
        with open(manifest_path, "w") as f:
            json.dump(manifest, f, indent=1)
        return 0
    manifest = json.load(open(manifest_path))
    out_dir = os.path.join(top, "check")
    os.makedirs(out_dir, exist_ok=True)
    failed = []
    for case in cases:
        want = manifest.get(case[0])
        if want is None:
            print(f"new  {case[0]}: not in the reference (record it)")
            continue
        out = os.path.join(out_dir, case[0] + ".kvtrace.h5")
        if os.path.exists(out):
            os.remove(out)
        rc, err = run(kvscope, case, out)
        if rc != want["rc"]:
            failed.append(f"{case[0]}: exit {rc}, the reference's {want['rc']}: {err}")
            print("FAIL " + failed[-1])
            continue
        if rc != 0:
            print(f"same {case[0]} (refused by both)")
            continue
        diffs = trace_identity.compare(os.path.join(top, case[0] + ".kvtrace.h5"), out)
        if diffs:
            failed.append(case[0] + ":\n      " + "\n      ".join(diffs[:12]))
            print("FAIL " + failed[-1])
        else:
            print("same " + case[0])
    if failed:
        print(f"\n{len(failed)} of {len(cases)} cases differ")
        return 1
    print(f"\nall {len(cases)} cases are the same files (timing aside)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
