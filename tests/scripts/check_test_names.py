#!/usr/bin/env python3
"""No Catch2 TEST_CASE name holds a ';'.

    check_test_names.py SOURCE_ROOT

catch_discover_tests hands CTest the names as a CMake list, which splits them
at ';': "a; b" became two CTest tests, "a" and " b", each of which ran no case
and passed ("No tests ran", exit 0), so the case itself never ran in CI.
Exit 1 naming each such case.
"""
import glob
import os
import re
import sys

NAME = re.compile(r'TEST_CASE\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)')


def main():
    root = sys.argv[1]
    bad = []
    for path in sorted(glob.glob(os.path.join(root, "tests", "**", "*.cpp"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for m in NAME.finditer(text):
            name = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))
            if ";" in name:
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"{os.path.relpath(path, root)}:{line}: TEST_CASE \"{name}\" holds ';' "
                           "(CTest would split it into cases that never run; expected ',')")
    for b in bad:
        print(b)
    if not bad:
        print("no TEST_CASE name holds ';'")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
