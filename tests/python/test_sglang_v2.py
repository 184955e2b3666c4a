# SPDX-License-Identifier: MIT
"""shardfs.sglang.ShardfsStorage against the rest of SGLang's current
HiCacheStorage interface: the v2 pool interface (register_mem_host_pool_v2,
batch_exists_v2, batch_get_v2, batch_set_v2 over PoolTransfer descriptors,
for models with more pools than KV: Mamba states, SWA, indexer pages), and
the attention-CP part of the key mapping. Written from the published
signatures and return conventions, with CPU tensors.

Claims:
  * every method of the interface has HiCacheStorage's name and parameters
    (and, where SGLang is importable, the real base class's: skipped here);
  * batch_set_v2 / batch_get_v2 round-trip the pages of several pools in
    one call and return {pool name: [bool per key]}; a pool's page of key K
    is the block file of "K.<pool>" (KV: of K);
  * a transfer that cannot be served (no such pool, indices that do not
    match the keys, a pool whose page is larger than a shard) fails its own
    pages only;
  * batch_exists_v2 returns the usable KV prefix under each pool's hit
    policy (all_pages / trailing_pages) and the pages found per pool;
  * bad input raises InvalidArgument; nothing crashes.
"""
import hashlib
import inspect
import os
import types
import unittest

import fixture
import fixture_sglang
from fixture_sglang import PAGE, SHARD, HostPool

torch, MISSING = fixture.optional("torch")

import shardfs
from shardfs import sglang

D = fixture.ModuleDaemon(MISSING, shard_size=SHARD)
setUpModule, tearDownModule = D.up, D.down


def storage_config(**kw):
    return fixture_sglang.storage_config(D, **kw)


def transfer(name, pages=None, ks=None, policy="all_pages"):
    """A PoolTransfer as the controller builds one (host <-> storage)."""
    idx = None if pages is None else torch.tensor([p * PAGE + t for p in pages for t in range(PAGE)])
    return types.SimpleNamespace(name=name, host_indices=idx, device_indices=None, keys=ks,
                                 hit_policy=policy, nodes_to_load=None, indices_from_pool=None)


def keys(n, salt):
    return [hashlib.sha256(f"{salt}-{i}".encode()).hexdigest() for i in range(n)]


V2 = {
    "register_mem_pool_host": ["mem_pool_host"],
    "register_mem_host_pool_v2": ["host_pool", "host_pool_name"],
    "batch_exists_v2": ["keys", "pool_transfers", "extra_info"],
    "batch_get_v2": ["transfers", "extra_info"],
    "batch_set_v2": ["transfers", "extra_info"],
    "batch_get_v1": ["keys", "host_indices", "extra_info"],
    "batch_set_v1": ["keys", "host_indices", "extra_info"],
    "batch_exists": ["keys", "extra_info"],
}


class Interface(unittest.TestCase):
    def test_v2_names_parameters_and_defaults(self):
        for name, params in V2.items():
            sig = inspect.signature(getattr(sglang.ShardfsStorage, name))
            got = list(sig.parameters)[1:]
            self.assertEqual(got, params, name)
            for p in ("extra_info", "pool_transfers"):
                if p in sig.parameters:
                    self.assertIsNone(sig.parameters[p].default, f"{name}: {p}=None")

    def test_every_method_of_sglangs_base_class(self):
        if not sglang.HAVE_SGLANG:
            self.skipTest("SGLang is not importable here (sglang.srt.mem_cache.hicache_storage): "
                          "the real-base-class check runs where SGLang is installed")
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
        for name, fn in inspect.getmembers(HiCacheStorage, inspect.isfunction):
            if name.startswith("_"):
                continue
            ours = getattr(sglang.ShardfsStorage, name)
            self.assertIsNot(ours, fn, f"{name} is the base class's: not implemented here")
            self.assertEqual(list(inspect.signature(ours).parameters),
                             list(inspect.signature(fn).parameters), name)

    def test_key_suffix_with_attention_cp(self):
        self.assertEqual(sglang.key_suffix(storage_config()), "_org-model_0_1")
        a = sglang.key_suffix(storage_config(attn_cp_rank=0, attn_cp_size=2))
        b = sglang.key_suffix(storage_config(attn_cp_rank=1, attn_cp_size=2))
        self.assertEqual(a, "_org-model_0_1_cp0_2")
        self.assertNotEqual(a, b, "each CP rank stores its own slice")
        self.assertEqual(sglang.key_suffix(storage_config(pp_size=2, pp_rank=1, attn_cp_rank=1,
                                                          attn_cp_size=2)),
                         "_org-model_0_1_2_1_cp1_2")


