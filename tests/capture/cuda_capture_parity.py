#!/usr/bin/env python3
"""`kvscope capture --device cuda` against `--device cpu` on stories260K.

    cuda_capture_parity.py KVSCOPE MODELS_DIR OUT_DIR [--jsonl FILE] [--against DEVICE]
                           [--no-catalogue]

One policy per path of the step driver: the device kernels with each
statistic (none, received, last query, observation window, pooled maps),
selection masks (quest) on the host path, an INT4 tier beside a float32 one
(sfc) by the blocked path on the device, and two
ranking policies (knorm, snapkv) that can meet exact ties; four of them
again with the prefill chunks attended by the blocked path
(--device-prefill blocked: received, last query, window, pooled), and one
with --oracle both ways (the oracle's full cache is attended on the device
too, its last-query weights per query head taken from the decode kernel). Then the
catalogue: every registered policy (`kvscope policies --json`) with its
defaults and budget=32 where it has a budget, and the policies that run
the model or its weights from their own hooks (KVzip+'s and CriticalKV's
W_O, kvgrad's replay with autograd, RestoreKV's adapted model). A catalogue
policy the CPU refuses on stories260K (a gate file it lacks, a setting the
model cannot meet) is reported as not applicable, not as a failure. Each
pair of traces must pass trace_parity.py (equal, or parted at a tie).
Without a CUDA device (CI) the script says so and exits 77, which CTest
shows as skipped; --against cpu runs the CPU against itself, a check of the
script where no GPU is at hand.
"""
import hashlib
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import parity_report  # noqa: E402
import trace_parity  # noqa: E402

GATES = os.path.join(os.path.dirname(os.path.dirname(HERE)), "resources", "gates")

POLICIES = [
    "full", "window:window=32", "streaming_llm:sinks=4,window=28", "h2o:heavy=16,recent=16",
    "tova:budget=32", "snapkv:budget=32,window=8", "knorm:budget=32",
    "quest:budget=32,page_size=8,dense_layers=1", "sfc:hot=0.4",
]
# Policies whose own hooks reach the model's weights or run the model: on
# --device cuda those live on the GPU while the hooks see host tensors.
WEIGHT_READERS = [
    "kvzip:budget=32,plus=true", "kvgrad:budget=32", "criticalkv:budget=32",
    "critical_adakv:budget=32", "restorekv:budget=32",
]
# Catalogue entries whose defaults stories260K cannot run: what they run with
# instead (the files resources/gates ships for stories260K).
CATALOGUE_SPECS = {
    "adakv": "adakv:budget=64",  # above its scorer's 32 protected entries
    "duo_attention": "duo_attention:pattern=" + os.path.join(GATES, "stories260K-duo-attention"),
    "lukv": "lukv:budget=32,curve=" + os.path.join(GATES, "stories260K-lukv-snapkv.npy"),
}
WHOLE_PROMPT = {"attention_gate"}  # its flags need the whole prompt in one chunk

# With --oracle, by both prefill ways.
ORACLE = ["h2o:heavy=16,recent=16"]
# The statistics again, the prefill through query blocks of matrix products.
BLOCKED_PREFILL = ["full", "h2o:heavy=16,recent=16", "tova:budget=32", "snapkv:budget=32,window=8"]
PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
          "park with her friends. One day, she saw a big red ball under a tree. She ran to get it, "
          "but a dog took it first. Lily was sad, but then the dog came back and gave her the ball. "
          "They played together all day and became best friends. The sun went down and Lily went "
          "home happy. The next morning, Lily woke up early and ran to the park again.")


def capture(kvscope, models, spec, device, out, extra=()):
    chunk = "512" if spec.split(":")[0] in WHOLE_PROMPT else "64"
    cmd = [kvscope, "capture", *extra, "--model", os.path.join(models, "stories260K.bin"),
           "--tokenizer", os.path.join(models, "tok512.bin"), "--prompt", PROMPT, "--policy", spec,
           "--max-new", "48", "--ignore-eos", "--prefill-chunk", chunk, "--device", device,
           "--capture", "received+pooled:16", "-o", out]
    return subprocess.run(cmd, capture_output=True, text=True)


