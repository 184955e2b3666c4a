# SPDX-License-Identifier: MIT
"""The adapters driven through the engines' own classes (tests/python/engines.py
says which parts of SGLang and UCM import here, and each test that needs
another part skips naming it), against a real daemon.

Claims:
  * SGLang's StorageBackendFactory builds ShardfsStorage from the dynamic
    extra config, with SGLang's HiCacheStorageConfig;
  * get_stats() answers SGLang's StorageMetrics or None, never a dict (the
    metrics collector asserts on anything else);
  * with the daemon killed, HiCache's storage calls answer misses without
    raising; once it is back (the same store), pages stored before hit and
    new ones store again;
  * clear() says it removed nothing (False);
  * UCM's factory (UcmConnectorFactoryV1) builds ShardfsStore; lookup()
    answers a numpy bool array; with the daemon killed, lookups are misses
    and every raise is a RuntimeError; after the restart, hits again;
  * a block counts as present only once every shard of it is stored;
  * UCM's config keys timeout_ms, posix_capacity_gb/posix_gc_enable
    (logged: not bounded here) and a repeated storage_backends are accepted.
"""
import errno
import time
import unittest

import engines
import fixture
import fixture_sglang
from fixture_sglang import PAGE, SHARD, HostPool

torch, _np, MISSING = fixture.optional("torch", "numpy")
WHY_SGLANG = engines.why_not("sglang")
WHY_UCM = engines.why_not("ucm")

import shardfs  # noqa: E402


