#!/usr/bin/env python3
"""Cross-checks KVScope's policies against NVIDIA kvpress on the same model and
prompt: after the prefill, the kept set of every (layer, kv head) must be the
same, or each difference must be explained by a tie rule this script checks.

Models: stories260K (llama2.c, converted in memory to a transformers
LlamaForCausalLM with its q/k rows permuted from interleaved to rotate-half
RoPE, as transformers' Llama converter does) and SmolLM2-135M-Instruct (the
GGUF, loaded by transformers' GGUF loader: 30 layers, GQA 9/3) and qwen3_moe
(a random Qwen3-MoE configuration saved by transformers: routed and dense
layers, per-head q/k norms, GQA 8/2; SmolLM2's tokenizer makes its prompt). KVScope runs
the same weights through `kvscope capture` (one prefill step) and the kept
sets are read back from the trace's events with h5py. kvpress compresses in
its prefill hook; its kept positions are found by matching each kept key to
the uncompressed keys (presses that remove entries) or read from
`masked_key_indices` (presses that mask, as AdaKV does).

Tie rule (the default for every scorer press): a difference is explained when
every entry only one side kept scores, in kvpress's own scores (recorded from
the press's `score`), within 1e-4 of the head's largest |score| (leaving out
the sentinels for "kept anyway") of every entry only the other side kept: the two engines compute the same function in
different float32 orders, so only near-equal scores may fall either way.

usage: kvpress_check.py KVSCOPE_EXE SHARED_DIR MODELS_DIR WORK_DIR --model stories260K|smollm2|qwen3_moe
       [--only NAME] [--table]   (--table: one markdown row per press, for docs/policies/README.md)
"""
import argparse
import contextlib
import copy
import importlib.metadata
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import h5py  # noqa: E402
import torch  # noqa: E402

import kvpress  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, HERE)
from llama2c_hf import load_llama2c  # noqa: E402
from kvpress_cases import cases_for  # noqa: E402

STORIES_PROMPT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
                  "One day, she saw a big red ball under a tree. She ran to the ball and kicked it. The ball "
                  "flew high and landed in the pond. Lily was sad. Her mom came and said")
SMOL_TASK = "needle:tokens=300,depth=0.5,seed=1"
MOE_TASK = "needle:tokens=200,depth=0.5,seed=2"
TIE_TOLERANCE = 1e-4


