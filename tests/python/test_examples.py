#!/usr/bin/env python3
"""Installs python/ (the kvscope package) with pip into a scratch folder and
runs every ```python block of python/README.md, in order, in one namespace,
on a real capture; then checks the package's errors.

usage: test_examples.py KVSCOPE SOURCE_DIR SHARED_DIR SCRATCH"""
import os
import re
import shutil
import subprocess
import sys

KVSCOPE, SOURCE, SHARED, SCRATCH = (os.path.abspath(a) for a in sys.argv[1:5])
SHARED = os.environ.get("KVSCOPE_SHARED_DIR", SHARED)
STORIES = os.path.join(SHARED, "models", "stories260K")
shutil.rmtree(SCRATCH, ignore_errors=True)
os.makedirs(SCRATCH)

trace = os.path.join(SCRATCH, "needle.kvtrace.h5")
subprocess.run([KVSCOPE, "capture", "--model", STORIES + "/stories260K.bin", "--tokenizer",
                STORIES + "/tok512.bin", "--policy", "streaming_llm:sinks=4,window=32",
                "--task", "needle:tokens=200,depth=0.2,seed=3", "--max-new", "8",
                "--capture", "received", "--oracle", "-q", "-o", trace], check=True)

# The causal search on it, for the causal example (kvscope.causal reads TRACE.causal/).
subprocess.run([KVSCOPE, "why", trace, "--causal", "--budget", "6", "--threads", "1"], check=True,
               capture_output=True)

# A small sweep for the sweep examples: the full cache and StreamingLLM on
# the passkey task at two depths.
plan = os.path.join(SCRATCH, "plan.toml")
with open(plan, "w") as f:
    f.write(f"""[sweep]
models = ["{STORIES}/stories260K.bin"]
tokenizer = "{STORIES}/tok512.bin"
max_new = 6
policies = ["full", "streaming_llm:sinks=4,window=32"]
tasks = ["needle"]
lengths = [200]
depths = [0.1, 0.9]
""")
sweep_dir = os.path.join(SCRATCH, "sweep")
subprocess.run([KVSCOPE, "sweep", plan, "-o", sweep_dir], check=True, capture_output=True)

# pip builds in the source folder it is given (build/, *.egg-info): give it a
# copy, so the checkout stays untouched.
package = os.path.join(SCRATCH, "package")
shutil.copytree(os.path.join(SOURCE, "python"), package,
                ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
site = os.path.join(SCRATCH, "site")
subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                "--no-build-isolation", "--disable-pip-version-check", "--target", site,
                package], check=True)

readme = open(os.path.join(SOURCE, "python", "README.md"), encoding="utf-8").read()
blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
if len(blocks) < 5:
    sys.exit(f"python/README.md: {len(blocks)} python examples, expected at least 5")
env = dict(os.environ, TRACE=trace, KVSCOPE=KVSCOPE, SWEEP=sweep_dir)
code = "\n".join(blocks) + """
# The package's errors.
import h5py
bad = os.path.join(os.path.dirname(os.environ["TRACE"]), "not-a-trace.h5")
h5py.File(bad, "w").close()
try:
    kvscope.open(bad)
    raise SystemExit("a file that is not a trace opened")
except kvscope.TraceError as e:
    assert "not-a-trace.h5: /: attribute format" in str(e), e
newer = os.path.join(os.path.dirname(os.environ["TRACE"]), "newer.kvtrace.h5")
import shutil; shutil.copyfile(os.environ["TRACE"], newer)
with h5py.File(newer, "r+") as f:
    f.attrs["version"] = 2
try:
    kvscope.open(newer)
    raise SystemExit("a version 2 trace opened")
except kvscope.TraceError as e:
    assert "version 2: this package reads version 1 (too new)" in str(e), e
print("examples and errors: ok")
"""
p = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=site), cwd=SCRATCH)
sys.exit(p.returncode)
