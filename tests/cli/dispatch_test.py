#!/usr/bin/env python3
"""kvscope runs the trace commands itself and hands the ones that run a model
to kvscope-engine beside it (app/cli/main.cpp): --help lists both kinds, an
engine command's own help and exit codes come back through kvscope, and
without the engine the command fails naming it, while the trace commands
still work.

usage: dispatch_test.py KVSCOPE SCRATCH
"""
import os
import re
import shutil
import subprocess
import sys

KVSCOPE, SCRATCH = sys.argv[1:3]
ENGINE = os.path.join(os.path.dirname(KVSCOPE), "kvscope-engine")
# kvscope's own; `policies` is in both, and `why`, whose --causal search replays in the engine.
TRACE_COMMANDS = {"info", "why", "synth", "export"}


def run(*args, exe=KVSCOPE):
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def subcommands(help_text):
    """The names under SUBCOMMANDS: in CLI11's help."""
    names, inside = set(), False
    for line in help_text.splitlines():
        if line.startswith("SUBCOMMANDS:") or line.startswith("Subcommands:"):
            inside = True
            continue
        if inside:
            m = re.match(r"\s+([a-z][a-z-]*)\s", line + " ")
            if m:
                names.add(m.group(1))
            elif line.strip() and not line.startswith(" "):
                inside = False
    return names


def check(cond, what):
    if not cond:
        sys.exit("FAILED: " + what)
    print("ok:", what)


code, out = run("--help")
listed = subcommands(out)
code_e, out_e = run("--help", exe=ENGINE)
engine = subcommands(out_e)
check(code == 0 and code_e == 0, "kvscope --help and kvscope-engine --help exit 0")
check(engine and engine & TRACE_COMMANDS == {"why"},
      "the engine runs no trace command but why's causal search: %s" % sorted(engine))
check(listed == engine | TRACE_COMMANDS,
      "kvscope --help lists the trace commands and every engine command (%s)" % sorted(listed))

code, out = run("capture", "--help")
check(code == 0 and "--policy" in out and "--max-new" in out, "kvscope capture --help is capture's help")
code, out = run("capture")
check(code == 2 and "kvscope: error:" in out and "--model is required" in out,
      "an engine command's usage error exits 2 through kvscope, named as kvscope")
code, out = run("policies", "--explain", "h2o:heavy=4,recent=4")
check(code == 0 and "h2o" in out, "kvscope policies --explain runs in the engine")
code, out = run("policies", "--explain", "h2o:heavy=-1")
check(code == 2 and "heavy" in out, "a bad --explain spec exits 2 through kvscope: " + out.strip())
# kvscope lists the policies from the catalogue embedded at build time: the
# engine's own output, byte for byte, in each form.
for form in ([], ["--json"], ["--markdown"]):
    p_front = subprocess.run([KVSCOPE, "policies", *form], capture_output=True, text=True)
    p_engine = subprocess.run([ENGINE, "policies", *form], capture_output=True, text=True)
    check(p_front.returncode == 0 and p_engine.returncode == 0 and p_front.stdout == p_engine.stdout
          and "h2o" in p_front.stdout,
          "kvscope policies %s prints what kvscope-engine prints" % " ".join(form))

# kvscope alone in a folder: the engine's commands fail naming it; the trace
# commands do not need it.
lonely = os.path.join(SCRATCH, "lonely")
shutil.rmtree(lonely, ignore_errors=True)
os.makedirs(lonely)
alone = os.path.join(lonely, "kvscope")
shutil.copy2(KVSCOPE, alone)
code, out = run("capture", "--help", exe=alone)
check(code == 1 and os.path.join(lonely, "kvscope-engine") in out and "capture" in out,
      "without kvscope-engine, capture exits 1 naming the engine's path: " + out.strip())
trace = os.path.join(SCRATCH, "synth.kvtrace.h5")
code, out = run("synth", "--prompt-tokens", "64", "--decode-steps", "4", "-o", trace, exe=alone)
check(code == 0, "kvscope synth runs without the engine: " + out.strip())
code, out = run("info", trace, exe=alone)
check(code == 0 and "64" in out, "kvscope info runs without the engine")
code, out = run("policies", "--json", exe=alone)
check(code == 0 and '"streaming_llm"' in out, "kvscope policies lists the policies without the engine")
code, out = run("policies", "--explain", "h2o", exe=alone)
check(code == 1 and os.path.join(lonely, "kvscope-engine") in out,
      "without kvscope-engine, policies --explain exits 1 naming the engine's path")
print("all dispatch checks passed")