def until(pred, what, deadline=60.0):
    """Wait for pred() (the rank re-attaches by itself); a deadline, not a timing."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > deadline:
            raise AssertionError(f"{what}: not within {deadline} s")
        time.sleep(0.05)


class DaemonCase(fixture.OwnDaemonCase):
    shard_size = SHARD
    missing = MISSING


@unittest.skipIf(WHY_SGLANG, f"SGLang: {WHY_SGLANG}")
class SGLang(DaemonCase):
    def config(self, **kw):
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

        extra = fixture_sglang.storage_config(self.d).extra_config
        extra["backend_name"] = "shardfs"
        base = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                    is_mla_model=False, enable_storage_metrics=True, is_page_first_layout=True,
                    model_name="org/model", extra_config=extra)
        base.update(kw)
        return HiCacheStorageConfig(**base)

    def make(self, seed=1):
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
        from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

        pool = HostPool(seed)
        st = StorageBackendFactory.create_backend("dynamic", self.config(), pool)
        self.assertIsInstance(st, HiCacheStorage)
        st.register_mem_pool_host(pool)
        self.addCleanup(st.close)
        return st, pool

    @staticmethod
    def keys(n, salt):
        return [f"{salt}-{i:04d}" for i in range(n)]

    @staticmethod
    def indices(pages):
        return torch.tensor([p * PAGE + t for p in pages for t in range(PAGE)], dtype=torch.int64)

    def test_get_stats_is_storage_metrics_or_none(self):
        st, _ = self.make()
        self.assertEqual(st.batch_set_v1(self.keys(2, "m"), self.indices([0, 1])), [True, True])
        got = st.get_stats()
        cls = shardfs.sglang._storage_metrics_class()
        if cls is None:  # SGLang's metrics module needs torch >= 2 (engines.py)
            self.assertIsNone(got)
        else:
            self.assertIsInstance(got, cls)
            self.assertEqual(got.backup_pgs, [2])
        self.assertIsInstance(st.stats(), dict)

    def test_daemon_killed_and_restarted(self):
        st, pool = self.make()
        before = self.keys(2, "before")
        self.assertEqual(st.batch_set_v1(before, self.indices([0, 1])), [True, True])
        self.d.kill()
        # HiCache's threads catch nothing: misses, no raise.
        with self.assertLogs("shardfs.sglang", "ERROR"):
            self.assertEqual(st.batch_set_v1(self.keys(1, "gone"), self.indices([2])), [False])
        self.assertEqual(st.batch_get_v1(before, self.indices([3, 4])), [False, False])
        self.assertEqual(st.batch_exists(before), 0)
        self.assertFalse(st.exists(before[0]))
        self.d.start()
        until(lambda: st.batch_exists(before) == 2, "pages stored before the restart hit")
        self.assertEqual(st.batch_get_v1(before, self.indices([3, 4])), [True, True])
        self.assertEqual(pool.page_bytes(3 * PAGE), pool.page_bytes(0))
        self.assertEqual(st.batch_set_v1(self.keys(1, "after"), self.indices([5])), [True])

    def test_clear_says_nothing_was_removed(self):
        st, _ = self.make()
        with self.assertLogs("shardfs.sglang", "WARNING") as cm:
            self.assertFalse(st.clear())
        self.assertIn("nothing removed", "\n".join(cm.output))


@unittest.skipIf(WHY_UCM, f"UCM: {WHY_UCM}")
class Ucm(DaemonCase):
    def make(self, **extra):
        from ucm.store.factory_v1 import UcmConnectorFactoryV1
        from ucm.store.ucmstore_v1 import UcmKVStoreBaseV1

        config = {"storage_backends": [self.d.store], "shardfs_socket": self.d.sock,
                  "data_dir_shard_bytes": 0, "shardfs_device": "cpu", "device_id": 0,
                  "shard_size": SHARD, "block_size": 4 * SHARD, "tensor_size_list": [SHARD]}
        config.update(extra)
        st = UcmConnectorFactoryV1.create_connector("ShardfsStore", config, "shardfs.ucm")
        self.assertIsInstance(st, UcmKVStoreBaseV1)
        self.addCleanup(st.close)
        return st

    def dump(self, st, blocks, shards):
        bufs = [torch.full((SHARD,), i + 1, dtype=torch.uint8) for i in range(len(blocks))]
        st.wait(st.dump(blocks, shards, [[b] for b in bufs]))

    def test_lookup_is_a_numpy_bool_array(self):
        import numpy as np

        st = self.make()
        b = [fixture.block(i, b"np") for i in range(2)]
        self.dump(st, b[:1] * 4, [0, 1, 2, 3])
        got = st.lookup(b)
        self.assertIsInstance(got, np.ndarray)
        self.assertEqual(got.dtype, np.bool_)
        self.assertEqual(got.tolist(), [True, False])

    def test_half_dumped_block_is_not_present(self):
        st = self.make()
        b = [fixture.block(i, b"half") for i in range(2)]
        self.dump(st, [b[0]] * 4, [0, 1, 2, 3])
        self.dump(st, [b[1]], [0])  # layer 0 of 4 of a layerwise dump
        self.assertEqual(st.lookup(b).tolist(), [True, False])
        self.assertEqual(st.lookup_on_prefix(b), 0)
        self.assertEqual(st.lookup_on_prefix(b[1:]), -1)
        self.assertEqual(st.lookup_on_reverse(b), 0)
        self.assertEqual(st.lookup_on_reverse(b[1:]), -1)
        self.dump(st, [b[1]] * 3, [1, 2, 3])
        self.assertEqual(st.lookup_on_prefix(b), 1)

    def test_daemon_gone_is_a_miss_and_errors_are_runtime_errors(self):
        st = self.make()
        b = [fixture.block(i, b"gone") for i in range(2)]
        self.dump(st, [b[0]] * 4, [0, 1, 2, 3])
        self.d.kill()
        with self.assertLogs("shardfs.ucm", "ERROR"):
            self.assertEqual(st.lookup(b).tolist(), [False, False])
        self.assertEqual(st.lookup_on_prefix(b), -1)
        t = torch.zeros(SHARD, dtype=torch.uint8)
        for call in (lambda: st.wait(st.dump([b[1]], [0], [[t]])),
                     lambda: st.wait(st.load_data([b[0]], [0], [[t.data_ptr()]])),
                     lambda: st.wait(st.dump_data([b[1]], [0], [[t.data_ptr()]]))):
            try:
                call()
            except RuntimeError:
                pass  # what UCM's connector catches
        with self.assertRaises(RuntimeError) as cm:  # bad input too
            st.load_data([b[0]], [0], [["x"]])
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        self.d.start()
        until(lambda: st.lookup_on_prefix(b) == 0, "the block stored before the restart hits")
        st.wait(st.load_data([b[0]], [0], [[t.data_ptr()]]))
        self.assertEqual(t[0].item(), 1)

    def test_config_keys(self):
        with self.assertLogs("shardfs.ucm", "WARNING") as cm:
            st = self.make(timeout_ms=1234, posix_capacity_gb=10, posix_gc_enable=True,
                           storage_backends=[self.d.store, self.d.store])
        self.assertIn("not bounded", "\n".join(cm.output))
        self.assertEqual(st.rank_options["key_timeout_ms"], 1234)
        with self.assertRaises(RuntimeError):
            self.make(storage_backends=[self.d.store, self.d.dir])


if __name__ == "__main__":
    unittest.main()
