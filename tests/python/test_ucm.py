# SPDX-License-Identifier: MIT
"""shardfs.ucm.ShardfsStore driven the way UCM's vLLM connector drives a
StoreV1 (ucm/integration/vllm/ucm_connector.py): a worker store built from
the connector's config, load_data/dump_data with rows of raw pointers into
a paged KV cache (K and V of every layer per block), wait() raising
RuntimeError on failure, a scheduler store answering lookup_on_prefix.

Claims:
  * the interface has StoreV1's method names and parameters;
  * dumps write the posix layout (one file per block under data/ or the
    data_dir_shard_bytes directories, shard n at n * shard_size, the pieces
    of a shard in row order), and files laid out that way by hand load;
  * a failed entry makes wait() raise RuntimeError, with per-entry statuses;
  * dump_data's prerequisite_handle: with the host copier the store
    synchronizes the event, then dumps; with the CUDA copier it hands the
    event to the library (Rank.dumpv after=) and blocks on nothing;
  * cc_store() raises (ENOTSUP): there is no UCM C++ Store to hand out;
  * two engine instances (processes) share one CacheBuffer: what one dumps
    the other loads without a backend load;
  * against UCM's own base class when UCM is importable (skipped here).
"""
import errno
import inspect
import multiprocessing
import os
import unittest
from unittest import mock

import fixture

torch, np, MISSING = fixture.optional("torch", "numpy")

import shardfs
from shardfs import _pieces, ucm

# A small model: 2 layers, K and V each [num_blocks, block_tokens, heads, head_dim] fp16.
LAYERS, BLOCKS, TOKENS, HEADS, HEAD_DIM = 2, 8, 16, 2, 32
PIECE = TOKENS * HEADS * HEAD_DIM * 2
SHARD = LAYERS * 2 * PIECE  # 16 KiB: one shard holds the whole block of this rank
D = fixture.ModuleDaemon(MISSING, shard_size=SHARD)
setUpModule, tearDownModule = D.up, D.down


class KVCache:
    """vLLM's paged KV cache and UCM's KVCacheLayout arithmetic over it."""

    def __init__(self, seed):
        g = torch.Generator().manual_seed(seed)
        self.layers = [[torch.randn(BLOCKS, TOKENS, HEADS, HEAD_DIM, generator=g).half()
                        for _ in range(2)] for _ in range(LAYERS)]
        self.base = np.array([[kv[0].data_ptr() for kv in layer] for layer in self.layers], np.uint64)
        self.stride = np.full((LAYERS, 2), PIECE, np.uint64)

    def tensor_size_list(self):
        return self.stride.reshape(-1).tolist()

    def addrs(self, vllm_blocks):
        ids = np.array(vllm_blocks, np.uint64)
        out = ids[:, None, None] * self.stride[None, :, :] + self.base[None, :, :]
        return out.reshape(len(vllm_blocks), -1)

    def block_bytes(self, vllm_block):
        return b"".join(kv[vllm_block].numpy().tobytes() for layer in self.layers for kv in layer)

    def zero(self):
        for layer in self.layers:
            for kv in layer:
                kv.zero_()


def worker_config(kv, **extra):
    """What UCMConnector._create_store hands a worker's store."""
    cfg = {
        "storage_backends": [D.store],  # the connector splits the ':' list
        "shardfs_socket": D.sock,
        "data_dir_shard_bytes": 0,
        "unique_id": "engine-0",
        "device_id": 0,
        "tensor_size_list": kv.tensor_size_list(),
        "shard_size": SHARD,
        "block_size": SHARD,
        "local_rank_size": 1,
        "posix_gc_enable": False,
        "share_buffer_enable": False,
        "shardfs_device": "cpu",
    }
    cfg.update(extra)
    return cfg


def scheduler_config(**extra):
    cfg = {"storage_backends": [D.store], "shardfs_socket": D.sock, "data_dir_shard_bytes": 0,
           "unique_id": "engine-0", "block_size": SHARD, "posix_gc_enable": True}
    cfg.update(extra)
    return cfg


def ids(n, salt):
    return [fixture.block(i, salt) for i in range(n)]


# StoreV1 as published (ucm/store/ucmstore_v1.py): method -> parameter names.
STOREV1 = {
    "cc_store": [],
    "lookup": ["block_ids"],
    "lookup_on_prefix": ["block_ids"],
    "prefetch": ["block_ids"],
    "load": ["block_ids", "shard_index", "dst_tensor"],
    "dump": ["block_ids", "shard_index", "src_tensor"],
    "load_data": ["block_ids", "shard_index", "dst_addr"],
    "dump_data": ["block_ids", "shard_index", "src_addr", "prerequisite_handle"],
    "wait": ["task"],
    "check": ["task"],
}


