#!/usr/bin/env python3
"""Runs every row of the bad-input catalogue (docs/errors.md) and checks that
the command exits with the row's code and prints the row's message, exactly,
as one line of its output (stdout and stderr).

usage: bad_inputs.py KVSCOPE DOC SHARED_DIR MODELS_DIR SCRATCH [--print]

Placeholders in commands and messages:
  {kvscope}        the kvscope executable
  {stories}        ../shared/models/stories260K (stories260K.bin, tok512.bin)
  {models}         models/ (SmolLM2 GGUF fetched by scripts/fetch-models)
  {fixtures}       tests/fixtures
  {tmp}            a scratch folder, fresh per run
  {trace}          a small real capture (stories260K, H2O, every capture level, oracle)
  {bad:NAME}       a damaged copy of a file, made by the recipe NAME below
In messages, <N> stands for a number that differs between runs (a file size).
A command may start with NAME=VALUE words: its environment, e.g.
KVSCOPE_HAYSTACK_TEXT={tmp}/none.txt {kvscope} capture ...
--print runs every row and prints what it got, for writing new rows.
"""
import os
import random
import re
import shlex
import shutil
import struct
import subprocess
import sys

import h5py
import numpy as np

KVSCOPE, DOC, SHARED, MODELS, SCRATCH = sys.argv[1:6]
SHARED = os.environ.get("KVSCOPE_SHARED_DIR", SHARED)
MODELS = os.environ.get("KVSCOPE_MODELS_DIR", MODELS)
PRINT = "--print" in sys.argv[6:]
SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STORIES = os.path.join(SHARED, "models", "stories260K")
FIXTURES = os.path.join(SOURCE, "tests", "fixtures")
GATES = os.path.join(SOURCE, "resources", "gates")

shutil.rmtree(SCRATCH, ignore_errors=True)
os.makedirs(SCRATCH)
TRACE = os.path.join(SCRATCH, "good.kvtrace.h5")


def run(args, env=None):
    p = subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=300,
                       env=env)
    return p.returncode, p.stdout + p.stderr


def make_trace():
    code, out = run([KVSCOPE, "capture", "--model", STORIES + "/stories260K.bin", "--tokenizer",
                     STORIES + "/tok512.bin", "--policy", "h2o:heavy=8,recent=8", "--prompt",
                     "Once upon a time", "--max-new", "20", "--capture", "received+pooled:8+topk:4",
                     "--oracle", "-q", "-o", TRACE])
    if code != 0:
        sys.exit("could not capture the good trace: " + out)


# ---- recipes for damaged files ----------------------------------------------

def copy_trace(name):
    path = os.path.join(SCRATCH, name + ".kvtrace.h5")
    shutil.copyfile(TRACE, path)
    return path


def edit_attr(obj, key, value):
    def recipe(path):
        with h5py.File(path, "r+") as f:
            f[obj].attrs[key] = value
    return recipe


def edit_value(dataset, index, value):
    def recipe(path):
        with h5py.File(path, "r+") as f:
            d = f[dataset]
            flat = d[...].reshape(-1)
            flat[index] = value
            d[...] = flat.reshape(d.shape)
    return recipe


def delete(obj):
    def recipe(path):
        with h5py.File(path, "r+") as f:
            del f[obj]
    return recipe


def truncate(n):
    def recipe(path):
        with open(path, "r+b") as f:
            f.truncate(n)
    return recipe


def damage_heap(path):
    data = bytearray(open(path, "rb").read())
    at = data.find(b"GCOL")
    struct.pack_into("<Q", data, at + 24, 1 << 40)  # object 1's size
    open(path, "wb").write(data)


def add_series(value_shape, order, inf_at=None):
    """A /series group as a policy that declares the series "cutoff" writes
    it, with `order` as its order attribute and a value dataset of
    value_shape ((S, L, K) when None; zeros, +inf at index inf_at), for
    damaged-series rows (the good trace's policy declares none)."""
    def recipe(path):
        with h5py.File(path, "r+") as f:
            shape = value_shape or (f["steps/kind"].shape[0], f["run"].attrs["n_layers"],
                                    f["run"].attrs["n_kv_heads"])
            g = f.create_group("series")
            g.attrs.create("order", order, dtype=h5py.string_dtype())
            c = g.create_group("cutoff")
            c.attrs["meaning"], c.attrs["units"] = "test cutoff", "1"
            d = c.create_dataset("value", shape=shape, maxshape=(None,) + shape[1:],
                                 dtype=np.float32, chunks=True)
            d.attrs["meaning"], d.attrs["units"], d.attrs["axes"] = "test", "1", "S,L,K"
            if inf_at is not None:
                d[inf_at] = np.inf
    return recipe


