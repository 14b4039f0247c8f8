#!/usr/bin/env bash
# On a GPU machine: trains the SmolLM2-135M-Instruct gates that this project's
# 2-core CPUs could only train at 256-512-token windows for a few hundred steps
# (resources/gates/README.md). Here they train at SEQ_LEN-token windows with
# `kvscope train --device cuda` (docs/training.md, "On a GPU"):
#   wgkv              WG-KV's write gate         (as shipped: --gate window=64 --lambda 0.1)
#   retention-global  DBTrimKV's retention gates (as shipped: hidden=16, bias_init=5;
#                     the budget is the trainer's default, SEQ_LEN / 4 per head)
#   kvpop-mlstm       KVpop's mLSTM scorer       (as shipped: the default budget 4 + 64 + 188)
#
#   bash bench/gpu/train-gates.sh OUT_DIR [STEPS (2000)] [SEQ_LEN (2048)]
#
# Needs .gpu/ carried (bench/gpu/make-sysroot.sh: the build's sysroot), and on
# this machine:
#   KVSCOPE_SMOLLM2  the GGUF (98 MB, over what one device call carries: split it
#                    with `split -b 50M`, carry the halves in two calls on the same
#                    warm machine and join them there with cat);
#   KVSCOPE_CORPUS   the Debian documentation text the shipped gates trained on
#                    (scripts/gates/make-corpus; default .gpu/debian-docs.txt).
# Environment: TRAIN_SECONDS (per gate and call, default 150), DTYPE of the
# frozen model (fp32), KVSCOPE_BUILD (/tmp/kvbuild), DEVICE (cuda; cpu runs
# the same script on a CPU machine, to check it).
#
# Each gate checkpoints every 50 steps into OUT_DIR. A run cut off by
# TRAIN_SECONDS (or by the call's limit) resumes from its checkpoint when this
# script runs again with OUT_DIR carried back, so thousands of steps can span
# several calls (with the same STEPS and SEQ_LEN: the checkpoint refuses
# other options). Writes OUT_DIR/<gate>.safetensors (+ .json .csv .log .ckpt,
# .generated.jsonl), env.txt and log.txt; `status.txt` lists each gate as
# done or resumable. The gates are compared with the shipped ones afterwards,
# on any machine, by bench/gates/quality.py (the rows of docs/policies/*.md).
set -uo pipefail
out=${1:?usage: train-gates.sh OUT_DIR [STEPS] [SEQ_LEN]}
steps=${2:-2000}
seq_len=${3:-2048}
mkdir -p "$out" && out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
log() { echo "[train-gates $(date +%T)] $*" | tee -a "$out/log.txt" >&2; }
model=${KVSCOPE_SMOLLM2:?KVSCOPE_SMOLLM2: the SmolLM2-135M-Instruct GGUF on this machine}
corpus=${KVSCOPE_CORPUS:-$root/.gpu/debian-docs.txt}
seconds=${TRAIN_SECONDS:-150}
dtype=${DTYPE:-fp32}
device=${DEVICE:-cuda}
b=${KVSCOPE_BUILD:-/tmp/kvbuild}
[ -f "$model" ] || { log "no model at $model"; exit 1; }
[ -f "$corpus" ] || { log "no corpus at $corpus (scripts/gates/make-corpus; carry it in .gpu/)"; exit 1; }
{
  [ "$device" = cpu ] || nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  lscpu | grep -E 'Model name|^CPU\(s\)'
  echo "device $device steps $steps seq_len $seq_len dtype $dtype train_seconds $seconds"
} >"$out/env.txt" 2>&1

if [ ! -x "$b/app/kvscope" ]; then
  log "build"
  bash bench/gpu/build-capture.sh "$b" >"$out/build.txt" 2>&1 || {
    tail -40 "$out/build.txt" | tee -a "$out/log.txt"
    log "build failed"
    exit 1
  }
fi
source "$b/kvscope-env.sh"
kv=$b/app/kvscope

# train NAME ARGS...: one gate, resumed from its checkpoint when there is one.
train() {
  local name=$1
  shift
  local o="$out/SmolLM2-135M-Instruct-$name.safetensors" resume=()
  [ -f "${o%.safetensors}.ckpt" ] && resume=(--resume)
  log "$name: ${resume[*]:-fresh} (steps $steps, seq_len $seq_len)"
  timeout "$seconds" "$kv" train "$@" --model "$model" --data "$corpus" --seq-len "$seq_len" \
    --steps "$steps" --seed 0 --eval-every 200 --eval-windows 8 --checkpoint-every 50 -q \
    --device "$device" --dtype "$dtype" "${resume[@]}" -o "$o" >>"$out/log.txt" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then
    echo "$name done" >>"$out/status.txt"
    log "$name: done ($(tail -1 "${o%.safetensors}.log"))"
  elif [ $rc -eq 124 ]; then
    echo "$name resumable" >>"$out/status.txt"
    local at="before its first evaluation"
    [ -f "${o%.safetensors}.csv" ] && at="at step $(tail -1 "${o%.safetensors}.csv" | cut -d, -f2)"
    log "$name: stopped after ${seconds} s $at (rerun to resume)"
  else
    echo "$name failed rc=$rc" >>"$out/status.txt"
    log "$name: failed (rc $rc)"
  fi
}

: >"$out/status.txt"
train wgkv --policy wgkv --generate 3000 --lr 3e-3 --lambda 0.1 --gate window=64
train retention-global --policy retention-global --generate 3000 --lr 5e-3 --gate hidden=16 \
  --gate bias_init=5
train kvpop-mlstm --policy kvpop --scorer mlstm --lr 5e-3
log "done: $(tr '\n' ';' <"$out/status.txt")"
