#!/usr/bin/env python3
"""Regenerates the seed corpora of the libFuzzer targets (tests/fuzz/corpus)
and the fixtures the policy target points path parameters at
(tests/fuzz/fixtures). Standard library only.

Seeds are small real files or slices of them, plus hand-made edge cases:
  trace (read, validate)      traces from `kvscope synth`, `kvscope capture` on
                              the tiny-llama fixture, and write_seed_trace (an
                              unclosed and a killed writer's file); needs
                              --kvscope and --seed-writer
  gguf                        the tiny-llama fixtures; SmolLM2's vocabulary cut to
                              400 tokens (needs --smollm); a llama (SentencePiece)
                              vocabulary from stories260K's tok512.bin
  safetensors                 model fixtures; hand-made headers
  hf_config                   every fixture config.json; hand-made variants
  tokenizer_json              the small fixtures; SmolLM2's and Llama 2's cut to
                              a few hundred tokens
  llama2c_checkpoint          tiny legacy and v1 checkpoints; a slice of stories260K
  llama2c_tokenizer           tok512.bin; hand-made vocabularies
  torch_pickle                the official gate fixtures; hand-made torch.save
                              archives written without torch
  gate_set                    kvscope gate files of every kind for stories260K
  policy_spec                 one spec per registered policy

Usage: make_seeds.py [--kvscope build/app/kvscope] [--seed-writer write_seed_trace]
                     [--shared ../shared]
                     [--smollm models/SmolLM2-135M-Instruct.Q4_1.gguf] [targets...]
"""
import argparse
import io
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import types
import pickle
import zipfile
from collections import OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")


def out_dir(target):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    return d


def write(target, name, data):
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(out_dir(target), name), "wb") as f:
        f.write(data)


def copy(target, name, src):
    shutil.copyfile(src, os.path.join(out_dir(target), name))


# ---- GGUF -------------------------------------------------------------------

GGUF_TYPES = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6, "bool": 7,
              "str": 8, "arr": 9, "u64": 10, "i64": 11, "f64": 12}
SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B",
              10: "<Q", 11: "<q", 12: "<d"}


def read_gguf(path):
    """(metadata [(key, type, value)], tensors [(name, ne, type)]) of a GGUF."""
    with open(path, "rb") as f:
        data = f.read(64 << 20)  # metadata and directory come first
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("<Q")
        s = data[pos:pos + n].decode("utf-8", "surrogateescape")
        pos += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et = take("<I")
            n = take("<Q")
            return (et, [value(et) for _ in range(n)])
        return take(SCALAR_FMT[t])

    assert data[:4] == b"GGUF"
    pos = 4
    take("<I")
    n_tensors, n_kv = take("<Q"), take("<Q")
    meta = []
    for _ in range(n_kv):
        k = string()
        t = take("<I")
        meta.append((k, t, value(t)))
    tensors = []
    for _ in range(n_tensors):
        name = string()
        nd = take("<I")
        ne = [take("<Q") for _ in range(nd)]
        tt = take("<I")
        take("<Q")
        tensors.append((name, ne, tt))
    return meta, tensors


GGML_BLOCK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 8: (32, 34), 30: (1, 2)}


def write_gguf(meta, tensors, version=3, alignment=32):
    """GGUF bytes: meta [(key, type, value)], tensors [(name, ne, type, data bytes or None)]."""
    out = io.BytesIO()

    def string(s):
        b = s.encode("utf-8", "surrogateescape")
        out.write(struct.pack("<Q", len(b)) + b)

    def value(t, v):
        if t == 8:
            string(v)
        elif t == 9:
            et, items = v
            out.write(struct.pack("<IQ", et, len(items)))
            for it in items:
                value(et, it)
        else:
            out.write(struct.pack(SCALAR_FMT[t], v))

    out.write(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(meta)))
    for k, t, v in meta:
        string(k)
        out.write(struct.pack("<I", t))
        value(t, v)
    blobs, offset = [], 0
    for name, ne, tt, blob in tensors:
        block, nbytes = GGML_BLOCK[tt]
        n = 1
        for d in ne[1:]:
            n *= d
        size = ne[0] // block * nbytes * n
        if blob is None:
            blob = bytes((i * 37) & 0x3F for i in range(size))  # small finite values
        assert len(blob) == size
        string(name)
        out.write(struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne))
        out.write(struct.pack("<IQ", tt, offset))
        blobs.append(blob)
        offset += (size + alignment - 1) // alignment * alignment
    pad = (-out.tell()) % alignment
    out.write(b"\0" * pad)
    for blob in blobs:
        out.write(blob + b"\0" * ((-len(blob)) % alignment))
    return out.getvalue()


