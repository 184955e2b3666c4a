# SPDX-License-Identifier: MIT
"""shardfs.vllm.ShardfsOffloadingSpec driven through vLLM's real offloading
classes (vLLM 0.34.0; tests/python/engines.py says which parts import with
this machine's torch 1.13, and each test needing another part skips naming
it), against a real daemon. The spec is built by vLLM's own
OffloadingSpecFactory from the connector's extra config; the manager and
worker are called as vLLM's connector calls them (its scheduler and worker
halves, which do not import here: fixture_vllm.py holds the sequence).

Claims:
  * vLLM's factory finds the spec from spec_name/spec_module_path;
  * store, lookup, load: every byte back, with one page per block (straight
    to the page) and with K/V pieces of several layers (one vectored entry
    per block: Rank.loadv/dumpv, no staging copy in Python);
  * a chunk of several blocks per offloaded block moved in part: the holes
    are zeros in the store, and a load writes only the pages it moves;
  * a block of more pieces than the library's entry takes is refused at
    worker start, naming the counts;
  * a block nobody stored is a miss; a block stored is not stored again;
  * a failed load is reported per block (the other blocks of its job load)
    and as success=False for the job, never as an exception;
  * the daemon killed: lookups miss, stores are dropped, loads fail as
    results once the worker's rank has seen it (until then they are served,
    byte-exact, from the cache's memory it still maps); restarted: the same blocks hit and load, stores go again;
  * two engine instances (processes): what A stored B finds and loads with
    no backend load (the mount's /stats), and the reverse; the other
    engine's result comes back in a file, whole, even unbuffered with its
    stdout unread until it exits (stdout is only for logs);
  * keys are vLLM's block hashes: xxhash without PYTHONHASHSEED is refused
    with a log line (the tier is off: no lookups answer, nothing stored);
  * TP: each worker stores its slice as its own shard, and a block is a hit
    only when every slice is there; MLA (replicated): one shard per block,
    stored once, every rank loads the same bytes;
  * the wrong shard size fails at the worker, naming the size to mount with;
  * stores are write-behind by default: a job ends once its blocks are in
    the node's cache, loadable from memory, and the store gets the exact
    bytes after (/stats counts the background writes); a failed background
    write is counted and the block stays loadable; "store": "write-through"
    ends a job once the store has the blocks.
"""
import ctypes
import errno
import json
import os
import subprocess
import sys
import time
import unittest

import engines
import fixture

torch, MISSING = fixture.optional("torch")
WHY_VLLM = engines.why_not("vllm")
HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = 4096      # bytes of one layer's page (K and V of TOKENS tokens)
LAYERS = 4

if not WHY_VLLM and not MISSING:
    import fixture_vllm as fv

    from shardfs import vllm as svllm


def until(pred, what, deadline=60.0):
    """Wait for pred() (the rank re-attaches by itself); a deadline, not a timing."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > deadline:
            raise AssertionError(f"{what}: not within {deadline} s")
        time.sleep(0.05)


@unittest.skipIf(WHY_VLLM, f"vLLM: {WHY_VLLM}")
class VllmCase(fixture.OwnDaemonCase):
    shard_size = PAGE * LAYERS
    missing = MISSING

    def store_file_size(self, blk, want):
        """The size of block blk's store file once it is `want` bytes, or
        the last size seen at the deadline: stores are write-behind, their
        file writes follow the job's end."""
        path = os.path.join(self.d.store, "data", blk)

        def size():
            try:
                return os.path.getsize(path)
            except FileNotFoundError:
                return -1
        try:
            until(lambda: size() == want, f"store file {blk} of {want} bytes")
        except AssertionError:
            pass  # the caller's assert says what it found
        return size()

    def engine(self, page=PAGE, layers=LAYERS, seed=1, block_major=False, **kw):
        kw_cache = {"block_major": block_major}
        extra = fv.extra_config(self.d.sock, self.d.store, **kw.pop("extra", {}))
        spec = fv.make_spec(fv.offloading_config(extra, page, layers, **kw))
        manager = spec.get_manager()
        self.addCleanup(manager.shutdown)
        cache = fv.KVCache(page, layers, seed, block_major=kw_cache.get("block_major", False))
        worker = spec.get_worker(cache.caches)
        self.addCleanup(worker.shutdown)
        return spec, manager, worker, cache


