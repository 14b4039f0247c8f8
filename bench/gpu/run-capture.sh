#!/usr/bin/env bash
# On a GPU machine: builds kvscope (bench/gpu/build-capture.sh), checks that
# `kvscope capture --device cuda` writes the trace `--device cpu` writes
# (tests/capture/trace_parity.py: tokens, steps and events equal, received mass
# within tolerance) on stories260K and on a Llama-3.1-8B-shaped model with
# random weights, then benchmarks that model at 8K and 32K tokens of context
# (--capture none / events / received+pooled) against PyTorch's own model forward
# (transformers, SDPA, bf16) in the same run.
#   [STAGES="parity train"] bash bench/gpu/run-capture.sh OUT_DIR [contexts...]
#   (contexts default 8192 32768)
# Writes OUT_DIR/env.txt, log.txt, parity.jsonl, train-parity.jsonl, bench.jsonl, sdpa.jsonl.
# Needs .gpu/ carried (bench/gpu/make-sysroot.sh: the sysroot and stories260K),
# and a working tree under the device tool's 64 MiB: move the SmolLM2 gate
# files of resources/gates/ aside for the call (none of this reads them).
# OUT_DIR/kvscope is the binary built there, for a later call to carry.
set -uo pipefail
# STAGES (default all): any of parity train sweep smollm2 parity8b bench, so one
# session's device calls (10 minutes each at most) can split the work; on a
# machine still warm from the last call /tmp/kvbuild is kept and the build
# is incremental.
stages=" ${STAGES:-parity train sweep smollm2 parity8b bench} "
want() { [[ "$stages" == *" $1 "* ]]; }
out=${1:?usage: run-capture.sh OUT_DIR [contexts...]}
shift
contexts=("$@")
[ $# -eq 0 ] && contexts=(8192 32768)
mkdir -p "$out" && out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
log() { echo "[run-capture $(date +%T)] $*" | tee -a "$out/log.txt" >&2; }
py=${KVSCOPE_PYTHON:-$(command -v python3)}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  g++ --version | head -1
  lscpu | grep -E 'Model name|^CPU\(s\)'
} >"$out/env.txt" 2>&1

b=/tmp/kvbuild
# KVSCOPE_BUILT=1: an earlier invocation of this call built it (device-call.sh
# runs one stage per invocation; a configure each time would cost seconds).
if [ "${KVSCOPE_BUILT:-0}" = 1 ] && [ -x "$b/app/kvscope" ]; then
  log "build: kept from the previous stage"
else
  log "build"
  if ! bash bench/gpu/build-capture.sh "$b" >"$out/build.txt" 2>&1; then
    tail -60 "$out/build.txt" | tee -a "$out/log.txt"
    log "build failed"; exit 1
  fi
fi
source "$b/kvscope-env.sh"
kv=$b/app/kvscope
cp "$kv" "$out/kvscope"
t=/tmp/kvcap && mkdir -p "$t"

# 1. Parity on stories260K: one policy per path (device kernels with each
#    statistic and the oracle; masks and INT4 tiers on the host path).
S=.gpu/models
if want parity; then
  log "parity: stories260K"
  "$py" tests/capture/cuda_capture_parity.py "$kv" "$S" "$t/stories" --jsonl "$out/parity.jsonl" >>"$out/log.txt" 2>&1 \
    || log "stories260K parity: failures (log.txt)"
fi

# 1a. kvscope train --device cuda against --device cpu: every trainer that runs
#     on a GPU, three steps each (tests/train/cuda_train_parity.py).
if want train; then
  log "train parity: stories260K"
  "$py" tests/train/cuda_train_parity.py "$kv" "$S" "$t/train" --jsonl "$out/train-parity.jsonl" >>"$out/log.txt" 2>&1 \
    || log "train parity: failures (log.txt)"
fi

