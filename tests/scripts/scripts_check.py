#!/usr/bin/env python3
"""Every shell script of the repository parses (bash -n) and passes
shellcheck at its error level, and every Python file of bench/ and tests/
compiles. Most of these run by hand or on a lent GPU machine (bench/gpu/),
where a typo costs device time CI never sees.

usage: scripts_check.py REPO_ROOT"""
import os
import shutil
import subprocess
import sys

ROOT = os.path.abspath(sys.argv[1])
sys.path.insert(0, os.path.join(ROOT, "tests", "cli"))
import checks  # noqa: E402  (tests/cli/checks.py: named ok/FAIL lines)


def repository_files():
    """git's files, or (a source tree without .git) every file outside the build folders."""
    p = subprocess.run(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard", "-z"],
                       capture_output=True)
    if p.returncode == 0:
        names = [n.decode() for n in p.stdout.split(b"\0") if n]
    else:
        names = [os.path.relpath(os.path.join(d, f), ROOT) for d, dirs, fs in os.walk(ROOT)
                 for f in fs if not os.path.relpath(d, ROOT).startswith(("build", "models", ".git", "out"))]
    return [n for n in names if os.path.isfile(os.path.join(ROOT, n))]


def is_shell(path):
    if path.endswith(".sh"):
        return True
    with open(os.path.join(ROOT, path), "rb") as f:
        first = f.readline()
    return first.startswith(b"#!") and (b"bash" in first or first.strip().endswith(b"/sh"))


files = repository_files()
shell = sorted(f for f in files if not f.startswith(("build", "out/")) and is_shell(f))
python = sorted(f for f in files if f.endswith(".py") and f.startswith(("bench/", "tests/")))
checks.check(len(shell) >= 20 and "bench/gpu/device-call.sh" in shell and ".ci/run" in shell,
             f"{len(shell)} shell scripts found, bench/gpu's and .ci/run among them")
for f in shell:
    p = subprocess.run(["bash", "-n", f], cwd=ROOT, capture_output=True, text=True)
    checks.check(p.returncode == 0, f"bash -n {f}" + (": " + p.stderr.strip() if p.stderr else ""))
shellcheck = shutil.which("shellcheck")
if shellcheck:
    p = subprocess.run([shellcheck, "-S", "error", "-x"] + shell, cwd=ROOT, capture_output=True,
                       text=True)
    checks.check(p.returncode == 0, "shellcheck -S error on all of them" +
                 (":\n" + p.stdout[-3000:] if p.returncode else ""))
else:
    print("NOT RUN: shellcheck is not installed (scripts/setup-deps installs it)")
for f in python:
    p = subprocess.run([sys.executable, "-c", "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')", f],
                       cwd=ROOT, capture_output=True, text=True)
    checks.check(p.returncode == 0, f"compiles: {f}" + (": " + p.stderr.strip()[-300:] if p.returncode else ""))
checks.finish()
