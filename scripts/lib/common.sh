# Shared by the scripts in scripts/: logging and paths. Source, don't run.
# shellcheck shell=bash
KVSCOPE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Which LibTorch the build links (README, "LibTorch"): pip, the pinned PyPI
# torch (scripts/setup-torch; the default), or debian, Debian's libtorch-dev
# 1.13 (the fallback for machines without PyPI). Each has its own build tree.
KVSCOPE_TORCH="${KVSCOPE_TORCH:-pip}"
case "$KVSCOPE_TORCH" in
  pip) KVSCOPE_BUILD_DIR="${KVSCOPE_BUILD_DIR:-$KVSCOPE_ROOT/build}" ;;
  debian) KVSCOPE_BUILD_DIR="${KVSCOPE_BUILD_DIR:-$KVSCOPE_ROOT/build-debian-torch}" ;;
  *) printf '[kvscope] error: KVSCOPE_TORCH=%s: expected pip or debian\n' "$KVSCOPE_TORCH" >&2; exit 1 ;;
esac
KVSCOPE_MODELS_DIR="${KVSCOPE_MODELS_DIR:-$KVSCOPE_ROOT/models}"
KVSCOPE_SHARED_DIR="${KVSCOPE_SHARED_DIR:-$(cd "$KVSCOPE_ROOT/.." && pwd)/shared}"
# Caches that outlive build trees and clones (the pinned PyPI torch, llama.cpp).
KVSCOPE_CACHE_DIR="${KVSCOPE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvscope}"
export KVSCOPE_SHARED_DIR

# Seconds since the outermost script started (./scripts/test runs the others):
# each log line carries it, so a slow CI run shows which stage took the time.
export KVSCOPE_T0="${KVSCOPE_T0:-$(date +%s)}"
log() { printf '\033[1m[kvscope +%ss]\033[0m %s\n' "$(($(date +%s) - KVSCOPE_T0))" "$*" >&2; }
die() { printf '\033[1;31m[kvscope] error:\033[0m %s\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# ccache settings that make precompiled headers cacheable.
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
# Paths relative to the checkout: clones and worktrees at other paths (CI's
# fresh clone included) hit the same cache entries.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$KVSCOPE_ROOT}"
# The sanitizer tree compiles with -g1, and with debug info ccache hashes the
# working directory unless told not to: every clone at a new path (CI's
# included) then rebuilt build-sanitize/ from nothing. The cost: a cached
# object's DW_AT_comp_dir may name another clone's build folder; the file
# names in ASan's stack traces are relative (CCACHE_BASEDIR) and still right.
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
