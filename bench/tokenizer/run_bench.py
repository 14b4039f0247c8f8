#!/usr/bin/env python3
"""Encode throughput of KVScope's tokenizers against Hugging Face `tokenizers` (and llama2.c's
tokenizer.bin against the `sentencepiece` library), same text, same machine, same run, one thread
each (not a test; results go to docs/performance.md).

    /work/venv/bin/python bench/tokenizer/run_bench.py [--build build-tok] [--repeats 5]

The text (about 1 MB) is built from files every Debian machine and this checkout have: licence
texts (English prose), the C++ sources of this repository (code), and the tokenizer test corpus
(CJK, emoji, numbers, whitespace runs), interleaved. Each tokenizer encodes it as one document and
in ~2 KB chunks (prompt-sized, split at line ends); HF encodes the chunks with encode_batch on one
Rayon thread so no Python call overhead is counted. The id checksums must agree, otherwise the
run is reported as a mismatch.
"""
import argparse
import glob
import json
import os
import subprocess
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
FIX = os.path.join(ROOT, "tests", "fixtures", "tokenizer")


def build_text(path):
    parts = []
    for name in ("GPL-3", "GPL-2", "Apache-2.0", "LGPL-3", "MPL-2.0", "GFDL-1.3", "Artistic"):
        p = os.path.join("/usr/share/common-licenses", name)
        if os.path.exists(p):
            parts.append(open(p, encoding="utf-8", errors="replace").read())
    for p in sorted(glob.glob(os.path.join(ROOT, "core", "**", "*.cpp"), recursive=True) +
                    glob.glob(os.path.join(ROOT, "capture", "**", "*.cpp"), recursive=True)):
        parts.append(open(p, encoding="utf-8", errors="replace").read())
    corpus = json.load(open(os.path.join(FIX, "corpus.json"), encoding="utf-8"))
    # No special-token text, and no literal U+2581: llama2.c's vocabulary spells spaces as " "
    # where SentencePiece reads "▁" as a space, so that one character would differ by design.
    multilingual = "\n".join(t.replace("\u2581", "_") for t in corpus if "<" not in t)
    text = ""
    i = 0
    while len(text.encode("utf-8")) < 1_000_000:
        text += parts[i % len(parts)] + "\n" + multilingual + "\n"
        i += 1
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return text


def chunks_of(text, chunk):
    if chunk == 0:
        return [text]
    data = text.encode("utf-8")
    out, start = [], 0
    while start < len(data):
        end = min(len(data), start + chunk)
        nl = data.find(b"\n", end)
        end = len(data) if nl < 0 else nl + 1
        out.append(data[start:end].decode("utf-8"))
        start = end
    return out


def checksum(all_ids):
    s = 0
    for ids in all_ids:
        for i in ids:
            s = (s * 1000003 + i) % (1 << 64)
    return s


def hf_bench(path, text, repeats, chunk):
    tok = Tokenizer.from_file(path)
    pieces = chunks_of(text, chunk)
    best, result = 1e30, None
    for r in range(repeats + 1):
        t = time.perf_counter()
        if len(pieces) == 1:
            result = [tok.encode(pieces[0], add_special_tokens=False).ids]
        else:
            result = [e.ids for e in tok.encode_batch(pieces, add_special_tokens=False)]
        s = time.perf_counter() - t
        if r > 0:
            best = min(best, s)
    n = sum(len(x) for x in result)
    nbytes = len(text.encode("utf-8"))
    return {"impl": "hf", "tokens": n, "best_s": best, "mb_per_s": nbytes / best / 1e6,
            "tokens_per_s": n / best, "checksum": checksum(result)}


def sp_bench(model, text, repeats, chunk):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=model)
    pieces = chunks_of(text, chunk)
    best, result = 1e30, None
    for r in range(repeats + 1):
        t = time.perf_counter()
        result = [sp.encode(p) for p in pieces]
        s = time.perf_counter() - t
        if r > 0:
            best = min(best, s)
    n = sum(len(x) for x in result)
    nbytes = len(text.encode("utf-8"))
    return {"impl": "sentencepiece", "tokens": n, "best_s": best, "mb_per_s": nbytes / best / 1e6,
            "tokens_per_s": n / best, "checksum": checksum(result)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build-tok"))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    exe = os.path.join(args.build, "bench", "tokenizer", "bench_tokenizer")
    text_path = os.path.join(args.build, "bench_tokenizer_text.txt")
    text = build_text(text_path)
    print(f"text: {len(text.encode('utf-8'))} bytes, {len(text)} characters")
    cases = [("SmolLM2 byte-level BPE", os.path.join(FIX, "smollm2", "tokenizer.json")),
             ("Llama 2 SentencePiece BPE (Metaspace)", os.path.join(FIX, "llama2", "tokenizer.json")),
             ("Qwen2-regex BPE (NFC)", os.path.join(FIX, "qwen2_bpe", "tokenizer.json"))]
    shared = os.environ.get("KVSCOPE_SHARED_DIR", os.path.join(ROOT, "..", "shared"))
    l2 = os.path.join(shared, "tokenizers", "llama2")
    cases.append(("Llama 2 tokenizer.bin (llama2.c merge) vs sentencepiece", os.path.join(l2, "tokenizer.bin")))
    rows = []
    for label, path in cases:
        for chunk in (0, 2048):
            out = subprocess.run([exe, path, text_path, str(args.repeats), str(chunk)], check=True,
                                 capture_output=True, text=True).stdout
            ours = json.loads(out.strip().splitlines()[-1])
            if path.endswith(".bin"):
                hf = sp_bench(os.path.join(l2, "tokenizer.model"), text, args.repeats, chunk)
            else:
                hf = hf_bench(path, text, args.repeats, chunk)
            same = ours["checksum"] == hf["checksum"] and ours["tokens"] == hf["tokens"]
            mode = "document" if chunk == 0 else f"{ours['chunks']} chunks of ~{chunk} B"
            row = (f"{label}, {mode}: KVScope {ours['mb_per_s']:.2f} MB/s ({ours['tokens_per_s']/1e6:.2f} M tok/s), "
                   f"{'HF tokenizers' if hf['impl'] == 'hf' else 'sentencepiece'} {hf['mb_per_s']:.2f} MB/s ({hf['tokens_per_s']/1e6:.2f} M tok/s), "
                   f"ratio {ours['mb_per_s']/hf['mb_per_s']:.2f}x, ids {'identical' if same else 'MISMATCH'} "
                   f"({ours['tokens']} tokens)")
            print(row, flush=True)
            rows.append(row)


if __name__ == "__main__":
    main()