class Spec(VllmCase):
    def test_vllms_factory_builds_the_spec_from_the_extra_config(self):
        from vllm.v1.kv_offload.base import OffloadingSpec
        from vllm.v1.kv_offload.factory import OffloadingSpecFactory

        cls = OffloadingSpecFactory.get_spec_cls(fv.extra_config(self.d.sock, self.d.store))
        self.assertIs(cls, svllm.ShardfsOffloadingSpec)
        self.assertTrue(issubclass(cls, OffloadingSpec))
        spec, manager, worker, _ = self.engine()
        self.assertTrue(spec.shared)

    def test_vllms_offloading_connector(self):
        why = engines.vllm_part("OffloadingConnector")
        if why:
            self.skipTest(f"vLLM's OffloadingConnector (the scheduler and worker halves that call "
                          f"this spec): {why}; the tests drive the spec as it does")


class RoundTrip(VllmCase):
    def round_trip(self, page, layers):
        spec, manager, worker, cache = self.engine(page=page, layers=layers, seed=1)
        hashes = fv.block_hashes(seed=1, n=8)
        self.assertEqual(fv.lookup(manager, hashes), [False] * 8)
        src = [3, 5, 7, 9, 11, 13, 15, 17]
        self.assertEqual(len(fv.store(spec, manager, worker, cache, hashes, src, job_id=1)), 8)
        self.assertEqual(fv.lookup(manager, hashes), [True] * 8)
        dst = [20, 21, 22, 23, 24, 25, 26, 27]
        res = fv.load(manager, worker, cache, hashes, dst, job_id=2)
        self.assertTrue(res.success)
        self.assertEqual(res.transfer_size, 8 * page * layers)
        for s, t in zip(src, dst):
            self.assertEqual(cache.block(t), cache.block(s))
        # Stored again: nothing to do, another engine's copy counts too.
        out = manager.prepare_store(fv.keys_of(hashes), None)
        self.assertEqual(out.keys_to_store, [])
        self.assertEqual(worker.failed_blocks, 0)

    def test_one_page_per_block_loads_every_byte(self):
        self.round_trip(PAGE * LAYERS, 1)

    def test_pieces_of_several_layers_load_every_byte(self):
        self.round_trip(PAGE, LAYERS)

    def test_pieces_go_as_vectored_entries_with_no_python_copy(self):
        """Every piece is moved by the library (loadv/dumpv): a memmove, the
        staging row's copy, raises here."""
        spec, manager, worker, cache = self.engine(page=PAGE, layers=LAYERS, seed=14)
        r = worker.link.get()
        calls = []
        for name in ("load", "dump", "loadv", "dumpv"):
            def spy(entries, *a, _name=name, _fn=getattr(r, name), **kw):
                calls.append(_name)
                return _fn(entries, *a, **kw)
            setattr(r, name, spy)

        class NoCopy:
            def __getattr__(self, name):
                if name in ("memmove", "memset", "string_at"):
                    raise AssertionError(f"ctypes.{name} in shardfs.vllm: a piece staged in Python")
                return getattr(ctypes, name)

        old = svllm.ctypes
        svllm.ctypes = NoCopy()
        self.addCleanup(setattr, svllm, "ctypes", old)
        hashes = fv.block_hashes(seed=14, n=4)
        self.assertEqual(len(fv.store(spec, manager, worker, cache, hashes, [1, 2, 3, 4], job_id=1)), 4)
        self.assertTrue(fv.load(manager, worker, cache, hashes, [9, 10, 11, 12], job_id=2).success)
        self.assertEqual(calls, ["dumpv", "loadv"])
        for s, t in zip([1, 2, 3, 4], [9, 10, 11, 12]):
            self.assertEqual(cache.block(t), cache.block(s))

    def spy_calls(self, worker):
        """The Rank calls a worker makes, by name, in order."""
        r = worker.link.get()
        calls = []
        for name in ("load", "dump", "loadv", "dumpv"):
            def spy(entries, *a, _name=name, _fn=getattr(r, name), **kw):
                calls.append(_name)
                return _fn(entries, *a, **kw)
            setattr(r, name, spy)
        return calls

    def test_adjacent_pages_of_a_block_go_as_one_range(self):
        """Layer tensors that are views of one block-major tensor: a block's
        pages follow each other, merged into one range of the shard."""
        spec, manager, worker, cache = self.engine(page=PAGE, layers=LAYERS, seed=16,
                                                   block_major=True)
        calls = self.spy_calls(worker)
        hashes = fv.block_hashes(seed=16, n=4)
        self.assertEqual(len(fv.store(spec, manager, worker, cache, hashes, [1, 2, 3, 4], job_id=1)), 4)
        self.assertTrue(fv.load(manager, worker, cache, hashes, [9, 10, 11, 12], job_id=2).success)
        self.assertEqual(calls, ["dump", "load"])
        for s, t in zip([1, 2, 3, 4], [9, 10, 11, 12]):
            self.assertEqual(cache.block(t), cache.block(s))

    def test_the_columns_of_a_job_merge_only_adjacent_pages(self):
        """_columns: pages in vLLM's order (data ref, then block), per block
        the refs in order, a page that starts where the one before it ends
        merged into it, never across blocks."""
        from vllm.v1.kv_offload.base import DevicePointers

        import numpy as np

        # Two blocks, three refs; block 0: refs 0 and 1 adjacent, block 1:
        # refs 1 and 2 adjacent; block 1's ref 0 follows block 0's ref 2.
        ptrs = np.array([1000, 5000,  # ref 0, blocks 0 and 1
                         1100, 6000,  # ref 1
                         3000, 6100],  # ref 2
                        dtype=np.uint64)
        sizes = np.array([100, 100, 100, 100, 100, 100], dtype=np.uint64)
        dp = DevicePointers(ptrs=ptrs, sizes=sizes, group_block_counts=(2,),
                            group_data_ref_counts=(3,), block_indices=(0,))
        counts, pieces = svllm.ShardfsOffloadingWorker._columns(dp, [b"a" * 16, b"b" * 16])
        self.assertEqual(counts, [2, 2])
        self.assertEqual(pieces.tolist(), [[1000, 200], [3000, 100], [5000, 100], [6000, 200]])

    def test_a_chunk_moved_in_part_has_holes(self):
        """Two GPU blocks per offloaded block (2 layers of PAGE: the shard is
        layer 0's two pages, then layer 1's): a job that starts in the middle
        of a chunk moves its pages only; a store's holes are zeros."""
        # Write-through: the store holds the bytes when the job ends.
        spec, manager, worker, cache = self.engine(page=PAGE, layers=2, seed=15, blocks_per_chunk=2,
                                                   extra={"store": "write-through"})
        hashes = fv.block_hashes(seed=15, n=3)
        keys = fv.keys_of(hashes)
        out = manager.prepare_store(keys[:2], None)
        worker.submit_store(1, cache.ptrs([3, 4, 5, 6]), out.store_spec)
        self.assertTrue(fv.finish(worker, [1])[1].success)
        # The second half of chunk 0, then chunk 1 whole.
        before = cache.block(9)
        worker.submit_load(2, manager.prepare_load(keys[:2], None), cache.ptrs([10, 11, 12], first=1))
        self.assertTrue(fv.finish(worker, [2])[2].success)
        self.assertEqual([cache.block(10), cache.block(11), cache.block(12)],
                         [cache.block(4), cache.block(5), cache.block(6)])
        self.assertEqual(cache.block(9), before)
        # A store of the second half of a chunk: the first half is zeros.
        out = manager.prepare_store(keys[2:], None)
        worker.submit_store(3, cache.ptrs([7], first=1), out.store_spec)
        self.assertTrue(fv.finish(worker, [3])[3].success)
        with open(os.path.join(self.d.store, "data", out.store_spec.blocks[0].hex()), "rb") as f:
            raw = f.read()
        zeros = bytes(PAGE)
        page7 = [bytes(t[7].numpy().tobytes()) for t in cache.tensors]
        self.assertEqual(raw, zeros + page7[0] + zeros + page7[1])

    def test_more_pieces_than_an_entry_takes_are_refused_at_worker_start(self):
        with self.assertRaisesRegex(ValueError, r"up to 514 pieces.*at most 512"):
            self.engine(page=128, layers=257, blocks_per_chunk=2)

    def test_a_block_nobody_stored_is_a_miss(self):
        spec, manager, worker, cache = self.engine()
        self.assertEqual(fv.lookup(manager, fv.block_hashes(seed=7, n=3)), [False] * 3)

    def test_a_failed_load_is_reported_per_block(self):
        spec, manager, worker, cache = self.engine()
        hashes = fv.block_hashes(seed=2, n=4)
        fv.store(spec, manager, worker, cache, hashes[:1] + hashes[2:], [0, 2, 3], job_id=1)
        before = cache.block(9)
        res = fv.load(manager, worker, cache, hashes, [8, 9, 10, 11], job_id=2)
        self.assertFalse(res.success)
        self.assertEqual(worker.failed_blocks, 1)
        self.assertEqual(worker.last_failures[2], [(spec.block_of(fv.keys_of(hashes)[1]).hex(),
                                                   -errno.ENOENT)])
        self.assertEqual(cache.block(8), cache.block(0))
        self.assertEqual(cache.block(9), before)  # untouched
        self.assertEqual(cache.block(10), cache.block(2))
        self.assertEqual(cache.block(11), cache.block(3))

    def test_the_wrong_shard_size_names_the_size_to_mount_with(self):
        with self.assertRaisesRegex(ValueError, rf"-o shard_size={PAGE * 2}\b"):
            self.engine(page=PAGE, layers=2)


