#!/usr/bin/env python3
"""Cross-checks KVScope's policies against NVIDIA kvpress on the same model and
prompt: the kept indices per (layer, kv head) after the prefill must match.

stories260K (llama2.c) is converted in memory to a transformers
LlamaForCausalLM (q/k rows permuted from interleaved to rotate-half RoPE, as
transformers' Llama converter does); KVScope runs the .bin through
`kvscope capture` (one prefill step) and the kept set is read back from the
trace's events with h5py. kvpress presses compress in the prefill hook.

usage: kvpress_check.py KVSCOPE_EXE SHARED_DIR WORK_DIR
"""
import copy
import os
import subprocess
import sys

import h5py
import torch

import kvpress

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from llama2c_hf import load_llama2c  # noqa: E402

PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
          "One day, she saw a big red ball under a tree. She ran to the ball and kicked it. The ball "
          "flew high and landed in the pond. Lily was sad. Her mom came and said")
BUDGET = 24


def kvscope_kept(exe, stories, work, spec):
    trace = os.path.join(work, spec.split(":")[0] + ".kvtrace.h5")
    subprocess.run([exe, "capture", "--model", os.path.join(stories, "stories260K.bin"),
                    "--tokenizer", os.path.join(stories, "tok512.bin"), "--prompt", PROMPT,
                    "--max-new", "1", "--prefill-chunk", "4096", "--capture", "events", "--policy", spec,
                    "-q", "-o", trace], check=True)
    with h5py.File(trace, "r") as f:
        ids = f["tokens/id"][:]
        prompt = int((f["tokens/role"][:] != 1).sum())
        L, K = int(f["run"].attrs["n_layers"]), int(f["run"].attrs["n_kv_heads"])
        kind, step = f["events/kind"][:], f["events/step"][:]
        layer, head, token = f["events/layer"][:], f["events/kv_head"][:], f["events/token"][:]
    kept = [[set() for _ in range(K)] for _ in range(L)]
    for k, s, l, h, t in zip(kind, step, layer, head, token):
        if s != 0:
            continue
        if k == 0:
            kept[l][h].add(int(t))
        elif k == 3:
            kept[l][h].discard(int(t))
    return ids[:prompt], kept


def kvpress_kept(model, ids, press):
    """Kept positions per (layer, kv head) and the uncompressed keys [L][K, T, hd]."""
    x = torch.tensor(ids, dtype=torch.long).unsqueeze(0)
    with torch.no_grad():
        full = model(x, use_cache=True).past_key_values
        with press(model):
            pressed = model(x, use_cache=True).past_key_values
    kept = []
    for l in range(len(model.model.layers)):
        fk, pk = full.layers[l].keys[0], pressed.layers[l].keys[0]  # [K, T, hd], [K, kept, hd]
        heads = []
        for h in range(fk.shape[0]):
            # Each kept key is the original key at one position: find it.
            match = (pk[h][:, None, :] == fk[h][None, :, :]).all(-1)  # [kept, T]
            assert (match.sum(1) == 1).all(), "kept key not found exactly once"
            heads.append(set(int(i) for i in match.float().argmax(1)))
        kept.append(heads)
    return kept, [full.layers[l].keys[0] for l in range(len(model.model.layers))]


def knorm_ties(keys, diffs):
    """Whether every knorm difference swaps keys of equal norm. Keys of the same
    token at layer 0 differ only by RoPE, a rotation: their norms are equal and
    only rounding (ours vs transformers' RoPE) decides which one is kept."""
    for l, h, only_ours, only_theirs in diffs:
        norms = keys[l][h].double().norm(dim=-1)
        ours = sorted(float(norms[p]) for p in only_ours)
        theirs = sorted(float(norms[p]) for p in only_theirs)
        if len(ours) != len(theirs) or any(abs(a - b) > 1e-5 * max(a, b) for a, b in zip(ours, theirs)):
            return False
    return True


def ratio_for(n, keep):
    r = (n - keep) / n
    while int(n * (1 - r)) < keep:
        r -= 1e-9
    from kvpress.utils import compute_n_kept
    assert compute_n_kept(n, r) == keep
    return r


def main():
    exe, shared, work = sys.argv[1], sys.argv[2], sys.argv[3]
    shared = os.environ.get("KVSCOPE_SHARED_DIR") or shared
    os.makedirs(work, exist_ok=True)
    stories = os.path.join(shared, "models", "stories260K")
    model = load_llama2c(os.path.join(stories, "stories260K.bin"), attn_implementation="eager")
    # Expected attention on stories260K reaches scores of 1e-80 (layer 1): in
    # float32 kvpress's softmax makes most of them exactly 0 and topk picks
    # among the ties arbitrarily. KVScope ranks the log scores exactly, so
    # kvpress runs that press on a float64 copy of the model.
    model64 = copy.deepcopy(model).double()
    from kvpress import (ExpectedAttentionPress, KnormPress, SnapKVPress, StreamingLLMPress, TOVAPress)

    cases = [
        ("streaming_llm:sinks=4,window=%d" % (BUDGET - 4), model,
         lambda r: StreamingLLMPress(compression_ratio=r, n_sink=4)),
        ("snapkv:budget=%d,window=8,kernel=5" % BUDGET, model,
         lambda r: SnapKVPress(compression_ratio=r, window_size=8, kernel_size=5)),
        ("tova:budget=%d" % BUDGET, model, lambda r: TOVAPress(compression_ratio=r)),
        ("knorm:budget=%d" % BUDGET, model, lambda r: KnormPress(compression_ratio=r)),
        ("expected_attention:budget=%d,sinks=4,n_future=512" % BUDGET, model64,
         lambda r: ExpectedAttentionPress(compression_ratio=r, n_future_positions=512, n_sink=4)),
    ]
    failures = 0
    print("kvpress %s, prompt of stories260K, budget %d per head" % (getattr(kvpress, "__version__", "?"), BUDGET))
    for spec, oracle, make in cases:
        ids, ours = kvscope_kept(exe, stories, work, spec)
        n = len(ids)
        theirs, keys = kvpress_kept(oracle, ids, make(ratio_for(n, BUDGET)))
        L, K = len(ours), len(ours[0])
        same = sum(ours[l][h] == theirs[l][h] for l in range(L) for h in range(K))
        diffs = [(l, h, sorted(ours[l][h] - theirs[l][h]), sorted(theirs[l][h] - ours[l][h]))
                 for l in range(L) for h in range(K) if ours[l][h] != theirs[l][h]]
        name = spec.split(":")[0]
        explained = True
        if name == "tova":
            # kvpress always keeps the last prompt token (F.pad with max + 1);
            # TOVA ranks it like any other. Any difference must be exactly that.
            explained = all(t == [n - 1] and len(o) == 1 for _, _, o, t in diffs)
        elif name == "knorm":
            explained = knorm_ties(keys, diffs)
        elif diffs:
            explained = False
        print("%-20s prompt %d tokens: %d/%d (layer, head) kept sets identical%s" %
              (name, n, same, L * K, "" if not diffs else
               (" (explained: %s)" % ("kvpress's last-token protection" if name == "tova" else
                                      "swaps of equal-norm keys") if explained else "")))
        for d in diffs[:5]:
            print("    layer %d head %d: only KVScope %s, only kvpress %s" % d)
        failures += not explained
    print("kvpress cross-check: %d of %d presses agree with KVScope" % (len(cases) - failures, len(cases)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
