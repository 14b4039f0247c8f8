#!/usr/bin/env python3
"""Compares a --device cuda capture with the --device cpu capture of the same run.

    trace_parity.py CPU.kvtrace.h5 CUDA.kvtrace.h5 [--mass-atol 2e-5] [--score-atol 1e-6]
                    [--json OUT]

Equal (bit for bit): the generated tokens, every step's kind, tokens, entries and
KV bytes, and every event (step, layer, head, token, kind, reason, tiers).
Within tolerance: event scores (policy-defined, often attention sums), the
received mass (`--capture received`), the pooled maps (float16 in the
trace), whose sums run in another order on the GPU, and the oracle's rows
(`--oracle`: KL and lost mass within tolerance; a top-k recall may differ by
one key of k, where two keys tie at the k-th place, in at most 1 % of the
heads' rows). Exit 0 when all hold, 1 with the first differences listed otherwise.

A policy that ranks entries can meet two whose scores differ by less than
the GPU's rounding (two keys of equal norm to 1e-7); the two devices may then
keep different entries, and everything after differs. Such a run passes as
"diverged at a tie" when, at the first event that differs, the two choices
(same layer, head) scored within |a - b| <= 1e-5 max(|a|, |b|) + 1e-6:
both as the CPU trace scored them, or each as its own side scored it at that
decision (each side chose its extreme, so equal extremes are two candidates
equal to rounding: SnapKV's window votes of keys with next to no attention,
-4.6e-9 against -1.3e-10). Any other first difference fails.
"""
import argparse
import json
import sys

import h5py
import numpy as np

EXACT = [
    "/steps/kind", "/steps/first_token", "/steps/n_tokens", "/steps/entries", "/steps/kv_bytes",
    "/steps/event_begin", "/steps/event_count",
    "/events/step", "/events/layer", "/events/kv_head", "/events/token", "/events/kind",
    "/events/reason", "/events/from_tier", "/events/to_tier",
    "/attention/received/offset", "/attention/received/count", "/attention/received/token",
]


def committed(f, name):
    d = f[name][()]
    if name.startswith("/steps/"):
        d = d[: len(f["/steps/kind"])]
    return d


EVENT_COLUMNS = ["step", "layer", "kv_head", "token", "kind", "reason", "from_tier", "to_tier"]


def first_event_difference(c, g):
    """Index of the first event that differs, or None."""
    if "/events/kind" not in c or "/events/kind" not in g:
        return None
    n = min(len(c["/events/kind"]), len(g["/events/kind"]))
    first = None
    for col in EVENT_COLUMNS:
        x, y = c["/events/" + col][:n], g["/events/" + col][:n]
        d = np.nonzero(x != y)[0]
        if d.size and (first is None or d[0] < first):
            first = int(d[0])
    if first is None and len(c["/events/kind"]) != len(g["/events/kind"]):
        first = n
    return first


def tie_at(c, g, i):
    """The tie behind a divergence at event i, or None when it is no tie."""
    ev = {k: c["/events/" + k][()] for k in ("step", "layer", "kv_head", "token", "kind", "score")}
    if i >= len(ev["kind"]) or i >= len(g["/events/kind"]):
        return None
    gt = int(g["/events/token"][i])
    if int(g["/events/kind"][i]) != int(ev["kind"][i]) or gt == int(ev["token"][i]):
        return None
    a = float(ev["score"][i])
    same = (ev["layer"] == ev["layer"][i]) & (ev["kv_head"] == ev["kv_head"][i]) & (ev["token"] == gt)
    # The other side's choice as the CPU trace scored it anywhere, and as the
    # other side scored it at this very decision: each side's choice was its
    # extreme, so equal extremes mean two candidates equal to rounding.
    scores = [float(s) for s in ev["score"][same] if not np.isnan(s)]
    scores.append(float(g["/events/score"][i]))
    scores = [s for s in scores if not np.isnan(s)]
    if np.isnan(a) or not scores:
        return None
    b = min(scores, key=lambda s: abs(s - a))
    if abs(a - b) > 1e-5 * max(abs(a), abs(b)) + 1e-6:
        return None
    return {"event": i, "step": int(ev["step"][i]), "layer": int(ev["layer"][i]),
            "kv_head": int(ev["kv_head"][i]), "cpu_token": int(ev["token"][i]), "cuda_token": gt,
            "cpu_scores": [a, b]}