class Interface(unittest.TestCase):
    def test_storev1_names_and_parameters(self):
        for name, params in STOREV1.items():
            fn = getattr(ucm.ShardfsStore, name)
            got = list(inspect.signature(fn).parameters)[1:]
            self.assertEqual(got, params, name)
        self.assertEqual(inspect.signature(ucm.ShardfsStore.dump_data).parameters[
            "prerequisite_handle"].default, 0)
        self.assertEqual(list(inspect.signature(ucm.ShardfsStore).parameters), ["config"])

    def test_against_ucms_base_class(self):
        if not ucm.HAVE_UCM:
            self.skipTest("UCM is not importable here (ucm.store.ucmstore_v1): "
                          "the real-base-class check runs where UCM is installed")
        from ucm.store.ucmstore_v1 import Task, UcmKVStoreBaseV1
        self.assertTrue(issubclass(ucm.ShardfsStore, UcmKVStoreBaseV1))
        self.assertTrue(issubclass(ucm.ShardfsUcmTask, Task))
        self.assertFalse(getattr(ucm.ShardfsStore, "__abstractmethods__", set()))
        from ucm.store.factory_v1 import UcmConnectorFactoryV1
        store = UcmConnectorFactoryV1.create_connector("ShardfsStore", scheduler_config(),
                                                       "shardfs.ucm")
        self.assertEqual(store.lookup_on_prefix([fixture.block(0, b"none")]), -1)
        store.close()


