#!/usr/bin/env python3
"""`kvscope train --device cuda` against `--device cpu` on stories260K.

    cuda_train_parity.py KVSCOPE MODELS_DIR OUT_DIR [--jsonl FILE] [--against DEVICE]

(--against cpu compares the CPU with itself: a check of this script where no
GPU is at hand; the default is cuda.)

Every trainer (app/cli/engine/train.cpp) trains three steps from the same seed
and text on both devices. The runs must agree: the loss of every step and
the held-out loss (the .csv; the numbers of the .json for the fitted kinds,
DuoAttention's pattern and LU-KV's profile) within a relative tolerance, and
every trained parameter of the written gate file (or fine-tuned model, head
pattern, budget curve) within an absolute one. Gates start from the same
host-initialised values and DMS's noise comes from the CPU generator on both
devices, so what differs is float32 rounding (reduction order, fused
kernels); SFC trains from two full-cache traces captured on the CPU first;
KVpop ranks its scores on the host and a near-tie can move one
boundary pair, hence its wider tolerance. Without a CUDA device (CI) the
script says so and exits 77, which CTest shows as skipped.
"""
import csv
import json
import os
import struct
import subprocess
import sys
from array import array

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
import parity_report  # noqa: E402

# (name, train arguments, relative tolerance of the losses, absolute of the
# tensors). The fitted kinds (restorekv, kvzap, fastkvzip, the query
# calibrations) write no .csv: their numbers in the .json's "training"
# (JSON_NUMBERS) are compared instead.
CASES = [
    ("wgkv", ["--policy", "wgkv", "--gate", "window=16"], 2e-3, 2e-4),
    ("attention-gate", ["--policy", "attention-gate", "--gate", "heads=2"], 2e-3, 2e-4),
    ("retention", ["--policy", "retention", "--gate", "hidden=16"], 2e-3, 2e-4),
    ("retention-global", ["--policy", "retention-global", "--gate", "hidden=8"], 2e-3, 2e-4),
    ("dms", ["--policy", "dms", "--gate", "window=8"], 5e-3, 5e-4),
    ("kvpop-mlp", ["--policy", "kvpop", "--scorer", "mlp", "--gate", "sinks=2", "--gate", "window=8", "--gate", "topk=16"],
     2e-2, 2e-3),
    ("kvpop-mlstm", ["--policy", "kvpop", "--scorer", "mlstm",
                     "--gate", "sinks=2", "--gate", "window=8", "--gate", "topk=16"], 2e-2, 2e-3),
    ("streaming-plus", ["--policy", "streaming-plus", "--gate", "sinks=2", "--gate", "window=8", "--gate", "topk=16"],
     2e-3, 2e-4),
    # From two full-cache traces captured on the CPU (traces()): --traces and
    # --holdout are added there.
    ("sfc", ["--policy", "sfc", "--tokens", "24"], 2e-3, 2e-4),
    # KVzip's read-backs on the device; restorekv trains there, the kvzap ridge
    # fit and fastkvzip's SGD run on the host from the device's targets.
    ("restorekv", ["--policy", "restorekv", "--seq-len", "96"], 5e-3, 5e-4),
    ("kvzap", ["--policy", "kvzap"], 5e-3, 5e-3),
    ("fastkvzip", ["--policy", "fastkvzip", "--gate", "iters=50", "--gate", "batch=32"], 5e-3, 1e-3),
    # Forward passes on the device; float64 sums on the device (qfilter) or
    # the host (query-stats' moments).
    ("qfilter", ["--policy", "qfilter"], 2e-3, 1e-3),
    ("query-stats", ["--policy", "query-stats"], 2e-3, 1e-3),
    # alpha after three AdamW steps (the reg term keeps every gradient off
    # zero, so no step's sign can flip); the held-out hard pattern ranks
    # alpha and near-ties can fall either way: not compared.
    # A short streaming window and a large step, so the mixed heads differ
    # from the teacher from the second step on and the distillation loss is
    # more than rounding.
    ("duo-attention", ["--policy", "duo-attention", "--seq-len", "256", "--lr", "0.1",
                       "--gate", "passkeys=1", "--gate", "words=2", "--gate", "sinks=4",
                       "--gate", "recent=32"], 5e-3, 2e-3),
    # The curve averages discrete budgets (1/64 per entry a head gains or
    # loses, over 3 samples): a near-tie among the scorer's ratings or the
    # hull's slopes moves one entry between heads, 0.0052 of a prune ratio.
    ("lukv", ["--policy", "lukv"], 2e-2, 2e-2),
]