def gguf_seeds(args):
    d = os.path.join(FIXTURES, "model", "llama_gguf")
    copy("gguf", "tiny-llama-q8_0.gguf", os.path.join(d, "tiny-llama-q8_0.gguf"))
    copy("gguf", "tiny-llama-f32.gguf", os.path.join(d, "tiny-llama-f32.gguf"))

    if args.smollm and os.path.exists(args.smollm):
        meta, _ = read_gguf(args.smollm)
        keep = 400
        tokens = dict((k, v) for k, t, v in meta)["tokenizer.ggml.tokens"][1][:keep]
        kept = set(tokens)
        small = []
        for k, t, v in meta:
            if k == "tokenizer.ggml.tokens":
                v = (8, tokens)
            elif k == "tokenizer.ggml.token_type":
                v = (v[0], v[1][:keep])
            elif k == "tokenizer.ggml.merges":
                merges = [m for m in v[1] if " " in m[1:] and
                          all(p in kept for p in m.split(" ", 1)) and m.replace(" ", "", 1) in kept]
                v = (8, merges)
            small.append((k, t, v))
        # The config reads the vocabulary size from token_embd.weight: a
        # Q4_1 tensor of one block per token keeps the seed small.
        embd = [("token_embd.weight", [32, keep], 3, None)]
        write("gguf", "smollm2-vocab400.gguf", write_gguf(small, embd))
        for pre in ("llama-bpe", "qwen2", "gpt-2"):
            variant = [(k, t, pre if k == "tokenizer.ggml.pre" else v) for k, t, v in small]
            write("gguf", "smollm2-vocab400-pre-%s.gguf" % pre, write_gguf(variant, embd))

    if args.shared:
        pieces, scores = read_llama2c_tokenizer(
            os.path.join(args.shared, "models", "stories260K", "tok512.bin"))
        types_ = [3 if i < 3 else 6 if i < 259 else 1 for i in range(len(pieces))]
        types_[0] = 2
        meta = [("general.architecture", 8, "llama"), ("general.name", 8, "stories260K"),
                ("llama.context_length", 4, 512), ("llama.embedding_length", 4, 64),
                ("llama.block_count", 4, 5), ("llama.feed_forward_length", 4, 172),
                ("llama.attention.head_count", 4, 8), ("llama.attention.head_count_kv", 4, 4),
                ("llama.attention.layer_norm_rms_epsilon", 6, 1e-5),
                ("llama.rope.dimension_count", 4, 8),
                ("tokenizer.ggml.model", 8, "llama"),
                ("tokenizer.ggml.tokens", 9, (8, pieces)),
                ("tokenizer.ggml.scores", 9, (6, scores)),
                ("tokenizer.ggml.token_type", 9, (5, types_)),
                ("tokenizer.ggml.bos_token_id", 4, 1), ("tokenizer.ggml.eos_token_id", 4, 2),
                ("tokenizer.ggml.unknown_token_id", 4, 0),
                ("tokenizer.ggml.add_bos_token", 7, 1)]
        write("gguf", "stories260K-spm-vocab.gguf",
              write_gguf(meta, [("token_embd.weight", [64, 512], 2, None)]))

    # Hand-made: header only, v2, a nested array, every scalar type, a
    # tensor whose type is not implemented.
    write("gguf", "empty-v3.gguf", write_gguf([], []))
    every = [("k.%s" % n, t, {8: "s", 7: 1, 6: 1.5, 12: -2.5}.get(t, 7))
             for n, t in GGUF_TYPES.items() if t != 9]
    every.append(("k.nested", 9, (9, [(4, [1, 2]), (8, ["a"])])))
    every.append(("k.bools", 9, (7, [0, 1])))
    write("gguf", "every-type-v2.gguf", write_gguf(every, [], version=2))
    write("gguf", "q4k-tensor.gguf",
          write_gguf([("general.alignment", 4, 64)],
                     [("t", [32, 2], 0, None), ("u", [256, 1], 0, None)], alignment=64))


