#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench_vllm: vLLM's worker-side offloading through ShardfsOffloadingSpec
against vLLM's own CPU tier, in the same run.

    /usr/bin/python3 tests/bench/bench_vllm.py [--quick] [--md FILE] [--build DIR]
                                               [--blocks N] [--layers L] [--page BYTES] [--reps R]

It runs itself again in the engines' environment (tests/python/engines-venv.sh,
which installs vLLM). One daemon (tests/python/fixture.py: a real mount
over a posix store), N blocks of a paged KV cache of CPU tensors in vLLM's
canonical layout (L layer tensors of pages of BYTES: one offloaded block is
L pieces, one per layer), device pointers from vLLM's
resolve_device_pointers, the spec from vLLM's OffloadingSpecFactory. Timed,
each a median over R runs:

  store   submit_store of N new blocks until the worker's wait() returns,
          then get_finished reports it: with the spec's default store
          (write-behind: the blocks Ready in the node's cache, the store
          write following in the background, not timed), and with
          "store": "write-through" (the cache and the store, a second
          worker of the same engine's daemon);
  load    submit_load of N resident blocks, the same (this engine);
  B load  a second engine instance (a forked process, its own spec, worker,
          Rank and KV cache) loads the N blocks engine A stored: from the
          cache, the store never read (checked: /stats bytes_read_total);
  vLLM CPU  vLLM's CPUOffloadingSpec, the same N blocks stored and loaded, if
          it constructs here; else its copy done by torch (each layer's N
          pages copied into / out of a CPU region tensor, one slice copy_
          per layer: an upper bound), named as such.

Each baseline copy runs right after the shardfs step it is compared with,
in the same process (B's in B's), so both see the same load of the host.
The end of a transfer is the worker's blocking wait(job) (vLLM's
OffloadingWorker API), as the baseline's copy_ returns when it is done: the
connector's poll of get_finished once a step would add up to one poll
period to either side.

Exit 77 when it cannot run (no vLLM, no torch, no FUSE, no daemon).
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import benchmd  # this directory's: the section writer the Python benchmarks share

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
SECTION = "bench_vllm"
STORE_BEHIND = "store N blocks (shardfs: write-behind, the default: Ready in the cache)"


def setup_paths(build):
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    sys.path.insert(0, os.path.join(ROOT, "gpu", "python"))
    os.environ.setdefault("SHARDFS_LIB", os.path.join(build, "gpu", "libshardfs-rank.so.0"))
    os.environ.setdefault("SHARDFS_BIN", os.path.join(build, "fs", "shardfs"))


def write_md(path, text):
    benchmd.write_md(path, SECTION, text)


def engine(fv, d, page, layers, nblocks, seed, **extra_kw):
    extra = fv.extra_config(d.sock, d.store, **extra_kw)
    spec = fv.make_spec(fv.offloading_config(extra, page, layers))
    fv.NUM_BLOCKS = max(fv.NUM_BLOCKS, 2 * nblocks)
    cache = fv.KVCache(page, layers, seed)
    return spec, spec.get_manager(), spec.get_worker(cache.caches), cache


def finished(worker, job):
    """The job's TransferResult once the worker's wait() returned."""
    worker.wait([job])
    for r in worker.get_finished():
        if r.job_id == job:
            return r
    raise AssertionError(f"job {job}: not reported by get_finished after wait")


def timed_store(fv, spec, manager, worker, cache, hashes, ids, job):
    keys = fv.keys_of(hashes)
    out = manager.prepare_store(keys, None)
    ptrs = cache.ptrs(ids)
    c0, t0 = time.process_time(), time.perf_counter()
    worker.submit_store(job, ptrs, out.store_spec)
    ok = finished(worker, job).success
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    assert ok and len(out.keys_to_store) == len(keys)
    return dt, dc