JSON_NUMBERS = {
    "restorekv": ["final_train_kl", "heldout_kl_restorekv", "heldout_kl_kvzip_same_budget"],
    "kvzap": ["heldout_r2"],
    "fastkvzip": ["final_train_bce_per_layer", "heldout_bce"],
    "qfilter": ["explained_share"],
    "query-stats": [],
    "duo-attention": ["distill", "mean_alpha"],
    "lukv": ["heldout"],
}

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
         "with her friends. One day, she saw a big red ball under a tree. She ran to the ball and "
         "picked it up.")


def traces(kvscope, models, out_dir):
    """Two full-cache traces with received attention, what sfc trains from."""
    paths = []
    for seed in (1, 2):
        path = os.path.join(out_dir, f"sfc-{seed}.kvtrace.h5")
        cmd = [kvscope, "capture", "--model", os.path.join(models, "stories260K.bin"),
               "--tokenizer", os.path.join(models, "tok512.bin"), "--prompt", STORY,
               "--temperature", "0.8", "--seed", str(seed), "--max-new", "49", "--threads", "1",
               "-q", "--policy", "full", "--capture", "received", "-o", path]
        subprocess.run(cmd, check=True, capture_output=True)
        paths.append(path)
    return ["--traces", paths[0], "--holdout", paths[1]]


def corpus(out_dir):
    """The repository's own prose: enough tokens for 3 windows and the held-out ones."""
    path = os.path.join(out_dir, "corpus.txt")
    with open(path, "w") as f:
        for name in ("README.md", "docs/architecture.md", "docs/training.md"):
            with open(os.path.join(ROOT, name)) as src:
                f.write(src.read())
    return path


def train(kvscope, models, data, args, device, output):
    text = [] if "sfc" in args else ["--data", data]
    if "sfc" not in args and "--seq-len" not in args:
        text += ["--seq-len", "64"]
    cmd = [kvscope, "train", "--model", os.path.join(models, "stories260K.bin"),
           "--tokenizer", os.path.join(models, "tok512.bin")] + text + [
           "--steps", "3", "--threads", "1", "--seed", "7", "-q",
           "--device", device, "-o", output] + args
    return subprocess.run(cmd, capture_output=True, text=True)


def safetensors(path):
    """name -> array('f') of a float32 safetensors file (what kvscope writes)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        if spec["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {spec['dtype']}, expected F32")
        a, b = spec["data_offsets"]
        out[name] = array("f", body[a:b])
    return out


def llama2c_floats(path):
    with open(path, "rb") as f:
        data = f.read()
    return {"weights": array("f", data[28:])}  # after the 7-int header


def head_pattern(path):
    """DuoAttention's alpha, a pattern directory's full_attention_heads.tsv."""
    with open(os.path.join(path, "full_attention_heads.tsv")) as f:
        return {"alpha": array("f", [float(x) for line in f for x in line.split()])}


def npy_floats(path):
    """LU-KV's curve: a little-endian float32 .npy (what kvscope writes)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY" or b"'<f4'" not in data[:128]:
        raise ValueError(f"{path}: not a little-endian float32 .npy")
    offset = (10 + struct.unpack("<H", data[8:10])[0]) if data[6] == 1 else \
        (12 + struct.unpack("<I", data[8:12])[0])
    return {"curve": array("f", data[offset:])}


READERS = {"streaming-plus": llama2c_floats, "duo-attention": head_pattern, "lukv": npy_floats}
OUTPUT_SUFFIX = {"streaming-plus": ".bin", "duo-attention": ".pattern", "lukv": ".npy"}