class StoreModes(VllmCase):
    """The extra config's "store": write-behind (the default) ends a store
    job once its blocks are Ready in the node's cache, the store's copy
    following; write-through once the store has them too."""

    def block_file(self, spec, key):
        return os.path.join(self.d.store, "data", spec.block_of(key).hex())

    def store_holds(self, spec, cache, hashes, src):
        for key, s in zip(fv.keys_of(hashes), src):
            try:
                with open(self.block_file(spec, key), "rb") as f:
                    if f.read() != cache.block(s):
                        return False
            except FileNotFoundError:
                return False
        return True

    def test_write_behind_is_the_default_and_the_store_follows(self):
        spec, manager, worker, cache = self.engine(seed=21)
        self.assertEqual(spec.store_mode, "write-behind")
        self.assertEqual(worker.link.get().dump_mode, "write-behind")
        hashes = fv.block_hashes(seed=21, n=4)
        src, dst = [0, 1, 2, 3], [8, 9, 10, 11]
        self.assertEqual(len(fv.store(spec, manager, worker, cache, hashes, src, job_id=1)), 4)
        loads = self.d.stats().get("shardfs_owner_loads_total", 0)
        self.assertTrue(fv.load(manager, worker, cache, hashes, dst, job_id=2).success)
        for s, t in zip(src, dst):
            self.assertEqual(cache.block(t), cache.block(s))
        self.assertEqual(self.d.stats().get("shardfs_owner_loads_total", 0), loads)  # memory
        until(lambda: self.d.stats().get("shardfs_write_behind_total", 0) >= 4,
              "the background store writes")
        self.assertTrue(self.store_holds(spec, cache, hashes, src))
        self.assertEqual(self.d.stats().get("shardfs_write_behind_failed_total", 0), 0)

    def test_write_through_on_request(self):
        spec, manager, worker, cache = self.engine(seed=22, extra={"store": "write-through"})
        self.assertEqual(worker.link.get().dump_mode, "write-through")
        hashes = fv.block_hashes(seed=22, n=3)
        self.assertEqual(len(fv.store(spec, manager, worker, cache, hashes, [0, 1, 2], job_id=1)), 3)
        self.assertTrue(self.store_holds(spec, cache, hashes, [0, 1, 2]))
        self.assertEqual(self.d.stats().get("shardfs_write_behind_total", 0), 0)

    def test_a_failed_background_write_is_counted_and_the_block_stays_loadable(self):
        spec, manager, worker, cache = self.engine(
            seed=23, extra={"shardfs_backend": f"fault:eio=1:{self.d.store}"})
        hashes = fv.block_hashes(seed=23, n=3)
        self.assertEqual(len(fv.store(spec, manager, worker, cache, hashes, [0, 1, 2], job_id=1)), 3)
        until(lambda: self.d.stats().get("shardfs_write_behind_failed_total", 0) >= 3,
              "the failed background writes counted in /stats")
        for key in fv.keys_of(hashes):
            self.assertFalse(os.path.exists(self.block_file(spec, key)))
        res = fv.load(manager, worker, cache, hashes, [8, 9, 10], job_id=2)
        self.assertTrue(res.success)
        for s, t in zip([0, 1, 2], [8, 9, 10]):
            self.assertEqual(cache.block(t), cache.block(s))

    def test_an_unknown_store_mode_is_refused(self):
        with self.assertRaisesRegex(ValueError, r"store='sometimes'"):
            self.engine(extra={"store": "sometimes"})


