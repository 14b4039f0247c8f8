#!/usr/bin/env python3
"""The anchor for bench/gpu/run-capture.sh: PyTorch's own model forward
(transformers' LlamaForCausalLM, attn_implementation="sdpa", bf16, a
DynamicCache) on the same model directory, prompt length and decode length,
in the same run on the same GPU: prefill and decode tokens/s of a first
(cold) and a second (warm) call, and the warm call's peak memory.

    sdpa_model_anchor.py MODEL_DIR --context N --decode M  (one JSON line)
"""
import argparse
import json
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--context", type=int, required=True)
    ap.add_argument("--decode", type=int, default=32)
    a = ap.parse_args()
    cfg = AutoConfig.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").cuda().eval()
    ids = torch.randint(3, 32000, (1, a.context), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    def run(ids, decode):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(ids, use_cache=True)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        cache = out.past_key_values
        nxt = out.logits[:, -1:].argmax(-1)
        for _ in range(decode):
            out = model(nxt, past_key_values=cache, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        return t1 - t0, time.perf_counter() - t1

    with torch.inference_mode():
        # cold: the first call of the process (cuBLAS handles, kernel loads),
        # as each `kvscope capture` process is measured; warm: the same again.
        cold = run(ids, a.decode)
        torch.cuda.reset_peak_memory_stats()
        warm = run(ids, a.decode)
    kv_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * 128 * (a.context + a.decode) * 2
    print(json.dumps({"engine": "transformers-sdpa-bf16", "context": a.context, "decode": a.decode,
                      "layers": cfg.num_hidden_layers,
                      "prefill_tok_s": a.context / warm[0], "decode_tok_s": a.decode / warm[1],
                      "cold_prefill_tok_s": a.context / cold[0], "cold_decode_tok_s": a.decode / cold[1],
                      "kv_bytes": kv_bytes,
                      "peak_mem_bytes": torch.cuda.max_memory_allocated(),
                      "torch": torch.__version__, "device": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
