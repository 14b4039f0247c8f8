#!/usr/bin/env python3
"""The policy quality table of docs/policies/README.md: every policy on
SmolLM2-135M-Instruct at equal memory (25 % and 12.5 % of a 2K context),

  KL      next-token KL(full || policy) per decode step, mean over --samples
          licence prompts of ~--context tokens and --new greedy tokens
          (`kvscope capture --oracle`: the full-cache shadow is teacher-forced
          on the policy's tokens);
  recall  the oracle's top-16 recall per decode step (the share of the full
          cache's 16 most-attended keys the policy still holds), same runs;
  passkey accuracy of kvscope's passkey task (`--task needle:tokens=C`, no
          chat template, greedy) over --depths depths from 0.1 to 0.9;
  entries the mean entries held per (layer, kv head) over the decode steps.

Results go to --out (JSON, one entry per (budget, policy), written after each
so an interrupted run resumes where it stopped); --markdown prints the table.

usage (from the repository root):
  bench/policies/quality_table.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --out bench/policies/results/quality-smollm2-2k.json [--only NAME,NAME] [--markdown]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gates"))
from quality import CHARS_PER_TOKEN, LICENSES, licence_text  # noqa: E402

# name -> spec; {M} entries per head, {H} = M/2, {W} = M - 4, {F} = the share,
# {T} = 4M/3 (entries whose keys keep half their channels take 3/4 of the memory),
# {D} = the share of DuoAttention's heads that stream so that the mean head
# holds M: streaming heads hold sinks + recent (S, from the pattern's
# config.json), the others all of the full cache's mean E entries, so
# D = 1 - (M - S) / (E - S) (E from the `full` row).
# Policies whose memory is their own (a learned gate, a threshold) have no
# placeholder: the table reports the entries they held.
POLICIES = [
    ("full", "full"),
    ("window", "window:window={M}"),
    ("streaming_llm", "streaming_llm:sinks=4,window={W}"),
    ("h2o", "h2o:heavy={H},recent={H}"),
    ("tova", "tova:budget={M}"),
    ("snapkv", "snapkv:budget={M}"),
    ("pyramidkv", "pyramidkv:budget={M}"),
    ("adakv", "adakv:scorer=snapkv,budget={M}"),
    ("criticalkv", "criticalkv:scorer=snapkv,budget={M}"),
    ("chunkkv", "snapkv:budget={M}+chunk:size=10,heads=shared"),
    ("knorm", "knorm:budget={M}"),
    ("expected_attention", "expected_attention:budget={M}"),
    ("random", "random:budget={M}"),
    ("observed_attention", "observed_attention:budget={M}"),
    ("keydiff", "keydiff:budget={M}"),
    ("lagkv", "lagkv:budget={M}"),
    ("cur", "cur:budget={M}"),
    ("leverage", "leverage:budget={M}"),
    ("non_causal_attention", "non_causal_attention:budget={M}"),
    ("compactor", "compactor:budget={M}"),
    ("quest", "quest:budget={M}"),
    ("dbtrimkv", "dbtrimkv:budget={M}"),
    ("kvpop", "kvpop:budget={M}"),
    ("sfc", "sfc:hot={F}"),
    ("wgkv", "wgkv"),
    ("simlayerkv", "simlayerkv:threshold=0.6,recent=256"),
    ("finch", "finch:budget={M},window=32"),
    ("kvzip", "kvzip:budget={M}"),
    ("cam", "cam:budget={M}"),
    ("qfilter", "qfilter:gates=resources/gates/SmolLM2-135M-Instruct-qfilter.safetensors,budget={M}"),
    ("expected_attention_stats",
     "expected_attention_stats:gates=resources/gates/SmolLM2-135M-Instruct-query-stats.safetensors,budget={M}"),
    ("cap", "cap:budget={M}"),
    ("critical_adakv", "critical_adakv:scorer=snapkv,budget={M}"),
    ("snapkv+think", "snapkv:budget={T},window=32+think:ratio=0.5"),
    ("kvzip+", "kvzip:budget={M},plus=true"),
    ("kvcompose", "kvcompose:budget={M}"),
    ("kvzap", "kvzap:gates=resources/gates/SmolLM2-135M-Instruct-kvzap.safetensors,budget={M}"),
    ("fastkvzip", "fastkvzip:gates=resources/gates/SmolLM2-135M-Instruct-fastkvzip.safetensors,budget={M}"),
    ("kvzap_no_window", "kvzap:gates=resources/gates/SmolLM2-135M-Instruct-kvzap.safetensors,budget={M},sinks=0,window=0"),
    ("kvgrad", "kvgrad:budget={M}"),
    ("dms_learned", "dms_learned:gates=resources/gates/SmolLM2-135M-Instruct-dms.safetensors"),
    ("restorekv", "restorekv:gates=resources/gates/SmolLM2-135M-Instruct-restorekv.safetensors,budget={M}"),
    ("snapkv+merge", "snapkv:budget={M}+merge"),
    ("trimkv", "trimkv:gates=resources/gates/SmolLM2-135M-Instruct-retention.safetensors,budget={M}"),
    ("attention_gate", "attention_gate:gates=resources/gates/SmolLM2-135M-Instruct-attention-gate.safetensors"),
    ("duo_attention", "duo_attention:pattern=resources/gates/SmolLM2-135M-Instruct-duo-attention,sparsity={D}"),
    ("dms_kvzap", "dms:scorer=kvzap,gates=resources/gates/SmolLM2-135M-Instruct-kvzap.safetensors,threshold=-4"),
    ("lukv", "lukv:scorer=snapkv,curve=resources/gates/SmolLM2-135M-Instruct-lukv-snapkv.npy,budget={M}"),
]
NOTES = {
    "quest": "selects {M} entries per query at read time; holds all",
    "sfc": "hot {M} + warm INT4 {M} + cold (unread) rest",
    "leverage": "prefill only: grows at decode",
    "non_causal_attention": "prefill only: grows at decode",
    "compactor": "prefill only: grows at decode",
    "wgkv": "its own memory (the shipped gate)",
    "simlayerkv": "its own memory (lazy layers keep 4 + 255)",
    "finch": "prefill only: grows at decode; the question = the prompt's last 32 tokens",
    "kvzip": "prefill only (a reconstruction pass, no chat template): grows at decode",
    "cam": "decode only (the paper's per-step CaM): the first decode step cuts the prompt",
    "kvzip+": "prefill only (KVzip+: weights over the norm of h, times the norm of v W_O; no chat template): grows at decode",
    "kvcompose": "prefill only (the prompt read a second time; one count per layer): grows at decode",
    "fastkvzip": "prefill only (trained gates, no second pass; one ranking over all heads): grows at decode",
    "kvgrad": "prefill only (KVzip's pass replayed with autograd, 512-token chunks; no chat template): grows at decode",
    "dms_learned": "its own memory (the shipped decisions, window 64): the same row at both budgets",
    "restorekv": "prefill only (KVzip + 8 restore tokens in the same budget; no chat template): grows at decode",
    "snapkv+merge": "SnapKV; every entry it evicts merges its value into the kept entry with the most similar key (kvpress MergingPress)",
    "attention_gate": "its own memory (the shipped gate, trained toward keeping 25 % with the model frozen, keeps 84 %): the same row at both budgets",
    "duo_attention": "the shipped pattern: its lowest-gate heads stream (sinks 16 + recent 112), as many as make the mean head hold M; the rest keep all",
    "dms_kvzap": "its own memory (KVzap's threshold -4 on its surrogate's scores): the same row at both budgets",
    "kvzap_no_window": "no sinks and no recent window (kvpress's KVzapPress alone), compressing at every step",
    "lukv": "SnapKV's scores, per-(layer, kv head) budgets from the shipped curve (`kvscope train "
            "--policy lukv`); prefill only: grows at decode",
    "snapkv+think": "SnapKV keeps 4/3 x the entries, ThinK halves their keys' channels: the same bytes; "
                    "prefill only: grows at decode",
}

# Capture options a policy needs: Attention-Gate's flags come from the whole
# prompt at once (one prefill step).
EXTRA_ARGS = {"attention_gate": ["--prefill-chunk", "4096"]}


def capture(args, spec, out, new, prompt=None, task=None, oracle=False, extra=()):
    source, pf = [], None
    if task:
        source = ["--task", task]
    else:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(prompt)
            pf = f.name
        source = ["--prompt-file", pf]
    cmd = [args.kvscope, "capture", "--model", args.model, *source, "--max-new", str(new), "--greedy",
           "--capture", "events", "-q", "--threads", str(args.threads), "--policy", spec, "-o", out, *extra]
    if oracle:
        cmd += ["--oracle", "--oracle-k", "16"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if pf:
        os.unlink(pf)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    with h5py.File(out, "r") as h:
        kind = h["steps/kind"][:]
        dec = np.nonzero(kind == 1)[0]
        L, K = h["occupancy/entries"].shape[1:3]
        res = {"entries": float(np.mean(h["steps/entries"][:][dec])) / (L * K)}
        if oracle:
            res["kl"] = float(np.mean(h["oracle/kl"][:][dec]))
            res["recall"] = float(np.mean(h["oracle/recall"][:][dec]))
        res["success"] = bool(h["generation/success"][()] == 1) if "generation/success" in h else None
    os.unlink(out)
    return res


def run_policy(args, spec, work, extra=()):
    trace = os.path.join(work, "t.kvtrace.h5")
    chars = int(args.context * CHARS_PER_TOKEN)
    kl = [capture(args, spec, trace, args.new, prompt=licence_text(LICENSES[i % len(LICENSES)])[:chars],
                  oracle=True, extra=extra) for i in range(args.samples)]
    depths = [0.1 + 0.8 * j / max(1, args.depths - 1) for j in range(args.depths)]
    pk = [capture(args, spec, trace, 12, task=f"needle:tokens={args.context},depth={d:.2f},seed={j + 1}",
                  extra=extra)
          for j, d in enumerate(depths)]
    return {"spec": spec, "kl": float(np.mean([r["kl"] for r in kl])),
            "recall": float(np.mean([r["recall"] for r in kl])),
            "entries": float(np.mean([r["entries"] for r in kl])),
            "passkey": sum(r["success"] for r in pk), "depths": len(pk),
            "passkey_by_depth": [bool(r["success"]) for r in pk]}


def passkey_after(args, spec, work, extra=()):
    """The passkey column with the question fed after the compression
    (`--query after`, kvpress's query_aware false): the same prompts."""
    trace = os.path.join(work, "t.kvtrace.h5")
    depths = [0.1 + 0.8 * j / max(1, args.depths - 1) for j in range(args.depths)]
    pk = [capture(args, spec, trace, 12, task=f"needle:tokens={args.context},depth={d:.2f},seed={j + 1}",
                  extra=(*extra, "--query", "after"))
          for j, d in enumerate(depths)]
    return {"passkey_after": sum(r["success"] for r in pk),
            "passkey_after_by_depth": [bool(r["success"]) for r in pk]}


def duo_sparsity(template, M, results, context):
    """{D}: the streaming share that makes DuoAttention's mean head hold M."""
    if "{D}" not in template:
        return ""
    pattern = template.split("pattern=")[1].split(",")[0]
    with open(os.path.join(pattern, "config.json")) as f:
        cfg = json.load(f)
    S = cfg["sink_size"] + cfg["recent_size"]
    full = next((r for k, r in results.items() if k.endswith("/full")), None)
    E = full["entries"] if full else context
    return f"{min(1.0, max(0.0, 1 - (M - S) / (E - S))):.3f}"


def markdown(results, shares):
    after = any("passkey_after" in r for r in results.values())
    cols = "KL | recall | passkey | " + ("q. after | " if after else "") + "entries"
    rows = ["| policy | spec at 25 % | " + " | ".join(
        f"{int(s * 100 * 10) / 10:g} %: {cols}" for s in shares) + " |",
            "| --- | --- | " + " | ".join(" | ".join(["---"] * (5 if after else 4)) for _ in shares) + " |"]
    for name, _ in POLICIES:
        cells = []
        spec = None
        for s in shares:
            r = results.get(f"{s}/{name}")
            if r is None:
                cells.append(" | ".join(["—"] * (5 if after else 4)))
                continue
            spec = spec or r["spec"]
            pa = (f"{r['passkey_after']}/{r['depths']} | " if "passkey_after" in r else "— | ") if after else ""
            cells.append(f"{r['kl']:.4f} | {r['recall']:.3f} | {r['passkey']}/{r['depths']} | {pa}"
                         f"{r['entries']:.0f}")
        if spec is None:
            continue
        note = NOTES.get(name, "")
        rows.append(f"| `{name}`{' (' + note.replace('{M}', 'M') + ')' if note else ''} | `{spec}` | "
                    + " | ".join(cells) + " |")
    return "\n".join(rows)


def save(path, results):
    with open(path + ".tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvscope", default="build/app/kvscope")
    ap.add_argument("--model", required=True)
    ap.add_argument("--context", type=int, default=2000)
    ap.add_argument("--shares", default="0.25,0.125")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--depths", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--query-after", action="store_true",
                    help="add the passkey column with the question after the compression to the "
                         "results already in --out (the policies of --only)")
    args = ap.parse_args()
    shares = [float(s) for s in args.shares.split(",")]
    results = json.load(open(args.out)) if os.path.exists(args.out) else {}
    if args.markdown:
        print(markdown(results, shares))
        return
    work = tempfile.mkdtemp(prefix="kvscope-quality-")
    only = set(args.only.split(",")) if args.only else None
    for share in shares:
        M = int(round(share * args.context))
        for name, template in POLICIES:
            key = f"{share}/{name}"
            if args.query_after:
                if (only and name not in only) or key not in results or "passkey_after" in results[key]:
                    continue
                t0 = time.time()
                results[key].update(passkey_after(args, results[key]["spec"], work,
                                                  EXTRA_ARGS.get(name, ())))
                save(args.out, results)
                print(f"{key}: passkey, question after: {results[key]['passkey_after']}/{args.depths} "
                      f"({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
                continue
            if (only and name not in only) or key in results or (name == "full" and share != shares[0]):
                continue
            spec = (template.replace("{M}", str(M)).replace("{H}", str(M // 2)).replace("{W}", str(M - 4))
                    .replace("{F}", str(share)).replace("{T}", str(int(round(M * 4 / 3))))
                    .replace("{D}", duo_sparsity(template, M, results, args.context)))
            t0 = time.time()
            try:
                r = run_policy(args, spec, work, EXTRA_ARGS.get(name, ()))
            except RuntimeError as e:
                print(f"{key}: FAILED {e}", file=sys.stderr, flush=True)
                continue
            r["seconds"] = time.time() - t0
            results[key] = r
            if "{" not in template:  # its own memory: one run stands for every share
                for s in shares:
                    results[f"{s}/{name}"] = r
            save(args.out, results)
            print(f"{key}: KL {r['kl']:.4f} recall {r['recall']:.3f} passkey {r['passkey']}/{r['depths']} "
                  f"entries {r['entries']:.0f} ({r['seconds']:.0f} s)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
