#!/bin/sh
# Runs kvpress_check.py in the oracle environment (scripts/setup-oracles;
# ./scripts/test exports KVSCOPE_ORACLE_PYTHON); exits 77 (CTest: skipped),
# saying so, only when no python with kvpress, torch, transformers, gguf and
# h5py can be found.
# usage: run_kvpress_check.sh KVSCOPE_EXE SHARED_DIR MODELS_DIR WORK_DIR
here=$(dirname "$0")
cache="${KVSCOPE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvscope}"
for py in "$KVSCOPE_ORACLE_PYTHON" "$cache/oracles-current/bin/python"; do
  [ -n "$py" ] || continue
  if "$py" -c "import kvpress, torch, transformers, gguf, h5py" >/dev/null 2>&1; then
    exec "$py" "$here/kvpress_check.py" "$@"
  fi
done
echo "SKIPPED: no python with kvpress, torch, transformers, gguf and h5py (run scripts/setup-oracles)"
exit 77
