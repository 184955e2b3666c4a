# SPDX-License-Identifier: MIT
"""shardfs.sglang.ShardfsStorage driven the way SGLang's HiCache controller
drives an L3 backend: built by the dynamic factory as cls(storage_config,
kwargs), given the host pool with register_mem_pool_host(), then the
zero-copy batch_get_v1/batch_set_v1 over page addresses from the pool's
get_page_buffer_meta(), batch_exists for prefetch, and the copying
get/set/batch_get/batch_set.

Claims:
  * the interface has HiCacheStorage's method names and parameters;
  * pages round-trip through the zero-copy path; each page is one block file
    of the posix layout named by the documented key mapping, K then V;
  * batch_exists counts the leading existing keys; missing pages fail only
    their own entries;
  * two engine instances (processes) share one CacheBuffer: what one stores
    the other loads without a backend load;
  * against SGLang's own base class when SGLang is importable (skipped here).
"""
import hashlib
import inspect
import multiprocessing
import os
import unittest

import fixture
import fixture_sglang
from fixture_sglang import PAGE, SHARD, HostPool

torch, MISSING = fixture.optional("torch")

import shardfs
from shardfs import sglang

D = fixture.ModuleDaemon(MISSING, shard_size=SHARD)
setUpModule, tearDownModule = D.up, D.down


def storage_config(tp_rank=0, tp_size=1, mla=False, **extra):
    return fixture_sglang.storage_config(D, extra, tp_rank=tp_rank, tp_size=tp_size,
                                         is_mla_model=mla)


def make(seed=1, **kw):
    """As StorageBackendFactory._create_dynamic_backend, then the controller."""
    st = sglang.ShardfsStorage(storage_config(**kw), {})
    pool = HostPool(seed)
    st.register_mem_pool_host(pool)
    return st, pool


def indices(pages):
    return torch.tensor([p * PAGE + t for p in pages for t in range(PAGE)], dtype=torch.int64)


def keys(n, salt):
    return [hashlib.sha256(f"{salt}-{i}".encode()).hexdigest() for i in range(n)]


HICACHE = {
    "batch_get_v1": ["keys", "host_indices", "extra_info"],
    "batch_set_v1": ["keys", "host_indices", "extra_info"],
    "get": ["key", "target_location", "target_sizes"],
    "batch_get": ["keys", "target_locations", "target_sizes"],
    "set": ["key", "value", "target_location", "target_sizes"],
    "batch_set": ["keys", "values", "target_locations", "target_sizes"],
    "exists": ["key"],
    "batch_exists": ["keys", "extra_info"],
    "clear": [],
    "get_stats": [],
    "register_mem_pool_host": ["mem_pool_host"],
}


class Interface(unittest.TestCase):
    def test_hicache_storage_names_and_parameters(self):
        for name, params in HICACHE.items():
            got = list(inspect.signature(getattr(sglang.ShardfsStorage, name)).parameters)[1:]
            self.assertEqual(got, params, name)

    def test_against_sglangs_base_class(self):
        if not sglang.HAVE_SGLANG:
            self.skipTest("SGLang is not importable here (sglang.srt.mem_cache.hicache_storage): "
                          "the real-base-class check runs where SGLang is installed")
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
        self.assertTrue(issubclass(sglang.ShardfsStorage, HiCacheStorage))
        self.assertFalse(getattr(sglang.ShardfsStorage, "__abstractmethods__", set()))
        st, _ = make()
        self.assertEqual(st.batch_exists(keys(1, "none")), 0)
        st.close()

    def test_key_mapping(self):
        st, _ = make()
        try:
            k = "ab" * 32
            self.assertEqual(st.block_of(k), hashlib.md5((k + "_org-model_0_1").encode()).digest())
        finally:
            st.close()
        a = sglang.key_suffix(storage_config(tp_rank=0, tp_size=2))
        b = sglang.key_suffix(storage_config(tp_rank=1, tp_size=2))
        self.assertNotEqual(a, b, "MHA: each TP rank stores its own slice")
        a = sglang.key_suffix(storage_config(tp_rank=0, tp_size=2, mla=True))
        b = sglang.key_suffix(storage_config(tp_rank=1, tp_size=2, mla=True))
        self.assertEqual(a, b, "MLA: the ranks share the page")


