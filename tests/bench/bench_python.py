#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench_python: the Python binding against the C API, in the same run.

    /usr/bin/python3 tests/bench/bench_python.py [--quick] [--md FILE] [--build DIR]
                                                 [--reps R] [--shards N] [--shard-size BYTES]

(tests/bench/run.sh runs it with the build directory it benchmarks.)

One process, one daemon (tests/python/fixture.py: a real mount over a posix
store), one shardfs.Rank. A task of N shards (default 64 x 256 KiB) is made
resident, then loaded again and again into one torch CPU tensor (row i =
shard i; the row views made once, as an engine keeps its per-block views),
two ways, interleaved run by run (which goes first alternates):

  python  Rank.load(entries).wait(), the entry list of (block, shard, row)
          built on every call and checked and packed by the binding (block
          ids, shard indices, contiguity, sizes, addresses);
  C API   sfs_rank_load + sfs_rank_wait + sfs_rank_task_free on an entry
          array built once, timed in C (clock_gettime) by bench_python_c.so,
          a small shared object loaded into this process and called with the
          same rank pointer: what a C program does, no interpreter in the
          timed region.

Reported: the median time of each, the ratio C time / Python time (the
Python path's share of the C API's throughput; target >= 0.9x), the same for
a 1-key task (their difference is the binding's per-call overhead, in us),
and a breakdown of the Python path's own work (building the entry array,
submitting, waiting) measured with the load itself left out. Exit 77 when it
cannot run here (no torch, no FUSE, no daemon, no bench_python_c.so).
"""
import argparse
import ctypes
import datetime
import glob
import os
import platform
import statistics
import sys
import time

import benchmd  # this directory's: the section writer the Python benchmarks share

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
SECTION = "bench_python"


def setup_paths(build):
    """Point the fixture and the package at BUILD's daemon and library."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    sys.path.insert(0, os.path.join(ROOT, "gpu", "python"))
    os.environ.setdefault("SHARDFS_LIB", os.path.join(build, "gpu", "libshardfs-rank.so.0"))
    os.environ.setdefault("SHARDFS_BIN", os.path.join(build, "fs", "shardfs"))
    found = glob.glob(os.path.join(build, "tests", "bench", "bench_python_c.so"))
    return found[0] if found else None


def write_md(path, text):
    benchmd.write_md(path, SECTION, text)


class CDriver:
    """bench_python_c.so: the C API's load, timed in C."""

    def __init__(self, path, lib, rank):
        self.so = ctypes.CDLL(path)
        self.fn = self.so.bench_python_c_load
        self.fn.restype = ctypes.c_int
        self.fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                            ctypes.POINTER(ctypes.c_int64)]
        self.rank = rank
        self.ns = (ctypes.c_int64 * 1)()

    def entries(self, blk, n, rows):
        from shardfs import _lib
        arr = (_lib.Entry * n)()
        for i in range(n):
            ctypes.memmove(arr[i].block.b, blk, 16)
            arr[i].shard = i
            arr[i].addr = rows[i].data_ptr()
        return arr

    def run(self, arr, n):
        c0 = time.process_time()
        rc = self.fn(self.rank._ptr, ctypes.addressof(arr), n, 1, self.ns)
        cpu = time.process_time() - c0
        if rc:
            raise OSError(-rc, f"bench_python_c_load: {os.strerror(-rc)}")
        return self.ns[0] / 1e9, cpu


def run_triples(rank, blk, n, rows):
    """load() of a list of (block, shard, row view) triples, built per call."""
    c0, t0 = time.process_time(), time.perf_counter()
    st = rank.load([(blk, i, rows[i]) for i in range(n)]).wait()
    t, c = time.perf_counter() - t0, time.process_time() - c0
    if any(st):
        raise OSError(f"python load: statuses {st}")
    return t, c


def run_entries(rank, blk, n, dst):
    """load() of Rank.entries(block, range(n), tensor), made per call."""
    c0, t0 = time.process_time(), time.perf_counter()
    st = rank.load(rank.entries(blk, range(n), dst)).wait()
    t, c = time.perf_counter() - t0, time.process_time() - c0
    if any(st):
        raise OSError(f"python load: statuses {st}")
    return t, c


