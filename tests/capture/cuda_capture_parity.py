#!/usr/bin/env python3
"""`kvscope capture --device cuda` against `--device cpu` on stories260K.

    cuda_capture_parity.py KVSCOPE MODELS_DIR OUT_DIR [--jsonl FILE]

One policy per path of the step driver: the device kernels with each
statistic (none, received, last query, observation window, pooled maps),
selection masks (quest) and an INT4 tier (sfc) on the host path, and two
ranking policies (knorm, snapkv) that can meet exact ties. Each pair of
traces must pass trace_parity.py (equal, or parted at a tie). Without a CUDA
device (CI) the script says so and exits 77, which CTest shows as skipped.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import parity_report  # noqa: E402
import trace_parity  # noqa: E402

POLICIES = [
    "full", "window:window=32", "streaming_llm:sinks=4,window=28", "h2o:heavy=16,recent=16",
    "tova:budget=32", "snapkv:budget=32,window=8", "knorm:budget=32",
    "quest:budget=32,page_size=8,dense_layers=1", "sfc:hot=0.4",
]
PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
          "park with her friends. One day, she saw a big red ball under a tree. She ran to get it, "
          "but a dog took it first. Lily was sad, but then the dog came back and gave her the ball. "
          "They played together all day and became best friends. The sun went down and Lily went "
          "home happy. The next morning, Lily woke up early and ran to the park again.")


def capture(kvscope, models, spec, device, out):
    cmd = [kvscope, "capture", "--model", os.path.join(models, "stories260K.bin"),
           "--tokenizer", os.path.join(models, "tok512.bin"), "--prompt", PROMPT, "--policy", spec,
           "--max-new", "48", "--ignore-eos", "--prefill-chunk", "64", "--device", device,
           "--capture", "received+pooled:16", "-o", out]
    return subprocess.run(cmd, capture_output=True, text=True)


def main():
    kvscope, models, out_dir = sys.argv[1:4]
    jsonl = sys.argv[sys.argv.index("--jsonl") + 1] if "--jsonl" in sys.argv else None
    os.makedirs(out_dir, exist_ok=True)
    probe = capture(kvscope, models, "full", "cuda", os.path.join(out_dir, "probe.kvtrace.h5"))
    if parity_report.no_cuda(probe):
        return parity_report.SKIPPED
    failed = 0
    for spec in POLICIES:
        name = spec.split(":")[0]
        paths = {}
        for device in ("cpu", "cuda"):
            paths[device] = os.path.join(out_dir, f"{name}.{device}.kvtrace.h5")
            r = capture(kvscope, models, spec, device, paths[device])
            if r.returncode != 0:
                print(f"FAIL {spec} --device {device}: {r.stderr.strip()[-400:]}")
                failed += 1
        if not all(os.path.exists(p) for p in paths.values()):
            continue
        r = subprocess.run([sys.executable, trace_parity.__file__, paths["cpu"], paths["cuda"]],
                           capture_output=True, text=True)
        result = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {"passed": False, "error": r.stderr}
        record = {"model": "stories260K", "policy": spec, "result": result}
        failed += 0 if parity_report.report(record, jsonl) else 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