class ZeroCopy(fixture.Checks, unittest.TestCase):
    def setUp(self):
        self.st, self.pool = make()

    def tearDown(self):
        self.st.close()

    def test_pages_round_trip_and_land_in_the_posix_layout(self):
        ks = keys(3, "v1")
        want = [self.pool.page_bytes(p * PAGE) for p in (1, 5, 2)]
        self.assertEqual(self.st.batch_set_v1(ks, indices([1, 5, 2])), [True] * 3)
        for k, w in zip(ks, want):
            with open(os.path.join(D.store, "data", self.st.block_of(k).hex()), "rb") as f:
                self.assertEqual(f.read(), w, "one block file per page: K then V")
        self.pool.kv_buffer.zero_()
        self.assertEqual(self.st.batch_get_v1(ks, indices([7, 8, 9])), [True] * 3)
        self.assertEqual([self.pool.page_bytes(p * PAGE) for p in (7, 8, 9)], want)

    def test_batch_exists_counts_the_leading_run_and_misses_fail_alone(self):
        ks = keys(4, "exists")
        self.assertEqual(self.st.batch_set_v1(ks[:2], indices([0, 1])), [True, True])
        self.assertEqual(self.st.batch_exists(ks), 2)
        self.assertEqual(self.st.batch_exists(ks[2:]), 0)
        self.assertEqual(self.st.batch_exists([]), 0)
        self.assertTrue(self.st.exists(ks[0]))
        self.assertFalse(self.st.exists(ks[3]))
        got = self.st.batch_get_v1([ks[0], ks[3], ks[1]], indices([10, 11, 12]))
        self.assertEqual(got, [True, False, True])

    def test_bad_input_is_a_logged_miss(self):
        self.logged_miss(lambda: self.st.batch_get_v1(keys(2, "bad"), indices([0])))  # 2 keys, 1 page
        self.logged_miss(lambda: self.st.exists(b"not a str"))
        small = sglang.ShardfsStorage(storage_config(), {})
        try:
            pool = HostPool(1)
            pool.get_dummy_flat_data_page = lambda: torch.zeros(10, dtype=torch.bfloat16)
            with self.assertRaises(shardfs.InvalidArgument):
                small.register_mem_pool_host(pool)
            self.logged_miss(lambda: small.batch_get_v1(keys(1, "bad"), indices([0])))  # no pool registered
        finally:
            small.close()


class Copying(unittest.TestCase):
    def test_get_set_batch_get_batch_set(self):
        st, pool = make()
        try:
            ks = keys(3, "copy")
            pages = [pool.get_data_page(p * PAGE) for p in (0, 1, 2)]
            self.assertTrue(st.batch_set(ks[:2], pages[:2]))
            self.assertTrue(st.set(ks[2], pages[2]))
            dummy = pool.get_dummy_flat_data_page()
            got = st.batch_get(ks + keys(1, "copy-missing"), [dummy] * 4)  # as the controller does
            self.assertIsNone(got[3])
            for g, p in zip(got[:3], pages):
                self.assertTrue(torch.equal(g, p))
            one = st.get(ks[1])
            self.assertTrue(torch.equal(one, pages[1]))
            self.assertIsNone(st.get(keys(1, "copy-missing")[0]))
            self.assertIsInstance(st.stats(), dict)
        finally:
            st.close()


def engine_set(ks, out):
    st, pool = make(seed=11)
    out.put((st.batch_set_v1(ks, indices(range(len(ks)))),
             [pool.page_bytes(p * PAGE) for p in range(len(ks))]))
    st.close()


def engine_get(ks, out):
    st, pool = make(seed=12)
    ok = st.batch_get_v1(ks, indices(range(len(ks))))
    out.put((ok, [pool.page_bytes(p * PAGE) for p in range(len(ks))], st.stats()))
    st.close()


class TwoEngines(unittest.TestCase):
    def test_what_one_instance_stores_the_other_loads_from_memory(self):
        ctx = multiprocessing.get_context("fork")
        ks = keys(5, "two")
        out = ctx.Queue()
        a = ctx.Process(target=engine_set, args=(ks, out))
        a.start()
        ok, stored = out.get(timeout=60)
        a.join(30)
        self.assertEqual(ok, [True] * 5)
        before = D.stats()
        b = ctx.Process(target=engine_get, args=(ks, out))
        b.start()
        ok, loaded, stats = out.get(timeout=60)
        b.join(30)
        self.assertEqual(ok, [True] * 5)
        self.assertEqual(loaded, stored)
        self.assertEqual(stats["hits"], 5)
        self.assertEqual(stats["owner_loads"], 0, "no backend load in the second instance")
        self.assertEqual(D.stats()["shardfs_owner_loads_total"], before["shardfs_owner_loads_total"])


if __name__ == "__main__":
    unittest.main()