# 1a'. kvscope sweep --device cuda against --device cpu: the example plan's 60
#      cells on stories260K, each cell's outcome compared (status, answer
#      found, text generated; needle-survival counts may part at ties as
#      events do).
if want sweep; then
  log "sweep parity: stories260K example plan"
  sed "s#\.\./\.\./\.\./shared/models/stories260K#$root/$S#" bench/sweeps/stories260K-example.toml >"$t/example.toml"
  for d in cpu cuda; do
    rm -rf "$t/sweep-$d"
    timeout 300 "$kv" sweep "$t/example.toml" -o "$t/sweep-$d" --device $d >"$t/sweep-$d.txt" 2>&1 \
      || log "sweep $d failed: $(tail -3 "$t/sweep-$d.txt")"
  done
  "$py" - "$t/sweep-cpu/results.csv" "$t/sweep-cuda/results.csv" >>"$out/parity.jsonl" 2>>"$out/log.txt" <<'PY' \
    || log "sweep parity: no tables to compare (log.txt)"
import csv, json, sys
cpu, cuda = ({r["cell_id"]: r for r in csv.DictReader(open(p))} for p in sys.argv[1:])
keys = ("status", "success", "generated")
same = [c for c in cpu if c in cuda and all(cpu[c][k] == cuda[c][k] for k in keys)]
print(json.dumps({"model": "stories260K", "sweep": "stories260K-example", "cells_cpu": len(cpu),
                  "cells_cuda": len(cuda), "same_outcome": len(same),
                  "differ": sorted(set(cpu) - set(same))}))
PY
fi

# 1b. SmolLM2-135M-Instruct, when KVSCOPE_SMOLLM2 names its GGUF on this
#     machine. The 98 MB file is over what one device call carries: split it
#     here (split -b 50M) and carry the halves in two calls on the same warm
#     machine, joining them there with cat.
if want smollm2 && [ -n "${KVSCOPE_SMOLLM2:-}" ] && [ -f "$KVSCOPE_SMOLLM2" ]; then
  log "parity: SmolLM2"
  # sfc, kvpop and wgkv: several attended tiers or an INT4 tier, read on the
  # device by the blocked path (docs/architecture.md), with the shipped gates.
  for spec in full h2o:heavy=64,recent=64 tova:budget=128 snapkv:budget=128,window=16 \
    sfc:hot=0.4 kvpop wgkv; do
    name=${spec%%:*}
    for d in cpu cuda; do
      timeout 120 "$kv" capture --model "$KVSCOPE_SMOLLM2" --task needle:tokens=512 --policy "$spec" \
        --max-new 24 --ignore-eos --device $d --capture received+pooled:16 \
        -o "$t/m-$name.$d.kvtrace.h5" >"$t/m-$name.$d.txt" 2>&1 \
        || log "capture SmolLM2 $spec $d failed: $(tail -3 "$t/m-$name.$d.txt")"
    done
    echo "{\"model\": \"SmolLM2-135M-Instruct\", \"policy\": \"$spec\", \"result\": $("$py" tests/capture/trace_parity.py "$t/m-$name.cpu.kvtrace.h5" "$t/m-$name.cuda.kvtrace.h5" 2>&1 | tail -1)}" >>"$out/parity.jsonl"
  done
fi

# 2. The 8B-shaped model: parity at 1K tokens (fp32 both sides; the prefill's
#    chunks of 512 through the kernel and through the blocked path), then the
#    benchmark.
m=/tmp/llama8b-4l
if want parity8b || want bench; then
  log "model: $m"
  [ -f "$m/config.json" ] || "$py" bench/gpu/make_llama8b_shaped.py "$m" --layers 4 >>"$out/log.txt" 2>&1 \
    || { log "model failed"; exit 1; }
