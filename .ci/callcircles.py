#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
#
# callcircles.py - call circles between source files: which file defines
# each non-static function, which other files call it, and every circle in
# that graph (a -> b -> ... -> a). The house rule: a room calls downward.
#
#   .ci/callcircles.py [-v] DIR...      (e.g. core gpu fs; each searched below)
#
# Exits 1 when there is a circle. A lexical check, not a compiler: comments
# are stripped, a definition is a line that starts in column 0 with a
# non-static return type and ends its parameter list in '{' (the house
# layout), a call is NAME( anywhere. Includes cannot make circles between .c
# files (they include headers only); headers are checked by the compiler.
import os
import re
import sys

verbose = len(sys.argv) > 1 and sys.argv[1] == "-v"
dirs = [d for d in sys.argv[1:] if d != "-v"]
files = sorted(os.path.join(r, f) for d in dirs for r, _, fs in os.walk(d) for f in fs
               if f.endswith((".c", ".cu")))
defs, src = {}, {}
for f in files:
    s = open(f, encoding="utf-8", errors="replace").read()
    s = re.sub(r"/\*.*?\*/", "", s, flags=re.S)
    s = re.sub(r"//[^\n]*", "", s)
    src[f] = s
    for m in re.finditer(r"^(?!static)[A-Za-z_][\w \*]*?\b(\w+)\s*\([^;]*?\)\s*\{", s, flags=re.M):
        defs.setdefault(m.group(1), f)
edges = {}
for f, s in src.items():
    for m in re.finditer(r"\b(\w+)\s*\(", s):
        g = defs.get(m.group(1))
        if g and g != f:
            edges.setdefault((f, g), set()).add(m.group(1))
if verbose:
    for (a, b), fns in sorted(edges.items()):
        print(f"{a} -> {b}: {' '.join(sorted(fns))}")
adj = {}
for a, b in edges:
    adj.setdefault(a, set()).add(b)
circles = []


def walk(start, node, path):
    for n in sorted(adj.get(node, ())):
        if n == start:
            circles.append(path + [n])
        elif n not in path and n > start:  # each circle once, from its least file
            walk(start, n, path + [n])


for f in files:
    walk(f, f, [f])
for c in circles:
    print("circle: " + " -> ".join(c))
print(f"{len(circles)} circle(s) among {len(files)} files")
sys.exit(1 if circles else 0)