class DaemonGone(VllmCase):
    @staticmethod
    def sees_gone(spec, worker, key):
        r = worker.link.rank
        if r is None:
            return True
        try:
            return not r.lookup([spec.block_of(key)])[0]
        except OSError:
            return True

    def test_killed_and_restarted_under_a_running_engine(self):
        spec, manager, worker, cache = self.engine()
        hashes = fv.block_hashes(seed=3, n=4)
        fv.store(spec, manager, worker, cache, hashes, [0, 1, 2, 3], job_id=1)
        self.d.kill()
        with self.assertLogs("shardfs.vllm", "ERROR"):
            self.assertEqual(fv.lookup(manager, hashes), [False] * 4)
        self.assertIsNone(fv.store(spec, manager, worker, cache, fv.block_hashes(seed=4, n=2),
                                   [4, 5], job_id=2))
        # Until the worker's rank has seen the daemon go (its watcher, on its
        # own thread), a load is still served from the cache's memory, which
        # it keeps mapped: the right bytes. Once seen, loads fail as results.
        until(lambda: self.sees_gone(spec, worker, hashes[0]), "the worker's rank sees the kill")
        res = fv.load(manager, worker, cache, hashes, [8, 9, 10, 11], job_id=3)
        self.assertFalse(res.success)
        self.d.start()
        until(lambda: fv.lookup(manager, hashes) == [True] * 4, "hits after the restart")
        until(lambda: fv.load(manager, worker, cache, hashes, [8, 9, 10, 11], job_id=4).success,
              "a load after the restart")
        for s, t in zip([0, 1, 2, 3], [8, 9, 10, 11]):
            self.assertEqual(cache.block(t), cache.block(s))
        more = fv.block_hashes(seed=4, n=2)
        self.assertEqual(len(fv.store(spec, manager, worker, cache, more, [4, 5], job_id=5)), 2)
        self.assertEqual(fv.lookup(manager, more), [True, True])


