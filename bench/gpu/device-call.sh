#!/usr/bin/env bash
# There, on the GPU machine: one device call of the plan bench/gpu/plan-calls.sh
# prints (bench/gpu/README.md).
#   bash bench/gpu/device-call.sh stash              # call 1
#   STAGES="..." bash bench/gpu/device-call.sh run   # call 2
# Both keep what this call carried (.gpu/parts/*, .gpu/sysroot.tar.xz,
# .gpu/models, .gpu/debian-docs.txt) in $KEEP (/tmp/kvscope-gpu), which
# outlives the call on a warm machine, and put what an earlier call kept back
# into .gpu/. Once every part of the manifest is there, the GGUF is joined,
# unpacked and checked against its SHA-256 (KVSCOPE_SMOLLM2 then names it).
# `run` then runs the STAGES in the order given, each as soon as the one
# before ends, so a call cut off by its time limit loses only the last:
#   parity sweep train smollm2 parity8b bench   bench/gpu/run-capture.sh's stages
#   gates                                       bench/gpu/train-gates.sh with the
#                                               time left (DEADLINE_S, default 570 s
#                                               after the call began)
# Results go to $OUT/capture and $OUT/gates (the device tool brings $OUT back).
set -uo pipefail
start=$(date +%s)
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
keep=${KEEP:-/tmp/kvscope-gpu}
out=${OUT:-/tmp/kvscope-out}
mkdir -p "$keep" "$out" .gpu/parts
log() { echo "[device-call $(date +%T)] $*" | tee -a "$out/device-call.txt" >&2; }

# What this call carried, kept; what an earlier call kept, back in place.
for f in .gpu/parts/* .gpu/sysroot.tar.xz .gpu/debian-docs.txt; do
  [ -f "$f" ] && cp -f "$f" "$keep/$(basename "$f")"
done
[ -d .gpu/models ] && { rm -rf "$keep/models"; cp -a .gpu/models "$keep/models"; }
for f in sysroot.tar.xz debian-docs.txt; do
  [ -f ".gpu/$f" ] || [ ! -f "$keep/$f" ] || cp "$keep/$f" ".gpu/$f"
done
[ -d .gpu/models ] || [ ! -d "$keep/models" ] || cp -a "$keep/models" .gpu/models
log "kept in $keep: $(cd "$keep" && ls | tr '\n' ' ')"

# The GGUF, once every part is here.
gguf=""
if [ -f "$keep/manifest.json" ]; then
  gguf=$(python3 - "$keep" <<'PY'
import hashlib, json, lzma, os, sys
keep = sys.argv[1]
m = json.load(open(os.path.join(keep, "manifest.json")))
target = os.path.join(keep, m["file"])
if os.path.exists(target) and hashlib.sha256(open(target, "rb").read()).hexdigest() == m["sha256"]:
    print(target); sys.exit(0)
missing = [p for p in m["parts"] if not os.path.exists(os.path.join(keep, p))]
if missing:
    print(f"GGUF parts still to come: {missing}", file=sys.stderr); sys.exit(0)
packed = b""
for p, digest in zip(m["parts"], m["part_sha256"]):
    chunk = open(os.path.join(keep, p), "rb").read()
    if hashlib.sha256(chunk).hexdigest() != digest:
        sys.exit(f"{p}: SHA-256 differs from the manifest's (a part from another pack?)")
    packed += chunk
data = lzma.decompress(packed)
if hashlib.sha256(data).hexdigest() != m["sha256"] or len(data) != m["bytes"]:
    sys.exit(f"{m['file']}: joined and unpacked, but its SHA-256 differs from the manifest's")
open(target, "wb").write(data)
print(target)
PY
  ) || log "GGUF: could not be joined (above)"
  [ -n "$gguf" ] && log "GGUF: $gguf (SHA-256 checked)"
fi
[ -n "$gguf" ] && export KVSCOPE_SMOLLM2=$gguf

case "${1:-}" in
stash) log "stashed" ;;
run)
  deadline=$((start + ${DEADLINE_S:-570}))
  for stage in ${STAGES:-parity smollm2 parity8b sweep train bench gates}; do
    left=$((deadline - $(date +%s)))
    [ "$left" -gt 20 ] || { log "$stage: skipped, ${left} s left"; continue; }
    log "$stage: begins, ${left} s left"
    if [ "$stage" = gates ]; then
      # Three gates share what is left; each checkpoints and resumes.
      TRAIN_SECONDS=$(((left - 15) / 3)) bash bench/gpu/train-gates.sh "$out/gates" 2000 2048
    else
      STAGES=$stage timeout "$left" bash bench/gpu/run-capture.sh "$out/capture" 8192 32768
    fi
    log "$stage: exit $?"
    [ -x /tmp/kvbuild/app/kvscope ] && export KVSCOPE_BUILT=1
  done
  rm -f "$out/capture/kvscope"  # the binary: not needed back
  ;;
*)
  log "usage: device-call.sh stash | run"
  exit 2
  ;;
esac
