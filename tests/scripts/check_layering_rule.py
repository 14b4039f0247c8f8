#!/usr/bin/env python3
"""cmake/KVScopeLayering.cmake's include rule stops cmake on a forbidden include.

    check_layering_rule.py SOURCE_ROOT WORK_DIR

Configures two throwaway projects that load the module: one whose
capture/gates file includes a capture/policy header must fail naming the file
and the include; one without it must configure. Exit 1 otherwise.
"""
import os
import shutil
import subprocess
import sys

PROJECT = """cmake_minimum_required(VERSION 3.20)
project(layering_rule NONE)
set(KVSCOPE_SOURCE_ROOT ${{CMAKE_CURRENT_SOURCE_DIR}})
include({module})
kvscope_forbid_includes(capture/gates "capture/policy/;capture/train/")
"""


def configure(work, module, includes):
    src, build = os.path.join(work, "src"), os.path.join(work, "build")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(src, "capture", "gates"))
    with open(os.path.join(src, "CMakeLists.txt"), "w") as f:
        f.write(PROJECT.format(module=module))
    with open(os.path.join(src, "capture", "gates", "net.cpp"), "w") as f:
        f.write("".join(f'#include "{h}"\n' for h in includes))
    return subprocess.run(["cmake", "-S", src, "-B", build], capture_output=True, text=True)


def main():
    module = os.path.join(os.path.abspath(sys.argv[1]), "cmake", "KVScopeLayering.cmake")
    work = sys.argv[2]
    bad = configure(os.path.join(work, "forbidden"), module,
                    ["capture/gates/gate_set.h", "capture/policy/policy.h"])
    out = bad.stdout + bad.stderr
    if bad.returncode == 0 or "capture/gates/net.cpp" not in out or "capture/policy/policy.h" not in out:
        print("a capture/gates file including capture/policy/policy.h did not stop cmake "
              f"naming both (exit {bad.returncode}):\n{out}")
        return 1
    good = configure(os.path.join(work, "allowed"), module, ["capture/gates/gate_set.h"])
    if good.returncode != 0:
        print(f"a capture/gates file including only capture/gates stopped cmake:\n{good.stderr}")
        return 1
    print("the include rule stops cmake on capture/gates -> capture/policy, and only then")
    return 0


if __name__ == "__main__":
    sys.exit(main())