def timed_load(fv, manager, worker, cache, hashes, ids, job):
    spec = manager.prepare_load(fv.keys_of(hashes), None)
    ptrs = cache.ptrs(ids)
    c0, t0 = time.process_time(), time.perf_counter()
    worker.submit_load(job, spec, ptrs)
    ok = finished(worker, job).success
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    assert ok
    return dt, dc


def drain(d, written, deadline=120.0):
    """Wait until the daemon's /stats counts `written` write-behind store
    writes (the background writes of the store just timed)."""
    t0 = time.monotonic()
    while d.stats().get("shardfs_write_behind_total", 0) < written:
        if time.monotonic() - t0 > deadline:
            raise RuntimeError(f"write-behind: {written} store writes not done in {deadline} s")
        time.sleep(0.002)


class TorchCpuTier:
    """The CPU tier's copy by torch, at its fastest: one slice copy_ per
    layer each way (N pages in a row on both sides: an upper bound for a
    tier whose pages are scattered)."""

    def __init__(self, torch, cache, nblocks):
        self.cache, self.n = cache, nblocks
        self.region = [torch.empty((nblocks,) + tuple(t.shape[1:]), dtype=t.dtype)
                       for t in cache.tensors]

    def store(self):
        c0, t0 = time.process_time(), time.perf_counter()
        for r, t in zip(self.region, self.cache.tensors):
            r.copy_(t[0:self.n])
        return time.perf_counter() - t0, time.process_time() - c0

    def load(self):
        c0, t0 = time.process_time(), time.perf_counter()
        for r, t in zip(self.region, self.cache.tensors):
            t[self.n:2 * self.n].copy_(r)
        return time.perf_counter() - t0, time.process_time() - c0


def child_load(torch, fv, d, args, seed, hashes, out_fd):
    """Engine B (forked): its own spec, worker and Rank; loads A's blocks,
    each load followed by B's CPU tier loading its own."""
    try:
        spec, manager, worker, cache = engine(fv, d, args.page, args.layers, args.blocks, seed)
        ids = list(range(args.blocks))
        tier = TorchCpuTier(torch, cache, args.blocks)
        tier.store()
        times, base = [], []
        for i in range(args.reps):
            times.append(timed_load(fv, manager, worker, cache, hashes, ids, 100 + i))
            base.append(tier.load())
        worker.shutdown()
        manager.shutdown()
        os.write(out_fd, json.dumps({"t": times, "base": base}).encode())
        os._exit(0)
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        os.write(out_fd, json.dumps({"error": repr(e)}).encode())
        os._exit(1)


def run(args):
    import engines
    import fixture

    torch, missing = fixture.optional("torch")
    if missing:
        print(f"bench_vllm: {missing}", file=sys.stderr)
        return 77
    why = engines.why_not("vllm") or fixture.usable()
    if why:
        print(f"bench_vllm: skipped: {why}", file=sys.stderr)
        return 77
    import fixture_vllm as fv

    rows = []
    for layers, page in ((args.layers, args.page), (1, args.layers * args.page)):
        rows.append((layers, page) + tuple(measure(args, torch, engines, fixture, fv, layers, page)))
    return report(args, rows, engines.vllm_part("CPUOffloadingSpec"))


