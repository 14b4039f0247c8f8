#!/usr/bin/env python3
"""Interop: a gate file written by `kvscope train` is a standard safetensors
file an independent reader understands: an 8-byte little-endian header size,
a JSON header whose __metadata__ holds the kvscope.gates JSON document, and
F32 tensors laid out back to back. Reads it with numpy only (the system
python3), checks the documented names, shapes and metadata.

usage: read_gate_file.py KVSCOPE SHARED_DIR WORK_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np


def main():
    exe, shared, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    model = os.path.join(shared, "models", "stories260K")
    out = os.path.join(work, "g.safetensors")
    subprocess.run([exe, "train", "--policy", "wgkv", "--model", os.path.join(model, "stories260K.bin"),
                    "--tokenizer", os.path.join(model, "tok512.bin"), "--generate", "2000", "--seq-len", "64",
                    "--steps", "2", "--threads", "1", "--gate", "window=16", "-q", "-o", out], check=True)
    with open(out, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = json.loads(header.pop("__metadata__")["kvscope.gates"])
    assert meta["format"] == "kvscope-gates" and meta["version"] == 1, meta
    assert meta["policy"] == "wgkv"
    assert meta["hyperparameters"]["window"] == 16
    assert meta["base_model"]["n_layers"] == 5 and len(meta["base_model"]["sha256"]) == 64
    assert meta["training"]["steps"] == 2 and "kvscope train" in meta["training"]["command"]
    assert meta["training"]["data"]["generated"]["tokens"] >= 2000
    base = 8 + n
    end = 0
    for l in range(5):
        p = f"layers.{l}.self_attn.g_predictors."
        for name, shape in [("pre_key_norm.weight", [8]), ("post_key_norm.weight", [8]),
                            ("conv1.weight", [4 * 32, 16, 1]), ("conv1.bias", [128]),
                            ("conv2.weight", [4, 32, 1]), ("conv2.bias", [4])]:
            t = header[p + name]
            assert t["dtype"] == "F32" and t["shape"] == shape, (name, t)
            a, b = t["data_offsets"]
            arr = np.frombuffer(data[base + a:base + b], dtype="<f4").reshape(shape)
            assert np.isfinite(arr).all()
            end = max(end, b)
    assert base + end == len(data), "tensors cover the file"
    with open(os.path.join(work, "g.json")) as f:
        assert json.load(f)["policy"] == "wgkv"
    print("ok")


if __name__ == "__main__":
    main()