class TwoEngines(VllmCase):
    def other(self, what, seed, first, n, env=None, read_late=False):
        """Another engine (fixture_vllm.py in a process of its own): its result
        comes back in a file, whole; its stdout and stderr are only logs, kept
        for a failure's message. read_late: its stdout and stderr are a pipe
        read only once it has exited."""
        env = dict(os.environ if env is None else env)
        env.pop("PYTHONHASHSEED", None)
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(svllm.__file__)))
        env["PYTHONPATH"] = os.pathsep.join([pkg, HERE])
        self.runs = getattr(self, "runs", 0) + 1
        result = os.path.join(self.d.dir, f"other-{self.runs}.json")
        logs = os.path.join(self.d.dir, f"other-{self.runs}.log")
        argv = [sys.executable, os.path.join(HERE, "fixture_vllm.py"), result, self.d.sock,
                self.d.store, what, str(seed), str(first), str(n), str(PAGE), str(LAYERS)]
        if read_late:
            p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            try:
                rc = p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                self.fail("the other engine blocked writing to its stdout, unread: it must not "
                          "need a reader")
            finally:
                log = p.stdout.read().decode(errors="replace")
                p.stdout.close()
        else:
            with open(logs, "wb") as f:
                rc = subprocess.run(argv, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    timeout=120).returncode
            with open(logs, errors="replace") as f:
                log = f.read()
        self.assertEqual(rc, 0, f"the other engine ({what}) ended with {rc}:\n{log[-3000:]}")
        self.assertTrue(os.path.exists(result), f"the other engine ({what}) left no result:\n"
                        f"{log[-3000:]}")
        with open(result) as f:
            return json.load(f)

    def test_the_result_does_not_need_stdout_read(self):
        """Unbuffered (PYTHONUNBUFFERED=1: a short write to the fd is lost
        silently) and with nobody reading its stdout until it exits, the
        other engine's result comes back whole."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        a = self.other("store", seed=16, first=0, n=6, env=env, read_late=True)
        self.assertEqual(a["stored"], 6)
        b = self.other("load", seed=16, first=0, n=6, env=env, read_late=True)
        self.assertEqual(b["hits"], [True] * 6)
        self.assertTrue(b["success"])
        self.assertEqual(b["blocks"], a["blocks"])

    def test_what_one_engine_stored_the_other_loads_from_memory(self):
        a = self.other("store", seed=5, first=0, n=6)
        self.assertEqual(a["stored"], 6)
        loads = self.backend_loads()
        b = self.other("load", seed=5, first=0, n=6)
        self.assertEqual(b["hits"], [True] * 6)
        self.assertTrue(b["success"])
        self.assertEqual(b["blocks"], a["blocks"])
        self.assertEqual(self.backend_loads(), loads)
        # The reverse: this process stores, another engine loads.
        spec, manager, worker, cache = self.engine(seed=6)
        hashes = fv.block_hashes(seed=6, n=3)
        fv.store(spec, manager, worker, cache, hashes, [0, 1, 2], job_id=1)
        loads = self.backend_loads()
        c = self.other("load", seed=6, first=0, n=3)
        self.assertEqual(c["hits"], [True] * 3)
        self.assertEqual(c["blocks"], [cache.block(i).hex() for i in range(3)])
        self.assertEqual(self.backend_loads(), loads)

    def backend_loads(self):
        """The mount's /stats: loads from the store, and their bytes."""
        st = self.d.stats()
        return st.get("shardfs_owner_loads_total", 0), st.get("shardfs_bytes_read_total", 0)


