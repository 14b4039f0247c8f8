#!/usr/bin/env python3
"""The anchor of bench/gpu: PyTorch's scaled_dot_product_attention on the
shapes bench_kernels_cuda times (one Llama-3.1-8B layer: 32 query heads,
8 kv heads, head_dim 128; random values), in the same run on the same GPU.
Decode: one query over a contiguous [8, ctx, 128] cache (grouped-query
attention, no statistics); prefill: ctx causal queries. fp32 and bf16.
Prints one JSON object per measurement (CUDA-event mean per call).
usage: sdpa_anchor.py [contexts...]   (default 8192 32768)"""
import json
import sys

import torch
import torch.nn.functional as F

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 32, 8, 128, 32


def time_ms(f, warm, reps):
    for _ in range(warm):
        f()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        f()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def sdpa(q, k, v, causal):
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    except TypeError:  # torch < 2.5: no enable_gqa; repeat the kv heads
        r = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(
            q, k.repeat_interleave(r, 1), v.repeat_interleave(r, 1), is_causal=causal)


def report(**row):
    print(json.dumps(row), flush=True)


def main():
    contexts = [int(a) for a in sys.argv[1:]] or [8192, 32768]
    print(json.dumps({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                      "cuda": torch.version.cuda}), flush=True)
    torch.manual_seed(1)
    for ctx in contexts:
        for dtype in (torch.float32, torch.bfloat16):
            name = str(dtype).replace("torch.", "")
            k = torch.randn(1, KV_HEADS, ctx, HEAD_DIM, device="cuda", dtype=dtype)
            v = torch.randn_like(k)
            q = torch.randn(1, HEADS, 1, HEAD_DIM, device="cuda", dtype=dtype)
            ms = time_ms(lambda: sdpa(q, k, v, False), 10, 100)
            report(phase="decode", impl="torch sdpa", dtype=name, context=ctx, ms_per_layer=round(ms, 4),
                   **{f"ms_for_{LAYERS}_layers": round(ms * LAYERS, 3)})
            qp = torch.randn(1, HEADS, ctx, HEAD_DIM, device="cuda", dtype=dtype)
            try:
                reps = 3 if ctx <= 8192 else 1
                ms = time_ms(lambda: sdpa(qp, k, v, True), 1, reps)
                report(phase="prefill", impl="torch sdpa", dtype=name, context=ctx,
                       ms_per_layer=round(ms, 3))
            except torch.OutOfMemoryError as e:
                report(phase="prefill", impl="torch sdpa", dtype=name, context=ctx,
                       error=f"out of memory: {str(e)[:120]}")
            del q, k, v, qp
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
