"""Named checks for the command-line test scripts: each prints ok/FAIL with
what it checked; finish() exits non-zero when any failed."""
import sys

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def finish():
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("all checks passed")
