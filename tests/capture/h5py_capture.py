#!/usr/bin/env python3
"""h5py reads the events of a real capture (stories260K under H2O) and finds
them consistent with the lifetimes and occupancy KVScope wrote.

usage: h5py_capture.py KVSCOPE_EXE SHARED_DIR WORK_DIR
"""
import os
import subprocess
import sys

import h5py
import numpy as np


def main():
    exe, shared, work = sys.argv[1], sys.argv[2], sys.argv[3]
    shared = os.environ.get("KVSCOPE_SHARED_DIR") or shared
    os.makedirs(work, exist_ok=True)
    trace = os.path.join(work, "h2o.kvtrace.h5")
    stories = os.path.join(shared, "models", "stories260K")
    subprocess.run([exe, "capture", "--model", os.path.join(stories, "stories260K.bin"),
                    "--tokenizer", os.path.join(stories, "tok512.bin"),
                    "--prompt", "Tom had a big dog named Max. Max liked to", "--max-new", "40",
                    "--policy", "h2o:heavy=6,recent=6", "-q", "-o", trace], check=True)
    with h5py.File(trace, "r") as f:
        assert f["run/complete"][()] == 1
        assert f["run"].attrs["policy_name"] == "h2o"
        kind = f["events/kind"][:]
        step, layer, head, token = (f["events/" + c][:] for c in ("step", "layer", "kv_head", "token"))
        L, K = f["run"].attrs["n_layers"], f["run"].attrs["n_kv_heads"]
        admit, evict = f["lifetimes/admit_step"][:], f["lifetimes/evict_step"][:]
        n_admit = n_evict = 0
        for k, s, l, h, t in zip(kind, step, layer, head, token):
            if k == 0:
                assert admit[l, h, t] == s
                n_admit += 1
            elif k == 3:
                assert evict[l, h, t] == s
                n_evict += 1
        assert n_admit == L * K * f["tokens/id"].shape[0]
        assert n_evict > 0
        occ = f["occupancy/entries"][:]
        held_at_end = ((admit >= 0) & (evict < 0)).sum(axis=2)
        assert np.array_equal(occ[-1, :, :, 0], held_at_end)
        assert occ.max() <= 12, occ.max()
        print("h5py read %d events (%d admits, %d evictions) of %s, consistent with lifetimes and occupancy"
              % (len(kind), n_admit, n_evict, trace))


if __name__ == "__main__":
    main()
