#!/usr/bin/env python3
"""h5py reads a trace written by KVScope and finds exactly what was written.

usage: h5py_interop.py WRITE_INTEROP_TRACE_EXE WORK_DIR
"""
import json
import math
import os
import subprocess
import sys

import h5py
import numpy as np


def main():
    exe, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    trace, expected_path = os.path.join(work, "interop.kvtrace.h5"), os.path.join(work, "interop.json")
    subprocess.run([exe, trace, expected_path], check=True)
    with open(expected_path) as f:
        want = json.load(f)

    with h5py.File(trace, "r") as f:
        assert f.attrs["format"] == want["format"], f.attrs["format"]
        assert f.attrs["version"] == want["version"]
        run = f["run"]
        assert run.attrs["policy"] == want["policy"]
        assert run.attrs["prompt"] == want["prompt"]
        assert list(run.attrs["tier_names"]) == want["tier_names"]
        # Minor version 3: one 0/1 flag per tier (here tier 1, "cold", is not attended).
        attended = run.attrs["tier_attended"]
        assert attended.dtype == np.uint8, attended.dtype
        assert attended.tolist() == want["tier_attended"], attended
        assert run.attrs["n_layers"] == want["n_layers"]
        assert f["run/complete"][()] == 1

        assert f["steps/kind"].shape == (want["n_steps"],)
        assert f["tokens/id"][:].tolist() == want["token_ids"]
        assert f["tokens/role"][:].tolist() == want["token_roles"]
        text = bytes(f["tokens/text_bytes"][:])
        begin, length = f["tokens/text_begin"][:], f["tokens/text_len"][:]
        pieces = [text[b:b + n].decode() for b, n in zip(begin, length)]
        assert pieces == want["token_texts"]

        for col, values in want["events"].items():
            got = f["events/" + col][:]
            if col == "score":
                assert np.array_equal(got, np.array(values, dtype=np.float32)), col
            else:
                assert got.tolist() == values, col
        assert f["events/kind"].attrs["units"] == "enum"

        occ = f["occupancy/entries"][:]
        assert occ.shape == (want["n_steps"], want["n_layers"], want["n_kv_heads"], 2)
        assert occ.reshape(want["n_steps"], -1).tolist() == want["occupancy"]
        assert f["steps/entries"][:].tolist() == want["entries"]
        assert (occ.reshape(want["n_steps"], -1).sum(axis=1) == f["steps/entries"][:]).all()

        assert f["lifetimes/admit_step"][1, 1, :].tolist() == want["admit_step_l1_k1"]
        assert f["lifetimes/evict_step"][1, 1, :].tolist() == want["evict_step_l1_k1"]

        pooled = f["attention/pooled/mean"]
        assert pooled.dtype == np.float16, pooled.dtype
        got = pooled[1, 2, :, :].astype(np.float32)
        assert np.array_equal(got, np.array(want["pooled_mean_l1_h2"], dtype=np.float32))

        # /series (minor version 2), present only when the policy declared one.
        if "series" in f:
            series = f["series"]
            assert [str(n) for n in series.attrs["order"]] == want["series_names"]
            for i, name in enumerate(want["series_names"]):
                assert series[name].attrs["units"] == want["series_units"]
                value = series[name + "/value"]
                assert value.dtype == np.float32, value.dtype
                assert value.shape == (want["n_steps"], want["n_layers"], want["n_kv_heads"])
                expected = np.array([[np.nan if v is None else v for v in row]
                                     for row in want["series_values"]], dtype=np.float32)
                assert np.array_equal(value[:].reshape(want["n_steps"], -1), expected,
                                      equal_nan=True), name
        else:
            assert not want.get("series_names"), "the trace lacks /series"

        # /stalls (minor version 3): one row per reactive fetch, in every trace.
        stalls = want["stalls"]
        assert len(stalls["step"]) > 0, "the interop trace should hold stalls"
        types = {"step": np.int32, "layer": np.int16, "kv_head": np.int16, "token": np.int32,
                 "wait_s": np.float32, "needed": np.int8}
        for col, dtype in types.items():
            got = f["stalls/" + col]
            assert got.dtype == dtype, (col, got.dtype)
            assert got.maxshape == (None,), (col, got.maxshape)
            assert np.array_equal(got[:], np.array(stalls[col], dtype=dtype)), col
        assert f["stalls/wait_s"].attrs["units"] == "s"

        assert bytes(f["generation/text_bytes"][:]).decode() == want["generated_text"]
        # Every dataset says what it holds.
        missing = []
        f.visititems(lambda name, obj: missing.append(name)
                     if isinstance(obj, h5py.Dataset) and not {"units", "meaning"} <= set(obj.attrs) else None)
        assert not missing, missing
    print("h5py read %s: %d steps, %d tokens, %d events match what KVScope wrote"
          % (trace, want["n_steps"], len(want["token_ids"]), len(want["events"]["step"])))


if __name__ == "__main__":
    main()
