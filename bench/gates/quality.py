#!/usr/bin/env python3
"""Quality of the learned policies against StreamingLLM and H2O at equal KV
memory, on a real model, through `kvscope capture --oracle` (docs/policies/
wgkv.md, attention_gate.md, trimkv.md, dbtrimkv.md record the results).

Two tasks on prompts the gates never saw (the gates train on Debian docs and
model-generated text):

  heldout   a ~C-token prefix of a licence is the prompt (prefilled in one
            step), the model then generates T tokens greedily; the oracle
            shadow (full cache, teacher-forced on the same tokens) gives the
            next-token KL(full || policy) and the top-k recall per decode step.
  needle    --needle-kind passkey (default): kvscope's built-in passkey task
            (`--task needle:tokens=C,depth=D,seed=J`: a pass key in filler
            text, then the question; success = the answer contains the key).
            --needle-kind licence: "The access code for the <colour> vault is
            NNNN." planted in licence text (SmolLM2-135M misses it even with
            the full cache). Chat template on (SmolLM2-Instruct).

Equal memory: a learned policy runs first; its mean cache entries per (layer,
kv head) over the decode steps, E, sets the budget of the baselines run on the
same prompt: streaming_llm (4 sinks + E - 4 recent) and h2o (E/2 heavy + E/2
recent). trimkv and dbtrimkv take a budget themselves: they run at --budget M
per head against the baselines at M.

usage: quality.py --kvscope build/app/kvscope --model models/SmolLM2-135M-Instruct.Q4_1.gguf
         --policy NAME=SPEC [...] [--budget-policy NAME=SPEC ...] --budget M
         [--context 1024] [--new 48] [--samples 6] [--needles 10] --out results.json
SPEC is a --policy spec; for --budget-policy it may contain {M}.
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

LICENSES = ["GPL-3", "Apache-2.0", "MPL-2.0", "LGPL-2.1", "GFDL-1.3", "GPL-2", "Artistic", "CC0-1.0"]
CHARS_PER_TOKEN = 4.0  # English licence text in SmolLM2's tokenizer, measured from the traces


def licence_text(name):
    with open(os.path.join("/usr/share/common-licenses", name), encoding="utf-8", errors="replace") as f:
        return " ".join(f.read().split())


def capture(args, spec, prompt, out, new, chat=False, expect=None, task=None):
    """prompt: text, or None with task: a built-in `kvscope capture --task`."""
    pf = None
    if task is None:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(prompt)
            pf = f.name
    source = ["--task", task] if task else ["--prompt-file", pf]
    cmd = [args.kvscope, "capture", "--model", args.model] + source + ["--max-new", str(new),
           "--greedy", "--prefill-chunk", "8192", "--oracle", "--oracle-k", str(args.oracle_k), "-q",
           "--threads", str(args.threads), "--policy", spec, "-o", out]
    if chat:
        cmd.append("--chat")
    if expect:
        cmd += ["--expect", expect]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if pf:
        os.unlink(pf)
    if r.returncode != 0:
        sys.exit(f"capture failed ({spec}): {r.stderr[-2000:]}")
    with h5py.File(out, "r") as h:
        kind = h["steps/kind"][:]
        S = len(kind)
        dec = np.nonzero(kind[:S] == 1)[0]
        L, K = h["occupancy/entries"].shape[1:3]
        entries = h["steps/entries"][:S].astype(float) / (L * K)
        res = {
            "spec": spec,
            "prompt_tokens": int(h["steps/n_tokens"][0]) if kind[0] == 0 else None,
            "kl": float(np.mean(h["oracle/kl"][:S][dec])),
            "recall": float(np.mean(h["oracle/recall"][:S][dec])),
            "entries_per_head": float(np.mean(entries[dec])),
            "entries_after_prefill": float(entries[dec[0] - 1]),
            "seconds": time.time() - t0,
        }
        text = h["run"].attrs.get("prompt", "")
    if expect or task:
        res["success"] = "expected answer found" in r.stderr
    os.unlink(out)
    return res


def baselines(E):
    B = max(8, int(round(E)))
    return {
        "streaming_llm": f"streaming_llm:sinks=4,window={B - 4}",
        "h2o": f"h2o:heavy={B // 2},recent={B - B // 2}",
    }


def needle_prompt(text, chars, depth, colour, code):
    body = text[:chars]
    cut = body.rfind(". ", 0, int(len(body) * depth)) + 2
    fact = f"The access code for the {colour} vault is {code}. "
    return (body[:cut] + fact + body[cut:] + f"\n\nQuestion: What is the access code for the {colour} vault? "
            "Answer with the four-digit code only.")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvscope", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--policy", action="append", default=[], help="NAME=SPEC of a learned policy with its own memory")
    ap.add_argument("--budget-policy", action="append", default=[], help="NAME=SPEC with {M} for the budget")
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--context", type=int, default=1024, help="prompt tokens (approximate)")
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--samples", type=int, default=6)
    ap.add_argument("--needles", type=int, default=10)
    ap.add_argument("--needle-context", type=int, action="append", default=[])
    ap.add_argument("--needle-kind", choices=["passkey", "licence"], default="passkey",
                    help="passkey: kvscope's built-in task (--task needle:...); licence: an access code "
                         "planted in licence text (SmolLM2-135M misses it even with the full cache)")
    ap.add_argument("--oracle-k", type=int, default=16)
    ap.add_argument("--skip-full", action="store_true",
                    help="no full-cache run (each capture's oracle shadow gives its KL anyway)")
    ap.add_argument("--skip-baselines", action="store_true",
                    help="no streaming_llm/h2o runs (adding a policy to an earlier run's prompts)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    policies = dict(p.split("=", 1) for p in args.policy)
    budget_policies = dict(p.split("=", 1) for p in args.budget_policy)
    work = tempfile.mkdtemp(prefix="kvscope-gates-bench-")
    results = {"command": " ".join(sys.argv), "model": args.model, "context": args.context, "new": args.new,
               "budget": args.budget, "heldout": [], "needle": []}
    trace = os.path.join(work, "t.kvtrace.h5")

    # --- held-out text: KL and recall ---
    texts = [licence_text(n) for n in LICENSES]
    chars = int(args.context * CHARS_PER_TOKEN)
    samples = []
    for i in range(args.samples):
        t = texts[i % len(texts)]
        start = (i // len(texts)) * chars // 2
        samples.append(t[start:start + chars])
    for i, prompt in enumerate(samples):
        row = {"sample": i, "source": LICENSES[i % len(LICENSES)]}
        if not args.skip_full:
            row["full"] = capture(args, "full", prompt, trace, args.new)
        for name, spec in policies.items():
            r = capture(args, spec, prompt, trace, args.new)
            row[name] = r
            for b, bspec in baselines(r["entries_per_head"]).items():
                row[f"{name}/{b}"] = capture(args, bspec, prompt, trace, args.new)
        for name, spec in budget_policies.items():
            row[name] = capture(args, spec.replace("{M}", str(args.budget)), prompt, trace, args.new)
        for b, bspec in (baselines(args.budget) if budget_policies and not args.skip_baselines else {}).items():
            row[f"budget/{b}"] = capture(args, bspec, prompt, trace, args.new)
        results["heldout"].append(row)
        print(json.dumps({k: (v if not isinstance(v, dict) else {x: v[x] for x in ("kl", "recall", "entries_per_head")})
                          for k, v in row.items()}), flush=True)

    # --- planted fact retrieval ---
    colours = ["red", "green", "blue", "amber", "violet", "silver", "black", "white", "golden", "orange"]
    rng = np.random.default_rng(7)
    for ctx in args.needle_context or [args.context]:
        for j in range(args.needles):
            text = texts[j % len(texts)]
            depth = 0.1 + 0.8 * (j / max(1, args.needles - 1))
            code = str(int(rng.integers(1000, 9999)))
            if args.needle_kind == "passkey":
                prompt, task, expect, new = None, f"needle:tokens={ctx},depth={depth:.2f},seed={j}", None, 16
            else:
                prompt = needle_prompt(text, int(ctx * CHARS_PER_TOKEN), depth, colours[j % len(colours)], code)
                task, expect, new = None, code, 8

            def run(spec):
                return capture(args, spec, prompt, trace, new, chat=True, expect=expect, task=task)

            row = {"context": ctx, "depth": depth, "code": code}
            if not args.skip_full:
                row["full"] = run("full")
            for name, spec in policies.items():
                r = run(spec)
                row[name] = r
                for b, bspec in baselines(r["entries_per_head"]).items():
                    row[f"{name}/{b}"] = run(bspec)
            M = max(8, int(args.budget * ctx / args.context))
            for name, spec in budget_policies.items():
                row[name] = run(spec.replace("{M}", str(M)))
            for b, bspec in (baselines(M) if budget_policies and not args.skip_baselines else {}).items():
                row[f"budget/{b}"] = run(bspec)
            results["needle"].append(row)
            print(json.dumps({k: (v["success"], round(v["entries_per_head"], 1)) if isinstance(v, dict) else v
                              for k, v in row.items()}), flush=True)

    # --- summary ---
    def agg(rows, key, field):
        vals = [r[key][field] for r in rows if key in r]
        return float(np.mean(vals)) if vals else None

    summary = {}
    keys = sorted({k for r in results["heldout"] + results["needle"] for k, v in r.items() if isinstance(v, dict)})
    for k in keys:
        summary[k] = {
            "kl": agg(results["heldout"], k, "kl"),
            "recall": agg(results["heldout"], k, "recall"),
            "entries_per_head": agg(results["heldout"], k, "entries_per_head"),
            "needle_accuracy": agg(results["needle"], k, "success"),
            "needle_entries_per_head": agg(results["needle"], k, "entries_per_head"),
        }
    results["summary"] = summary
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print("\n%-40s %8s %8s %8s %8s" % ("policy", "KL", "recall", "entries", "needle"))
    for k, s in summary.items():
        f = lambda v, fmt: (fmt % v) if v is not None else "-"
        print("%-40s %8s %8s %8s %8s" % (k, f(s["kl"], "%.4f"), f(s["recall"], "%.3f"),
                                          f(s["entries_per_head"], "%.1f"), f(s["needle_accuracy"], "%.2f")))


if __name__ == "__main__":
    main()
