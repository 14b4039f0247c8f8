#!/usr/bin/env python3
"""The KV cache in the model's precision (--kv-dtype), end to end on
stories260K, for every policy of the golden catalogue:

1. bf16 weights: a bf16 cache holds the keys and values the model computed
   exactly (they are bf16 already), so `--kv-dtype bf16` must give the event
   stream and the tokens of `--kv-dtype fp32`, bit for bit, at half the KV
   bytes in every step.
2. fp32 weights, bf16 cache: every policy runs on rounded rows to a complete
   trace whose /run says what was stored (kv_dtype, tier_formats; SFC's warm
   tier stays INT4), and `full` holds half the bytes of its fp32 run.

    kv_dtype_parity.py KVSCOPE STORIES_DIR OUT_DIR
"""
import os
import subprocess
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "policies"))
import golden_events  # noqa: E402  (the policy catalogue and the prompt)

KVSCOPE, STORIES, OUT = (os.path.abspath(a) for a in sys.argv[1:4])
ARGS = ["--model", os.path.join(STORIES, "stories260K.bin"), "--tokenizer",
        os.path.join(STORIES, "tok512.bin"), "--prompt", golden_events.STORIES_PROMPT,
        "--max-new", "24", "--threads", "1", "-q"]


def capture(spec, extra, name):
    trace = os.path.join(OUT, name + ".kvtrace.h5")
    cmd = [KVSCOPE, "capture", *ARGS, "--policy", spec, *extra, "-o", trace]
    r = subprocess.run(cmd, capture_output=True, text=True,
                       env={**os.environ, **golden_events.DETERMINISTIC_ENV})
    if r.returncode != 0:
        raise RuntimeError(" ".join(cmd) + "\n" + r.stderr[-600:])
    return trace


def read(trace):
    with h5py.File(trace, "r") as f:
        if f["run/complete"][()] != 1:
            raise RuntimeError(trace + ": capture not complete")
        run = f["run"].attrs
        formats = [x.decode() if isinstance(x, bytes) else str(x) for x in run["tier_formats"]]
        kv = run["kv_dtype"]
        return {"events": golden_events.events_csv(trace)[0],
                "tokens": f["tokens/id"][:].tolist(),
                "kv_bytes": f["steps/kv_bytes"][:].astype(np.int64),
                "kv_dtype": kv.decode() if isinstance(kv, bytes) else str(kv),
                "tier_formats": formats}


def main():
    os.makedirs(OUT, exist_ok=True)
    pattern = os.path.join(OUT, "heads.tsv")  # DuoAttention's pattern, as golden_events writes it
    with open(pattern, "w") as out:
        for l in range(5):
            out.write("\t".join("0.9" if (l + h) % 2 else "0.1" for h in range(4)) + "\n")
    cases = golden_events.stories_cases(pattern) + [("sfc", "sfc:hot=0.8")]
    failed = []
    for name, spec in cases:
        try:
            if name != "sfc":  # 1. bf16 weights: the same run at half the bytes
                wide = read(capture(spec, ["--dtype", "bf16", "--kv-dtype", "fp32"], name + ".w16kv32"))
                half = read(capture(spec, ["--dtype", "bf16", "--kv-dtype", "bf16"], name + ".w16kv16"))
                if wide["events"] != half["events"]:
                    failed.append(f"{name}: bf16 weights, the bf16 cache's events differ from fp32's")
                if wide["tokens"] != half["tokens"]:
                    failed.append(f"{name}: bf16 weights, the bf16 cache's tokens differ from fp32's")
                if not np.array_equal(wide["kv_bytes"], 2 * half["kv_bytes"]):
                    failed.append(f"{name}: kv_bytes not halved: {wide['kv_bytes'][:4]} vs "
                                  f"{half['kv_bytes'][:4]}")
                if (wide["kv_dtype"], half["kv_dtype"]) != ("fp32", "bf16"):
                    failed.append(f"{name}: /run kv_dtype {wide['kv_dtype']}, {half['kv_dtype']}")
            # 2. fp32 weights over a bf16 cache
            got = read(capture(spec, ["--kv-dtype", "bf16"], name + ".w32kv16"))
            want_formats = (["bfloat16", "int4", "bfloat16"] if name == "sfc"
                            else ["bfloat16"] * len(got["tier_formats"]))
            if got["kv_dtype"] != "bf16" or got["tier_formats"] != want_formats:
                failed.append(f"{name}: /run kv_dtype {got['kv_dtype']}, tier_formats "
                              f"{got['tier_formats']} (expected bf16, {want_formats})")
            if name == "full":
                base = read(capture(spec, [], name + ".w32kv32"))
                if not np.array_equal(base["kv_bytes"], 2 * got["kv_bytes"]):
                    failed.append("full: fp32 weights, the bf16 cache does not hold half the bytes")
                if base["tier_formats"] != ["float32"] or base["kv_dtype"] != "fp32":
                    failed.append(f"full: fp32 run records {base['kv_dtype']}, {base['tier_formats']}")
            print("ok", name)
        except RuntimeError as e:
            failed.append(f"{name}: {e}")
    if failed:
        sys.exit("kv-dtype parity failed:\n  " + "\n  ".join(failed))
    print(f"{len(cases)} policies: bf16 caches hold the model's bf16 rows exactly, fp32 models "
          "run on rounded rows")


if __name__ == "__main__":
    main()
