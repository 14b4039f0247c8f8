#!/usr/bin/env python3
"""Out of host memory, said plainly: `kvscope capture` on SmolLM2 under an
address-space cap (ulimit -v, RLIMIT_AS) too small for the run must exit 1
with "out of host memory" (what was asked, what the machine and the cap
allow), never LibTorch's raw allocator message or a C++ backtrace, and must
leave no trace file behind. The cap is found by bisection between one too
small for the executable's libraries to load (the loader's refusal, exit
127, before any of our code) and one the whole run fits in, so the test does
not depend on this machine's library sizes.

usage: host_memory_test.py KVSCOPE MODELS_DIR SCRATCH"""
import os
import resource
import shutil
import subprocess
import sys

from checks import check, finish

KVSCOPE, MODELS, SCRATCH = (os.path.abspath(a) for a in sys.argv[1:4])
MODEL = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
shutil.rmtree(SCRATCH, ignore_errors=True)
os.makedirs(SCRATCH)
if not os.path.exists(MODEL):
    sys.exit(f"{MODEL}: missing (scripts/fetch-models fetches it)")
MiB = 1 << 20
RAW = ("enforce fail", "DefaultCPUAllocator", "Exception raised from", "terminate called",
       "std::bad_alloc")


def run(cap):
    """Runs one capture under an address-space cap of `cap` bytes."""
    out = os.path.join(SCRATCH, f"cap-{cap // MiB}.kvtrace.h5")
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    p = subprocess.run([KVSCOPE, "capture", "--model", MODEL, "--prompt", "Once upon a time",
                        "--max-new", "4", "--threads", "1", "-o", out],
                       preexec_fn=limit, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stderr, out


lo, hi = 256 * MiB, 64 * 1024 * MiB  # lo: no executable of ours loads; hi: the run fits
code, err, _ = run(hi)
check(code == 0, f"the capture runs under a {hi // MiB} MiB cap (exit {code}): {err.strip()[-200:]}")
failures = []  # (cap, stderr, trace path) of the runs that ran out of memory
while hi - lo > 32 * MiB:
    mid = (lo + hi) // 2 // MiB * MiB
    code, err, out = run(mid)
    print(f"cap {mid // MiB} MiB: exit {code}: {err.strip()[-160:]}")
    check(code in (0, 1, 127) and not any(raw in err for raw in RAW),
          f"cap {mid // MiB} MiB: exit 0, 1 or the loader's 127, no raw LibTorch text")
    if code == 1:
        failures.append((mid, err, out))
    if code == 0:
        hi = mid
    else:
        lo = mid
check(bool(failures), f"a cap between the libraries' and the run's needs ran out of memory "
      f"(bisection ended at {lo // MiB}..{hi // MiB} MiB)")
for cap, err, out in failures:
    line = err.strip().splitlines()[-1] if err.strip() else ""
    check("out of host memory: " in line,
          f"cap {cap // MiB} MiB says it ran out of memory: {line}")
    check(f"ulimit -v caps this process at {cap / 1024**3:.1f} GiB" in line or
          f"ulimit -v caps this process at {cap / MiB:.1f} MiB" in line,
          f"cap {cap // MiB} MiB: the message names the cap")
    check(not os.path.exists(out), f"cap {cap // MiB} MiB: no trace file is left behind")
finish()
