# SPDX-License-Identifier: MIT
"""shardfs.Rank against a real daemon on a real mount over a posix store.

Claims:
  * N processes acting as TP ranks load the same keys: every byte lands in
    every rank's tensors, and the backend is read once per key (the ranks'
    owner_loads sum to the keys; the mount's /stats agree).
  * per-entry failures are per entry: a missing shard fails its entry with
    -ENOENT, the rest of the task loads;
  * a rank killed while it owns loads leaves the other ranks working: they
    take its keys over and load every byte;
  * every kind of bad input raises a clear exception (an OSError carrying an
    errno, InvalidArgument for what the caller got wrong) and nothing crashes
    the interpreter; a closed Rank, or the parent's Rank in a forked child,
    raises RankClosed.
"""
import ctypes
import errno
import gc
import multiprocessing
import os
import signal
import threading
import time
import unittest
import weakref

import fixture

torch, np, MISSING = fixture.optional("torch", "numpy")

import shardfs

SIZE = 64 << 10
D = fixture.ModuleDaemon(MISSING, shard_size=SIZE)
setUpModule, tearDownModule = D.up, D.down


def tensor_bytes(t):
    return t.numpy().tobytes()


# -- children (forked: they inherit the module's globals) -------------------

def tp_rank(r, world, blocks, nshards, backend, barrier, out):
    """One TP rank: load every (block, shard) into its own tensors, check."""
    try:
        torch.set_num_threads(1)
        with shardfs.Rank(socket=D.sock, backend=backend, rank=r, world=world) as rank:
            keys = [(b, s) for b in blocks for s in range(nshards)]
            dst = [torch.empty(SIZE, dtype=torch.uint8) for _ in keys]
            barrier.wait(30)
            st = rank.load([(b, s, t) for (b, s), t in zip(keys, dst)]).wait(60)
            bad = sum(tensor_bytes(t) != D.expected(b, s) for (b, s), t in zip(keys, dst))
            out.put((r, st, bad, rank.stats()))
    except BaseException as e:  # reported, never hung on
        out.put((r, repr(e), -1, None))


def victim(blocks, backend, out):
    """A rank that owns loads (slow backend) when it is killed."""
    rank = shardfs.Rank(socket=D.sock, backend=backend, rank=0, world=2)
    dst = [torch.empty(SIZE, dtype=torch.uint8) for _ in blocks]
    rank.load([(b, 0, t) for b, t in zip(blocks, dst)])
    out.put("loading")
    time.sleep(120)