def measure(args, torch, engines, fixture, fv, layers, page):
    """One layout: ([(step, shardfs runs, baseline runs), ...], B's bytes
    read from the store); a run is (wall s, process CPU s)."""
    args = argparse.Namespace(**vars(args))
    args.layers, args.page = layers, page
    shard = args.page * args.layers
    cap = max(64 << 20, 4 * shard * args.blocks * (args.reps + 2))
    d = fixture.Daemon(shard_size=shard, capacity=cap).start()
    try:
        spec, manager, worker, cache = engine(fv, d, args.page, args.layers, args.blocks, seed=1)
        assert worker.store_mode == "write-behind"
        wt = engine(fv, d, args.page, args.layers, args.blocks, seed=1, store="write-through")
        assert wt[2].store_mode == "write-through"
        n = args.blocks
        ids = list(range(n))
        tier = TorchCpuTier(torch, cache, n)
        stores, loads, cpu_stores, cpu_loads = [], [], [], []
        wt_stores, wt_cpu_stores = [], []
        for i in range(args.reps):
            hashes = fv.block_hashes(seed=1000 + i, n=n)
            stores.append(timed_store(fv, spec, manager, worker, cache, hashes, ids, 2 * i))
            drain(d, n * (i + 1))  # the baseline and the next steps run without them
            cpu_stores.append(tier.store())
            wt_stores.append(timed_store(fv, *wt, fv.block_hashes(seed=5000 + i, n=n), ids,
                                         1000 + i))
            wt_cpu_stores.append(tier.store())
            loads.append(timed_load(fv, manager, worker, cache, hashes, list(range(n, 2 * n)),
                                    2 * i + 1))
            cpu_loads.append(tier.load())
        for s, t in zip(ids, range(n, 2 * n)):
            assert cache.block(s) == cache.block(t)
        read0 = d.stats().get("shardfs_bytes_read_total", 0)
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(rfd)
            child_load(torch, fv, d, args, 2, fv.block_hashes(seed=1000, n=n), wfd)
        os.close(wfd)
        raw = b""
        while True:
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            raw += chunk
        os.close(rfd)
        os.waitpid(pid, 0)
        b = json.loads(raw.decode())
        if "error" in b:
            raise RuntimeError(f"engine B: {b['error']}")
        read1 = d.stats().get("shardfs_bytes_read_total", 0)
        worker.shutdown()
        manager.shutdown()
        wt[2].shutdown()
        wt[1].shutdown()
    finally:
        d.stop()
    return [(STORE_BEHIND, stores, cpu_stores),
            ("store N blocks (shardfs: write-through, cache and store)", wt_stores, wt_cpu_stores),
            ("load N blocks, same engine", loads, cpu_loads),
            ("load N blocks, a second engine (another process; its baseline: its own CPU tier)",
             [tuple(x) for x in b["t"]], [tuple(x) for x in b["base"]])], read1 - read0


