#!/usr/bin/env python3
"""docs/architecture.md's "Counts:" line against the registries kvscope reports.

    check_architecture.py KVSCOPE ARCHITECTURE_MD

Policies: `kvscope policies --json`; views: the choices of `kvscope export
--view` (its CLI11 help lists the view registry's names); trainers: the
trainers `kvscope train --list` lists. Exit 1 naming each count that differs.
"""
import json
import re
import subprocess
import sys


def help_text(kvscope, sub):
    return subprocess.run([kvscope, sub, "--help"], capture_output=True, text=True,
                          check=True).stdout


def registry_counts(kvscope):
    policies = json.loads(subprocess.run([kvscope, "policies", "--json"], capture_output=True,
                                         text=True, check=True).stdout)
    views = re.search(r"--view TEXT:\{([^}]*)\}", help_text(kvscope, "export"))
    if not views:
        sys.exit("check_architecture: `kvscope export --help` lists no --view choices")
    # One line per trainer of the registry.
    listed = subprocess.run([kvscope, "train", "--list"], capture_output=True, text=True,
                            check=True).stdout
    names = [l.split()[0] for l in listed.splitlines() if l.strip()]
    return {"policies": len(policies), "views": len(views.group(1).split(",")),
            "trainers": len(names)}


def documented_counts(path):
    with open(path, encoding="utf-8") as f:
        m = re.search(r"^Counts: (\d+) policies, (\d+) views, (\d+) trainers\.$", f.read(), re.M)
    if not m:
        sys.exit(f"{path}: no line 'Counts: N policies, N views, N trainers.'")
    return {"policies": int(m.group(1)), "views": int(m.group(2)), "trainers": int(m.group(3))}


def main():
    kvscope, doc = sys.argv[1], sys.argv[2]
    have, said = registry_counts(kvscope), documented_counts(doc)
    bad = [f"{k}: the docs say {said[k]}, kvscope has {have[k]}" for k in have if have[k] != said[k]]
    for line in bad:
        print(f"{doc}: Counts: {line}")
    if not bad:
        print("architecture counts agree:", ", ".join(f"{v} {k}" for k, v in have.items()))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
