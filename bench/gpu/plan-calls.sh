#!/usr/bin/env bash
# Here, before a GPU session's device calls (bench/gpu/README.md): fits the
# work into the device tool's limits and prints the calls to make.
#   bash bench/gpu/plan-calls.sh pack [GGUF]   # before the calls
#   bash bench/gpu/plan-calls.sh restore       # after them
#
# The tool copies the working tree plus the carried paths, 64 MiB in all per
# call, and a machine goes back after 30 s idle, so the work is two calls
# made back to back:
#   call 1  the SmolLM2 GGUF's first part (and the training corpus): stashed
#           in /tmp there, nothing else (seconds);
#   call 2  .gpu/ (the build's sysroot, stories260K) and the GGUF's second
#           part: joined and checked there, then the build and every stage.
# `pack` moves the tracked files no GPU stage reads (the SmolLM2 gates,
# screenshots, fuzzing corpora, tokenizer fixtures, retrofitted stories260K
# copies: ~110 MB) to ../kvscope-aside/, makes .gpu/ (make-sysroot.sh) when
# it is missing, compresses the GGUF (xz) and splits it so each call fits
# with a 2 MiB margin, and writes .gpu/parts/manifest.json (SHA-256 of the
# GGUF, the parts in order). `restore` moves the files back; git status is
# then what it was.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
aside=$(dirname "$root")/kvscope-aside
limit=$(((64 - 2) * 1024 * 1024))
die() { echo "plan-calls: ERROR: $*" >&2; exit 1; }

# Tracked paths the device stages never read (run-capture.sh, train-gates.sh
# and the parity scripts read tests/capture, tests/train, resources/gates/
# stories260K-*, bench/ and the sources).
bulky=(resources/gates/SmolLM2-135M-Instruct-* docs/images tests/fuzz/corpus
       tests/fuzz/regressions tests/fixtures/tokenizer/llama2 tests/fixtures/tokenizer/smollm2
       tests/fixtures/tokenizer/expected.json resources/models)

tree_bytes() {  # what the tool copies: tracked files present, untracked ones not ignored
  git ls-files -co --exclude-standard -z | python3 -c '
import os, sys
names = sys.stdin.buffer.read().split(b"\0")
print(sum(os.path.getsize(n) for n in names if n and os.path.isfile(n)))'
}

case "${1:-}" in
pack)
  gguf=${2:-${KVSCOPE_MODELS_DIR:-$root/models}/SmolLM2-135M-Instruct.Q4_1.gguf}
  [ -f "$gguf" ] || die "$gguf: missing (scripts/fetch-models fetches it)"
  [ ! -e "$aside" ] || die "$aside exists: run 'plan-calls.sh restore' first"
  mkdir -p "$aside"
  : >"$aside/MOVED"
  for pattern in "${bulky[@]}"; do
    for p in $pattern; do
      [ -e "$p" ] || continue
      mkdir -p "$aside/$(dirname "$p")"
      mv "$p" "$aside/$p"
      echo "$p" >>"$aside/MOVED"
    done
  done
  [ -f .gpu/sysroot.tar.xz ] || bash bench/gpu/make-sysroot.sh >&2
  corpus=.gpu/debian-docs.txt
  [ -f "$corpus" ] || bash scripts/gates/make-corpus "$root/$corpus" >&2 || true
  tree=$(tree_bytes)
  gpu=$(du -cb .gpu/sysroot.tar.xz .gpu/models | tail -1 | cut -f1)
  extra=$( [ -f "$corpus" ] && stat -c %s "$corpus" || echo 0)
  first=$((limit - tree - extra - 4096))   # call 1: the tree, the corpus, part 0
  second=$((limit - tree - gpu - 4096))    # call 2: the tree, .gpu, part 1
  rm -rf .gpu/parts && mkdir -p .gpu/parts
  python3 - "$gguf" .gpu/parts "$first" "$second" <<'PY'
import hashlib, json, lzma, os, sys
gguf, parts, first, second = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
data = open(gguf, "rb").read()
packed = lzma.compress(data, preset=6)
if len(packed) > first + second:
    sys.exit(f"plan-calls: ERROR: the GGUF packs to {len(packed)} bytes; two calls carry "
             f"{first} + {second}: move more of the tree aside")
cut = min(first, len(packed))
names = []
for i, chunk in enumerate((packed[:cut], packed[cut:])):
    names.append(f"smollm2.xz.{i}")
    with open(os.path.join(parts, names[-1]), "wb") as f:
        f.write(chunk)
json.dump({"file": os.path.basename(gguf), "bytes": len(data),
           "sha256": hashlib.sha256(data).hexdigest(), "parts": names,
           "part_sha256": [hashlib.sha256(c).hexdigest() for c in (packed[:cut], packed[cut:])]},
          open(os.path.join(parts, "manifest.json"), "w"), indent=1)
print(f"GGUF {len(data)} bytes -> xz {len(packed)}: part 0 {cut}, part 1 {len(packed) - cut}",
      file=sys.stderr)
PY
  p0=$(stat -c %s .gpu/parts/smollm2.xz.0)
  p1=$(stat -c %s .gpu/parts/smollm2.xz.1)
  m=$(stat -c %s .gpu/parts/manifest.json)
  one=$((tree + extra + p0 + m))
  two=$((tree + gpu + p1 + m))
  echo "tree $tree bytes; call 1 carries $one, call 2 carries $two (limit $limit)" >&2
  [ "$one" -le "$limit" ] && [ "$two" -le "$limit" ] || die "a call would exceed $limit bytes"
  c1='".gpu/parts/manifest.json", ".gpu/parts/smollm2.xz.0"'
  [ -f "$corpus" ] && c1="$c1, \"$corpus\""
  cat <<EOF
Make these two device calls back to back (a machine goes back after 30 s idle):
  1. command: bash bench/gpu/device-call.sh stash
     carry:   [$c1]
     timeout_s: 120
  2. command: STAGES="parity smollm2 parity8b sweep train bench gates" bash bench/gpu/device-call.sh run
     carry:   [".gpu/sysroot.tar.xz", ".gpu/models", ".gpu/parts/manifest.json", ".gpu/parts/smollm2.xz.1"]
     timeout_s: 590
Then: bash bench/gpu/plan-calls.sh restore
EOF
  ;;
restore)
  [ -f "$aside/MOVED" ] || die "$aside/MOVED: nothing was packed"
  while read -r p; do
    [ ! -e "$p" ] || die "$p exists in the tree and aside: resolve by hand"
    mkdir -p "$(dirname "$p")"
    mv "$aside/$p" "$p"
  done <"$aside/MOVED"
  rm -rf "$aside"
  echo "restored; git status:" >&2
  git status --short >&2
  ;;
*)
  die "usage: plan-calls.sh pack [GGUF] | restore"
  ;;
esac
