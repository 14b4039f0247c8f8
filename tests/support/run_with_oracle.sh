#!/bin/sh
# Runs a python check in the oracle environment (scripts/setup-oracles;
# ./scripts/test exports KVSCOPE_ORACLE_PYTHON); exits 77 (CTest: skipped),
# saying so, only when no python with transformers and jinja2 can be found.
# usage: run_with_oracle.sh SCRIPT ARGS...
cache="${KVSCOPE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvscope}"
for py in "$KVSCOPE_ORACLE_PYTHON" "$cache/oracles-current/bin/python"; do
  [ -n "$py" ] || continue
  if "$py" -c "import transformers, jinja2" >/dev/null 2>&1; then
    exec "$py" "$@"
  fi
done
echo "SKIPPED: no python with transformers and jinja2 (run scripts/setup-oracles)"
exit 77
