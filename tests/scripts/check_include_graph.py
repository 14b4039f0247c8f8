#!/usr/bin/env python3
"""The folders of capture/ include one another without a circle.

    check_include_graph.py SOURCE_ROOT

An edge A -> B is a file under capture/A including a header under capture/B.
Exit 1 printing a circle (with one include that makes each of its edges);
otherwise print the folders in an order where each includes only later ones.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^#include "capture/([a-z_]+)/', re.M)


def folder_graph(root):
    capture = os.path.join(root, "capture")
    edges = {}
    for folder in sorted(os.listdir(capture)):
        path = os.path.join(capture, folder)
        if not os.path.isdir(path):
            continue
        edges.setdefault(folder, {})
        for dirpath, _, files in os.walk(path):
            for name in sorted(files):
                if not name.endswith((".h", ".cpp", ".cu", ".cuh")):
                    continue
                file = os.path.join(dirpath, name)
                with open(file, encoding="utf-8") as f:
                    for target in INCLUDE.findall(f.read()):
                        if target != folder:
                            edges[folder].setdefault(target, os.path.relpath(file, root))
    return edges


def find_cycle(edges):
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, {})):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def main():
    root = sys.argv[1]
    edges = folder_graph(root)
    cycle = find_cycle(edges)
    if cycle:
        print("capture/ folders include one another in a circle:")
        for a, b in zip(cycle, cycle[1:]):
            print(f"  capture/{a} -> capture/{b} ({edges[a][b]})")
        return 1
    order, placed = [], set()
    while len(order) < len(edges):  # the folders each including only placed ones
        ready = [f for f in sorted(edges) if f not in placed and set(edges[f]) <= placed]
        order.extend(ready)
        placed.update(ready)
    print("no circle; from the bottom:", " <- ".join(order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
