#!/usr/bin/env bash
# The KVpop evidence of docs/policies/kvpop.md on SmolLM2-135M-Instruct at
# 75 % and 88 % compression of a 2K context (B = 512 and 256 per head):
#   1. the oracle top-k retention recall per (layer, kv head) of each scorer
#      (figure 7; kvpop_recall.py, exact dense-normaliser oracle, held-out
#      Debian docs), with a recency scorer (a fresh file: every token scores
#      alike, so the long-range set is the k most recent eligible tokens,
#      which is StreamingLLM's window) as the floor;
#   2. next-token KL(full || policy), the oracle's top-16 recall and passkey
#      accuracy (quality.py: licence text, 1984-token prompts + 64 generated;
#      the built-in passkey task at 1984 tokens, 8 depths) for the KVpop
#      scorers, TOVA, StreamingLLM and H2O at the same per-head budget.
# usage: bench/gates/kvpop_eval.sh OUT_DIR [THREADS]   (run from the repository root)
set -euo pipefail
out="${1:?output directory}"
threads="${2:-1}"
kv=build/app/kvscope
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
g=resources/gates/SmolLM2-135M-Instruct-kvpop
mkdir -p "$out"
[ -f "$out/recency.safetensors" ] ||
  "$kv" train --policy kvpop --scorer mlp --model "$model" --data out/gates/debian-docs.txt --seq-len 512 \
    --steps 1 --lr 1e-12 --eval-windows 1 --threads "$threads" -q -o "$out/recency.safetensors"
python3 bench/gates/kvpop_recall.py --kvscope "$kv" --model "$model" --data out/gates/debian-docs.txt \
  --seq-len 2048 --budget 512 --budget 256 --windows 4 --threads "$threads" \
  --scorer mlstm="$g-mlstm.safetensors" --scorer mlstm_immediate="$g-mlstm_immediate.safetensors" \
  --scorer mlp="$g-mlp.safetensors" --scorer recency="$out/recency.safetensors" --out "$out/recall.json"
for B in 512 256; do
  python3 bench/gates/quality.py --kvscope "$kv" --model "$model" --budget "$B" --context 1984 --new 64 \
    --samples 2 --needles 4 --threads "$threads" \
    --budget-policy kvpop_mlstm="kvpop:gates=$g-mlstm.safetensors,budget={M}" \
    --budget-policy kvpop_mlstm_immediate="kvpop:gates=$g-mlstm_immediate.safetensors,budget={M}" \
    --budget-policy kvpop_mlp="kvpop:gates=$g-mlp.safetensors,budget={M}" \
    --budget-policy tova="tova:budget={M}" --out "$out/quality-B$B.json"
done
