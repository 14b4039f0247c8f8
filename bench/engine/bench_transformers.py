#!/usr/bin/env python3
"""The transformers side of the engine benchmark: the same model (a GGUF,
dequantised to fp32 by transformers' gguf_file= loader, or a llama2.c .bin
converted by tests/support/llama2c_hf.py), the same prompt ids,
the same thread count; prefill as one forward, then greedy decode steps with
the KV cache. Both sides compute logits for the last position only, as
transformers' own generate() does (logits_to_keep=1): the prefill's work is
the model, not a 2048 x 49152 logits matrix nobody reads. Prints one JSON
object like bench_engine does.

    python bench_transformers.py --model M.gguf --ids ids.json --lengths 512,2048 --decode 64 --threads 2
"""
import argparse
import json
import os
import resource
import time

import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--lengths", default="512,2048")
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    a = ap.parse_args()
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16

    torch.set_num_threads(a.threads)
    with open(a.ids) as f:
        all_ids = json.load(f)
    t = time.perf_counter()
    if a.model.endswith(".bin"):  # llama2.c checkpoint (stories260K)
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "support"))
        from llama2c_hf import load_llama2c
        model = load_llama2c(a.model).to(dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(os.path.abspath(a.model)), gguf_file=os.path.basename(a.model),
            dtype=dtype)
    model.eval()
    load_s = time.perf_counter() - t
    out = {"engine": "transformers", "transformers": transformers.__version__,
           "torch": torch.__version__, "dtype": a.dtype, "threads": torch.get_num_threads(), "model": a.model,
           "attn_implementation": model.config._attn_implementation,
           "load_seconds": load_s, "runs": []}
    with torch.inference_mode():
        warm = torch.tensor([all_ids[:32]])
        o = model(input_ids=warm, use_cache=True, logits_to_keep=1)
        cache = o.past_key_values
        for p in range(32, 40):
            o = model(input_ids=torch.tensor([[all_ids[p]]]), past_key_values=cache, use_cache=True)
            cache = o.past_key_values
        for n in [int(x) for x in a.lengths.split(",")]:
            ids = torch.tensor([all_ids[:n]])
            # Twice, the faster counts: the first prefill of a new length
            # pays one-time costs (allocator growth, kernel selection).
            prefill_s = float("inf")
            for _ in range(2):
                t = time.perf_counter()
                o = model(input_ids=ids, use_cache=True, logits_to_keep=1)
                prefill_s = min(prefill_s, time.perf_counter() - t)
            cache = o.past_key_values
            token = int(o.logits[0, -1].argmax())
            steps = []
            for _ in range(a.decode):
                t = time.perf_counter()
                o = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True,
                          logits_to_keep=1)
                cache = o.past_key_values
                token = int(o.logits[0, -1].argmax())
                steps.append(time.perf_counter() - t)
            decode_s = sum(steps)
            out["runs"].append({"prompt_tokens": n, "prefill_seconds": prefill_s,
                                "prefill_tokens_per_second": n / prefill_s,
                                "decode_steps": a.decode, "decode_seconds": decode_s,
                                "decode_tokens_per_second": a.decode / decode_s})
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
