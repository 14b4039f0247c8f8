#!/usr/bin/env python3
"""Writes a Llama-3.1-8B-shaped model with random weights (no checkpoint can be
downloaded): the published config (hidden 4096, 32 query heads, 8 kv heads,
head_dim 128, MLP 14336, RoPE llama3 scaling, theta 500000) with fewer layers
(--layers), tied embeddings, bf16, and the llama2 tokenizer fixture (token ids
stay below the 128256-row vocabulary). Per-layer costs are those of the real
model; whole-model figures scale with 32 / layers.

    make_llama8b_shaped.py OUT_DIR [--layers 4] [--seed 0]
"""
import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg = dict(CONFIG, num_hidden_layers=a.layers)
    os.makedirs(a.out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(a.seed)
    D, F, H, K, hd = 4096, 14336, 32, 8, 128

    def w(rows, cols):  # the usual 1/sqrt(fan_in) scale keeps activations finite
        return (torch.randn(rows, cols, generator=g, device=dev) / cols**0.5).to(torch.bfloat16).cpu()

    t = {"model.embed_tokens.weight": w(cfg["vocab_size"], D), "model.norm.weight": torch.ones(D, dtype=torch.bfloat16)}
    for i in range(a.layers):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = w(H * hd, D)
        t[p + "self_attn.k_proj.weight"] = w(K * hd, D)
        t[p + "self_attn.v_proj.weight"] = w(K * hd, D)
        t[p + "self_attn.o_proj.weight"] = w(D, H * hd)
        t[p + "mlp.gate_proj.weight"] = w(F, D)
        t[p + "mlp.up_proj.weight"] = w(F, D)
        t[p + "mlp.down_proj.weight"] = w(D, F)
        t[p + "input_layernorm.weight"] = torch.ones(D, dtype=torch.bfloat16)
        t[p + "post_attention_layernorm.weight"] = torch.ones(D, dtype=torch.bfloat16)
    save_file(t, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    here = os.path.dirname(os.path.abspath(__file__))
    tok = os.path.join(here, "..", "..", "tests", "fixtures", "tokenizer", "llama2")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok, name), a.out)
    print(f"wrote {a.out}: {a.layers} layers, {sum(x.numel() for x in t.values()) / 1e9:.2f} B parameters")


if __name__ == "__main__":
    main()
