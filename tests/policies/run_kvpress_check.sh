#!/bin/sh
# Runs kvpress_check.py with the first python that imports kvpress, torch,
# transformers and h5py; exits 77 (CTest: skipped) when there is none.
# usage: run_kvpress_check.sh KVSCOPE_EXE SHARED_DIR WORK_DIR
here=$(dirname "$0")
for py in "$KVSCOPE_KVPRESS_PYTHON" /work/venv-kvpress/bin/python /work/venv/bin/python python3; do
  [ -n "$py" ] || continue
  if "$py" -c "import kvpress, torch, transformers, h5py" >/dev/null 2>&1; then
    exec "$py" "$here/kvpress_check.py" "$@"
  fi
done
echo "kvpress not importable by any python tried: cross-check skipped"
exit 77