def catalogue(kvscope):
    """Every registered policy with its defaults, budget=32 where it has one."""
    listed = json.loads(subprocess.run([kvscope, "policies", "--json"], check=True,
                                       capture_output=True, text=True).stdout)
    specs = []
    for entry in listed:
        if entry["kind"] != "policy":
            continue
        names = {p["name"] for p in entry["params"]}
        default = entry["name"] + (":budget=32" if "budget" in names else "")
        specs.append(CATALOGUE_SPECS.get(entry["name"], default))
    return specs


def compare(kvscope, models, spec, out_dir, against, optional, jsonl, prefills=("kernel",),
            extra=()):
    """How many of the spec's pairs fail: one CPU trace against a cuda trace per
    --device-prefill way; none when (optional) the CPU refuses the spec.
    `extra`: arguments both sides take (--oracle)."""
    # The policy's name and a digest of the whole spec (which may hold paths).
    name = (spec.split(":")[0] + "-" + hashlib.sha1(spec.encode()).hexdigest()[:8] +
            "".join(a.replace("-", "_") for a in extra))
    cpu = os.path.join(out_dir, f"{name}.cpu.kvtrace.h5")
    r = capture(kvscope, models, spec, "cpu", cpu, extra)
    if r.returncode != 0:
        if optional:
            print(f"n/a  {spec}: the CPU refuses it on stories260K: {r.stderr.strip()[-200:]}")
            return 0
        print(f"FAIL {spec} --device cpu: {r.stderr.strip()[-400:]}")
        return 1
    failed = 0
    for prefill in prefills:
        cuda = os.path.join(out_dir, f"{name}.{prefill}.cuda.kvtrace.h5")
        r = capture(kvscope, models, spec, against, cuda, [*extra, "--device-prefill", prefill])
        if r.returncode != 0:
            print(f"FAIL {spec} --device {against} --device-prefill {prefill}: {r.stderr.strip()[-400:]}")
            failed += 1
            continue
        r = subprocess.run([sys.executable, trace_parity.__file__, cpu, cuda],
                           capture_output=True, text=True)
        result = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {"passed": False, "error": r.stderr}
        record = {"model": "stories260K", "policy": spec, "device_prefill": prefill,
                  "extra": " ".join(extra), "result": result}
        failed += 0 if parity_report.report(record, jsonl) else 1
    return failed


def main():
    kvscope, models, out_dir = sys.argv[1:4]
    jsonl = sys.argv[sys.argv.index("--jsonl") + 1] if "--jsonl" in sys.argv else None
    against = sys.argv[sys.argv.index("--against") + 1] if "--against" in sys.argv else "cuda"
    os.makedirs(out_dir, exist_ok=True)
    probe = capture(kvscope, models, "full", against, os.path.join(out_dir, "probe.kvtrace.h5"))
    if parity_report.no_cuda(probe):
        return parity_report.SKIPPED
    failed = sum(compare(kvscope, models, spec, out_dir, against, False, jsonl,
                         ("kernel", "blocked") if spec in BLOCKED_PREFILL else ("kernel",))
                 for spec in POLICIES + WEIGHT_READERS)
    failed += sum(compare(kvscope, models, spec, out_dir, against, False, jsonl,
                          ("kernel", "blocked"), ("--oracle",)) for spec in ORACLE)
    if "--no-catalogue" not in sys.argv:
        done = {spec.split(":")[0] for spec in POLICIES + WEIGHT_READERS}
        failed += sum(compare(kvscope, models, spec, out_dir, against, True, jsonl)
                      for spec in catalogue(kvscope) if spec.split(":")[0] not in done)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