fi
if want parity8b; then
  for spec in full h2o:heavy=256,recent=256; do
    name=${spec%%:*}
    timeout 240 "$kv" capture --model "$m" --task needle:tokens=1024 --policy "$spec" --max-new 16 --ignore-eos \
      --device cpu --dtype fp32 --capture received+pooled:64 -o "$t/l-$name.cpu.kvtrace.h5" >"$t/l-$name.cpu.txt" 2>&1 \
      || log "capture 8B-shaped $spec cpu failed: $(tail -3 "$t/l-$name.cpu.txt")"
    for prefill in kernel blocked; do
      timeout 240 "$kv" capture --model "$m" --task needle:tokens=1024 --policy "$spec" --max-new 16 --ignore-eos \
        --device cuda --device-prefill $prefill --dtype fp32 --capture received+pooled:64 \
        -o "$t/l-$name.$prefill.kvtrace.h5" >"$t/l-$name.$prefill.txt" 2>&1 \
        || log "capture 8B-shaped $spec cuda $prefill failed: $(tail -3 "$t/l-$name.$prefill.txt")"
      echo "{\"model\": \"llama8b-shaped-4l\", \"policy\": \"$spec\", \"device_prefill\": \"$prefill\", \"result\": $("$py" tests/capture/trace_parity.py "$t/l-$name.cpu.kvtrace.h5" "$t/l-$name.$prefill.kvtrace.h5" --mass-atol 1e-4 2>&1 | tail -1)}" >>"$out/parity.jsonl"
    done
  done
fi

if want bench; then
  log "bench"
  for ctx in "${contexts[@]}"; do
    for run in "full none kernel" "full events kernel" "full received+pooled:64 kernel" \
               "h2o:heavy=1024,recent=1024 events kernel" \
               "full none blocked" "full received+pooled:64 blocked"; do
      set -- $run
      # Peak device memory: nvidia-smi sampled every 0.1 s, minus the idle reading.
      idle=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
      (while sleep 0.1; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; done) >"$t/mem.txt" 2>/dev/null &
      sampler=$!
      t0=$(date +%s.%N)
      timeout 200 "$kv" capture --model "$m" --task "needle:tokens=$ctx" --policy "$1" \
        --max-new 32 --ignore-eos --prefill-chunk 2048 --device cuda --device-prefill "$3" --dtype bf16 --capture "$2" \
        -o "$t/bench.kvtrace.h5" >"$t/bench.txt" 2>&1
      rc=$?
      echo "$t0 $(date +%s.%N)" | awk '{printf "%.2f s\n", $2 - $1}' >"$t/time.txt"
      kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
      peak=$(( $(sort -n "$t/mem.txt" | tail -1) - idle ))
      line=$(grep '^capture:' "$t/bench.txt" | tail -1)
      "$py" - "$ctx" "$1" "$2" "$rc" "$line" "$(cat "$t/time.txt" 2>/dev/null | tail -1)" "$peak" "$3" >>"$out/bench.jsonl" <<'PY'
import json, re, sys
ctx, policy, level, rc, line, tm, peak, prefill = sys.argv[1:]
g = lambda p: (float(re.search(p, line).group(1)) if re.search(p, line) else None)
print(json.dumps({"context": int(ctx), "policy": policy, "capture": level, "device_prefill": prefill, "rc": int(rc),
                  "prefill_tok_s": g(r"prefill ([0-9.]+) tokens/s"), "decode_tok_s": g(r"decode ([0-9.]+) tokens/s"),
                  "peak_kv": (re.search(r"peak ([0-9.]+ [KMG]iB)", line) or [None, None])[1],
                  "wall": tm, "peak_device_mib_sampled": int(peak), "line": line}))
PY
      log "$ctx $run: rc $rc ${line:0:200}"
      [ $rc -eq 0 ] || tail -5 "$t/bench.txt" >>"$out/log.txt"
    done
    timeout 120 "$py" bench/gpu/sdpa_model_anchor.py "$m" --context "$ctx" --decode 32 >>"$out/sdpa.jsonl" 2>>"$out/log.txt" \
      || log "sdpa anchor $ctx failed"
  done
fi
log "done"
