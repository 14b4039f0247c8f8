#!/usr/bin/env python3
"""A SmolLM2 passkey capture with --chat reads the tokens transformers'
apply_chat_template gives for the same messages.

The capture's prompt (/run prompt, /tokens id) is the chat template around
the task's user message, then the task's answer prefix. transformers renders
and tokenizes the same user message with SmolLM2's own tokenizer and template
(tests/fixtures/tokenizer/smollm2); its ids must be exactly the capture's
first ids.

  chat_passkey_oracle.py KVSCOPE_EXE MODELS_DIR WORK_DIR
"""
import os
import subprocess
import sys

import h5py
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
TOKENIZER = os.path.join(os.path.dirname(HERE), "fixtures", "tokenizer", "smollm2")


def main():
    exe, models, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    trace = os.path.join(work, "passkey-chat.kvtrace.h5")
    subprocess.run([exe, "capture", "--model",
                    os.path.join(models, "SmolLM2-135M-Instruct.Q4_1.gguf"), "--chat",
                    "--task", "needle:tokens=256,depth=0.5,seed=3", "--policy", "full",
                    "--max-new", "2", "-o", trace], check=True, capture_output=True)
    with h5py.File(trace, "r") as f:
        prompt = f["/run"].attrs["prompt"]
        prompt = prompt.decode() if isinstance(prompt, bytes) else prompt
        ids = [int(i) for i in f["/tokens/id"][:]]
    head, tail = "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"
    start = prompt.index(head) + len(head)
    user = prompt[start:prompt.index(tail, start)]
    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    want = tok.apply_chat_template([{"role": "user", "content": user}],
                                   add_generation_prompt=True, tokenize=True)
    want = list(want["input_ids"] if hasattr(want, "keys") else want)
    got = ids[:len(want)]
    if got != want:
        first = next(i for i, (a, b) in enumerate(zip(got + [None] * len(want), want)) if a != b)
        print("DIFFERS at token %d: kvscope %r, transformers %r" %
              (first, got[first:first + 8], want[first:first + 8]))
        sys.exit(1)
    print("the capture's first %d of %d ids are transformers' apply_chat_template ids "
          "(user message of %d characters)" % (len(want), len(ids), len(user)))


if __name__ == "__main__":
    main()