class Keys(VllmCase):
    def test_process_local_hashes_are_refused_with_a_log_line(self):
        old = os.environ.pop("PYTHONHASHSEED", None)
        self.addCleanup(lambda: old is None or os.environ.__setitem__("PYTHONHASHSEED", old))
        with self.assertLogs("shardfs.vllm", "ERROR") as cm:
            spec, manager, worker, cache = self.engine(extra={"prefix_caching_hash_algo": "xxhash"})
        self.assertIn("process-local", "\n".join(cm.output))
        self.assertFalse(spec.shared)
        hashes = fv.block_hashes(seed=8, n=2)
        self.assertIsNone(fv.store(spec, manager, worker, cache, hashes, [0, 1], job_id=1))
        s2, m2, w2, c2 = self.engine()
        fv.store(s2, m2, w2, c2, hashes, [0, 1], job_id=1)
        self.assertEqual(fv.lookup(m2, hashes), [True, True])
        self.assertEqual(fv.lookup(manager, hashes), [False, False])

    def test_the_hash_choices_that_share(self):
        self.assertTrue(svllm.hash_sharing("sha256", None)[0])
        self.assertTrue(svllm.hash_sharing("sha256_cbor", "0")[0])
        self.assertTrue(svllm.hash_sharing("xxhash", "42")[0])
        self.assertFalse(svllm.hash_sharing("xxhash_cbor", None)[0])
        self.assertFalse(svllm.hash_sharing("md5", None)[0])