def run_reused(rank, ents):
    """load() of one Rank.entries() made once and used again (its packed
    array is reused; only the buffer is checked again)."""
    c0, t0 = time.process_time(), time.perf_counter()
    st = rank.load(ents).wait()
    t, c = time.perf_counter() - t0, time.process_time() - c0
    if any(st):
        raise OSError(f"python load: statuses {st}")
    return t, c


def compare(rank, drv, blk, n, rows, dst, reps, warm):
    """Median (wall, process CPU) seconds of (entries made per call, entries
    reused, triples, C API), interleaved; the order rotates each run so that
    none always follows the same one."""
    arr = drv.entries(blk, n, rows)
    view = dst[:n]
    ents = rank.entries(blk, range(n), view)
    ways = [lambda: run_entries(rank, blk, n, view), lambda: run_reused(rank, ents),
            lambda: run_triples(rank, blk, n, rows), lambda: drv.run(arr, n)]
    for _ in range(warm):
        for w in ways:
            w()
    out = [[] for _ in ways]
    for r in range(reps):
        for k in range(len(ways)):
            j = (r + k) % len(ways)
            out[j].append(ways[j]())
    return [(statistics.median(w for w, _ in x), statistics.median(c for _, c in x)) for x in out]


def breakdown(rank, blk, n, rows, reps):
    """The Python path's own work, without the load: the entry list and its
    packing (Rank._entries), and the Task's submit + wait round trip on an
    already finished task is not separable, so: entries alone, then
    load() alone (entries + sfs_rank_load + Task), median us each."""
    ent, sub = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        rank._entries([(blk, i, rows[i]) for i in range(n)], True, "load")
        t1 = time.perf_counter()
        task = rank.load([(blk, i, rows[i]) for i in range(n)])
        t2 = time.perf_counter()
        task.wait()
        ent.append(t1 - t0)
        sub.append(t2 - t1)
    return statistics.median(ent), statistics.median(sub)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke mode: seconds, stdout only")
    ap.add_argument("--md", metavar="FILE", help="replace this program's section of FILE")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--shard-size", type=int, default=256 << 10)
    a = ap.parse_args()
    reps = a.reps or (20 if a.quick else 400)
    warm = 3 if a.quick else 20
    so = setup_paths(os.path.abspath(a.build))
    if so is None:
        print(f"{SECTION}: no bench_python_c.so under {a.build}/tests/bench "
              "(configure with -DSHARDFS_BENCH=ON): skipped", file=sys.stderr)
        return 77
    try:
        import torch
    except ImportError as e:
        print(f"{SECTION}: no torch ({e}): run with /usr/bin/python3: skipped", file=sys.stderr)
        return 77
    import fixture
    why = fixture.usable()
    if why:
        print(f"{SECTION}: {why}: skipped", file=sys.stderr)
        return 77
    import shardfs

    n, size = a.shards, a.shard_size
    torch.set_num_threads(1)
    d = fixture.Daemon(shard_size=size, capacity=max(64 << 20, 4 * n * size)).start()
    try:
        blk = fixture.block(0, b"bench")
        fixture.write_block(d.store, blk, n, size)
        with shardfs.Rank(socket=d.sock, backend=d.store) as rank:
            dst = torch.empty(n, size, dtype=torch.uint8)
            rows = [dst[i] for i in range(n)]
            assert not any(rank.load([(blk, i, rows[i]) for i in range(n)]).wait())
            for i in range(n):
                assert dst[i].numpy().tobytes() == fixture.shard_bytes(blk, i, size), i
            dst.zero_()  # the loop-free form writes the same bytes
            assert not any(rank.load(rank.entries(blk, range(n), dst)).wait())
            for i in range(n):
                assert dst[i].numpy().tobytes() == fixture.shard_bytes(blk, i, size), i
            drv = CDriver(so, shardfs._lib.lib(), rank)
            cpu0 = time.process_time()
            w0 = time.perf_counter()
            (py, pyc), (ru, ruc), (tri, tric), (c, cc) = compare(rank, drv, blk, n, rows, dst, reps, warm)
            (py1, py1c), (ru1, ru1c), (tri1, tri1c), (c1, c1c) = \
                compare(rank, drv, blk, 1, rows, dst, reps * 4, warm)
            ent, sub = breakdown(rank, blk, n, rows, max(10, reps // 4))
            busy = (time.process_time() - cpu0) / (time.perf_counter() - w0)
            st = rank.stats()
            for i in (0, n - 1):  # still the right bytes after every run
                assert dst[i].numpy().tobytes() == fixture.shard_bytes(blk, i, size), i
    finally:
        d.stop()

    gb = n * size / 1e9
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = []
    out.append("## The Python binding against the C API (`bench_python`)\n\n")
    out.append(f"Run {date}{' (--quick: not a measurement)' if a.quick else ''}: "
               f"`tests/bench/bench_python.py`, CPU: {cpu_name()} ({os.cpu_count()} online), "
               f"Python {platform.python_version()}, torch {torch.__version__}; "
               f"process CPU busy {busy:.2f} (CPUs used by this process per wall second). "
               f"One rank, host copier, a resident task loaded into a torch CPU tensor "
               f"(row views made once); medians of {reps} interleaved runs (1 key: {reps * 4}). "
               "C API: sfs_rank_load + sfs_rank_wait + sfs_rank_task_free timed in C "
               "(bench_python_c.so) on the same rank. Target: Python >= 0.9x the C API.\n\n")
    out.append("| task | C API | Python, `Rank.entries()` per call | Python / C | `entries()` reused "
               "| reused / C | list of triples | triples / C |\n")
    out.append("|---|---|---|---|---|---|---|---|\n")
    out.append(f"| {n} x {size >> 10} KiB | {c * 1e6:.1f} us ({gb / c:.2f} GB/s) | "
               f"{py * 1e6:.1f} us ({gb / py:.2f} GB/s) | **{c / py:.2f}x** | "
               f"{ru * 1e6:.1f} us | **{c / ru:.2f}x** | "
               f"{tri * 1e6:.1f} us ({gb / tri:.2f} GB/s) | {c / tri:.2f}x |\n")
    out.append(f"| 1 x {size >> 10} KiB | {c1 * 1e6:.1f} us | {py1 * 1e6:.1f} us | {c1 / py1:.2f}x | "
               f"{ru1 * 1e6:.1f} us | {c1 / ru1:.2f}x | {tri1 * 1e6:.1f} us | {c1 / tri1:.2f}x |\n\n")
    out.append(f"Process CPU time per load (every thread: the copier's memcpy included; "
               f"steadier than wall time on a shared host), C / Python: {n} keys "
               f"{cc * 1e6:.1f} / {pyc * 1e6:.1f} us = **{cc / pyc:.2f}x** (reused {cc / ruc:.2f}x, "
               f"triples {cc / tric:.2f}x); 1 key {c1c * 1e6:.1f} / {py1c * 1e6:.1f} us = "
               f"{c1c / py1c:.2f}x (reused {c1c / ru1c:.2f}x, triples {c1c / tri1c:.2f}x).\n\n")
    out.append("`Rank.entries(block, range(n), tensor)` is the loop-free form (entry i at "
               "row i): made per call, or made once and reused (its packed array is kept; each "
               "load checks the tensor again); the list of `(block, shard, row)` triples asks "
               "each row tensor for its address, contiguity, size and device. ")
    out.append(f"Per-call overhead of the binding (1-key task, Python - C): "
               f"**{(py1 - c1) * 1e6:.1f} us** (reused: {(ru1 - c1) * 1e6:.1f} us, triples: "
               f"{(tri1 - c1) * 1e6:.1f} us). "
               f"Python-side work in the {n}-entry load of triples: "
               f"building and checking the entry array {ent * 1e6:.1f} us, `load()` "
               f"(that + sfs_rank_load + the Task) {sub * 1e6:.1f} us. Rank counters: "
               f"{st['tasks']} tasks, {st['hits']} hits, {st['owner_loads']} backend loads.\n")
    out.append(f"\nLoad average at the end of the run: {os.getloadavg()[0]:.1f} on "
               f"{os.cpu_count()} CPUs.\n\nCommand: `tests/bench/run.sh` (or `/usr/bin/python3 "
               "tests/bench/bench_python.py --build build --md docs/PERFORMANCE.md`)\n")
    text = "".join(out)
    sys.stdout.write(text)
    if a.md and not a.quick:
        write_md(a.md, text)
        print(f"{SECTION}: section written to {a.md}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