# ---- safetensors ------------------------------------------------------------

def safetensors_bytes(tensors, metadata=None, pad=0):
    """tensors: [(name, dtype, shape, data bytes)]."""
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    h = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def safetensors_seeds(args):
    m = os.path.join(FIXTURES, "model")
    copy("safetensors", "llama-shard1.safetensors", os.path.join(m, "llama", "model-00001-of-00003.safetensors"))
    copy("safetensors", "qwen2.safetensors", os.path.join(m, "qwen2", "model.safetensors"))
    copy("safetensors", "expected.safetensors", os.path.join(m, "llama", "expected.safetensors"))
    write("safetensors", "empty-header.safetensors", safetensors_bytes([]))
    write("safetensors", "metadata-only.safetensors", safetensors_bytes([], {"format": "pt"}))
    write("safetensors", "mixed-dtypes.safetensors", safetensors_bytes([
        ("a", "F32", [2, 3], f32(range(6))), ("b", "BF16", [4], b"\x80\x3f" * 4),
        ("c", "F16", [1, 2], b"\x00\x3c" * 2), ("d", "U8", [3], b"\x01\x02\x03"),
        ("e", "BOOL", [1], b"\x01"), ("f", "I64", [1], struct.pack("<q", -1)),
        ("g", "F32", [0, 5], b""), ("h", "F8_E4M3", [2], b"\x01\x02")], {"k": "v"}, pad=5))


# ---- config.json ------------------------------------------------------------

