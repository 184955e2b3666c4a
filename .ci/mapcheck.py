#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
#
# mapcheck.py - docs/map.md stays true: every C or CUDA source file under
# core/, gpu/ and fs/ is named (in backticks, by its path below that folder)
# in the map's section for that folder ("## core/: ..."), and every source
# file a section names exists. Exits 1, listing what is missing or stale.
#
#   .ci/mapcheck.py [ROOT]      (default: the repository this script is in)
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
text = open(os.path.join(root, "docs", "map.md"), encoding="utf-8").read()
sections = {}
for m in re.finditer(r"^## (\w+)/:.*?(?=^## |\Z)", text, flags=re.M | re.S):
    sections[m.group(1)] = m.group(0)
bad = []
for top in ("core", "gpu", "fs"):
    sec = sections.get(top)
    if sec is None:
        bad.append(f"docs/map.md has no '## {top}/:' section")
        continue
    named = set(re.findall(r"`([\w./-]+\.(?:c|cu))`", sec))
    have = set()
    for r, _, files in os.walk(os.path.join(root, top)):
        for f in files:
            if f.endswith((".c", ".cu")):
                have.add(os.path.relpath(os.path.join(r, f), os.path.join(root, top)))
    bad += [f"{top}/{f}: not in docs/map.md" for f in sorted(have - named)]
    bad += [f"docs/map.md names {top}/{f}, which does not exist" for f in sorted(named - have)]
for b in bad:
    print(b)
print(f"map check: {len(bad)} problem(s)")
sys.exit(1 if bad else 0)
