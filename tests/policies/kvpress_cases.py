"""The presses kvpress_check.py compares, one Case each: KVScope's spec, the
kvpress press, and the tie rule that may explain a difference (None: the
default near-tie rule on kvpress's own scores)."""
from dataclasses import dataclass
from typing import Callable, Optional

import kvpress


@dataclass
class Case:
    name: str                      # KVScope policy name (the case's label)
    press_name: str                # kvpress class
    spec: Callable                 # (budget, prompt tokens) -> KVScope spec
    press: Callable                # (compression_ratio, Model) -> press
    budget: Callable = lambda n: max(1, n // 4)  # entries kept per head
    float64: bool = False          # kvpress runs on a float64 copy of the model
    sdpa: bool = False             # the press refuses eager attention
    masks: bool = False            # the press masks (masked_key_indices) instead of removing
    seed: int = 0                  # torch.manual_seed before the press is built and run
    decode: int = 0                # decode steps before the kept sets are compared
    by_values: bool = False        # find kvpress's kept entries by their values (keys re-rotated)
    question: int = 0              # FinchPress: a delimiter before the prompt's last `question` tokens
    runner: Optional[Callable] = None  # (model, ids, press, KVScope's trace) -> (kept, scores)
    channels: bool = False         # compare pruned key channel sets (the runner's), not kept tokens
    query_after: bool = False      # KVScope --query after: kvpress compresses the context alone
    tie: Optional[Callable] = None  # (diffs, kvpress scores, Model) -> explained?
    why: str = "near-equal scores (within 1e-4 of the head's largest)"


def tova_tie(diffs, scores, model):
    """kvpress always keeps the last prompt token (F.pad with max + 1); TOVA
    ranks it like any other. Any difference must be exactly that."""
    n = len(model.ids)
    return all(t == [n - 1] and len(o) == 1 for _, _, o, t in diffs)


def keeps_window(window):
    """The entropy gate of kvpress can cut SnapKV's observation window (its
    tokens all score max + 1, so a chunk holding some of them and a few others
    looks spiky); KVScope keeps a scorer's protected entries whatever the
    selection. Any difference must be only that: KVScope keeps some of the
    last `window` prompt entries kvpress dropped, nothing else differs."""
    def rule(diffs, scores, model):
        n = len(model.ids)
        return all(not t and all(p >= n - window for p in o) for _, _, o, t in diffs)
    return rule


def knorm_tie(diffs, scores, model):
    """Swaps of keys of equal norm: keys of one token at layer 0 differ only by
    RoPE, a rotation, so their norms are equal; KVScope breaks the tie by
    position, kvpress by the rounding of its RoPE."""
    for l, h, only_ours, only_theirs in diffs:
        s = scores[l][h]  # -||k||
        ours = sorted(float(s[p]) for p in only_ours)
        theirs = sorted(float(s[p]) for p in only_theirs)
        if len(ours) != len(theirs) or any(abs(a - b) > 1e-5 * abs(b) for a, b in zip(ours, theirs)):
            return False
    return True


def qfilter_press(ratio, model, name):
    """kvpress's QFilterPress with KVScope's calibrated filters (kvpress would
    download its own from the Hugging Face hub). kvpress keeps the highest
    -(f . k); KVScope the highest u . k: f = -u."""
    import os
    import torch
    from safetensors.torch import load_file
    here = os.path.dirname(os.path.abspath(__file__))
    t = load_file(os.path.join(here, "..", "..", "resources", "gates", name + "-qfilter.safetensors"))
    press = kvpress.QFilterPress(compression_ratio=ratio)
    press.q_filters = [-t["layers.%d.qfilter" % l] for l in range(len(t))]
    press.post_init_from_model = lambda model: None
    return press


def kvzap_press(ratio, model, name):
    """kvpress's KVzapPress (linear) with KVScope's fitted surrogate as its
    kvzap_model (kvpress would download NVIDIA's from the Hugging Face hub,
    which has none for these models)."""
    import os
    from safetensors.torch import load_file
    from kvpress.presses.kvzap_press import KVzapConfig, KVzapModel
    here = os.path.dirname(os.path.abspath(__file__))
    t = load_file(os.path.join(here, "..", "..", "resources", "gates", name + "-kvzap.safetensors"))
    layers = len(t) // 2
    k, d = t["layers.0.kvzap.weight"].shape
    surrogate = KVzapModel(KVzapConfig(input_dim=d, output_dim=k, n_modules=layers, hidden_dim=None))
    for l in range(layers):
        surrogate.layers[l].weight.data = t["layers.%d.kvzap.weight" % l].clone()
        surrogate.layers[l].bias.data = t["layers.%d.kvzap.bias" % l].clone()
    press = kvpress.KVzapPress(compression_ratio=ratio, model_type="linear")
    press.kvzap_model = surrogate.eval()
    press.post_init_from_model = lambda model: None
    return press


def fastkvzip_press(model, name):
    """kvpress's FastKVzipPress with KVScope's trained gates as its modules
    (kvpress would download the authors' from the Hugging Face hub, which has
    none for these models), pruning L*K*(n - budget) entries in all."""
    import os
    from safetensors.torch import load_file
    import torch
    from kvpress.presses.fastkvzip_press import FastKVzipGate
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "resources", "gates", name + "-fastkvzip.safetensors")
    t = load_file(path)
    n, L, K = len(model.ids), model.layers, model.kv_heads
    q_rows, d = t["layers.0.fastkvzip.q_proj.weight"].shape
    dim = t["layers.0.fastkvzip.q_norm.weight"].shape[0]
    base = t["layers.0.fastkvzip.k_base"].shape[2]
    gates = []
    for l in range(L):
        prefix = "layers.%d.fastkvzip." % l
        gate = FastKVzipGate(l, d, K, q_rows // (K * dim), torch.float32, output_dim=dim, sink=base)
        gate.load_state_dict({k[len(prefix):]: v for k, v in t.items() if k.startswith(prefix)})
        gates.append(gate.eval())
    budget = max(1, n // 4)
    press = kvpress.FastKVzipPress(compression_ratio=(L * K * (n - budget) + 0.5) / (L * K * n), n_sink=4)
    press.gates = gates
    return press


def fastkvzip_kept(model, ids, press, trace):
    """kvpress's kept sets (masked entries) and its gate scores per layer."""
    from kvpress_check import kvpress_kept
    kept, _ = kvpress_kept(model, ids, press, masks=True)
    return kept, {l: press.score_val[l][0].double() for l in range(press.score_val.shape[0])}


def duo_pattern(name, layers, kv_heads):
    """A head-pattern file (the official full_attention_heads.tsv format) of
    distinct seeded gates, written once per model."""
    import os
    import tempfile
    import numpy as np
    path = os.path.join(tempfile.gettempdir(), "kvscope-duo-%s.tsv" % name)
    gates = np.random.default_rng(11).permutation(layers * kv_heads).reshape(layers, kv_heads)
    gates = (gates + 0.5) / (layers * kv_heads)
    with open(path, "w") as f:
        for row in gates:
            f.write("\t".join("%.6f" % g for g in row) + "\n")
    return path


def duo_press(path, sinks, recent):
    """kvpress's DuoAttentionPress on KVScope's head pattern (kvpress fetches
    the official ones from GitHub)."""
    import numpy as np
    press = kvpress.DuoAttentionPress(head_compression_ratio=0.5)
    press.load_attention_pattern = lambda model: (sinks, recent, np.clip(np.loadtxt(path, delimiter="\t"), 0, 1))
    return press


def lukv_curve(name, layers, kv_heads):
    """A budget curve (kvpress's [99, layers, kv heads] .npy of prune ratios)
    of seeded ratios that differ by head, written once per model; kvpress
    downloads the official ones, which exist for Llama-3.1-8B only."""
    import os
    import tempfile
    import numpy as np
    path = os.path.join(tempfile.gettempdir(), "kvscope-lukv-%s.npy" % name)
    rng = np.random.default_rng(13)
    base = np.linspace(0.01, 0.99, 99)[:, None, None]
    spread = rng.uniform(-0.2, 0.2, size=(1, layers, kv_heads))
    np.save(path, np.clip(base + spread, 0.0, 0.97).astype(np.float64))
    return path


def lukv_press(ratio, path, scorer):
    """kvpress's LUKVPress around a scorer, on KVScope's curve."""
    import numpy as np
    press = kvpress.LUKVPress(press=scorer, compression_ratio=ratio, sink=4, window=1)
    press._budget_curves = np.load(path)
    return press


def ea_stats_press(ratio, name):
    """kvpress's ExpectedAttentionStatsPress with KVScope's calibrated query
    statistics (kvpress would download its own from the Hugging Face hub)."""
    import os
    import torch
    from safetensors.torch import load_file
    here = os.path.dirname(os.path.abspath(__file__))
    t = load_file(os.path.join(here, "..", "..", "resources", "gates", name + "-query-stats.safetensors"))
    L = len(t) // 2
    press = kvpress.ExpectedAttentionStatsPress(compression_ratio=ratio, n_future_positions=512, n_sink=4)
    press.mu = torch.stack([t["layers.%d.query_mean" % l] for l in range(L)]).double()
    press.cov = torch.stack([t["layers.%d.query_cov" % l] for l in range(L)]).double()
    return press


def global_ties(diffs, scores, model):
    """KVzip ranks the entries of every layer and head together, so an entry
    one side keeps may stand for an entry the other keeps in another head:
    explained when every entry only one side kept scores, in kvpress's own
    scores, within 1e-4 of the largest score of the whole cache of every entry
    only the other side kept."""
    import torch
    real = torch.cat([s.flatten() for s in scores.values()])
    scale = float(real.abs().max())
    a = [float(scores[l][h][p]) for l, h, o, _ in diffs for p in o]
    b = [float(scores[l][h][p]) for l, h, _, t in diffs for p in t]
    return bool(a) and bool(b) and max(b) - min(a) <= 1e-4 * scale and max(a) - min(b) <= 1e-4 * scale


def kvzip_press(model, chunk, plus=False):
    """kvpress's KVzipPress pruning L*K*(n - budget) entries in all (its
    compression_ratio counts entries of every layer and head together)."""
    n, L, K = len(model.ids), model.layers, model.kv_heads
    budget = max(1, n // 4)
    ratio = (L * K * (n - budget) + 0.5) / (L * K * n)
    return kvpress.KVzipPress(compression_ratio=ratio, n_sink=4, chunk_size=chunk,
                              kvzip_plus_normalization=plus)


def kvgrad_press(model, chunk):
    """kvpress's KVgradPress (KVzip's pass replayed with autograd) pruning
    L*K*(n - budget) entries in all, as kvzip_press."""
    n, L, K = len(model.ids), model.layers, model.kv_heads
    budget = max(1, n // 4)
    ratio = (L * K * (n - budget) + 0.5) / (L * K * n)
    return kvpress.KVgradPress(compression_ratio=ratio, n_sink=4, chunk_size=chunk)


def restorekv_press(model, name):
    """kvpress's RestoreKVPress with KVScope's trained restore tokens and LoRA
    adapters (kvpress would download the released ones, which exist for 8B
    models only): the adapters go into the transformers model as a PEFT
    adapter of the same rank and alpha, on the same seven projections, and
    are removed after the case. Its ratio: KVzip's L*K*(n - budget) pruned,
    to which RestoreKV adds n_restore / context itself."""
    import json
    import os
    from safetensors import safe_open
    from safetensors.torch import load_file
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "resources", "gates", name + "-restorekv.safetensors")
    t = load_file(path)
    with safe_open(path, "pt") as f:
        hyper = json.loads(f.metadata()["kvscope.gates"])["hyperparameters"]
    n, L, K = len(model.ids), model.layers, model.kv_heads
    budget = max(1, n // 4)
    press = kvpress.RestoreKVPress(compression_ratio=(L * K * (n - budget) + 0.5) / (L * K * n),
                                   n_sink=4, chunk_size=2048)
    names = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
             "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
             "down": "mlp.down_proj"}

    def post_init(m):
        from peft import LoraConfig
        if "restorekv" not in getattr(m, "peft_config", {}):
            m.add_adapter(LoraConfig(r=int(hyper["rank"]), lora_alpha=float(hyper["alpha"]),
                                     lora_dropout=0.0, bias="none",
                                     target_modules=[v.split(".")[1] for v in names.values()]),
                          adapter_name="restorekv")
        for l, layer in enumerate(m.model.layers):
            for short, attr in names.items():
                mod = layer.get_submodule(attr)
                mod.lora_A["restorekv"].weight.data.copy_(t["layers.%d.lora.%s.a" % (l, short)])
                mod.lora_B["restorekv"].weight.data.copy_(t["layers.%d.lora.%s.b" % (l, short)])
        m.disable_adapters()
        press.restore_embeddings = t["restore_embeddings"].to(m.device, dtype=m.dtype)
        press.restore_model_name = "kvscope"

    press.post_init_from_model = post_init
    press.kvscope_model = model  # restorekv_kept captures once more with --oracle
    return press


def restorekv_kept(model, ids, press, trace):
    """KVzip's kept sets (kvzip_kept) under RestoreKVPress, and the restore
    pass itself: the next-token KL(full || compressed) of the first decode
    step, which reads the restore entries, from kvpress's cache (its restore
    pass through the PEFT adapter, its masks) against KVScope's --oracle KL of
    the same step. The adapter is removed from the shared model afterwards."""
    import h5py
    import torch
    import kvpress_check
    with h5py.File(trace, "r") as f:
        spec = f["run"].attrs["policy"]
        spec = spec.decode() if isinstance(spec, bytes) else str(spec)
    wrapper = press.kvscope_model
    fed, _, oracle_trace = wrapper.capture("restorekv-oracle", spec, 1, ["--oracle"])
    with h5py.File(oracle_trace, "r") as f:
        kinds, kl = f["steps/kind"][:], f["oracle/kl"][:]
    ours = float(kl[list(kinds).index(1)])  # the first decode step
    first = fed[len(ids)]  # the token it fed
    theirs = []

    def after(m, cache, n):
        restore = press.num_restore_tokens
        pos = n + restore
        rest = ids[n:] + [first]  # a chat prompt's generation prompt, then the token
        x = torch.tensor([rest], dtype=torch.long)
        p = torch.arange(pos, pos + len(rest)).unsqueeze(0)
        lp = m(input_ids=x, past_key_values=cache, position_ids=p).logits[0, -1].double().log_softmax(-1)
        from transformers import DynamicCache
        full = DynamicCache(config=m.config)
        masks = [l.self_attn.masked_key_indices for l in m.model.layers]
        for l in m.model.layers:
            l.self_attn.masked_key_indices = None
        m(input_ids=torch.tensor([ids[:n]]), past_key_values=full)
        lf = m(input_ids=x, past_key_values=full, position_ids=p).logits[0, -1].double().log_softmax(-1)
        for l, mask in zip(m.model.layers, masks):
            l.self_attn.masked_key_indices = mask
        theirs.append(float((lf.exp() * (lf - lp)).sum()))

    try:
        kept, scores = kvpress_check.kvzip_kept(model, ids, press, trace, after=after)
    finally:
        if "restorekv" in getattr(model, "peft_config", {}):
            model.delete_adapter("restorekv")
    print("    restore pass: first decode step KL(full || compressed) kvpress %.6f, KVScope %.6f"
          % (theirs[0], ours))
    assert abs(theirs[0] - ours) <= 1e-3 * max(abs(ours), 1e-3), \
        "the restore pass differs: KL %.6f (kvpress) vs %.6f (KVScope)" % (theirs[0], ours)
    return kept, scores


def kvcompose_press(model, structured=True, **aggregation):
    """kvpress's KVComposePress keeping L*K*budget entries in all: its ratio
    counts the L*n composite slots (structured) or the L*K*n per-head slots,
    and (L*K*budget + 0.5) / (L*K*n) kept gives exactly L*budget and L*K*budget."""
    n, L, K = len(model.ids), model.layers, model.kv_heads
    budget = max(1, n // 4)
    ratio = (L * K * (n - budget) - 0.5) / (L * K * n)
    return kvpress.KVComposePress(compression_ratio=ratio, structured=structured, **aggregation)


def ratio_of(n, keep):
    from kvpress_check import ratio_for
    return ratio_for(n, keep)


def cases_for(model_name):
    P = kvpress
    # Sizes that exercise each press's structure on the model's prompt (98
    # tokens for stories260K, 282 for SmolLM2): several LagKV partitions, a
    # last non-causal chunk that kvpress pads.
    lag, chunk = (16, 32) if model_name == "stories260K" else (32, 64)
    lazy, recent = (0.62, 24) if model_name == "stories260K" else (0.6, 64)
    layers = {"stories260K": 5, "qwen3_moe": QWEN3_MOE["num_hidden_layers"]}.get(model_name, 30)
    # A threshold near the median KeyDiff score of the prompt: about half the
    # tokens leaving the window stay.
    dms_window, dms_threshold = (16, -0.92) if model_name == "stories260K" else (64, -0.835)
    filters = "stories260K" if model_name == "stories260K" else "SmolLM2-135M-Instruct"
    duo = duo_pattern(model_name, layers, 4 if model_name == "stories260K" else 3)
    curve = lukv_curve(model_name, layers, 4 if model_name == "stories260K" else 3)
    # Entries each layer keeps (PerLayerCompressionPress): 1/8 to 1/2 of the prompt.
    per_layer_keep = lambda n: [max(1, n * (1 + l % 4) // 8) for l in range(layers)]  # noqa: E731
    cases = [
        Case("streaming_llm", "StreamingLLMPress", lambda b, n: "streaming_llm:sinks=4,window=%d" % (b - 4),
             lambda r, m: P.StreamingLLMPress(compression_ratio=r, n_sink=4)),
        Case("snapkv", "SnapKVPress", lambda b, n: "snapkv:budget=%d,window=8,kernel=5" % b,
             lambda r, m: P.SnapKVPress(compression_ratio=r, window_size=8, kernel_size=5)),
        Case("tova", "TOVAPress", lambda b, n: "tova:budget=%d" % b, lambda r, m: P.TOVAPress(compression_ratio=r),
             tie=tova_tie, why="kvpress's last-token protection"),
        Case("knorm", "KnormPress", lambda b, n: "knorm:budget=%d" % b, lambda r, m: P.KnormPress(compression_ratio=r),
             tie=knorm_tie, why="swaps of equal-norm keys"),
        # Expected attention reaches scores of 1e-80 (stories260K layer 1): in
        # float32 kvpress's softmax makes most of them exactly 0 and topk picks
        # among the ties arbitrarily; KVScope ranks the log scores exactly, so
        # kvpress runs on a float64 copy of the model.
        Case("expected_attention", "ExpectedAttentionPress",
             lambda b, n: "expected_attention:budget=%d,sinks=4,n_future=512" % b,
             lambda r, m: P.ExpectedAttentionPress(compression_ratio=r, n_future_positions=512, n_sink=4),
             float64=True),
        Case("random", "RandomPress", lambda b, n: "random:budget=%d,seed=7" % b,
             lambda r, m: P.RandomPress(compression_ratio=r, seed=7)),
        Case("observed_attention", "ObservedAttentionPress", lambda b, n: "observed_attention:budget=%d" % b,
             lambda r, m: P.ObservedAttentionPress(compression_ratio=r)),
        Case("keydiff", "KeyDiffPress", lambda b, n: "keydiff:budget=%d" % b,
             lambda r, m: P.KeyDiffPress(compression_ratio=r)),
        Case("lagkv", "LagKVPress", lambda b, n: "lagkv:budget=%d,sinks=4,lag=%d" % (b, lag),
             lambda r, m: P.LagKVPress(compression_ratio=r, n_sink=4, lag_size=lag)),
        Case("cur", "CURPress", lambda b, n: "cur:budget=%d,sinks=4,window=16" % b,
             lambda r, m: P.CURPress(compression_ratio=r, num_sinks=4, local_window_size=16)),
        Case("leverage", "LeverageScorePress", lambda b, n: "leverage:budget=%d,sketch=16,seed=3" % b,
             lambda r, m: P.LeverageScorePress(compression_ratio=r, sketch_dimension=16), seed=3),
        Case("non_causal_attention", "NonCausalAttnPress",
             lambda b, n: "non_causal_attention:budget=%d,chunk=%d" % (b, chunk),
             lambda r, m: P.NonCausalAttnPress(compression_ratio=r, chunk_size=chunk)),
        Case("compactor", "CompactorPress",
             lambda b, n: "compactor:budget=%d,chunk=%d,sketch=16,seed=5" % (b, chunk),
             lambda r, m: P.CompactorPress(compression_ratio=r, chunk_size=chunk, sketch_dimension=16), seed=5),
        Case("criticalkv", "CriticalKVPress(SnapKVPress)",
             lambda b, n: "criticalkv:scorer=snapkv,budget=%d,window=8,kernel=5" % b,
             lambda r, m: P.CriticalKVPress(P.SnapKVPress(compression_ratio=r, window_size=8, kernel_size=5))),
        Case("chunkkv", "ChunkKVPress(SnapKVPress)",
             lambda b, n: "snapkv:budget=%d,window=8,kernel=5+chunk:size=10,heads=shared" % b,
             lambda r, m: P.ChunkKVPress(P.SnapKVPress(compression_ratio=r, window_size=8, kernel_size=5),
                                         chunk_length=10), sdpa=True),
        Case("block", "BlockPress(KeyDiffPress)", lambda b, n: "keydiff:budget=%d+block:size=16" % b,
             lambda r, m: P.BlockPress(P.KeyDiffPress(compression_ratio=r), block_size=16), sdpa=True),
        Case("adakv", "AdaKVPress(SnapKVPress)",
             lambda b, n: "adakv:scorer=snapkv,budget=%d,window=8,kernel=5,alpha=0.2" % b,
             lambda r, m: P.AdaKVPress(P.SnapKVPress(compression_ratio=r, window_size=8, kernel_size=5),
                                       alpha_safeguard=0.2), sdpa=True, masks=True),
        Case("per_chunk", "ChunkPress(KeyDiffPress)", lambda b, n: "keydiff:budget=%d+per_chunk:size=32" % b,
             lambda r, m: P.ChunkPress(P.KeyDiffPress(compression_ratio=r), chunk_length=32), sdpa=True),
        Case("qfilter", "QFilterPress (KVScope's filters)", lambda b, n: "qfilter:budget=%d" % b,
             lambda r, m: qfilter_press(r, m, filters)),
        Case("kvzap", "KVzapPress(linear, KVScope's surrogate)", lambda b, n: "kvzap:budget=%d,sinks=0,window=0" % b,
             lambda r, m: kvzap_press(r, m, filters)),
        Case("merge", "MergingPress(KnormPress)", lambda b, n: "knorm:budget=%d+merge" % b,
             lambda r, m: P.MergingPress(press=P.KnormPress(compression_ratio=r)),
             tie=knorm_tie, why="swaps of equal-norm keys"),
        Case("duo_attention", "DuoAttentionPress (KVScope's head pattern)",
             lambda b, n: "duo_attention:pattern=%s,sparsity=0.5,sinks=4,recent=%d" % (duo, recent),
             lambda r, m: duo_press(duo, 4, recent), sdpa=True, masks=True),
        Case("critical_adakv", "CriticalAdaKVPress(SnapKVPress)",
             lambda b, n: "critical_adakv:scorer=snapkv,budget=%d,window=8,kernel=5" % b,
             lambda r, m: P.CriticalAdaKVPress(P.SnapKVPress(compression_ratio=r, window_size=8, kernel_size=5)),
             sdpa=True, masks=True),
        Case("cap", "CapPress", lambda b, n: "cap:budget=%d,sinks=4,n_future=512,tau=5" % b,
             lambda r, m: P.CapPress(compression_ratio=r, tau=5.0, n_future_positions=512, n_sink=4)),
        Case("expected_attention_stats", "ExpectedAttentionStatsPress (KVScope's statistics)",
             lambda b, n: "expected_attention_stats:budget=%d,sinks=4,n_future=512" % b,
             lambda r, m: ea_stats_press(r, filters), float64=True),
        Case("dms", "DMSPress(KeyDiffPress)",
             lambda b, n: "dms:scorer=keydiff,threshold=%g,sliding_window=%d" % (dms_threshold, dms_window),
             lambda r, m: P.DMSPress(P.KeyDiffPress(), threshold=dms_threshold, sliding_window_size=dms_window),
             sdpa=True, masks=True),
        # FINCH's question is the prompt's last 16 tokens: kvpress finds it
        # from a delimiter token inserted before them (and removed from the
        # embeddings), KVScope from window=16.
        Case("finch", "FinchPress", lambda b, n: "finch:budget=%d,window=16" % b,
             lambda r, m: P.FinchPress(compression_ratio=r), by_values=True, question=16),
        Case("finch_plain", "FinchPress(normalize_scores=False, rerotate_keys=False)",
             lambda b, n: "finch:budget=%d,window=16,normalize=false,rerotate=false" % b,
             lambda r, m: P.FinchPress(compression_ratio=r, normalize_scores=False, rerotate_keys=False),
             question=16),
        Case("rerotate", "KeyRerotationPress(KnormPress)", lambda b, n: "knorm:budget=%d+rerotate" % b,
             lambda r, m: P.KeyRerotationPress(press=P.KnormPress(compression_ratio=r)),
             tie=knorm_tie, why="swaps of equal-norm keys", by_values=True),
        # The paper's pyramid (spread=prefix, the default) adds the window to
        # every layer; kvpress spreads the whole budget. beta 2 keeps kvpress's
        # pyramid within its fit condition on these short prompts.
        Case("pyramidkv", "PyramidKVPress",
             lambda b, n: "pyramidkv:budget=%d,window=8,kernel=5,beta=2,spread=all" % b,
             lambda r, m: P.PyramidKVPress(compression_ratio=r, window_size=8, kernel_size=5, beta=2)),
        Case("layer_ratios", "PerLayerCompressionPress(KnormPress)",
             lambda b, n: "knorm:budget=%d+layer_ratios:keep=%s" % (
                 b, "/".join("%.6f" % (k / n) for k in per_layer_keep(n))),
             lambda r, m: P.PerLayerCompressionPress(
                 P.KnormPress(), compression_ratios=[ratio_of(len(m.ids), k) for k in per_layer_keep(len(m.ids))]),
             tie=knorm_tie, why="swaps of equal-norm keys"),
        # Decode-time presses: kept sets after 12 decode steps. The base is
        # keydiff: knorm's exact layer-0 ties (equal norms of a repeated
        # token) can fall either way at one step and then change every later
        # token's keys, so its differences would not stay at ties.
        Case("decoding", "DecodingPress(KeyDiffPress)",
             lambda b, n: "keydiff:budget=%d+cadence:every=4,prefill=false" % b,
             lambda r, m: P.DecodingPress(P.KeyDiffPress(), compression_interval=4,
                                          target_size=max(1, len(m.ids) // 4), hidden_states_buffer_size=0),
             decode=12),
        Case("compression_ratio_decoding", "CompressionRatioDecodingPress(KeyDiffPress)",
             lambda b, n: "keydiff:budget=%d+cadence:every=3,prefill=false,keep=0.25" % b,
             lambda r, m: P.CompressionRatioDecodingPress(base_press=P.KeyDiffPress(), compression_interval=3,
                                                          target_compression_ratio=0.75,
                                                          hidden_states_buffer_size=0),
             decode=12),
        Case("prefill_decoding", "PrefillDecodingPress(KeyDiffPress, DecodingPress(KeyDiffPress))",
             lambda b, n: "keydiff:budget=%d+cadence:every=4" % b,
             lambda r, m: P.PrefillDecodingPress(
                 prefilling_press=P.KeyDiffPress(compression_ratio=r),
                 decoding_press=P.DecodingPress(P.KeyDiffPress(), compression_interval=4,
                                                target_size=max(1, len(m.ids) // 4), hidden_states_buffer_size=0)),
             decode=12),
        # CaM: the same cadence; kvpress draws its Bernoulli merges from
        # torch's seeded generator, KVScope from a generator seeded alike, so
        # the merged values (and the later keys they shape) agree too.
        Case("cam", "CAMPress(KeyDiffPress)",
             lambda b, n: "cam:scorer=keydiff,budget=%d,every=4,merge_budget=4,merge_seed=7" % b,
             lambda r, m: P.CAMPress(P.KeyDiffPress(), compression_interval=4,
                                     target_size=max(1, len(m.ids) // 4), hidden_states_buffer_size=0,
                                     merge_budget=4),
             seed=7, decode=12),
        Case("entropy_chunkkv", "EntropyGatedChunkKVPress(SnapKVPress)",
             lambda b, n: "snapkv:budget=%d,window=8,kernel=5+chunk:size=10,heads=shared,entropy=4" % b,
             lambda r, m: P.EntropyGatedChunkKVPress(P.SnapKVPress(compression_ratio=r, window_size=8, kernel_size=5),
                                                    chunk_length=10, low_entropy_chunk_length=4), sdpa=True,
             tie=keeps_window(8), why="KVScope keeps SnapKV's window, which kvpress's entropy gate cut"),
        # Thresholds between the layers' laziness scores on each prompt, so
        # that some layers are lazy and some not.
        # KVzip: the context-reconstruction pass; one chunk (the default
        # 2048) and several (32 tokens: kvpress's softmax over sinks + chunk +
        # repeat, and its repeat prompt with the previous chunk's tail).
        Case("kvzip", "KVzipPress", lambda b, n: "kvzip:budget=%d,sinks=4" % b,
             lambda r, m: kvzip_press(m, 2048), sdpa=True, masks=True,
             runner=lambda *a: __import__("kvpress_check").kvzip_kept(*a), tie=global_ties,
             why="near-equal scores across heads (within 1e-4 of the largest)"),
        Case("kvzip_plus", "KVzipPress(kvzip_plus_normalization=True)",
             lambda b, n: "kvzip:budget=%d,sinks=4,plus=true,chunk=%d" % (b, chunk),
             lambda r, m: kvzip_press(m, chunk, plus=True), sdpa=True, masks=True,
             runner=lambda *a: __import__("kvpress_check").kvzip_kept(*a), tie=global_ties,
             why="near-equal scores across heads (within 1e-4 of the largest)"),
        Case("kvzip_chunked", "KVzipPress(chunk_size=%d)" % chunk,
             lambda b, n: "kvzip:budget=%d,sinks=4,chunk=%d" % (b, chunk),
             lambda r, m: kvzip_press(m, chunk), sdpa=True, masks=True,
             runner=lambda *a: __import__("kvpress_check").kvzip_kept(*a), tie=global_ties,
             why="near-equal scores across heads (within 1e-4 of the largest)"),
        # RestoreKV: KVzip's pass, the restore tokens through the LoRA
        # adapters (KVScope's shipped ones), KVzip's eviction n_restore more.
        Case("restorekv", "RestoreKVPress", lambda b, n: "restorekv:budget=%d,sinks=4" % b,
             lambda r, m: restorekv_press(m, filters), sdpa=True, masks=True,
             runner=restorekv_kept, tie=global_ties,
             why="near-equal scores across heads (within 1e-4 of the largest)"),
        # KVgrad: the reconstruction pass replayed with autograd; its default
        # 512-token chunks.
        Case("kvgrad", "KVgradPress", lambda b, n: "kvgrad:budget=%d,sinks=4" % b,
             lambda r, m: kvgrad_press(m, 512), sdpa=True, masks=True,
             runner=lambda *a: __import__("kvpress_check").kvzip_kept(*a), tie=global_ties,
             why="near-equal scores across heads (within 1e-4 of the largest)"),
        Case("kvgrad_chunked", "KVgradPress(chunk_size=%d)" % chunk,
             lambda b, n: "kvgrad:budget=%d,sinks=4,chunk=%d" % (b, chunk),
             lambda r, m: kvgrad_press(m, chunk), sdpa=True, masks=True,
             runner=lambda *a: __import__("kvpress_check").kvzip_kept(*a), tie=global_ties,
             why="near-equal scores across heads (within 1e-4 of the largest)"),
        # Fast KVzip: trained gates in place of the reconstruction pass.
        Case("fastkvzip", "FastKVzipPress (KVScope's gates)", lambda b, n: "fastkvzip:budget=%d" % b,
             lambda r, m: fastkvzip_press(m, filters), sdpa=True, masks=True,
             runner=fastkvzip_kept, tie=global_ties,
             why="near-equal scores across heads (within 1e-4 of the largest)"),
        # KVCompose: the prompt read a second time; composite tokens (one
        # count per layer) and the unstructured variant (one count per head).
        Case("kvcompose", "KVComposePress", lambda b, n: "kvcompose:budget=%d" % b,
             lambda r, m: kvcompose_press(m),
             runner=lambda *a: __import__("kvpress_check").kvcompose_kept(*a)),
        Case("kvcompose_unstructured", "KVComposePress(structured=False)",
             lambda b, n: "kvcompose:budget=%d,structured=false" % b,
             lambda r, m: kvcompose_press(m, structured=False),
             runner=lambda *a: __import__("kvpress_check").kvcompose_kept(*a)),
        Case("kvcompose_mean_max", "KVComposePress(agg_task='mean', agg_group='max')",
             lambda b, n: "kvcompose:budget=%d,task=mean,group=max" % b,
             lambda r, m: kvcompose_press(m, agg_task="mean", agg_group="max"),
             runner=lambda *a: __import__("kvpress_check").kvcompose_kept(*a)),
        # LU-KV: per-head budgets from a seeded curve given to both.
        Case("lukv", "LUKVPress(KeyDiffPress) (KVScope's curve)",
             lambda b, n: "lukv:scorer=keydiff,curve=%s,budget=%d,keep_first=4,keep_last=1" % (curve, b),
             lambda r, m: lukv_press(r, curve, P.KeyDiffPress()), sdpa=True, masks=True),
        # ThinK prunes key channels, not tokens: the sets compared are the
        # channels each head dropped (trace /key_channels) and those kvpress
        # zeroed.
        Case("think", "ThinKPress(0.5)", lambda b, n: "think:ratio=0.5,window=32",
             lambda r, m: P.ThinKPress(key_channel_compression_ratio=0.5, window_size=32),
             channels=True, runner=lambda *a: __import__("kvpress_check").think_pruned(*a),
             why="near-equal channel scores (within 1e-4 of the head's largest)"),
        Case("snapkv_think", "ComposedPress([SnapKV, ThinK(0.5)])",
             lambda b, n: "snapkv:budget=%d,window=8,kernel=5+think:ratio=0.5,window=32" % b,
             lambda r, m: P.ComposedPress([P.SnapKVPress(compression_ratio=r, window_size=8, kernel_size=5),
                                           P.ThinKPress(key_channel_compression_ratio=0.5, window_size=32)]),
             channels=True, runner=lambda *a: __import__("kvpress_check").think_pruned(*a),
             why="near-equal channel scores (within 1e-4 of the head's largest)"),
        Case("simlayerkv", "SimLayerKVPress",
             lambda b, n: "simlayerkv:threshold=%g,recent=%d,initial=4,last=1" % (lazy, recent),
             lambda r, m: P.SimLayerKVPress(lazy_threshold=lazy, n_recent=recent, n_initial=4, n_last=1)),
    ]
    if model_name == "smollm2":
        # The question after the compression (kvpress's query_aware false):
        # KVScope's prefill ends where the needle task's question begins, and
        # kvpress compresses those context ids alone, as its pipeline does.
        import dataclasses
        after = {"snapkv", "expected_attention", "kvzip"}
        cases += [dataclasses.replace(c, name=c.name + "_after", query_after=True)
                  for c in cases if c.name in after]
    if model_name == "qwen3_moe":
        # transformers runs Qwen3-MoE's experts with grouped GEMMs, which have
        # no float64 kernel: kvpress scores expected attention in float32 here
        # (this model's scores do not underflow as stories260K's do).
        import dataclasses
        cases = [dataclasses.replace(c, float64=False) for c in cases if c.name in MOE_CASES]
    return cases


# A random Qwen3-MoE (kvpress_check.py builds it with transformers): the KV
# path of Qwen3 (per-head q/k norms, GQA 8/2) under routed layers and one
# dense one (mlp_only_layers), top-2 of 8 experts renormalised.
QWEN3_MOE = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                 moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                 mlp_only_layers=[2], rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2,
                 rope_parameters=dict(rope_type="default", rope_theta=1000000.0))

# The presses run on the MoE model: the four (StreamingLLM, SnapKV,
# TOVA, KeyDiff) and the scorers whose inputs differ most (norms, observed
# and expected attention, per-head budgets, chunks), none needing a
# model-specific file (Q-Filters, DuoAttention, LUKV, KVzap ship per model).
MOE_CASES = ("streaming_llm", "snapkv", "tova", "keydiff", "knorm", "observed_attention",
             "expected_attention", "random", "lagkv", "pyramidkv", "adakv", "criticalkv", "chunkkv",
             "block", "cur", "leverage")
