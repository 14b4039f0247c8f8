#!/usr/bin/env python3
"""Markdown table of the gate files (and LU-KV curves) in a directory (resources/gates/README.md):
each file's policy, model, steps x seq-len, wall time, held-out numbers and
size, read from the gate file's JSON metadata sidecar.

usage: gate_table.py resources/gates
"""
import glob
import json
import os
import sys


def fmt(v):
    return "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))


def main():
    d = sys.argv[1]
    print("| file | policy | base model | steps x tokens | wall | held-out | size |")
    print("|---|---|---|---|---|---|---|")
    for js in sorted(glob.glob(os.path.join(d, "*.json"))):
        m = json.load(open(js))
        t = m["training"]
        st = js[:-5] + ".safetensors"
        h = t.get("heldout", {})
        if m["policy"] == "lukv":  # a budget curve (.npy) from a profile, not a gate file
            st = js[:-5] + ".npy"
            held = "; ".join(
                f"oracle importance kept at {100 * r['compression_ratio']:g} %: "
                f"{fmt(r['oracle_share_kept_by_curve'])} vs uniform {fmt(r['oracle_share_kept_uniform'])}"
                for r in h if r["compression_ratio"] in (0.5, 0.875))
            shape = f"{t['samples']} x {t['context_tokens']} + {t['future_tokens']} (profile, {t['scorer']})"
        elif m["policy"] == "qfilter":  # calibrated, not trained
            share = [x for layer in t["explained_share"] for x in layer]
            held = f"query energy along the filter: mean {fmt(sum(share) / len(share))}"
            shape = f"{t['windows']} x {t['seq_len']} (calibration)"
        elif m["policy"] == "query-stats":
            held = f"queries per kv head: {t['queries_per_kv_head']}"
            shape = f"{t['windows']} x {t['seq_len']} (calibration)"
        elif m["policy"] == "kvzap":  # ridge fit, closed form
            r2 = t["heldout_r2"]
            held = f"R² of log KVzip+ per layer: mean {fmt(sum(r2) / len(r2))} ({fmt(min(r2))}–{fmt(max(r2))})"
            shape = f"{t['windows']} x {t['seq_len']} (ridge fit)"
        elif m["policy"] == "fastkvzip":  # BCE against KVzip scores
            acc = t["heldout_accuracy"]
            held = (f"BCE per head {fmt(sum(t['heldout_bce']) / len(t['heldout_bce']))}, "
                    f"accuracy {fmt(sum(acc) / len(acc))} ({fmt(min(acc))}–{fmt(max(acc))})")
            shape = f"{t['windows']} x {t['seq_len']} ({int(m['hyperparameters']['iters'])} steps)"
        elif m["policy"] == "restorekv":  # self-distillation, against KVzip at the same budget
            held = (f"KL {fmt(t['heldout_kl_restorekv'])} vs KVzip alone "
                    f"{fmt(t['heldout_kl_kvzip_same_budget'])} at {t['budget_per_head']} entries per head")
            shape = f"{t['steps']} x {t['seq_len']}"
        elif m["policy"] == "sfc-gru":  # trained from traces: tokens sampled per trace and step
            held = (f"AUROC now {fmt(h['now']['auroc'])}, horizon {fmt(h['horizon']['auroc'])}; "
                    f"onsets forecast {fmt(h['onsets_forecast_lead'])}") if h else "-"
            shape = f"{t['steps']} x {t['tokens']} tokens"
        else:
            keys = [k for k in ("distill", "kl", "ce", "cap", "keep", "cache_fraction", "gate_mean", "agreement", "recall") if k in h]
            held = ", ".join(f"{k} {fmt(h[k])}" for k in keys)
            shape = f"{t['steps']} x {t['seq_len']}"
        print(f"| `{os.path.basename(st)}` | {m['policy']} | {m['base_model']['name']} | "
              f"{shape} | {t['wall_seconds']:.0f} s | {held} | "
              f"{os.path.getsize(st) / 1024:.0f} KiB |")
    for cfg in duo_patterns(d):
        print(duo_row(cfg))
    print()
    for js in sorted(glob.glob(os.path.join(d, "*.json"))):
        m = json.load(open(js))
        print(f"- `{os.path.basename(js)[:-5]}`: `{m['training']['command']}`")
    for cfg in duo_patterns(d):
        m = json.load(open(cfg))
        print(f"- `{os.path.basename(os.path.dirname(cfg))}/`: `{m['training']['command']}`")


def duo_patterns(d):
    """DuoAttention's head patterns: directories with config.json and full_attention_heads.tsv."""
    return [c for c in sorted(glob.glob(os.path.join(d, "*", "config.json")))
            if os.path.exists(os.path.join(os.path.dirname(c), "full_attention_heads.tsv"))]


def duo_row(cfg):
    m = json.load(open(cfg))
    t = m["training"]
    tsv = os.path.join(os.path.dirname(cfg), "full_attention_heads.tsv")
    held = (f"distill {fmt(t['heldout_distill_sparsity_0.5'])} at sparsity 0.5 vs "
            f"{fmt(t['heldout_distill_sparsity_0.5_reversed'])} with the ranking reversed")
    return (f"| `{os.path.basename(os.path.dirname(cfg))}/` | duo-attention | {m['base_model']['name']} | "
            f"{t['steps']} x {t['seq_len']} | {t['wall_seconds']:.0f} s | {held} | "
            f"{os.path.getsize(tsv) / 1024:.0f} KiB |")


if __name__ == "__main__":
    main()
