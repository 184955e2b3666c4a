#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The cost of the Python binding, against the C API in the same run.

    /usr/bin/python3 tests/python/bench_python.py [--reps R] [--shards N] [--shard-size BYTES]

A daemon (tests/python/fixture.py) serves a cache; one rank makes a task of
N shards (default 64 x 256 KiB) resident, then loads it again and again into
one torch CPU tensor (row i = shard i; the row views made once, as an
engine keeps its per-block views), two ways, interleaved:

  python  Rank.load(entries).wait(): the entry list built from the rows on
          every call, and checked and packed by the binding (block ids,
          shard indices, contiguity, sizes, addresses);
  C API   sfs_rank_load + sfs_rank_wait + sfs_rank_task_free on an entry
          array built once: what a C program does (three foreign calls).

It prints the median time of each, their ratio (C time / Python time: the
Python path's share of the C API's throughput), and the same for a 1-key
task, whose difference is the binding's per-call overhead. Not run by ctest
(a benchmark, not a test).
"""
import argparse
import ctypes
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "gpu", "python"))

import fixture  # noqa: E402
import torch  # noqa: E402

import shardfs  # noqa: E402
from shardfs import _lib  # noqa: E402


def c_task(rank, blk, n, dst):
    arr = (_lib.Entry * n)()
    for i in range(n):
        ctypes.memmove(arr[i].block.b, blk, 16)
        arr[i].shard = i
        arr[i].addr = dst[i].data_ptr()
    return arr


def run_c(lib, ptr, arr, n):
    task = ctypes.c_void_p()
    status = (ctypes.c_int * n)()
    t0 = time.perf_counter()
    rc = lib.sfs_rank_load(ptr, arr, n, ctypes.byref(task))
    rc = rc or lib.sfs_rank_wait(task, -1, status)
    lib.sfs_rank_task_free(task)
    t = time.perf_counter() - t0
    assert rc == 0 and not any(status)
    return t


def run_py(rank, blk, n, rows):
    t0 = time.perf_counter()
    st = rank.load([(blk, i, rows[i]) for i in range(n)]).wait()
    t = time.perf_counter() - t0
    assert not any(st)
    return t


def compare(rank, blk, n, dst, reps):
    lib = _lib.lib()
    arr = c_task(rank, blk, n, dst)
    rows = [dst[i] for i in range(n)]
    for _ in range(5):
        run_py(rank, blk, n, rows)
        run_c(lib, rank._ptr, arr, n)
    py, c = [], []
    for r in range(reps):  # alternate which goes first: neither inherits a warmer cache
        if r % 2:
            c.append(run_c(lib, rank._ptr, arr, n))
        py.append(run_py(rank, blk, n, rows))
        if not r % 2:
            c.append(run_c(lib, rank._ptr, arr, n))
    return statistics.median(py), statistics.median(c)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--shard-size", type=int, default=256 << 10)
    a = ap.parse_args()
    n, size = a.shards, a.shard_size
    torch.set_num_threads(1)
    d = fixture.Daemon(shard_size=size, capacity=max(64 << 20, 4 * n * size)).start()
    try:
        blk = fixture.block(0, b"bench")
        fixture.write_block(d.store, blk, n, size)
        with shardfs.Rank(socket=d.sock, backend=d.store) as rank:
            dst = torch.empty(n, size, dtype=torch.uint8)
            assert not any(rank.load([(blk, i, dst[i]) for i in range(n)]).wait())
            for i in (0, n - 1):
                assert dst[i].numpy().tobytes() == fixture.shard_bytes(blk, i, size)
            py, c = compare(rank, blk, n, dst, a.reps)
            gb = n * size / 1e9
            print(f"{n} x {size >> 10} KiB resident, torch CPU tensor, median of {a.reps}:")
            print(f"  python Rank.load().wait(): {py * 1e6:9.1f} us  {gb / py:6.2f} GB/s")
            print(f"  C API (prebuilt entries):  {c * 1e6:9.1f} us  {gb / c:6.2f} GB/s")
            print(f"  python / C throughput:     {c / py:9.2f}x")
            py1, c1 = compare(rank, blk, 1, dst, a.reps)
            print(f"1 x {size >> 10} KiB: python {py1 * 1e6:.1f} us, C API {c1 * 1e6:.1f} us, "
                  f"binding overhead per call {(py1 - c1) * 1e6:.1f} us")
    finally:
        d.stop()


if __name__ == "__main__":
    main()