def random_qwen3_moe(path):
    """kvpress_cases.QWEN3_MOE with seeded weights of enough spread that the
    router's choices and the attention differ by token, saved as an HF
    directory (fp32) for both engines."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from kvpress_cases import QWEN3_MOE
    torch.manual_seed(5)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**QWEN3_MOE)).eval()
    g = torch.Generator().manual_seed(17)
    with torch.no_grad():
        for n, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.2 * noise if "norm" in n else 0.1 * noise if "embed" in n else 0.2 * noise)
    model.save_pretrained(path, safe_serialization=True)
    return path


class Model:
    """One model as both engines see it: KVScope's command-line arguments,
    transformers' modules (eager attention, and the default for presses that
    refuse eager) and the prompt's token ids."""

    def __init__(self, name, exe, shared, models, work):
        self.name, self.exe, self.work = name, exe, work
        if name == "stories260K":
            d = os.path.join(shared, "models", "stories260K")
            self.args = ["--model", os.path.join(d, "stories260K.bin"), "--tokenizer", os.path.join(d, "tok512.bin"),
                         "--prompt", STORIES_PROMPT]
            self.eager = load_llama2c(os.path.join(d, "stories260K.bin"), attn_implementation="eager")
            self.sdpa = load_llama2c(os.path.join(d, "stories260K.bin"), attn_implementation="sdpa")
        elif name == "smollm2":
            gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
            if not os.path.exists(os.path.join(models, gguf)):
                sys.exit(os.path.join(models, gguf) + " is missing: run scripts/fetch-models")
            self.args = ["--model", os.path.join(models, gguf), "--task", SMOL_TASK, "--chat"]
            from transformers import AutoModelForCausalLM
            # Dequantizing the GGUF takes transformers ~16 s: once, and the
            # SDPA model is a copy with the other attention.
            self.eager = AutoModelForCausalLM.from_pretrained(
                models, gguf_file=gguf, attn_implementation="eager", dtype=torch.float32).eval()
            self.sdpa = copy.deepcopy(self.eager)
            self.sdpa.set_attn_implementation("sdpa")
            assert (self.eager.config._attn_implementation, self.sdpa.config._attn_implementation) == ("eager", "sdpa")
        elif name == "qwen3_moe":
            gguf = os.path.join(models, "SmolLM2-135M-Instruct.Q4_1.gguf")
            if not os.path.exists(gguf):
                sys.exit(gguf + " is missing (its tokenizer serves the random model): run scripts/fetch-models")
            d = random_qwen3_moe(os.path.join(work, "qwen3_moe"))
            # kvpress applies Qwen3's per-head q/k norms when it recomputes
            # queries or keys from hidden states only for modules that are
            # Qwen3Attention (kvpress/utils.py, isinstance); Qwen3-MoE's
            # attention computes the same in a class of its own, so without
            # this kvpress would score un-normed queries (its omission, not a
            # difference of method).
            import kvpress.utils
            from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeAttention
            kvpress.utils.Qwen3Attention = (kvpress.utils.Qwen3Attention, Qwen3MoeAttention)
            import logging
            logging.getLogger("kvpress").setLevel(logging.ERROR)  # "model not tested", per press
            self.args = ["--model", d, "--tokenizer", gguf, "--task", MOE_TASK]
            from transformers import AutoModelForCausalLM
            load = lambda attn: AutoModelForCausalLM.from_pretrained(  # noqa: E731
                d, attn_implementation=attn, dtype=torch.float32).eval()
            self.eager, self.sdpa = load("eager"), load("sdpa")
        else:
            sys.exit("--model: expected stories260K, smollm2 or qwen3_moe, got " + name)
        self._float64 = None
        ids, _, _ = self.capture("full", "full")
        self.ids = ids  # the prompt
        self.layers = self.eager.config.num_hidden_layers
        self.kv_heads = self.eager.config.num_key_value_heads

    def context_length(self):
        """The prompt's tokens before its question (--query after)."""
        if not hasattr(self, "_context"):
            self._context = len(self.capture("full-after", "full", extra=("--query", "after"))[0])
        return self._context

    def float64(self):
        """A float64 copy (presses whose scores underflow float32)."""
        if self._float64 is None:
            self._float64 = copy.deepcopy(self.eager).double()
        return self._float64

    def capture(self, label, spec, decode=0, extra=()):
        """KVScope's prompt ids, kept sets [layer][head] after the prefill and
        `decode` decode steps, and the trace; with decode > 0 the ids are the
        prompt's followed by the `decode` tokens those steps fed."""
        trace = os.path.join(self.work, "%s-%s.kvtrace.h5" % (self.name, label))
        r = subprocess.run([self.exe, "capture", *self.args, "--max-new", str(decode + 1), "--ignore-eos",
                            "--prefill-chunk", "100000", "--capture", "events", "--policy", spec,
                            *extra, "-q", "-o", trace], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("kvscope capture --policy %s failed:\n%s" % (spec, r.stderr))
        with h5py.File(trace, "r") as f:
            ids = f["tokens/id"][:]
            # A policy's inserted tokens (RestoreKV's restore tokens: ids past
            # the model's vocabulary) are left out; positions map back to the
            # prompt's.
            inserted = ids >= self.eager.config.vocab_size if hasattr(self, "eager") else ids < 0
            position = {}
            for p, gone in enumerate(inserted):
                if not gone:
                    position[p] = len(position)
            ids = ids[~inserted]
            prompt = int((f["tokens/role"][:][~inserted] != 1).sum())
            if json.loads(f["run"].attrs["run_json"]).get("query") == "after":
                # --query after: the prompt the policy compressed ends where
                # the forced question begins (the first decode step's token).
                kinds, first = f["steps/kind"][:], f["steps/first_token"][:]
                prompt = int(first[int((kinds != 1).sum())])
            L, K = int(f["run"].attrs["n_layers"]), int(f["run"].attrs["n_kv_heads"])
            kind, step = f["events/kind"][:], f["events/step"][:]
            # Steps before the first decode step: the prefill and a policy's
            # context-reconstruction steps (kind 2, format 1.5).
            first_decode = int((f["steps/kind"][:] != 1).sum())
            layer, head, token = f["events/layer"][:], f["events/kv_head"][:], f["events/token"][:]
        kept = [[set() for _ in range(K)] for _ in range(L)]
        for k, s, l, h, t in zip(kind, step, layer, head, token):
            if s >= first_decode + decode:
                continue
            if int(t) not in position:
                continue
            if k == 0:
                kept[l][h].add(position[int(t)])
            elif k == 3:
                kept[l][h].discard(position[int(t)])
        if decode:
            assert len(ids) >= prompt + decode, "the capture stopped before %d decode steps" % decode
        return [int(i) for i in ids[:prompt + decode]], kept, trace


@contextlib.contextmanager
def recording_scores(press, T=None):
    """Records what the outermost scorer inside `press` returns from score(),
    per layer: {layer: tensor [K, T]}. A press that scores the prompt chunk by
    chunk in order (ChunkPress) has its pieces joined; otherwise the first
    call's scores (the whole prompt) stand."""
    pieces = {}
    scores = {}
    inner = press
    while not hasattr(inner, "score") and hasattr(inner, "press"):
        inner = inner.press
    if not hasattr(inner, "score"):
        yield scores
        return
    original = inner.score

    def score(module, *a, **kw):
        s = original(module, *a, **kw)
        pieces.setdefault(module.layer_idx, []).append(s[0].detach().double().clone())
        return s

    inner.score = score
    try:
        yield scores
    finally:
        del inner.score
        for l, ps in pieces.items():
            joined = sum(p.shape[-1] for p in ps) == T and len(ps) > 1
            scores[l] = torch.cat(ps, dim=-1) if joined else ps[0]


def scorer_leaves(press):
    """The ScorerPress objects inside a (wrapped) press: the ones whose
    compress() cuts the cache."""
    out, todo = [], [press]
    while todo:
        p = todo.pop()
        if isinstance(p, kvpress.ScorerPress):
            out.append(p)
        for attr in ("press", "base_press", "prefilling_press", "decoding_press"):
            if getattr(p, attr, None) is not None:
                todo.append(getattr(p, attr))
        todo.extend(getattr(p, "presses", []) or [])
    return out


def kvpress_kept_decoding(model, ids, press, decode):
    """kvpress's kept positions after the prefill and `decode` decode steps
    (the last `decode` ids fed one at a time with their positions, as
    kvpress's pipeline does). After a compression the later keys are not those
    of an uncompressed run, so positions are tracked through every compress()
    call instead: its output rows are copies of its input rows."""
    T, L = len(ids) - decode, len(model.model.layers)
    K = model.config.num_key_value_heads
    held = {l: [list(range(T)) for _ in range(K)] for l in range(L)}
    # The latest score each position got, by absolute position (for the tie rules).
    scores = {l: torch.full((K, len(ids)), float("nan"), dtype=torch.float64) for l in range(L)}
    leaves = scorer_leaves(press)
    assert leaves, "no ScorerPress inside the press"

    def scored(original):
        def score(module, *a, **kw):
            s = original(module, *a, **kw)
            l = module.layer_idx
            for h in range(K):
                scores[l][h, held[l][h]] = s[0, h].detach().double()
            return s
        return score

    def tracked(original):
        def compress(module, hidden_states, keys, values, attentions, kwargs):
            before = values.clone()  # CAMPress adds merged values in place
            k2, v2 = original(module, hidden_states, keys, values, attentions, kwargs)
            l = module.layer_idx
            for h in range(K):
                match = (k2[0, h][:, None, :] == keys[0, h][None, :, :]).all(-1)  # [kept, n]
                assert (match.sum(1) >= 1).all(), "a kept key matches no key before compress()"
                rows = match.float().argmax(1).tolist()
                # Kept entries whose value changed absorbed a merge.
                for i in (v2[0, h] != before[0, h][rows]).any(-1).nonzero().flatten().tolist():
                    absorbed.add((step[0], l, h, held[l][h][rows[i]]))
                held[l][h] = [held[l][h][r] for r in rows]
            return k2, v2
        return compress

    # CAMPress cuts in its own compress() (merging first), calling only its
    # base press's score(); the other decoding presses cut in the leaf's.
    cutters = [press] if type(press).__name__ == "CAMPress" else leaves
    absorbed, step = set(), [0]  # (step, layer, kv head, position) that absorbed a merge
    for cutter in cutters:
        cutter.compress = tracked(cutter.compress)
    for leaf in leaves:
        leaf.score = scored(leaf.score)
    x = torch.tensor(ids, dtype=torch.long).unsqueeze(0)
    try:
        with torch.no_grad(), press(model):
            cache = model(x[:, :T], use_cache=True).past_key_values
            for i in range(T, len(ids)):
                for l in range(L):
                    for h in range(K):
                        held[l][h].append(i)
                pos = torch.tensor([[i]])
                step[0] = i - T + 1  # the trace's step: the prefill is step 0
                cache = model(x[:, i:i + 1], past_key_values=cache, use_cache=True, position_ids=pos,
                              cache_position=pos[0]).past_key_values
    finally:
        for cutter in cutters:
            del cutter.compress
        for leaf in leaves:
            del leaf.score
    press.absorbed = absorbed
    for l in range(L):
        assert cache.layers[l].keys.shape[2] == len(held[l][0]), "position tracking lost a row"
    return [[set(held[l][h]) for h in range(K)] for l in range(L)], scores


def rerotated_kept(model, full, pressed, prefer):
    """Kept positions of one layer for presses that re-rotate the kept keys
    (KeyRerotationPress: the i-th kept entry, in position order, carries RoPE
    position i). Row i is entry p when its value is the full cache's value at
    p and its key, rotated forward by p - i, is the full cache's key at p.
    A token repeated at layer 0 has the same pre-RoPE key and value at every
    copy, so the pressed cache cannot say which copy it holds: of the copies
    that keep the rows in position order, the one KVScope kept (`prefer`) is
    taken, else the first."""
    fk, pk = full.keys[0], pressed.keys[0]      # [K, T, hd], [K, kept, hd]
    fv, pv = full.values[0], pressed.values[0]
    T = fk.shape[1]
    cos, sin = model.model.rotary_emb(fk, torch.arange(T).unsqueeze(0))  # [1, T, hd]
    cos, sin = cos[0].to(fk.dtype), sin[0].to(fk.dtype)
    half = fk.shape[-1] // 2
    scale = float(fk.abs().max())
    heads = []
    for h in range(fk.shape[0]):
        match = (pv[h][:, None, :] == fv[h][None, :, :]).all(-1)  # [kept, T]
        fits = []  # per row, the entries it can be (in position order)
        for i in range(pk.shape[1]):
            x = pk[h][i]
            row = []
            for p in match[i].nonzero().flatten().tolist():
                if p < i:
                    continue
                turned = x * cos[p - i] + torch.cat([-x[half:], x[:half]]) * sin[p - i]
                if float((turned - fk[h][p]).abs().max()) <= 1e-4 * scale:
                    row.append(p)
            assert row, "kept row %d of head %d is no rotated original entry" % (i, h)
            fits.append(row)
        # The latest entry each row can be with the rows after it still in
        # order; then, left to right, KVScope's choice where it fits.
        latest = [0] * len(fits)
        bound = T
        for i in reversed(range(len(fits))):
            below = [p for p in fits[i] if p < bound]
            assert below, "kept rows of head %d are in no position order" % h
            latest[i] = bound = below[-1]
        chosen, last = [], -1
        for i, row in enumerate(fits):
            ok = [p for p in row if last < p <= latest[i]]
            preferred = [p for p in ok if p in prefer[h]]
            last = preferred[0] if preferred else ok[0]
            chosen.append(last)
        heads.append(set(chosen))
    return heads


def with_delimiter(ids, press, question, vocab_size):
    """FinchPress's input: the prompt with a delimiter token before its last
    `question` tokens (the press's embedding hook finds the question by it and
    removes it, so the model sees the prompt itself). The delimiter is a
    token id the prompt does not use."""
    press.delimiter_token_id = next(t for t in range(vocab_size - 1, -1, -1) if t not in set(ids))
    return ids[:len(ids) - question] + [press.delimiter_token_id] + ids[len(ids) - question:]


_FULL_CACHES = {}


def full_cache(model, ids):
    """The uncompressed cache of `ids` (read-only): the same for every press of
    a model, so computed once per model and prompt."""
    key = (id(model), tuple(ids))
    if key not in _FULL_CACHES:
        with torch.no_grad():
            x = torch.tensor(ids, dtype=torch.long).unsqueeze(0)
            _FULL_CACHES[key] = model(x, use_cache=True).past_key_values
    return _FULL_CACHES[key]


def kvpress_kept(model, ids, press, masks=False, decode=0, by_values=None, question=0):
    """kvpress's kept positions per (layer, kv head) after the prefill (and
    `decode` decode steps), and the scores its scorer gave."""
    if decode:
        return kvpress_kept_decoding(model, ids, press, decode)
    x = torch.tensor(ids, dtype=torch.long).unsqueeze(0)
    pressed_ids = with_delimiter(ids, press, question, model.config.vocab_size) if question else ids
    with torch.no_grad():
        full = full_cache(model, ids)
        with recording_scores(press, len(ids)) as scores, press(model):
            pressed = model(torch.tensor(pressed_ids, dtype=torch.long).unsqueeze(0),
                            use_cache=True).past_key_values
    L = len(model.model.layers)
    kept = []
    for l in range(L):
        fk, pk = full.layers[l].keys[0], pressed.layers[l].keys[0]  # [K, T, hd], [K, kept, hd]
        heads = []
        if masks:
            # Masking presses keep the whole cache and hide entries from attention.
            masked = getattr(model.model.layers[l].self_attn, "masked_key_indices", None)
            for h in range(fk.shape[0]):
                gone = set()
                if masked is not None:
                    _, hh, ss = masked
                    gone = {int(s) for hi, s in zip(hh.tolist(), ss.tolist()) if hi == h}
                heads.append(set(range(fk.shape[1])) - gone)
            model.model.layers[l].self_attn.masked_key_indices = None
        else:
            if by_values is not None:  # KVScope's kept sets, [layer][head]
                heads = rerotated_kept(model, full.layers[l], pressed.layers[l], by_values[l])
                kept.append(heads)
                continue
            for h in range(fk.shape[0]):
                match = (pk[h][:, None, :] == fk[h][None, :, :]).all(-1)  # [kept, T]
                assert (match.sum(1) >= 1).all(), "a kept key matches no original key"
                # Equal keys (same token and position) cannot occur; the first match is the key.
                heads.append(set(int(i) for i in match.float().argmax(1)))
        kept.append(heads)
    return kept, scores


class _FixedTokenizer:
    """What KVzipPress asks of a tokenizer, answered with the ids KVScope fed
    (the stories260K tokenizer is llama2.c's, which transformers cannot load).
    With a template ("PREFIX%sSUFFIX"), a chat template whose rendering of a
    user message puts the content between the table's PREFIX and SUFFIX."""

    def __init__(self, table, template=None):
        self.table = table
        self.chat_template = template

    def apply_chat_template(self, messages, **kwargs):
        return self.chat_template % messages[0]["content"]

    def encode(self, text, return_tensors=None, add_special_tokens=False):
        return torch.tensor([self.table[text]], dtype=torch.long).reshape(1, -1)


def kvzip_kept(model, ids, press, trace, after=None):
    """KVzipPress's kept positions after its reconstruction pass (it masks:
    masked_key_indices) and its scores [K, T] per layer. Its repeat prompts are
    tokenized as KVScope tokenized them: the trace's /reconstruction rows are,
    per chunk, prompt + (the previous chunk's tail) + suffix + the chunk. A
    chat prompt (policy_params prefix and question): kvpress gets the prompt
    before its generation prompt as the context, the template's prefix and
    suffix from a tokenizer with a chat template, and the generation prompt
    counts as kept (kvpress compresses before the question is fed). `after`
    (model, cache, context length) runs on the compressed cache while the
    masks are still in place."""
    import types
    import kvpress.presses.kvzip_press as kz
    from transformers import DynamicCache
    with h5py.File(trace, "r") as f:
        rstep, rid = f["reconstruction/step"][:], f["reconstruction/id"][:]
        params = json.loads(f["run"].attrs["policy_params"])
    prefix, question = int(params.get("prefix", 0)), int(params.get("question", 0))
    fed = [[int(t) for t in rid[rstep == s]] for s in sorted(set(rstep.tolist()))]
    T, chunk = len(ids), press.chunk_size
    n = T - question  # kvpress's context: the prompt before the question's place
    pieces = [ids[s:min(n, s + chunk)] for s in range(prefix, n, chunk)]
    assert len(fed) == len(pieces), "KVScope fed %d chunks, kvpress makes %d" % (len(fed), len(pieces))
    heads = [f[:len(f) - len(p)] for f, p in zip(fed, pieces)]
    assert all(f[len(f) - len(p):] == p for f, p in zip(fed, pieces)), "a chunk does not end with its context"
    first = "\n\nRepeat the previous context exactly."
    nxt = "\n\nRepeat the part of the previous context exactly, starting with"
    template = None
    if question:
        suffix = ids[n:]
        table = {"PREFIX": ids[:prefix], "SUFFIX": suffix, first: heads[0][:len(heads[0]) - len(suffix)]}
        if len(heads) > 1:
            tail = pieces[0][-8:]
            table[nxt] = heads[1][:len(heads[1]) - len(suffix) - len(tail)]
        template = "PREFIX%sSUFFIX"
    # The global budget exactly: KVScope keeps L * K * budget entries in all,
    # and a per-head ratio can round kvpress's count of the whole cache by one or two.
    budget = max(1, T // 4)
    L, K = model.config.num_hidden_layers, model.config.num_key_value_heads
    press.compression_ratio = (L * K * (n - budget) + 0.5) / (L * K * n)
    if not question:
        table = {"": [], "\n": [], first: heads[0]}
        if len(heads) > 1:  # heads[1] = Q1 + tail + S, heads[0] = Q0 + S: find |S|
            tail = pieces[0][-8:]
            s = next(s for s in range(len(heads[0]) + 1)
                     if heads[1][len(heads[1]) - s - len(tail):len(heads[1]) - s] == tail
                     and heads[0][len(heads[0]) - s:] == heads[1][len(heads[1]) - s:])
            table = {"": [], "\n": heads[0][len(heads[0]) - s:], first: heads[0][:len(heads[0]) - s],
                     nxt: heads[1][:len(heads[1]) - s - len(tail)]}
    recorded = []
    original = press.compress_post

    def compress_post(m):
        recorded.append(press.score_val[:, 0].detach().double().clone())  # [L, K, T], before the sinks
        original(m)

    press.compress_post = compress_post
    saved = kz.AutoTokenizer
    kz.AutoTokenizer = types.SimpleNamespace(from_pretrained=lambda *a, **k: _FixedTokenizer(table, template))
    try:
        x = torch.tensor(ids[:n], dtype=torch.long).unsqueeze(0)
        cache = DynamicCache(config=model.config)
        with torch.no_grad(), press(model):
            model(input_ids=x, past_key_values=cache, use_cache=True)
    finally:
        kz.AutoTokenizer = saved
        del press.compress_post
    if after:
        with torch.no_grad():
            after(model, cache, n)
    L, K = len(model.model.layers), model.config.num_key_value_heads
    kept = []
    for l in range(L):
        attn = model.model.layers[l].self_attn
        _, hh, ss = attn.masked_key_indices
        attn.masked_key_indices = None
        gone = [set() for _ in range(K)]
        for h, s in zip(hh.tolist(), ss.tolist()):
            gone[h].add(int(s))
        kept.append([set(range(n)) - gone[h] | set(range(n, T)) for h in range(K)])
    scores = {l: recorded[0][l] for l in range(L)}
    return kept, scores


def kvcompose_kept(model, ids, press, trace):
    """KVComposePress's kept positions per (layer, kv head): the masks it
    builds after its second reading of the context (its structured variant
    then stacks the kept rows, which loses their positions), and its scores
    [K, T] per layer after the mean across heads."""
    from transformers import DynamicCache
    got = {}
    original = press.compress_cache

    def compress_cache(m):
        got["kept"] = [[set(int(p) for p in mask.nonzero().flatten()) for mask in row]
                       for row in press.important_mask_per_kv_head]
        got["scores"] = press.scores.detach().double().clone()
        original(m)

    press.compress_cache = compress_cache
    try:
        x = torch.tensor(ids, dtype=torch.long).unsqueeze(0)
        with torch.no_grad(), press(model):
            model(input_ids=x, past_key_values=DynamicCache(config=model.config), use_cache=True)
    finally:
        del press.compress_cache
    return got["kept"], {l: got["scores"][l] for l in range(got["scores"].shape[0])}


def trace_pruned_channels(trace, L, K):
    """The key channels each (layer, kv head) dropped: the trace's /key_channels."""
    with h5py.File(trace, "r") as f:
        layer, head, channel = (f["key_channels/" + c][:] for c in ("layer", "kv_head", "channel"))
    pruned = [[set() for _ in range(K)] for _ in range(L)]
    for l, h, c in zip(layer, head, channel):
        pruned[l][h].add(int(c))
    return pruned


def think_pruned(model, ids, press, trace):
    """The key channels ThinKPress zeroed per (layer, kv head): those where
    every pressed prompt key is exactly 0 and the full cache's keys are not,
    with its channel scores (recomputed as ThinKPress computes them)."""
    x = torch.tensor(ids, dtype=torch.long).unsqueeze(0)
    full = full_cache(model, ids)
    with torch.no_grad(), press(model):
        pressed = model(x, use_cache=True).past_key_values
    pruned, scores = [], {}
    for l in range(len(model.model.layers)):
        fk, pk = full.layers[l].keys[0], pressed.layers[l].keys[0]  # [K, T, hd]
        zero = (pk == 0).all(1) & ~(fk == 0).all(1)  # [K, hd]
        pruned.append([set(int(c) for c in zero[h].nonzero().flatten()) for h in range(fk.shape[0])])
        scores[l] = fk.pow(2).mean(1)  # the key half of the score: ties show there first
    return pruned, scores


def near_ties(scores, diffs, tolerance=TIE_TOLERANCE):
    """The default tie rule (module docstring)."""
    for l, h, only_ours, only_theirs in diffs:
        if l not in scores:
            return False
        s = scores[l][h]
        # The scale of the real scores: presses mark entries they keep anyway
        # with float32's largest value (or inf), which must not widen it.
        real = s[torch.isfinite(s) & (s.abs() < 1e30)]
        scale = float(real.abs().max()) if real.numel() else 0.0
        a = [float(s[p]) for p in only_ours]
        b = [float(s[p]) for p in only_theirs]
        if not a or not b or max(b) - min(a) > tolerance * scale:
            return False
    return True


def ratio_for(n, keep):
    """The compression_ratio for which kvpress keeps exactly `keep` of n."""
    from kvpress.utils import compute_n_kept
    r = (n - keep) / n
    while compute_n_kept(n, r) < keep:
        r -= 1e-9
    assert compute_n_kept(n, r) == keep
    return r


def check_merges(absorbed, trace):
    """The entries that absorbed merged values (kvpress: kept rows whose value
    compress() changed) are, per step, layer and kv head, the `into` entries
    of the trace's /merges: the same candidates, windows and seeded draws."""
    with h5py.File(trace, "r") as f:
        ours = set(zip(*[f["merges/" + c][:].tolist() for c in ("step", "layer", "kv_head", "into")]))
    assert absorbed, "kvpress merged nothing: the case checks no merge"
    assert ours == absorbed, "merges differ: %d only in KVScope's trace, %d only in kvpress's (e.g. %s)" % (
        len(ours - absorbed), len(absorbed - ours), sorted(ours ^ absorbed)[:4])


def run_case(model, case):
    n = len(model.ids)
    budget = case.budget(n)
    spec = case.spec(budget, n)
    extra = ("--query", "after") if case.query_after else ()
    if case.query_after:  # the budget follows the context's length
        n = model.context_length()
        budget = case.budget(n)
        spec = case.spec(budget, n)
    ids, ours, trace = model.capture(case.name, spec, case.decode, extra)
    if case.query_after:
        assert len(ids) == n < len(model.ids), "--query after: the prompt is not the context part"
    assert ids[:n] == model.ids[:n], "the prompt differs between captures"
    oracle = model.float64() if case.float64 else (model.sdpa if case.sdpa else model.eager)
    torch.manual_seed(case.seed)
    press = case.press(ratio_for(n, budget), model)
    if case.runner:
        theirs, scores = case.runner(oracle, ids, press, trace)
    else:
        theirs, scores = kvpress_kept(oracle, ids, press, masks=case.masks, decode=case.decode,
                                      by_values=ours if case.by_values else None, question=case.question)
    if getattr(press, "absorbed", None):
        check_merges(press.absorbed, trace)
    L, K = len(ours), len(ours[0])
    if case.channels:
        ours = trace_pruned_channels(trace, L, K)
    same = sum(ours[l][h] == theirs[l][h] for l in range(L) for h in range(K))
    diffs = [(l, h, sorted(ours[l][h] - theirs[l][h]), sorted(theirs[l][h] - ours[l][h]))
             for l in range(L) for h in range(K) if ours[l][h] != theirs[l][h]]
    explained = not diffs or (case.tie or (lambda d, s, m: near_ties(s, d)))(diffs, scores, model)
    held = sum(len(ours[l][h]) for l in range(L) for h in range(K))
    return spec, n, held / float(L * K), same, L * K, diffs, explained


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe")
    ap.add_argument("shared")
    ap.add_argument("models")
    ap.add_argument("work")
    ap.add_argument("--model", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--table", action="store_true")
    a = ap.parse_args()
    shared = os.environ.get("KVSCOPE_SHARED_DIR") or a.shared
    models = os.environ.get("KVSCOPE_MODELS_DIR") or a.models
    os.makedirs(a.work, exist_ok=True)
    torch.set_num_threads(1)
    model = Model(a.model, a.exe, shared, models, a.work)
    cases = [c for c in cases_for(a.model) if not a.only or c.name in a.only.split(",")]
    print("kvpress %s on %s (%d layers x %d kv heads), prompt of %d tokens" %
          (importlib.metadata.version("kvpress"), a.model, model.layers, model.kv_heads, len(model.ids)))
    failures, rows = [], []
    for case in cases:
        started = time.monotonic()
        try:
            spec, n, mean_kept, same, total, diffs, explained = run_case(model, case)
        except Exception as e:  # one press's failure must not hide the others
            print("%-22s FAILED: %s" % (case.name, e))
            failures.append(case.name)
            continue
        why = case.why if diffs and explained else ""
        what = ("pruned %5.1f key channels per head" % mean_kept if case.channels else
                "kept %5.1f of %d per head" % (mean_kept, n))
        sets = "pruned channel sets" if case.channels else "kept sets"
        print("%-22s %-18s %s: %d/%d (layer, head) %s identical%s [%.1f s]" %
              (case.name, case.press_name, what, same, total, sets,
               "" if not diffs else " (explained: %s)" % why if explained else " NOT EXPLAINED",
               time.monotonic() - started))
        for d in diffs[:4]:
            print("    layer %d head %d: only KVScope %s, only kvpress %s" % d)
        rows.append((case.name, case.press_name, same, total, len(diffs), explained, why))
        if not explained:
            failures.append(case.name)
    if a.table:
        for name, press, same, total, nd, ok, why in rows:
            print("| `%s` | %s | %s | %d/%d | %s |" % (name, press, a.model, same, total,
                                                   "identical" if not nd else why if ok else "differs"))
    print("kvpress cross-check on %s: %d of %d presses agree with KVScope%s" %
          (a.model, len(cases) - len(failures), len(cases),
           "" if not failures else " (failed: %s)" % ", ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