class Parallel(VllmCase):
    shard_size = PAGE * LAYERS

    def test_tp_workers_store_their_slices_and_a_block_hits_when_all_are_there(self):
        s0, m0, w0, c0 = self.engine(seed=10, world=2, rank=0)
        s1, m1, w1, c1 = self.engine(seed=11, world=2, rank=1)
        hashes = fv.block_hashes(seed=9, n=2)
        out = m0.prepare_store(fv.keys_of(hashes), None)
        w0.submit_store(1, c0.ptrs([0, 1]), out.store_spec)
        self.assertTrue(fv.finish(w0, [1])[1].success)
        self.assertEqual(fv.lookup(m0, hashes), [False, False])  # slice 1 is missing
        w1.submit_store(1, c1.ptrs([0, 1]), out.store_spec)
        self.assertTrue(fv.finish(w1, [1])[1].success)
        self.assertEqual(fv.lookup(m0, hashes), [True, True])
        spec = m0.prepare_load(fv.keys_of(hashes), None)
        for w, c, seed in ((w0, c0, 10), (w1, c1, 11)):
            w.submit_load(2, spec, c.ptrs([5, 6]))
            self.assertTrue(fv.finish(w, [2])[2].success)
            self.assertEqual([c.block(5), c.block(6)], [c.block(0), c.block(1)])
        self.assertNotEqual(c0.block(5), c1.block(5))
        blk = out.store_spec.blocks[0].hex()
        self.assertEqual(self.store_file_size(blk, 2 * self.shard_size), 2 * self.shard_size)

    def test_mla_stores_one_shard_and_every_rank_loads_it(self):
        s0, m0, w0, c0 = self.engine(seed=12, world=2, rank=0, replicated=True)
        s1, m1, w1, c1 = self.engine(seed=13, world=2, rank=1, replicated=True)
        self.assertTrue(s0.replicated_layout)
        hashes = fv.block_hashes(seed=10, n=2)
        self.assertEqual(len(fv.store(s0, m0, w0, c0, hashes, [0, 1], job_id=1)), 2)
        self.assertEqual(fv.lookup(m1, hashes), [True, True])
        loads = self.d.stats().get("shardfs_bytes_read_total", 0)
        for m, w, c in ((m0, w0, c0), (m1, w1, c1)):
            self.assertTrue(fv.load(m, w, c, hashes, [7, 8], job_id=2).success)
            self.assertEqual([c.block(7), c.block(8)], [c0.block(0), c0.block(1)])
        self.assertEqual(self.d.stats().get("shardfs_bytes_read_total", 0), loads)
        blk = s0.block_of(fv.keys_of(hashes)[0]).hex()
        self.assertEqual(self.store_file_size(blk, self.shard_size), self.shard_size)


if __name__ == "__main__":
    unittest.main()