def report(args, rows, why_cpu):
    import torch

    n = args.blocks
    base = ("vLLM's CPUOffloadingSpec" if not why_cpu else
            "vLLM's CPU tier's copy done by torch, at its fastest (one slice copy_ per layer)")
    lines = [
        "## vLLM's offloading tier: shardfs against vLLM's CPU tier (`bench_vllm`)",
        "",
        f"Run {datetime.date.today()}: `tests/bench/bench_vllm.py`, CPU: {platform.machine()} "
        f"({os.cpu_count()} online), Python {platform.python_version()}, torch {torch.__version__}, vLLM 0.34.0. "
        f"The worker side: {n} blocks of one shard of {args.layers * args.page // 1024} KiB, "
        f"CPU tensors in vLLM's canonical layout, two layouts: {args.layers} layer tensors of "
        f"{args.page // 1024} KiB pages (a block is {args.layers} pieces: one vectored entry, `Rank.loadv`/`dumpv`) "
        f"and one tensor whose page is the block (one range: `Rank.load`/`dump`); medians of {args.reps} interleaved runs. "
        f"Baseline: {base}" + (f" (vLLM's own does not construct here: {why_cpu})." if why_cpu else "."),
        "",
        "| layout | step | shardfs (`ShardfsOffloadingSpec`) | baseline | shardfs / baseline (throughput; range; CPU) |",
        "|---|---|---|---|---|",
    ]
    reads, ratios, store_ratios = [], [], []
    for layers, page, steps, b_read in rows:
        total = n * layers * page

        def cell(runs):
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            return f"{wall * 1e3:.2f} ms ({total / wall / 1e9:.2f} GB/s; CPU {cpu * 1e3:.2f} ms)"

        name = f"{layers} pieces" if layers > 1 else "one range"
        for step, ours, theirs in steps:
            per_run = sorted(b[0] / a[0] for a, b in zip(ours, theirs))
            ratio = statistics.median(per_run)
            cpu = statistics.median(b[1] for b in theirs) / statistics.median(a[1] for a in ours)
            if not step.startswith("store"):
                ratios.append(ratio)
            elif step == STORE_BEHIND:
                store_ratios.append(ratio)
            lines.append(f"| {name} | {step} | {cell(ours)} | {cell(theirs)} | **{ratio:.2f}x** "
                         f"({per_run[0]:.2f}..{per_run[-1]:.2f}; CPU {cpu:.2f}x) |")
        reads.append(b_read)
    met = "Met" if min(ratios) >= 1.0 else "Not met"
    store_met = "Met" if min(store_ratios) >= 1.0 else "Not met"
    lines += [
        "",
        f"The second engine's loads read {sum(reads)} bytes from the store "
        "(`shardfs_bytes_read_total`): what engine A stored, B loaded from the node's cache.",
        "",
        "Each ratio is the median of the per-run ratios (baseline wall / shardfs wall, each "
        "baseline copy run right after the shardfs step it is compared with, in the same "
        "process), then their range; CPU: the process's CPU time (every thread: the copier's "
        "included) per step, baseline / shardfs.",
        "",
        f"Targets: >= 1.0x for the store and the loads of a single engine, and the second "
        f"engine's load >= 1.0x of the CPU tier loading its own. {met} by the loads in this "
        f"run (their median ratios {min(ratios):.2f}x..{max(ratios):.2f}x); {store_met.lower()} "
        f"by the write-behind store ({min(store_ratios):.2f}x..{max(store_ratios):.2f}x). "
        "A write-behind store job ends once its blocks are Ready in the node's cache; the "
        "posix store's file writes start once the job's end is seen (the worker's wait, or a "
        "poll that returns it; 2 ms after the end at most), on background threads 10 nicer "
        "than the engine's, and run on after it: the bench waits for them "
        "(`shardfs_write_behind_total`) before the "
        "baseline's copy and the next step, so no other step shares the CPUs with them. The "
        "write-through store has the file writes in its timed "
        "region (the CPU tier keeps RAM only): far from the baseline, by design. With pieces, a job's blocks go to the "
        "library in columns (`shardfs.EntriesV`, made by numpy from vLLM's pointer arrays), "
        "each block one vectored entry (`sfs_rank_loadv`/`sfs_rank_dumpv`): the copier moves "
        "every piece straight between the page and the cache, no staging row; a load batch "
        "of 1 MiB or more with non-temporal stores. The one-range loads are the library's "
        "copier against one `copy_` per layer of N pages in a row, the baseline's best case.",
        "",
        f"Load average at the end of the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs.",
        "",
        f"Command: `/usr/bin/python3 tests/bench/bench_vllm.py --build build --md docs/PERFORMANCE.md` "
        f"(`--blocks {n} --layers {args.layers} --page {args.page} --reps {args.reps}`)",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.md:
        write_md(args.md, text)
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--md")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--page", type=int, default=32 << 10)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args(argv)
    if args.quick:
        args.blocks, args.reps = 8, 3
    sys.dont_write_bytecode = True
    if os.environ.get("SHARDFS_ENGINES", "1") != "0" and not os.environ.get("SHARDFS_IN_ENGINES"):
        try:
            out = subprocess.run(["bash", os.path.join(ROOT, "tests", "python", "engines-venv.sh")],
                                 check=True, stdout=subprocess.PIPE, timeout=900)
            py = out.stdout.decode().strip().splitlines()[-1]
            os.environ["SHARDFS_IN_ENGINES"] = "1"
            os.execv(py, [py, os.path.abspath(__file__)] + argv)
        except (OSError, subprocess.SubprocessError) as e:
            print(f"bench_vllm: engines-venv.sh failed ({e})", file=sys.stderr)
            return 77
    setup_paths(os.path.abspath(args.build))
    return run(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
