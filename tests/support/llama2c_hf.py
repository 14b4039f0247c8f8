"""A llama2.c checkpoint (e.g. stories260K.bin) as a transformers
LlamaForCausalLM: q/k rows permuted from llama2.c's interleaved RoPE pairs to
transformers' rotate-half halves, as transformers' Llama converter does. Used
by the kvpress cross-check (tests/policies/kvpress_check.py) and the engine
benchmark (bench/engine/bench_transformers.py).
"""
import struct

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM


def load_llama2c(path, dtype=torch.float32, attn_implementation=None):
    """attn_implementation: e.g. "eager" where attention weights must be
    returned (kvpress); None keeps transformers' default."""
    with open(path, "rb") as f:
        dim, hidden, L, H, K, vocab, seq = struct.unpack("7i", f.read(28))
        shared = vocab > 0
        vocab = abs(vocab)
        data = np.frombuffer(f.read(), dtype=np.float32)
    hd = dim // H
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        t = torch.from_numpy(data[off:off + n].copy()).reshape(shape)
        off += n
        return t

    w = {"embed": take(vocab, dim), "att_norm": take(L, dim), "wq": take(L, H * hd, dim),
         "wk": take(L, K * hd, dim), "wv": take(L, K * hd, dim), "wo": take(L, dim, H * hd),
         "ffn_norm": take(L, dim), "w1": take(L, hidden, dim), "w2": take(L, dim, hidden),
         "w3": take(L, hidden, dim), "final_norm": take(dim)}
    take(seq, hd // 2)
    take(seq, hd // 2)  # legacy freq_cis tables
    w["cls"] = w["embed"] if shared else take(vocab, dim)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=hidden, num_hidden_layers=L,
                      num_attention_heads=H, num_key_value_heads=K, max_position_embeddings=seq,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=shared,
                      attention_bias=False, mlp_bias=False, bos_token_id=1, eos_token_id=2)
    if attn_implementation:
        cfg._attn_implementation = attn_implementation
    model = LlamaForCausalLM(cfg).eval()

    def permute(t, heads):  # interleaved pairs -> rotate-half halves
        out_dim, in_dim = t.shape
        return t.view(heads, out_dim // heads // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)

    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(w["embed"])
        for l, layer in enumerate(model.model.layers):
            layer.input_layernorm.weight.copy_(w["att_norm"][l])
            layer.self_attn.q_proj.weight.copy_(permute(w["wq"][l], H))
            layer.self_attn.k_proj.weight.copy_(permute(w["wk"][l], K))
            layer.self_attn.v_proj.weight.copy_(w["wv"][l])
            layer.self_attn.o_proj.weight.copy_(w["wo"][l])
            layer.post_attention_layernorm.weight.copy_(w["ffn_norm"][l])
            layer.mlp.gate_proj.weight.copy_(w["w1"][l])
            layer.mlp.down_proj.weight.copy_(w["w2"][l])
            layer.mlp.up_proj.weight.copy_(w["w3"][l])
        model.model.norm.weight.copy_(w["final_norm"])
        model.lm_head.weight.copy_(w["cls"])
    return model.to(dtype)