class Worker(unittest.TestCase):
    def setUp(self):
        self.kv = KVCache(1)
        self.store = ucm.ShardfsStore(worker_config(self.kv))

    def tearDown(self):
        self.store.close()

    def test_dump_data_writes_the_posix_layout_and_load_data_reads_it_back(self):
        blocks = ids(3, b"ucm-dump")
        vllm = [5, 1, 6]
        want = [self.kv.block_bytes(v) for v in vllm]
        self.store.wait(self.store.dump_data(blocks, [0] * 3, self.kv.addrs(vllm), 0))
        for b, w in zip(blocks, want):
            with open(os.path.join(D.store, "data", b.hex()), "rb") as f:
                self.assertEqual(f.read(), w, "shard 0 at offset 0, pieces in row order")
        self.kv.zero()
        into = [2, 3, 7]
        task = self.store.load_data(blocks, [0] * 3, [list(r) for r in self.kv.addrs(into)])
        self.store.wait(task)
        self.assertEqual(task.statuses, [0, 0, 0])
        self.assertTrue(self.store.check(task))
        self.assertEqual([self.kv.block_bytes(v) for v in into], want)

    def spy_dumpv(self, drop_after):
        """Record each Rank.dumpv call's after=; with drop_after, dump
        without it (this host copier cannot wait for an event)."""
        calls = []
        real = self.store.rank.dumpv

        def dumpv(entries, keep=None, after=None):
            calls.append(after)
            return real(entries, keep=keep, after=None if drop_after else after)

        self.store.rank.dumpv = dumpv
        self.addCleanup(vars(self.store.rank).pop, "dumpv")
        return calls

    def test_a_prerequisite_with_the_host_copier_is_synchronized_before_the_dump(self):
        blocks = ids(2, b"ucm-prereq-host")
        want = [self.kv.block_bytes(v) for v in (2, 3)]
        order = []
        calls = self.spy_dumpv(drop_after=False)
        with mock.patch.object(_pieces, "event_sync", side_effect=lambda h: order.append(h)):
            self.store.wait(self.store.dump_data(blocks, [0, 0], self.kv.addrs([2, 3]), 0xE7E47))
        self.assertEqual(order, [0xE7E47])
        self.assertEqual(calls, [None], "the host copier's dump goes without the event")
        for b, w in zip(blocks, want):
            with open(os.path.join(D.store, "data", b.hex()), "rb") as f:
                self.assertEqual(f.read(), w)

    def test_a_prerequisite_with_the_cuda_copier_goes_to_the_library(self):
        """The routing: a store whose copier is CUDA's hands the event to
        Rank.dumpv(after=) and never synchronizes it in Python (the event
        itself is the GPU check's: no device here, so the spy dumps
        without it)."""
        blocks = ids(2, b"ucm-prereq-cuda")
        want = [self.kv.block_bytes(v) for v in (4, 5)]
        calls = self.spy_dumpv(drop_after=True)
        self.store.rank.copier = "cuda"
        self.addCleanup(setattr, self.store.rank, "copier", "host")
        with mock.patch.object(_pieces, "event_sync",
                               side_effect=AssertionError("the thread blocked on the event")):
            self.store.wait(self.store.dump_data(blocks, [0, 0], self.kv.addrs([4, 5]), 0xE7E47))
        self.assertEqual(calls, [0xE7E47])
        for b, w in zip(blocks, want):
            with open(os.path.join(D.store, "data", b.hex()), "rb") as f:
                self.assertEqual(f.read(), w)

    def test_files_laid_out_by_hand_load(self):
        blocks = ids(2, b"ucm-hand")
        for b in blocks:
            fixture.write_block(D.store, b, 2, SHARD)
        task = self.store.load_data(blocks, [1, 0], self.kv.addrs([0, 4]))
        self.store.wait(task)
        self.assertEqual(self.kv.block_bytes(0), fixture.shard_bytes(blocks[0], 1, SHARD))
        self.assertEqual(self.kv.block_bytes(4), fixture.shard_bytes(blocks[1], 0, SHARD))

    def test_tensor_rows_load_and_dump(self):
        blocks = ids(2, b"ucm-tensor")
        whole = [torch.arange(SHARD, dtype=torch.uint8) for _ in blocks]  # one piece: zero copy
        self.store.wait(self.store.dump(blocks, [0, 0], [[t] for t in whole]))
        pieces = [[kv[3] for layer in self.kv.layers for kv in layer],
                  [kv[2] for layer in self.kv.layers for kv in layer]]
        task = self.store.load(blocks, [0, 0], pieces)
        while not self.store.check(task):
            pass
        self.store.wait(task)
        self.assertEqual(self.kv.block_bytes(3), whole[0].numpy().tobytes())
        self.assertEqual(self.kv.block_bytes(2), whole[1].numpy().tobytes())

    def test_a_failed_entry_raises_runtime_error_with_statuses(self):
        have = ids(1, b"ucm-have")[0]
        fixture.write_block(D.store, have, 1, SHARD)
        missing = ids(1, b"ucm-missing")[0]
        task = self.store.load_data([have, missing], [0, 0], self.kv.addrs([0, 1]))
        with self.assertRaises(RuntimeError) as cm:
            self.store.wait(task)
        self.assertEqual(task.statuses, [0, -errno.ENOENT])
        self.assertIn("1 of 2 entries failed", str(cm.exception))
        self.assertEqual(self.kv.block_bytes(0), fixture.shard_bytes(have, 0, SHARD))

    def test_bad_rows_raise(self):
        with self.assertRaises(ucm.ShardfsUcmBadInput):
            self.store.load_data(ids(1, b"x"), [0], [[1, 2, 3]])  # 3 pointers, layout has 4
        with self.assertRaises(ucm.ShardfsUcmBadInput):
            self.store.load(ids(1, b"x"), [0], [[torch.empty(SHARD - 2, dtype=torch.uint8)]])
        with self.assertRaises(ucm.ShardfsUcmBadInput):
            self.store.load(ids(2, b"x"), [0], [[torch.empty(SHARD, dtype=torch.uint8)]])
        with self.assertRaises(ucm.ShardfsUcmBadInput):
            self.store.load_data([b"short"], [0], self.kv.addrs([0]))
        with self.assertRaises(ucm.ShardfsUcmBadInput):
            ucm.ShardfsStore(worker_config(self.kv, shard_size=SHARD * 2))
        with self.assertRaises(ucm.ShardfsUcmBadInput):
            ucm.ShardfsStore(worker_config(self.kv, storage_backends=["/a", "/b"]))

    def test_scheduler_store_answers_lookups(self):
        blocks = ids(3, b"ucm-sched")
        self.store.wait(self.store.dump_data(blocks[:2], [0, 0], self.kv.addrs([0, 1])))
        sched = ucm.ShardfsStore(scheduler_config())
        try:
            self.assertEqual(sched.rank.device, -1, "the scheduler opens the query-only role")
            self.assertEqual(list(sched.lookup(blocks)), [True, True, False])
            self.assertEqual(sched.lookup_on_prefix(blocks), 1)
            self.assertEqual(sched.lookup_on_prefix(blocks[2:]), -1)
            self.assertEqual(sched.lookup_on_prefix(blocks[:2]) + 1, 2, "the connector's hit count")
            with self.assertRaises(ucm.ShardfsUcmError) as cm:
                sched.cc_store()  # no UCM C++ Store* for native code to call
            self.assertEqual(cm.exception.errno, errno.ENOTSUP)
        finally:
            sched.close()
        self.store.prefetch(blocks)  # advisory: never fails