def losses(csv_path):
    with open(csv_path) as f:
        return [(r["phase"], int(r["step"]), float(r["loss"])) for r in csv.DictReader(f)]


def json_losses(json_path, keys):
    """The fitted kinds' numbers as (key, index, value) rows, like losses()."""
    with open(json_path) as f:
        training = json.load(f)["training"]
    def flat(v):
        if isinstance(v, dict):
            return [x for key in sorted(v) for x in flat(v[key])]
        return [x for item in v for x in flat(item)] if isinstance(v, list) else [float(v)]

    rows = []
    for key in keys:
        rows += [(key, i, v) for i, v in enumerate(flat(training[key]))]
    return rows


def compare(name, paths, rtol, atol):
    problems = []
    if name in JSON_NUMBERS:
        lc, lg = (json_losses(paths[d]["json"], JSON_NUMBERS[name]) for d in ("cpu", "cuda"))
    else:
        lc, lg = losses(paths["cpu"]["csv"]), losses(paths["cuda"]["csv"])
    if [r[:2] for r in lc] != [r[:2] for r in lg]:
        problems.append(f"the .csv rows differ: {lc} vs {lg}")
    worst_loss = 0.0
    for (phase, step, a), (_, _, b) in zip(lc, lg):
        # Held-out R^2 and BCE can sit near 0: relative to at least 0.1 there.
        rel = abs(a - b) / max(abs(a), 0.1 if name in JSON_NUMBERS else 1e-12)
        worst_loss = max(worst_loss, rel)
        if rel > rtol:
            problems.append(f"{phase} step {step}: loss {a} (cpu) vs {b} (cuda), rel {rel:.2e} > {rtol}")
    read = READERS.get(name, safetensors)
    tc, tg = read(paths["cpu"]["out"]), read(paths["cuda"]["out"])
    if sorted(tc) != sorted(tg):
        problems.append(f"the tensors differ: {sorted(tc)} vs {sorted(tg)}")
    worst_param = 0.0
    for key in sorted(set(tc) & set(tg)):
        a, b = tc[key], tg[key]
        if len(a) != len(b):
            problems.append(f"{key}: {len(a)} vs {len(b)} values")
            continue
        d = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
        worst_param = max(worst_param, d)
        if d > atol:
            problems.append(f"{key}: max |cpu - cuda| {d:.2e} > {atol}")
    return {"passed": not problems, "loss_rel": worst_loss, "param_abs": worst_param,
            "rtol": rtol, "atol": atol, "problems": problems[:8]}


def main():
    kvscope, models, out_dir = sys.argv[1:4]
    jsonl = sys.argv[sys.argv.index("--jsonl") + 1] if "--jsonl" in sys.argv else None
    against = sys.argv[sys.argv.index("--against") + 1] if "--against" in sys.argv else "cuda"
    os.makedirs(out_dir, exist_ok=True)
    data = corpus(out_dir)
    probe = train(kvscope, models, data, CASES[0][1], against, os.path.join(out_dir, "probe.safetensors"))
    if parity_report.no_cuda(probe):
        return parity_report.SKIPPED
    failed = 0
    sfc_traces = traces(kvscope, models, out_dir)
    for name, args, rtol, atol in CASES:
        if name == "sfc":
            args = args + sfc_traces
        paths = {}
        ok = True
        for device, run_on in (("cpu", "cpu"), ("cuda", against)):
            base = os.path.join(out_dir, f"{name}.{device}")
            out = base + OUTPUT_SUFFIX.get(name, ".safetensors")
            meta = os.path.join(out, "config.json") if name == "duo-attention" else base + ".json"
            paths[device] = {"out": out, "csv": base + ".csv", "json": meta}
            r = train(kvscope, models, data, args, run_on, out)
            if r.returncode != 0:
                print(f"FAIL {name} --device {run_on}: {r.stderr.strip()[-600:]}")
                ok = False
        result = compare(name, paths, rtol, atol) if ok else {"passed": False, "error": "a run failed"}
        record = {"model": "stories260K", "trainer": name, "result": result}
        failed += 0 if parity_report.report(record, jsonl) else 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
