# libFuzzer flags shared by run-fuzz-test (CTest) and scripts/fuzz (long
# shellcheck shell=bash
# runs). Source, don't run.

# Every run: the memory limits that turn an unbounded allocation into a
# finding, a per-input time limit (ASan and UBSan builds are slow, but no
# valid parse of a small input takes seconds), and reports that say where.
fuzz_common_flags() {
  echo -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=25 -print_final_stats=1
}

# Per target: input size limits and dictionaries.
fuzz_target_flags() {
  local name="$1" dir
  dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  case "$name" in
    trace_read | trace_validate) echo -max_len=400000 ;;  # seeds are traces of 65-290 KB
    gguf | tokenizer_json | torch_pickle | gate_set | safetensors) echo -max_len=262144 ;;
    llama2c_checkpoint | llama2c_tokenizer) echo -max_len=65536 ;;
    hf_config | policy_spec) echo -max_len=4096 ;;
    chat_template) echo -max_len=32768 ;;  # real templates are 0.4-17 KB
  esac
  [ -f "$dir/dict/$name.dict" ] && echo "-dict=$dir/dict/$name.dict"
  return 0
}

# Sanitizer settings: stop at the first report, with a stack; leaks inside
# HDF5 and LibTorch on corrupt input are suppressed (lsan.supp says why).
_fuzz_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# Always these suppressions (LSan takes one file): a caller's LSAN_OPTIONS,
# e.g. the sanitizer stage's, does not know LibTorch's leak on a damaged zip.
export LSAN_OPTIONS="suppressions=$_fuzz_dir/lsan.supp:print_suppressions=0"
