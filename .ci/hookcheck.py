#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
#
# hookcheck.py - what ships reads no environment variable of the tests or
# the benchmarks. Two checks, each exits 1 listing what it found:
#
# 1. The sources: every getenv() in core/, fs/ and gpu/ lies in a block
#    compiled only into the tests' or the benchmarks' variants, under
#    `#ifdef SFS_TEST_HOOKS` or `#ifdef SFS_BENCH_BASELINES` (or the #else
#    of an #ifndef of one; core/CMakeLists.txt says which build defines
#    which). The product daemon and libshardfs-rank define neither.
# 2. With a build directory: the product binaries it holds (fs/shardfs,
#    gpu/libshardfs-rank.so, gpu/shardfs-load) carry no SHARDFS_ name but
#    the library's symbol versions (SHARDFS_RANK_0.1, ...); and the tests'
#    daemon, fs/shardfs-hooks, where built, does carry its hooks' names, so
#    the check is known to see them.
#
#   .ci/hookcheck.py [--root ROOT] [BUILD_DIR]
import os
import re
import sys

GUARDS = ("SFS_TEST_HOOKS", "SFS_BENCH_BASELINES")
SOURCES = (".c", ".h", ".cu", ".cpp")


def strip_comments(text):
    """The text with comments blanked (newlines kept) and string literals kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def names_guard(expr):
    """Does a #if expression require one of the guards to be defined?"""
    return any(re.search(r"(?<!!)\bdefined\s*\(?\s*" + g + r"\b", expr) for g in GUARDS) and "||" not in expr


def unguarded_getenvs(path):
    """(line, text) of each getenv outside a guarded block."""
    text = strip_comments(open(path, encoding="utf-8", errors="replace").read())
    stack = []  # per open #if: [this branch guarded, the #if's #else would be guarded]
    bad = []
    for no, line in enumerate(text.split("\n"), 1):
        m = re.match(r"\s*#\s*(\w+)\s*(.*)", line)
        if m:
            d, rest = m.group(1), m.group(2).strip()
            if d == "ifdef":
                g = rest.split()[0] in GUARDS if rest else False
                stack.append([g, False])
            elif d == "ifndef":
                g = rest.split()[0] in GUARDS if rest else False
                stack.append([False, g])
            elif d == "if":
                stack.append([names_guard(rest), False])
            elif d == "elif" and stack:
                stack[-1] = [names_guard(rest), False]
            elif d == "else" and stack:
                stack[-1] = [stack[-1][1], False]
            elif d == "endif" and stack:
                stack.pop()
            continue
        if re.search(r"\b(secure_)?getenv\s*\(", line) and not any(b[0] for b in stack):
            bad.append((no, line.strip()))
    return bad


def check_sources(root):
    bad = []
    for top in ("core", "fs", "gpu"):
        for r, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if f.endswith(SOURCES):
                    p = os.path.join(r, f)
                    for no, line in unguarded_getenvs(p):
                        bad.append(f"{os.path.relpath(p, root)}:{no}: {line}")
    return bad


NAME = re.compile(rb"SHARDFS_[A-Z0-9_]+")
ALLOWED = re.compile(rb"SHARDFS_RANK_[0-9]+$")  # symbol versions: SHARDFS_RANK_0.1


def names_in(path):
    data = open(path, "rb").read()
    return sorted({m.group(0).decode() for m in NAME.finditer(data) if not ALLOWED.match(m.group(0))})


def check_binaries(build):
    bad, seen = [], 0
    for rel in ("fs/shardfs", "gpu/libshardfs-rank.so", "gpu/shardfs-load"):
        p = os.path.join(build, rel)
        if not os.path.exists(p):
            continue
        seen += 1
        for name in names_in(os.path.realpath(p)):
            bad.append(f"{rel}: carries {name}")
    if not seen:
        bad.append(f"{build}: none of the product binaries is built there")
    hooks = os.path.join(build, "fs", "shardfs-hooks")
    if os.path.exists(hooks) and "SHARDFS_TEST_CGROUP_ROOT" not in names_in(hooks):
        bad.append("fs/shardfs-hooks carries no SHARDFS_TEST_CGROUP_ROOT: the check cannot see names")
    return bad


def main(argv):
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    args = list(argv)
    if args[:1] == ["--root"] and len(args) > 1:
        root, args = args[1], args[2:]
    bad = [f"{b}: getenv outside an #ifdef SFS_TEST_HOOKS / SFS_BENCH_BASELINES block" for b in check_sources(root)]
    if args:
        bad += check_binaries(args[0])
    for b in bad:
        print(b)
    if bad:
        print("hookcheck: the product reads test or benchmark environment variables (see above)")
        return 1
    print("hookcheck: no test or benchmark environment variable in the product" + (f" ({args[0]})" if args else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