def hf_config_seeds(args):
    m = os.path.join(FIXTURES, "model")
    for d in sorted(os.listdir(m)):
        p = os.path.join(m, d, "config.json")
        if os.path.exists(p):
            copy("hf_config", d + ".json", p)
    llama = {"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 172,
             "num_hidden_layers": 5, "num_attention_heads": 8, "num_key_value_heads": 4,
             "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "bos_token_id": 1,
             "eos_token_id": [1, 2], "tie_word_embeddings": True}
    write("hf_config", "llama3-rope.json", json.dumps(dict(llama, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256}, rope_theta=500000.0)))
    write("hf_config", "rope-parameters-v5.json", json.dumps(dict(llama, rope_parameters={
        "rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})))
    write("hf_config", "qwen3-layer-types.json", json.dumps(dict(
        llama, model_type="qwen3", head_dim=8, use_sliding_window=True, sliding_window=64,
        layer_types=["sliding_attention", "full_attention"] * 2 + ["full_attention"])))
    write("hf_config", "mistral-null-window.json",
          json.dumps(dict(llama, model_type="mistral", sliding_window=None)))
    write("hf_config", "gpt2-defaults.json", json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    write("hf_config", "dynamic-partial.json", json.dumps(dict(
        llama, rope_scaling={"type": "dynamic", "factor": 2.0}, partial_rotary_factor=1.0)))


# ---- tokenizer.json -----------------------------------------------------------

def cut_tokenizer_json(src, keep):
    """The tokenizer with its vocabulary cut to the ids < keep (and the added
    tokens), merges kept when both parts and the result survive."""
    j = json.load(open(src, encoding="utf-8"))
    m = j["model"]
    added = {t["content"] for t in j.get("added_tokens") or []}
    vocab = {k: v for k, v in m["vocab"].items() if v < keep or k in added}
    merges = []
    for mg in m["merges"]:
        a, b = mg.split(" ", 1) if isinstance(mg, str) else mg
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(mg)
    m["vocab"], m["merges"] = vocab, merges
    return json.dumps(j, ensure_ascii=False)


def tokenizer_json_seeds(args):
    t = os.path.join(FIXTURES, "tokenizer")
    for d in ("handmade_a", "handmade_b", "llama3_bpe", "qwen2_bpe"):
        copy("tokenizer_json", d + ".json", os.path.join(t, d, "tokenizer.json"))
    write("tokenizer_json", "smollm2-cut600.json",
          cut_tokenizer_json(os.path.join(t, "smollm2", "tokenizer.json"), 600))
    write("tokenizer_json", "llama2-cut600.json",
          cut_tokenizer_json(os.path.join(t, "llama2", "tokenizer.json"), 600))


# ---- llama2.c -----------------------------------------------------------------

def read_llama2c_tokenizer(path):
    data = open(path, "rb").read()
    pos, pieces, scores = 4, [], []
    while pos < len(data):
        score, n = struct.unpack_from("<fi", data, pos)
        pos += 8
        pieces.append(data[pos:pos + n].decode("utf-8", "surrogateescape"))
        scores.append(score)
        pos += n
    return pieces, scores


def llama2c_checkpoint(dim, hidden, layers, heads, kv_heads, vocab, seq, shared, v1=False):
    kv = dim * kv_heads // heads
    hd = dim // heads
    n = (layers * (2 * dim + dim * dim * 2 + kv * dim * 2 + 3 * hidden * dim) + vocab * dim + dim
         + (0 if shared else vocab * dim))
    if not v1:
        n += seq * hd  # the two legacy RoPE tables
        header = struct.pack("<7i", dim, hidden, layers, heads, kv_heads,
                             vocab if shared else -vocab, seq)
    else:
        header = struct.pack("<Ii7iB", 0x616b3432, 1, dim, hidden, layers, heads, kv_heads, vocab,
                             seq, 1 if shared else 0)
        header += b"\0" * (256 - len(header))
    rng = random.Random(dim * 1000 + layers)
    return header + f32([rng.uniform(-0.1, 0.1) for _ in range(n)])


def llama2c_seeds(args):
    write("llama2c_checkpoint", "tiny-legacy-shared.bin", llama2c_checkpoint(8, 16, 2, 2, 1, 32, 16, True))
    write("llama2c_checkpoint", "tiny-legacy-unshared.bin", llama2c_checkpoint(8, 12, 1, 2, 2, 16, 8, False))
    write("llama2c_checkpoint", "tiny-v1.bin", llama2c_checkpoint(16, 24, 1, 4, 2, 32, 8, True, v1=True))
    if args.shared:
        model = os.path.join(args.shared, "models", "stories260K")
        with open(os.path.join(model, "stories260K.bin"), "rb") as f:
            write("llama2c_checkpoint", "stories260K-first16k.bin", f.read(16384))
        copy("llama2c_tokenizer", "tok512.bin", os.path.join(model, "tok512.bin"))

    def vocab(max_len, entries):
        return struct.pack("<i", max_len) + b"".join(
            struct.pack("<fi", s, len(p)) + p for s, p in entries)

    base = [(0.0, b"<unk>"), (0.0, b"<s>"), (0.0, b"</s>")]
    write("llama2c_tokenizer", "bytes-and-merges.bin", vocab(8, base + [
        (0.0, b"<0x%02X>" % b) for b in range(256)] + [
        (-1.0, b" "), (-2.0, b"a"), (-3.0, b"b"), (-0.5, b"ab"), (-0.2, b" ab"),
        (-1e11, b"aa"), (0.0, b"\xc3\xa9")]))
    write("llama2c_tokenizer", "three-tokens.bin", vocab(5, base))


# ---- torch.save archives ------------------------------------------------------

def fake_torch_modules():
    """Modules named like torch's, so pickle writes the globals torch.save does."""
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")
    for name in ("FloatStorage", "HalfStorage", "BFloat16Storage", "LongStorage", "DoubleStorage"):
        cls = type(name, (), {})
        cls.__module__ = "torch"
        setattr(torch, name, cls)

    def _rebuild_tensor_v2(*a):
        pass

    def _rebuild_parameter(*a):
        pass

    for fn in (_rebuild_tensor_v2, _rebuild_parameter):
        fn.__module__ = "torch._utils"
        fn.__qualname__ = fn.__name__
        setattr(utils, fn.__name__, fn)
    torch._utils = utils
    sys.modules["torch"], sys.modules["torch._utils"] = torch, utils
    return torch, utils


class Storage:
    def __init__(self, cls, key, numel):
        self.cls, self.key, self.numel = cls, key, numel


class Tensor:
    def __init__(self, storage, offset, size, stride, parameter=False):
        self.args = (storage, offset, tuple(size), tuple(stride), False, OrderedDict())
        self.parameter = parameter

    def __reduce__(self):
        torch = sys.modules["torch"]
        if self.parameter:
            return (torch._utils._rebuild_parameter, (Tensor(*self.args[:4]), False, OrderedDict()))
        return (torch._utils._rebuild_tensor_v2, self.args)


class TorchPickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            return ("storage", obj.cls, obj.key, "cpu", obj.numel)
        return None


def torch_save(state, storages, name="archive"):
    """A torch.save-style zip: data.pkl, data/<key>, version, byteorder."""
    buf = io.BytesIO()
    p = io.BytesIO()
    TorchPickler(p, protocol=2).dump(state)
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr(name + "/data.pkl", p.getvalue())
        z.writestr(name + "/byteorder", "little")
        for key, blob in storages.items():
            z.writestr(name + "/data/" + key, blob)
        z.writestr(name + "/version", "3\n")
    return buf.getvalue()


def torch_pickle_seeds(args):
    g = os.path.join(FIXTURES, "gates")
    copy("torch_pickle", "wgkv_official.pt", os.path.join(g, "wgkv_official.pt"))
    copy("torch_pickle", "trimkv_weights.pth", os.path.join(g, "trimkv", "trimkv_weights.pth"))
    copy("torch_pickle", "not_tensors.pt", os.path.join(g, "not_tensors.pt"))
    torch, _ = fake_torch_modules()
    s0 = Storage(torch.FloatStorage, "0", 12)
    s1 = Storage(torch.HalfStorage, "1", 4)
    state = OrderedDict([
        ("model.layers.0.self_attn.retention_gate.linear1.weight", Tensor(s0, 0, [3, 4], [4, 1])),
        ("model.layers.0.self_attn.retention_gate.bias", Tensor(s1, 1, [2], [1], parameter=True)),
        ("model.layers.0.self_attn.retention_gate.linear2.weight", Tensor(s0, 2, [2, 2], [1, 2]))])
    write("torch_pickle", "handmade-ordereddict.pt",
          torch_save(state, {"0": f32(range(12)), "1": b"\x00\x3c" * 4}))
    plain = {"layers.0.self_attn.g_predictors.conv1.weight": Tensor(s0, 0, [2, 2, 1], [2, 1, 1])}
    write("torch_pickle", "handmade-dict.pt", torch_save(plain, {"0": f32(range(12))}, name="gates"))
    write("torch_pickle", "handmade-empty-dict.pt", torch_save({}, {}))


# ---- gate files -------------------------------------------------------------------

STORIES = dict(L=5, K=4, hd=8, D=64)


def gate_params(kind, hyper):
    L, K, hd, D = STORIES["L"], STORIES["K"], STORIES["hd"], STORIES["D"]
    out = []
    for l in range(L):
        p = "layers.%d." % l
        if kind == "wgkv":
            inner = int(hyper["expand"] * hd)
            g = p + "self_attn.g_predictors."
            out += [(g + "pre_key_norm.weight", [hd]), (g + "post_key_norm.weight", [hd]),
                    (g + "conv1.weight", [K * inner, 2 * hd, 1]), (g + "conv1.bias", [K * inner]),
                    (g + "conv2.weight", [K, inner, 1]), (g + "conv2.bias", [K])]
        elif kind == "attention-gate":
            w = hyper["heads"] * hyper["head_dim"]
            out += [(p + "attention_gate.%s.weight" % m, [w, D]) for m in ("q_proj", "k_proj", "v_proj")]
            out += [(p + "attention_gate.o_proj.weight", [K, w])]
        elif kind == "retention":
            g, I = p + "self_attn.retention_gate.", hyper["hidden"]
            out += [(g + "linear1.weight", [I, D]), (g + "linear1.bias", [I]),
                    (g + "linear2.weight", [K, I]), (g + "bias", [K])]
        else:
            g, I = p + "self_attn.retention_gate.", hyper["hidden"]
            out += [(g + "linear1.weight", [K * I, D]), (g + "linear1.bias", [K * I])]
    if kind == "retention-global":
        out += [("retention_gate_shared.linear2.weight", [1, hyper["hidden"]]),
                ("retention_gate_shared.bias", [1])]
    return out


def gate_set_seeds(args):
    hypers = {"wgkv": {"window": 16, "tau": 0.1, "expand": 4, "epsilon": 1e-3, "norm_eps": 1e-6,
                       "activation": "gelu"},
              "attention-gate": {"heads": 1, "head_dim": 8, "tau": 0.5, "gamma": 2.0},
              "retention": {"hidden": 8, "activation": "silu", "bias_init": 10.0},
              "retention-global": {"hidden": 8, "activation": "silu", "bias_init": 10.0}}
    for kind, hyper in hypers.items():
        rng = random.Random(kind)
        tensors = []
        for name, shape in sorted(gate_params(kind, hyper)):
            n = 1
            for d in shape:
                n *= d
            tensors.append((name, "F32", shape, f32([round(rng.uniform(-0.5, 0.5), 3) for _ in range(n)])))
        meta = {"format": "kvscope-gates", "version": 1, "policy": kind, "hyperparameters": hyper,
                "base_model": {"name": "stories260K", "shape": STORIES},
                "training": {"source": "tests/fuzz/make_seeds.py (random values)"}}
        write("gate_set", "stories260K-%s.safetensors" % kind,
              safetensors_bytes(tensors, {"kvscope.gates": json.dumps(meta)}))


# ---- policy specs and their fixtures -------------------------------------------

POLICY_SPECS = [
    "full", "window:window=64", "streaming_llm:sinks=4,window=60",
    "h2o:heavy=32,recent=32,sinks=4", "tova:budget=64,mean_heads=false",
    "snapkv:budget=64,window=16,kernel=5,pooling=max", "pyramidkv:budget=64,beta=20,decode=false",
    "knorm:budget=64", "expected_attention:budget=64,n_future=64,epsilon=0.01,refresh=4",
    "adakv:budget=64,alpha=0.2,scorer=tova", "adakv:scorer=snapkv,window=8,kernel=3",
    "duo_attention:pattern=full_attention_heads.tsv,sparsity=0.5",
    "duo_attention:pattern=duo,threshold=0.3,sinks=4,recent=16",
    "quest:budget=64,page_size=16,dense_layers=1", "wgkv:gates=wgkv,window=16,tau=0.2",
    "wgkv:gates=wgkv_official.pt", "attention_gate:gates=attention-gate,tau=0.4,gamma=1.5",
    "trimkv:gates=retention,budget=32,buffer=4,lookahead=2", "trimkv:gates=trimkv",
    "dbtrimkv:gates=retention-global,budget=32,min=2,window=4"]


def policy_spec_seeds(args):
    for i, spec in enumerate(POLICY_SPECS):
        write("policy_spec", "%02d-%s.txt" % (i, spec.split(":")[0]), spec)
    duo = os.path.join(HERE, "fixtures", "duo")
    os.makedirs(duo, exist_ok=True)
    rng = random.Random(260)
    with open(os.path.join(duo, "full_attention_heads.tsv"), "w") as f:
        for _ in range(STORIES["L"]):
            f.write("\t".join("%.3f" % rng.random() for _ in range(STORIES["K"])) + "\n")
    with open(os.path.join(duo, "config.json"), "w") as f:
        json.dump({"sink_size": 4, "recent_size": 32}, f)
        f.write("\n")


# ---- traces -----------------------------------------------------------------------

def trace_seeds(args):
    """Small traces: synthetic ones of one or two layers, real captures of the
    tiny-llama fixture (2 layers, 2 kv heads; stories260K's 5 x 4 heads make
    700 KB traces), an unclosed and a killed writer's file. Lifetimes are
    stored in uncompressed chunks of 4096 tokens per head, so even these
    are 65-290 KB."""
    if not args.kvscope:
        print("traces: skipped (no --kvscope)", file=sys.stderr)
        return
    tmp = tempfile.mkdtemp()
    synth = ["synth", "--heads", "2", "--kv-heads", "1", "--prompt-tokens", "16", "--decode-steps",
             "4", "--window", "4", "--sinks", "1", "--pooled-block", "4", "--topk", "2"]
    runs = {
        "synth-all-levels.kvtrace.h5": synth + ["--layers", "1"],
        "synth-two-tiers.kvtrace.h5": synth + ["--layers", "2", "--tiers", "2", "--prefill-chunk", "8"],
        "synth-events-only.kvtrace.h5": ["synth", "--layers", "1", "--heads", "2", "--kv-heads", "1",
                                         "--prompt-tokens", "8", "--decode-steps", "4",
                                         "--pooled-block", "0", "--topk", "0", "--no-received",
                                         "--no-oracle", "--no-dense", "--no-gates"],
    }
    model = os.path.join(FIXTURES, "model", "llama_gguf", "tiny-llama-q8_0.gguf")
    cap = ["capture", "--model", model, "--tokenizer",
           os.path.join(FIXTURES, "tokenizer", "handmade_a", "tokenizer.json"),
           "--prompt", "hello world hello", "--max-new", "3", "-q"]
    runs["capture-h2o-all-levels.kvtrace.h5"] = cap + [
        "--policy", "h2o:heavy=2,recent=2", "--capture", "events+received+pooled:4+topk:2+dense:1.3",
        "--oracle"]
    runs["capture-streaming-events.kvtrace.h5"] = cap + [
        "--policy", "streaming_llm:sinks=1,window=3", "--capture", "events"]
    for name, argv in runs.items():
        subprocess.run([args.kvscope] + argv + ["-o", os.path.join(tmp, name)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if args.seed_writer:
        for mode in ("incomplete", "killed"):
            name = "writer-%s.kvtrace.h5" % mode
            subprocess.run([args.seed_writer, os.path.join(tmp, name), mode], check=True)
    for name in os.listdir(tmp):
        copy("trace", name, os.path.join(tmp, name))
    shutil.rmtree(tmp)
    write("trace", "not-hdf5.bin", b"\x89HDF\r\n\x1a\n" + b"\0" * 64)


TARGETS = {"gguf": gguf_seeds, "safetensors": safetensors_seeds, "hf_config": hf_config_seeds,
           "tokenizer_json": tokenizer_json_seeds, "llama2c": llama2c_seeds,
           "torch_pickle": torch_pickle_seeds, "gate_set": gate_set_seeds,
           "policy_spec": policy_spec_seeds, "traces": trace_seeds}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvscope", help="kvscope executable (for the trace seeds)")
    ap.add_argument("--seed-writer", help="write_seed_trace executable (build-sanitize/tests/fuzz)")
    ap.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    ap.add_argument("--smollm", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("targets", nargs="*", choices=[[]] + list(TARGETS), default=[])
    args = ap.parse_args()
    if args.shared and not os.path.isdir(args.shared):
        args.shared = None
    for name in args.targets or TARGETS:
        TARGETS[name](args)


if __name__ == "__main__":
    main()
