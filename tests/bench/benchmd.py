# SPDX-License-Identifier: MIT
"""benchmd.py - the Python benchmarks' part of docs/PERFORMANCE.md: replace
a program's section, between its `<!-- NAME:begin -->` and
`<!-- NAME:end -->` markers, as bench_util.h does for the C ones (appended
when the file has none), by tmp + rename."""
import os


def write_md(path, section, text):
    """Replace section's block of path with text."""
    begin, end = f"<!-- {section}:begin -->", f"<!-- {section}:end -->"
    try:
        with open(path) as f:
            old = f.read()
    except FileNotFoundError:
        old = ""
    s = old.find(begin)
    e = old.find(end, s) if s >= 0 else -1
    block = f"{begin}\n{text}{end}\n"
    if s >= 0 and e >= 0:
        rest = old[e + len(end):]
        new = old[:s] + block + (rest[1:] if rest.startswith("\n") else rest)
    else:
        new = old.rstrip("\n") + ("\n\n" if old else "") + block
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(new)
    os.replace(tmp, path)