def add_stall(step, wait_s):
    """One /stalls row (minor version 3) naming `step` and waiting `wait_s`,
    for damaged-stall rows (the good trace's policy never stalls: its /stalls
    is empty)."""
    def recipe(path):
        with h5py.File(path, "r+") as f:
            row = {"step": step, "layer": 0, "kv_head": 0, "token": 0, "wait_s": wait_s,
                   "needed": -1}
            for col, value in row.items():
                d = f["stalls/" + col]
                d.resize((1,))
                d[0] = value
    return recipe


TRACE_RECIPES = {
    "format": edit_attr("/", "format", "netcdf-thing"),
    "version2": edit_attr("/", "version", np.int64(2)),
    "version0": edit_attr("/", "version", np.int64(0)),
    "layers": edit_attr("/run", "n_layers", np.int64(1000000000)),
    "kvheads": edit_attr("/run", "n_kv_heads", np.int64(3)),
    "vocab": edit_attr("/run", "vocab_size", np.int64(1 << 40)),
    "budget_kind": edit_attr("/run", "budget_kind", "banana"),
    "policy_attr": lambda p: delete_attr(p, "/run", "policy"),
    "events_kind": delete("/events/kind"),
    "oracle": delete("/oracle"),
    "received": delete("/attention/received"),
    "token_id": edit_value("/tokens/id", 2, 5000),
    "mass_nan": edit_value("/attention/received/mass", 3, np.nan),
    "wall_nan": edit_value("/steps/wall_s", 1, np.nan),
    "event_layer": edit_value("/events/layer", 4, 99),
    "heap": damage_heap,
    "series_order": add_series(None, ["cutoff", "ghost"]),
    "series_shape": add_series((20, 5), ["cutoff"]),
    "series_inf": add_series(None, ["cutoff"], inf_at=(2, 0, 1)),
    "stall_step": add_stall(999, 0.001),
    "stall_wait": add_stall(1, -0.5),
    "tier_attended": edit_attr("/run", "tier_attended", np.array([1, 0], dtype=np.uint8)),
    "cut40": truncate(40),
    "cut_half": lambda p: truncate(os.path.getsize(p) // 2)(p),
}


def delete_attr(path, obj, key):
    with h5py.File(path, "r+") as f:
        del f[obj].attrs[key]


def copy_file(src, name):
    path = os.path.join(SCRATCH, name)
    shutil.copyfile(src, path)
    return path


def hf_dir(name, edit, base="llama"):
    path = os.path.join(SCRATCH, name)
    shutil.copytree(os.path.join(FIXTURES, "model", base), path)
    cfg = os.path.join(path, "config.json")
    text = open(cfg).read()
    open(cfg, "w").write(edit(text))
    return path


def json_set(key, raw):
    return lambda text: re.sub(r'"%s"\s*:\s*[^,}]+' % key, '"%s": %s' % (key, raw), text)


def json_update(**keys):
    import json
    return lambda text: json.dumps({**json.loads(text), **keys}, indent=2)


def write_file(name, data):
    path = os.path.join(SCRATCH, name)
    open(path, "wb").write(data)
    return path


def big_prompt():
    words = random.Random(1).choices(["the", "cat", "sat", "on", "a", "mat"], k=60000)
    return write_file("big.txt", " ".join(words).encode())


FILE_RECIPES = {
    "empty": lambda: write_file("empty.kvtrace.h5", b""),
    "text": lambda: write_file("text.kvtrace.h5", b"this is a text file, not a trace\n"),
    "prompt_big": big_prompt,
    "gguf_cut": lambda: cut_copy(os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf"), "cut.gguf", 100000),
    "ckpt_cut": lambda: cut_copy(os.path.join(STORIES, "stories260K.bin"), "cut.bin", 2000),
    "ckpt_text": lambda: write_file("text.bin", b"not a checkpoint\n" * 4),
    "tok_cut": lambda: cut_copy(os.path.join(STORIES, "tok512.bin"), "cut-tok.bin", 10),
    "tokenizer_json": lambda: write_file("tokenizer.json", b"{ not json"),
    "hf_layers": lambda: hf_dir("hf-layers", json_set("num_hidden_layers", "1000000000")),
    "hf_heads": lambda: hf_dir("hf-heads", json_set("num_attention_heads", "-4")),
    "hf_eos": lambda: hf_dir("hf-eos", json_set("eos_token_id", "4294967544")),
    "moe_shared": lambda: hf_dir("moe-shared", json_update(shared_expert_intermediate_size=64), "qwen3_moe"),
    "moe_layer": lambda: hf_dir("moe-layer", json_update(mlp_only_layers=[7]), "qwen3_moe"),
    "moe_topk": lambda: hf_dir("moe-topk", json_update(num_experts_per_tok=9), "mixtral"),
    "phi3_factors": lambda: hf_dir("phi3-factors", lambda t: t.replace('"short_factor": [', '"short_factor": [1.0, '),
                                   "phi3"),
    "sweep_plan": lambda: write_file("plan.toml", (
        '[sweep]\nname = "p"\nmodels = ["%s/stories260K.bin"]\ntokenizer = "%s/tok512.bin"\n'
        'policies = ["full"]\ntasks = ["needle"]\nlengths = [100]\ndepths = [0.5]\nseeds = [1]\n' % (STORIES, STORIES)).encode()),
    "dataset_no_context": lambda: write_file("no-context.jsonl", b'{"question": "q", "answer": "a"}\n'),
    "dataset_answer_type": lambda: write_file(
        "answer-type.jsonl", b'\n{"context": "c", "question": "q", "answer": "a"}\n'
                             b'{"context": "c", "question": "q", "answer": 7}\n'),
}


def cut_copy(src, name, n):
    path = os.path.join(SCRATCH, name)
    with open(src, "rb") as f:
        open(path, "wb").write(f.read(n))
    return path


made = {}


def materialise(name):
    if name in made:
        return made[name]
    if name in TRACE_RECIPES:
        path = copy_trace(name)
        TRACE_RECIPES[name](path)
    elif name in FILE_RECIPES:
        path = FILE_RECIPES[name]()
    else:
        sys.exit("unknown recipe {bad:%s} in %s" % (name, DOC))
    made[name] = path
    return path


def expand(text):
    text = re.sub(r"\{bad:([a-z0-9_]+)\}", lambda m: materialise(m.group(1)), text)
    return (text.replace("{kvscope}", KVSCOPE).replace("{stories}", STORIES)
            .replace("{models}", MODELS).replace("{fixtures}", FIXTURES).replace("{gates}", GATES)
            .replace("{tmp}", SCRATCH).replace("{trace}", TRACE))


# ---- the catalogue ----------------------------------------------------------

def rows():
    """(number, command, exit, message) of every catalogue row."""
    out = []
    for line in open(DOC):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].isdigit():
            continue
        number, _what, command, code, message = cells
        unquote = lambda c: c[1:-1].replace("\\|", "|") if c.startswith("`") and c.endswith("`") else c
        out.append((int(number), unquote(command), int(code), unquote(message)))
    return out


def main():
    make_trace()
    catalogue = rows()
    if len(catalogue) < 60:
        sys.exit("%s: %d rows (expected at least 60)" % (DOC, len(catalogue)))
    failures = 0
    for number, command, code, message in catalogue:
        args = [expand(a) for a in shlex.split(command)]
        env = dict(os.environ)
        while args and re.match(r"^[A-Z_][A-Z0-9_]*=", args[0]):
            name, value = args.pop(0).split("=", 1)
            env[name] = value
        if not args or args[0] != KVSCOPE:
            sys.exit("row %d: the command must start with {kvscope}" % number)
        got_code, output = run(args, env)
        want = expand(message)
        # "<N>" stands for a number that differs between runs (a file size).
        pattern = re.compile("^" + re.escape(want).replace(re.escape("<N>"), r"\d+") + "$")
        lines = [l.rstrip() for l in output.splitlines()]
        if PRINT:
            print("%d | exit %d | %s" % (number, got_code, " // ".join(lines[:3])))
            continue
        if got_code != code or not any(pattern.match(l) for l in lines):
            failures += 1
            print("row %d FAILED: %s\n  expected exit %d and the line: %s\n  got exit %d:\n    %s"
                  % (number, command, code, want, got_code, "\n    ".join(lines[:6])))
    if not PRINT:
        print("%d rows, %d failed" % (len(catalogue), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