class Pools(fixture.Checks, unittest.TestCase):
    def setUp(self):
        self.st = sglang.ShardfsStorage(storage_config(), {})
        self.kv, self.mamba = HostPool(21), HostPool(22)
        self.st.register_mem_host_pool_v2(self.kv, "kv")
        self.st.register_mem_host_pool_v2(self.mamba, "mamba")

    def tearDown(self):
        self.st.close()

    def test_set_then_get_several_pools_in_one_call(self):
        ks = keys(3, "v2")
        want_kv = [self.kv.page_bytes(p * PAGE) for p in (1, 2, 3)]
        want_m = [self.mamba.page_bytes(p * PAGE) for p in (4, 5, 6)]
        got = self.st.batch_set_v2([transfer("kv", [1, 2, 3], ks), transfer("mamba", [4, 5, 6], ks)])
        self.assertEqual(got, {"kv": [True] * 3, "mamba": [True] * 3})
        for k, w, m in zip(ks, want_kv, want_m):
            with open(os.path.join(D.store, "data", self.st.block_of(k).hex()), "rb") as f:
                self.assertEqual(f.read(), w, "KV page: the block of K")
            with open(os.path.join(D.store, "data", self.st.block_of(k + ".mamba").hex()), "rb") as f:
                self.assertEqual(f.read(), m, "another pool's page: the block of K.<pool>")
        self.kv.kv_buffer.zero_()
        self.mamba.kv_buffer.zero_()
        got = self.st.batch_get_v2([transfer("kv", [7, 8, 9], ks), transfer("mamba", [10, 11, 12], ks)])
        self.assertEqual(got, {"kv": [True] * 3, "mamba": [True] * 3})
        self.assertEqual([self.kv.page_bytes(p * PAGE) for p in (7, 8, 9)], want_kv)
        self.assertEqual([self.mamba.page_bytes(p * PAGE) for p in (10, 11, 12)], want_m)
        # v1 and v2 name the same KV blocks.
        self.st.register_mem_pool_host(self.kv)
        self.assertEqual(self.st.batch_get_v1(ks, transfer("kv", [13, 14, 15]).host_indices),
                         [True] * 3)

    def test_a_transfer_that_cannot_be_served_fails_alone(self):
        ks = keys(2, "v2-bad")
        self.st.register_mem_host_pool_v2(HostPool(23, heads=4), "swa")  # pages over a shard
        got = self.st.batch_set_v2([transfer("kv", [0, 1], ks), transfer("swa", [0, 1], ks),
                                    transfer("indexer", [0, 1], ks),      # never registered
                                    transfer("mamba", [0], ks)])          # 2 keys, 1 page
        self.assertEqual(got, {"kv": [True, True], "swa": [False, False],
                               "indexer": [False, False], "mamba": [False, False]})
        missing = keys(1, "v2-missing")
        got = self.st.batch_get_v2([transfer("kv", [2, 3], [ks[0], missing[0]])])
        self.assertEqual(got, {"kv": [True, False]})
        self.assertEqual(self.st.batch_get_v2([transfer("kv", [], [])]), {"kv": []})
        self.assertEqual(self.st.batch_get_v2([]), {})

    def test_batch_exists_v2_hit_policies(self):
        ks = keys(4, "v2-exists")
        self.assertEqual(self.st.batch_set_v2([transfer("kv", [0, 1, 2, 3], ks)]),
                         {"kv": [True] * 4})
        self.assertEqual(self.st.batch_set_v2([transfer("mamba", [0, 1], ks[:2])]),
                         {"mamba": [True, True]})
        self.assertEqual(self.st.batch_set_v2([transfer("swa", [3], ks[3:])]), {"swa": [False]},
                         "swa is not registered yet")
        self.st.register_mem_host_pool_v2(HostPool(24), "swa")
        self.assertEqual(self.st.batch_set_v2([transfer("swa", [3], ks[3:])]), {"swa": [True]})
        r = self.st.batch_exists_v2(ks)
        self.assertEqual((r.kv_hit_pages, r.extra_pool_hit_pages), (4, {"kv": 4}))
        # all_pages: the pool's page for every page of the prefix.
        r = self.st.batch_exists_v2(ks, [transfer("mamba", ks=ks)])
        self.assertEqual((r.kv_hit_pages, r.extra_pool_hit_pages), (2, {"kv": 4, "mamba": 2}))
        # trailing_pages: only the last len(keys) pages of the prefix.
        r = self.st.batch_exists_v2(ks, [transfer("swa", ks=ks[:1], policy="trailing_pages")])
        self.assertEqual((r.kv_hit_pages, r.extra_pool_hit_pages), (4, {"kv": 4, "swa": 4}))
        r = self.st.batch_exists_v2(ks, [transfer("mamba", ks=ks[:1], policy="trailing_pages")])
        self.assertEqual((r.kv_hit_pages, r.extra_pool_hit_pages), (2, {"kv": 4, "mamba": 2}))
        # The usable prefix is the smallest of the pools'.
        r = self.st.batch_exists_v2(ks, [transfer("swa", ks=ks[:1], policy="trailing_pages"),
                                         transfer("mamba", ks=ks)])
        self.assertEqual(r.kv_hit_pages, 2)
        r = self.st.batch_exists_v2(ks, [transfer("indexer", ks=ks)])
        self.assertEqual((r.kv_hit_pages, r.extra_pool_hit_pages), (0, {"kv": 4}))
        r = self.st.batch_exists_v2(keys(2, "v2-none"), [transfer("mamba", ks=ks)])
        self.assertEqual((r.kv_hit_pages, r.extra_pool_hit_pages), (0, {}))
        self.assertEqual(self.st.batch_exists_v2([]).kv_hit_pages, 0)

    def test_bad_input_is_a_logged_miss(self):
        for bad in (None, "kv", 3):
            self.logged_miss(lambda: self.st.batch_get_v2(bad))
        self.logged_miss(lambda: self.st.batch_exists_v2([b"not a str"]))
        self.logged_miss(lambda: self.st.batch_set_v2([transfer("kv", [0], [12345])]))
        self.st.close()
        self.logged_miss(lambda: self.st.batch_get_v2([transfer("kv", [0], keys(1, "closed"))]))


if __name__ == "__main__":
    unittest.main()