def compare_oracle(c, g, mass_atol, out, diff):
    """The oracle's rows (/oracle: kl, lost_mass, recall) of the two traces."""
    if ("/oracle" in c) != ("/oracle" in g):
        diff("/oracle: in one trace only")
        return
    if "/oracle" not in c:
        return
    x = {k: c["/oracle/" + k][()].astype(np.float64) for k in ("kl", "lost_mass", "recall")}
    y = {k: g["/oracle/" + k][()].astype(np.float64) for k in ("kl", "lost_mass", "recall")}
    for k in x:
        if x[k].shape != y[k].shape:
            diff(f"/oracle/{k}: shape {x[k].shape} vs {y[k].shape}")
            return
    kl_err = np.abs(x["kl"] - y["kl"]) - (1e-4 + 1e-3 * np.abs(x["kl"]))
    out["oracle_kl_max_abs_diff"] = float(np.max(np.abs(x["kl"] - y["kl"]), initial=0.0))
    if x["kl"].size and kl_err.max() > 0:
        diff(f"/oracle/kl: max |cuda - cpu| {out['oracle_kl_max_abs_diff']:.3g} beyond 1e-4 + 1e-3 |kl|")
    lost = float(np.max(np.abs(x["lost_mass"] - y["lost_mass"]), initial=0.0))
    out["oracle_lost_mass_max_abs_diff"] = lost
    if lost > mass_atol:
        diff(f"/oracle/lost_mass: max |cuda - cpu| {lost:.3g} > {mass_atol}")
    k = int(c["/oracle"].attrs.get("recall_k", 1))
    moved = np.abs(x["recall"] - y["recall"])
    out["oracle_recall_rows_differing"] = int((moved > 0).sum())
    if (moved > 1.0 / k + 1e-6).any() or (moved > 0).sum() > 0.01 * moved.size:
        diff(f"/oracle/recall: {int((moved > 0).sum())} of {moved.size} rows differ "
             f"(at most one key of k={k} in 1 % of them allowed)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cpu")
    ap.add_argument("cuda")
    ap.add_argument("--mass-atol", type=float, default=2e-5)
    ap.add_argument("--score-rtol", type=float, default=1e-3)
    ap.add_argument("--score-atol", type=float, default=1e-6)
    ap.add_argument("--json")
    a = ap.parse_args()
    out = {"cpu": a.cpu, "cuda": a.cuda, "differences": []}
    with h5py.File(a.cpu, "r") as c, h5py.File(a.cuda, "r") as g:
        first = first_event_difference(c, g)
        tie = tie_at(c, g, first) if first is not None else None
        if tie:  # the runs part at a tie; what follows differs by consequence
            out.update(equal=False, diverged_at_tie=tie, passed=True)
            print(json.dumps(out))
            return 0

        def diff(msg):
            out["differences"].append(msg)

        for key in ("/tokens/id", "/generation/token"):
            if key in c and key in g and not np.array_equal(c[key][()], g[key][()]):
                diff(f"{key}: generated tokens differ")
        for name in EXACT:
            if (name in c) != (name in g):
                diff(f"{name}: in one trace only")
                continue
            if name not in c:
                continue
            x, y = committed(c, name), committed(g, name)
            if x.shape != y.shape:
                diff(f"{name}: shape {x.shape} vs {y.shape}")
            elif not np.array_equal(x, y):
                i = int(np.argmax(x != y))
                diff(f"{name}: {int((x != y).sum())} of {x.size} differ (first at {i}: {x[i]} vs {y[i]})")
        out["events"] = int(len(c["/events/kind"])) if "/events/kind" in c else 0
        if "/events/score" in c and "/events/score" in g and c["/events/score"].shape == g["/events/score"].shape:
            x, y = c["/events/score"][()].astype(np.float64), g["/events/score"][()].astype(np.float64)
            same_nan = np.isnan(x) == np.isnan(y)
            ok = np.isclose(x, y, rtol=a.score_rtol, atol=a.score_atol, equal_nan=True)
            out["score_max_abs_diff"] = float(np.nanmax(np.abs(x - y))) if x.size and not np.all(np.isnan(x)) else 0.0
            if not (same_nan.all() and ok.all()):
                diff(f"/events/score: {int((~ok).sum())} of {x.size} beyond rtol {a.score_rtol}, "
                     f"atol {a.score_atol}")
        m = "/attention/received/mass"
        if m in c and m in g and c[m].shape == g[m].shape:
            x, y = c[m][()].astype(np.float64), g[m][()].astype(np.float64)
            err = float(np.max(np.abs(x - y))) if x.size else 0.0
            out["received_rows"] = int(x.size)
            out["received_max_abs_diff"] = err
            if err > a.mass_atol:
                diff(f"{m}: max |cuda - cpu| {err:.3g} > {a.mass_atol}")
        for name in ("/attention/pooled/mean", "/attention/pooled/max"):
            if name in c and name in g and c[name].shape == g[name].shape:
                x = np.nan_to_num(c[name][()].astype(np.float64))
                y = np.nan_to_num(g[name][()].astype(np.float64))
                # float16 in the trace: compare to its precision
                tol = 1e-3 * np.maximum(np.abs(x), 1e-3)
                err = float(np.max(np.abs(x - y) - tol)) if x.size else 0.0
                out[name.split("/")[-1] + "_max_abs_diff"] = float(np.max(np.abs(x - y))) if x.size else 0.0
                if err > 0:
                    diff(f"{name}: beyond float16 precision (max |cuda - cpu| {out[name.split('/')[-1] + '_max_abs_diff']:.3g})")
            elif (name in c) != (name in g):
                diff(f"{name}: in one trace only")
        compare_oracle(c, g, a.mass_atol, out, diff)
    out["equal"] = out["passed"] = not out["differences"]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out))
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