def run_ranks(ctx, world, blocks, nshards, backend):
    barrier = ctx.Barrier(world)
    out = ctx.Queue()
    procs = [ctx.Process(target=tp_rank, args=(r, world, blocks, nshards, backend, barrier, out))
             for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in procs:
            r, st, bad, stats = out.get(timeout=120)
            results[r] = (st, bad, stats)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return results


class TPRanks(unittest.TestCase):
    def test_n_ranks_load_every_byte_with_one_backend_load_per_key(self):
        world, nblocks, nshards = 4, 6, 4
        blocks = [fixture.block(i, b"tp") for i in range(nblocks)]
        for b in blocks:
            fixture.write_block(D.store, b, nshards, SIZE)
        before = D.stats()
        results = run_ranks(multiprocessing.get_context("fork"), world, blocks, nshards, D.store)
        after = D.stats()
        nkeys = nblocks * nshards
        self.assertEqual(sorted(results), list(range(world)))
        for r, (st, bad, stats) in results.items():
            self.assertEqual(st, [0] * nkeys, f"rank {r}")
            self.assertEqual(bad, 0, f"rank {r}: shards with wrong bytes")
        owner = sum(stats["owner_loads"] for _, _, stats in results.values())
        self.assertEqual(owner, nkeys, "backend loads summed over the ranks")
        self.assertEqual(after["shardfs_owner_loads_total"] - before["shardfs_owner_loads_total"], nkeys)
        self.assertEqual(after["shardfs_bytes_read_total"] - before["shardfs_bytes_read_total"],
                         nkeys * SIZE)
        # Each rank's own copies: every key, whoever loaded it.
        for r, (_, _, stats) in results.items():
            self.assertEqual(stats["copies"], nkeys, f"rank {r}")

    def test_killed_rank_leaves_the_others_working(self):
        ctx = multiprocessing.get_context("fork")
        blocks = [fixture.block(i, b"kill") for i in range(8)]
        for b in blocks:
            fixture.write_block(D.store, b, 1, SIZE)
        before = D.stats()
        out = ctx.Queue()
        p = ctx.Process(target=victim, args=(blocks, f"fault:latency_us=20000000:{D.store}", out))
        p.start()
        try:
            self.assertEqual(out.get(timeout=60), "loading")
            state = os.path.join(D.mnt, "block", blocks[0].hex(), "shard", "0")
            t0 = time.monotonic()
            while os.getxattr(state, "user.shardfs.state") != b"loading":
                self.assertLess(time.monotonic() - t0, 20, "the victim never owned a load")
                time.sleep(0.01)
        finally:
            os.kill(p.pid, signal.SIGKILL)
            p.join(30)
        self.assertEqual(p.exitcode, -signal.SIGKILL)
        results = run_ranks(ctx, 2, blocks, 1, D.store)
        for r, (st, bad, _) in results.items():
            self.assertEqual(st, [0] * len(blocks), f"rank {r}")
            self.assertEqual(bad, 0, f"rank {r}")
        after = D.stats()
        self.assertGreaterEqual(after["shardfs_takeovers_total"] - before["shardfs_takeovers_total"], 1,
                                "the survivors took the dead rank's loads over")


class OneRank(fixture.RankCase):
    daemon = D

    def test_missing_shard_fails_its_entry_only(self):
        have = fixture.block(1, b"partial")
        fixture.write_block(D.store, have, 2, SIZE)
        missing = fixture.block(2, b"partial")
        dst = [torch.empty(SIZE, dtype=torch.uint8) for _ in range(3)]
        st = self.rank.load([(have, 0, dst[0]), (missing, 0, dst[1]), (have, 1, dst[2])]).wait(30)
        self.assertEqual(st, [0, -errno.ENOENT, 0])
        self.assertEqual(tensor_bytes(dst[0]), D.expected(have, 0))
        self.assertEqual(tensor_bytes(dst[2]), D.expected(have, 1))

    def test_every_buffer_kind_and_block_spelling_loads(self):
        b = fixture.block(1, b"kinds")
        fixture.write_block(D.store, b, 5, SIZE)
        t = torch.empty(SIZE // 4, dtype=torch.float32)  # any dtype: bytes count
        a = np.empty(SIZE, dtype=np.uint8)
        ba = bytearray(SIZE)
        raw = (ctypes.c_char * SIZE)()
        mv = memoryview(bytearray(SIZE))
        st = self.rank.load([(b, 0, t), (b.hex(), 1, a), (b.hex().upper(), 2, ba),
                             (bytearray(b), 3, ctypes.addressof(raw)), (memoryview(b), 4, mv)]).wait(30)
        self.assertEqual(st, [0] * 5)
        self.assertEqual(t.numpy().tobytes(), D.expected(b, 0))
        self.assertEqual(a.tobytes(), D.expected(b, 1))
        self.assertEqual(bytes(ba), D.expected(b, 2))
        self.assertEqual(bytes(raw), D.expected(b, 3))
        self.assertEqual(bytes(mv), D.expected(b, 4))

    def test_dump_writes_the_posix_layout_and_loads_back_from_the_cache(self):
        b = fixture.block(1, b"dump")
        src = [np.frombuffer(D.expected(b, 0), dtype=np.uint8), D.expected(b, 1),
               torch.frombuffer(bytearray(D.expected(b, 2)), dtype=torch.uint8)]
        st = self.rank.dump([(b, i, s) for i, s in enumerate(src)]).wait(30)
        self.assertEqual(st, [0, 0, 0])
        with open(os.path.join(D.store, "data", b.hex()), "rb") as f:
            body = f.read()
        self.assertEqual(body, D.expected(b, 0) + D.expected(b, 1) + D.expected(b, 2))
        before = self.rank.stats()["cache"]["owner_loads"]
        with shardfs.Rank(socket=D.sock, backend=D.store) as other:
            dst = [np.empty(SIZE, np.uint8) for _ in range(3)]
            self.assertEqual(other.load([(b, i, d) for i, d in enumerate(dst)]).wait(30), [0] * 3)
            self.assertEqual([d.tobytes() for d in dst], [D.expected(b, i) for i in range(3)])
            self.assertEqual(other.stats()["hits"], 3)
        self.assertEqual(self.rank.stats()["cache"]["owner_loads"], before, "no backend load")

    def test_lookup_prefix_touch_prefetch_stats(self):
        bs = [fixture.block(i, b"query") for i in range(4)]
        for b in bs[:2]:
            fixture.write_block(D.store, b, 2, SIZE)
        self.assertEqual(self.rank.lookup(bs), [True, True, False, False])
        self.assertEqual(self.rank.lookup(bs, shard=1), [True, True, False, False])
        self.assertEqual(self.rank.lookup(bs, shard=2), [False] * 4)
        self.assertEqual(self.rank.lookup_prefix(bs), 1)
        self.assertEqual(self.rank.lookup_prefix(bs[2:]), -1)
        self.assertEqual(self.rank.lookup_prefix([]), -1)
        self.assertEqual(self.rank.lookup([]), [])
        self.assertEqual(self.rank.prefetch([(bs[0], 0), (bs[1], 1)]), 2)
        t0 = time.monotonic()
        while self.rank.stats()["cache"]["resident_bytes"] < 2 * SIZE:
            self.assertLess(time.monotonic() - t0, 10)
            time.sleep(0.01)
        self.assertGreaterEqual(self.rank.touch(bs), 2)
        st = self.rank.stats()
        self.assertEqual(st["prefetched"], 2)
        self.assertIn("requests", st["cache"])
        self.assertEqual(self.rank.load([]).wait(), [])

    def test_open_by_mount_point(self):
        with shardfs.Rank(mount=D.mnt, backend=D.store) as r:
            self.assertEqual(r.shard_size, SIZE)
            self.assertEqual(r.copier, "host")

    def test_class_name_counts_this_ranks_reads_under_it_in_stats(self):
        block = fixture.block(0, b"class")
        fixture.write_block(D.store, block, 1, SIZE)
        with self.assertRaises(shardfs.InvalidArgument):
            shardfs.Rank(mount=D.mnt, backend=D.store, class_name="no spaces")
        with shardfs.Rank(mount=D.mnt, backend=D.store, class_name="pyclass") as r:
            dst = bytearray(SIZE)
            self.assertEqual(r.load([(block, 0, dst)]).wait(), [0])
            self.assertEqual(r.load([(block, 0, dst)]).wait(), [0])
        with open(os.path.join(D.mnt, "stats")) as f:
            text = f.read()
        for tier, n in (("store", 1), ("memory", 1), ("miss", 0)):
            line = f'shardfs_class_served_total{{class="pyclass",tier="{tier}"}} {n}\n'
            self.assertIn(line, text)

    def test_dump_mode_write_behind_and_a_bad_one(self):
        with self.assertRaises(shardfs.InvalidArgument):
            shardfs.Rank(mount=D.mnt, backend=D.store, dump_mode="sometimes")
        block = fixture.block(0, b"behind")
        src = bytes(range(256)) * (SIZE // 256)
        with shardfs.Rank(mount=D.mnt, backend=D.store, dump_mode="write-behind") as r:
            self.assertEqual(r.dump_mode, "write-behind")
            self.assertEqual(r.dump([(block, 0, src)]).wait(), [0])
        # Closed: every background store write ended.
        path = os.path.join(D.store, "data", block.hex())
        with open(path, "rb") as f:
            self.assertEqual(f.read(SIZE), src)

    def test_wait_timeout_then_wait(self):
        b = fixture.block(1, b"slow")
        fixture.write_block(D.store, b, 1, SIZE)
        with shardfs.Rank(socket=D.sock, backend=f"fault:latency_us=1000000:{D.store}") as r:
            dst = np.empty(SIZE, np.uint8)
            task = r.load([(b, 0, dst)])
            with self.assertRaises(shardfs.WaitTimeout) as cm:
                task.wait(timeout=0)
            self.assertIsInstance(cm.exception, TimeoutError)
            self.assertEqual(cm.exception.errno, errno.ETIMEDOUT)
            with self.assertRaises(TimeoutError):
                task.wait(timeout=0.05)
            self.assertEqual(task.wait(), [0])
            self.assertEqual(task.wait(), [0])
            self.assertTrue(task.done())
            self.assertEqual(dst.tobytes(), D.expected(b, 0))

    def test_threads_wait_for_one_task(self):
        b = fixture.block(1, b"threads")
        fixture.write_block(D.store, b, 1, SIZE)
        with shardfs.Rank(socket=D.sock, backend=f"fault:latency_us=200000:{D.store}") as r:
            dst = np.empty(SIZE, np.uint8)
            task = r.load([(b, 0, dst)])
            got = []
            threads = [threading.Thread(target=lambda: got.append(task.wait(10))) for _ in range(4)]
            for t in threads:
                t.start()
            while not task.done():
                time.sleep(0.001)
            for t in threads:
                t.join(10)
            self.assertEqual(got, [[0]] * 4)
            self.assertEqual(dst.tobytes(), D.expected(b, 0))

    def test_a_task_holds_its_buffers_until_waited(self):
        b = fixture.block(1, b"hold")
        fixture.write_block(D.store, b, 1, SIZE)
        # 2 s of latency: the load must still run after the del and the
        # collection below, on a loaded CI host too (300 ms was not enough).
        with shardfs.Rank(socket=D.sock, backend=f"fault:latency_us=2000000:{D.store}") as r:
            t = torch.empty(SIZE, dtype=torch.uint8)
            ref = weakref.ref(t)
            task = r.load([(b, 0, t)])
            del t
            gc.collect()
            self.assertIsNotNone(ref(), "the task keeps the destination alive")
            self.assertFalse(task.done())
            t = ref()
            self.assertEqual(task.wait(), [0])
            self.assertEqual(tensor_bytes(t), D.expected(b, 0))
            del t
            gc.collect()
            self.assertIsNone(ref(), "released once waited")
            # A task dropped while it runs is parked; close finishes it.
            t2 = torch.empty(SIZE, dtype=torch.uint8)
            ref2 = weakref.ref(t2)
            r.load([(fixture.block(2, b"hold"), 0, t2)])
            del t2
            gc.collect()
            self.assertIsNotNone(ref2(), "a dropped running task keeps its buffer")
        gc.collect()
        self.assertIsNone(ref2(), "released once the rank closed")


class Cuda(unittest.TestCase):
    """Loads and dumps with the CUDA copier, into and from CUDA tensors; runs
    where torch sees a GPU and the library was built with CUDA."""

    def setUp(self):
        if not torch.cuda.is_available() or shardfs.cuda_devices() == 0:
            self.skipTest("no CUDA here (torch.cuda or libshardfs-rank without CUDA): "
                          "the CUDA copier's Python path runs on a GPU machine")

    def test_load_and_dump_cuda_tensors(self):
        b = fixture.block(1, b"cuda")
        fixture.write_block(D.store, b, 2, SIZE)
        with shardfs.Rank(socket=D.sock, backend=D.store, device=0) as r:
            self.assertEqual(r.copier, "cuda")
            dst = torch.empty(2, SIZE, dtype=torch.uint8, device="cuda:0")
            self.assertEqual(r.load([(b, 0, dst[0]), (b, 1, dst[1])]).wait(30), [0, 0])
            self.assertEqual(dst[1].cpu().numpy().tobytes(), D.expected(b, 1))
            out = fixture.block(2, b"cuda")
            torch.cuda.synchronize()
            self.assertEqual(r.dump([(out, 0, dst[0])]).wait(30), [0])
            with open(os.path.join(D.store, "data", out.hex()), "rb") as f:
                self.assertEqual(f.read(), D.expected(b, 0))


class BadInput(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rank = shardfs.Rank(socket=D.sock, backend=D.store)
        cls.b = fixture.block(1, b"bad")

    @classmethod
    def tearDownClass(cls):
        cls.rank.close()

    def einval(self, fn, *args, match=None, **kw):
        with self.assertRaises(shardfs.InvalidArgument) as cm:
            fn(*args, **kw)
        e = cm.exception
        self.assertIsInstance(e, OSError)
        self.assertIsInstance(e, ValueError)
        self.assertEqual(e.errno, errno.EINVAL)
        if match:
            self.assertIn(match, str(e))

    def test_wrong_tensor_size(self):
        self.einval(self.rank.load, [(self.b, 0, torch.empty(SIZE - 1, dtype=torch.uint8))],
                    match=f"tensor holds {SIZE - 1} bytes, the shard is {SIZE}")
        self.einval(self.rank.dump, [(self.b, 0, torch.empty(SIZE, dtype=torch.float16))],
                    match="tensor holds")

    def test_non_contiguous_tensor(self):
        t = torch.empty(2 * SIZE, dtype=torch.uint8)[::2]
        self.assertEqual(t.numel(), SIZE)
        self.einval(self.rank.load, [(self.b, 0, t)], match="not contiguous")
        a = np.empty(2 * SIZE, np.uint8)[::2]
        self.einval(self.rank.load, [(self.b, 0, a)], match="not C-contiguous")

    def test_unknown_key_format(self):
        buf = bytearray(SIZE)
        for blk in ("xyz", "g" * 32, "0" * 31, b"\0" * 15, b"0" * 32, 12345, None, 1.5):
            self.einval(self.rank.load, [(blk, 0, buf)], match="block id")
        self.einval(self.rank.lookup, ["nothex"], match="block id")
        self.einval(self.rank.lookup, "0" * 32, match="list of block ids")
        self.einval(self.rank.prefetch, [(self.b,)], match="(block, shard)")
        for shard in (-1, 1 << 32, "0", 1.0):
            self.einval(self.rank.load, [(self.b, shard, buf)], match="shard")
        self.einval(self.rank.load, [(self.b, 0)], match="triple")
        self.einval(self.rank.load, None, match="entries")

    def test_tensors_without_host_memory(self):
        meta = torch.empty(SIZE, dtype=torch.uint8, device="meta")
        self.einval(self.rank.load, [(self.b, 0, meta)], match="meta")
        self.einval(self.rank.dump, [(self.b, 0, meta)], match="meta")

    def test_bad_buffers(self):
        self.einval(self.rank.load, [(self.b, 0, bytes(SIZE))], match="read-only")
        ro = np.zeros(SIZE, np.uint8)
        ro.flags.writeable = False
        self.einval(self.rank.load, [(self.b, 0, ro)], match="read-only")
        self.einval(self.rank.load, [(self.b, 0, 0)], match="not a valid pointer")
        self.einval(self.rank.load, [(self.b, 0, -4096)], match="not a valid pointer")
        self.einval(self.rank.load, [(self.b, 0, object())], match="not a buffer")
        self.einval(self.rank.load, [(self.b, 0, bytearray(10))], match="buffer holds 10 bytes")
        self.einval(self.rank.load, [(self.b, 0, True)], match="bool")

    def test_bad_rank_arguments(self):
        self.einval(shardfs.Rank, match="exactly one")
        self.einval(shardfs.Rank, socket=D.sock, mount=D.mnt, match="exactly one")
        self.einval(shardfs.Rank, socket=D.sock, rank=2, world=2, match="rank < world")
        self.einval(shardfs.Rank, socket=D.sock, device="cuda:0", match="device")
        self.einval(shardfs.Rank, socket=D.sock, colour="blue", match="unknown option")
        self.einval(shardfs.Rank, socket=D.sock, load_depth=-1, match="load_depth")
        self.einval(shardfs.Rank, socket=D.sock, rotate=1, match="rotate")
        with self.assertRaises(shardfs.ShardfsError) as cm:
            shardfs.Rank(socket=os.path.join(D.dir, "no.sock"))
        self.assertIn(cm.exception.errno, (errno.ENOENT, errno.ECONNREFUSED))
        self.assertIn("no.sock", str(cm.exception))
        with self.assertRaises(shardfs.ShardfsError) as cm:
            shardfs.Rank(socket=D.sock, backend="/nonexistent/store")
        self.assertEqual(cm.exception.errno, errno.ENOENT)
        if shardfs.cuda_devices() == 0:
            with self.assertRaises(shardfs.ShardfsError) as cm:
                shardfs.Rank(socket=D.sock, device=0)
            self.assertEqual(cm.exception.errno, errno.ENODEV)
            self.assertIn("device=None", str(cm.exception))
        task = self.rank.load([])
        self.einval(task.wait, timeout=-1, match="timeout")

    def test_scheduler_role_refuses_loads(self):
        with shardfs.Rank(socket=D.sock, backend=D.store, device=-1) as sched:
            self.assertEqual(sched.lookup([self.b]), [False])
            with self.assertRaises(shardfs.ShardfsError) as cm:
                sched.load([(self.b, 0, bytearray(SIZE))])
            self.assertEqual(cm.exception.errno, errno.EPERM)

    def test_closed_rank(self):
        r = shardfs.Rank(socket=D.sock, backend=D.store)
        r.close()
        r.close()  # idempotent
        self.assertTrue(r.closed)
        for call in (lambda: r.load([(self.b, 0, bytearray(SIZE))]), lambda: r.lookup([self.b]),
                     lambda: r.lookup_prefix([self.b]), lambda: r.touch([self.b]),
                     lambda: r.prefetch([(self.b, 0)]), r.stats):
            with self.assertRaises(shardfs.RankClosed) as cm:
                call()
            self.assertEqual(cm.exception.errno, errno.EBADF)
            self.assertIn("closed", str(cm.exception))
        with self.assertRaises(shardfs.RankClosed):
            with r:
                pass

    def test_parents_rank_in_a_forked_child(self):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                try:
                    self.rank.lookup([self.b])
                except shardfs.RankClosed as e:
                    code = 0 if "after fork" in str(e) else 2
                self.rank.close()  # a no-op in the child, not a hang
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertTrue(os.WIFEXITED(status))
        self.assertEqual(os.WEXITSTATUS(status), 0)
        self.assertEqual(self.rank.lookup([self.b]), [False], "the parent's rank still works")


if __name__ == "__main__":
    unittest.main()