def engine_dump(blocks, vllm, out):
    kv = KVCache(7)
    store = ucm.ShardfsStore(worker_config(kv, unique_id="engine-A"))
    store.wait(store.dump_data(blocks, [0] * len(blocks), kv.addrs(vllm)))
    out.put([kv.block_bytes(v) for v in vllm])
    store.close()


def engine_load(blocks, out):
    kv = KVCache(8)
    kv.zero()
    store = ucm.ShardfsStore(worker_config(kv, unique_id="engine-B"))
    into = list(range(len(blocks)))
    store.wait(store.load_data(blocks, [0] * len(blocks), kv.addrs(into)))
    out.put(([kv.block_bytes(v) for v in into], store.stats()))
    store.close()


class TwoEngines(unittest.TestCase):
    def test_what_one_instance_dumps_the_other_loads_from_memory(self):
        ctx = multiprocessing.get_context("fork")
        blocks = ids(4, b"ucm-two")
        out = ctx.Queue()
        a = ctx.Process(target=engine_dump, args=(blocks, [0, 2, 4, 6], out))
        a.start()
        dumped = out.get(timeout=60)
        a.join(30)
        before = D.stats()
        b = ctx.Process(target=engine_load, args=(blocks, out))
        b.start()
        loaded, stats = out.get(timeout=60)
        b.join(30)
        after = D.stats()
        self.assertEqual(loaded, dumped)
        self.assertEqual(stats["hits"], 4)
        self.assertEqual(stats["owner_loads"], 0, "no backend load in the second instance")
        self.assertEqual(after["shardfs_owner_loads_total"], before["shardfs_owner_loads_total"])


class Layerwise(unittest.TestCase):
    def test_shard_n_is_layer_n_at_n_times_shard_size(self):
        """UCMLayerWiseConnector: one shard per layer, shard index = layer id."""
        layer_shard = 2 * PIECE
        d = fixture.Daemon(shard_size=layer_shard).start()
        try:
            kv = KVCache(5)
            cfg = worker_config(kv, shardfs_socket=d.sock, storage_backends=d.store,
                                tensor_size_list=[PIECE, PIECE], shard_size=layer_shard,
                                block_size=SHARD)
            store = ucm.ShardfsStore(cfg)
            try:
                b = ids(1, b"ucm-layer")[0]
                rows = kv.addrs([6]).reshape(1, LAYERS, 2)
                tasks = [store.dump_data([b], [layer], rows[:, layer, :]) for layer in range(LAYERS)]
                for t in tasks:
                    store.wait(t)
                with open(os.path.join(d.store, "data", b.hex()), "rb") as f:
                    self.assertEqual(f.read(), kv.block_bytes(6), "layer n at n * shard_size")
                kv.zero()
                into = kv.addrs([0]).reshape(1, LAYERS, 2)
                for layer in range(LAYERS):
                    store.wait(store.load_data([b], [layer], into[:, layer, :]))
                with open(os.path.join(d.store, "data", b.hex()), "rb") as f:
                    self.assertEqual(kv.block_bytes(0), f.read())
                store.prefetch([b])  # every layer's shard of the block
            finally:
                store.close()
        finally:
            d.stop()


class DirPrefix(unittest.TestCase):
    def test_data_dir_shard_bytes_directories(self):
        d = fixture.Daemon(shard_size=SHARD, opts="dir_prefix=3").start()
        try:
            kv = KVCache(3)
            cfg = worker_config(kv, shardfs_socket=d.sock, storage_backends=d.store)
            del cfg["data_dir_shard_bytes"]  # UCM's default: 3
            store = ucm.ShardfsStore(cfg)
            try:
                b = ids(1, b"ucm-prefix")[0]
                store.wait(store.dump_data([b], [0], kv.addrs([1])))
                with open(os.path.join(d.store, b.hex()[:3], b.hex()), "rb") as f:
                    self.assertEqual(f.read(), kv.block_bytes(1))
                hand = ids(1, b"ucm-prefix-hand")[0]
                fixture.write_block(d.store, hand, 1, SHARD, dir_prefix=3)
                store.wait(store.load_data([hand], [0], kv.addrs([2])))
                self.assertEqual(kv.block_bytes(2), fixture.shard_bytes(hand, 0, SHARD))
                # The daemon reads the same files through the mount.
                with open(os.path.join(d.mnt, "block", hand.hex(), "shard", "0"), "rb") as f:
                    self.assertEqual(f.read(), fixture.shard_bytes(hand, 0, SHARD))
            finally:
                store.close()
        finally:
            d.stop()


if __name__ == "__main__":
    unittest.main()
