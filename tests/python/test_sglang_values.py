# SPDX-License-Identifier: MIT
"""shardfs.sglang.ShardfsStorage with values that are not one KV page, and
with heads split across TP sizes.

Claims:
  * a hybrid model's extra pool whose page is smaller than the shard (a
    Mamba state of 4,864 B against a 32 KiB shard, two buffers per state) is
    served by batch_set_v2/batch_get_v2 byte-exact, and batch_exists_v2 with
    trailing_pages reports the usable prefix;
  * the generic set/get/batch_set/batch_get keep any value of up to the
    shard (less its 16-byte header) exactly, with its length: tensors of
    any dtype and shape, as SGLang's NIXL backend test uses them, and the
    (target_location, target_sizes) address form; a target of another size
    than the stored value is a miss; a full shard is stored as it is (the
    block file is the value, as UCM's PosixStore expects);
  * with should_split_heads (page_head layout, tp_lcm_size), an instance of
    TP 2 and two ranks of an instance of TP 4 share pages: each head group
    is the block of the TP-4 rank holding it.
"""
import hashlib
import os
import types
import unittest

import fixture
import fixture_sglang

torch, MISSING = fixture.optional("torch")

from shardfs import _pieces, sglang

SHARD = 32768
D = fixture.ModuleDaemon(MISSING, shard_size=SHARD)
setUpModule, tearDownModule = D.up, D.down


def keys(n, salt):
    return [hashlib.sha256(f"{salt}-{i}".encode()).hexdigest() for i in range(n)]


def transfer(name, idx, ks, policy="all_pages"):
    return types.SimpleNamespace(name=name, host_indices=torch.tensor(idx, dtype=torch.int64),
                                 device_indices=None, keys=ks, hit_policy=policy)


def kv_indices(pages, page=4):
    return [p * page + t for p in pages for t in range(page)]


class Hybrid(unittest.TestCase):
    def setUp(self):
        self.st = sglang.ShardfsStorage(fixture_sglang.storage_config(D), {})
        self.kv = fixture_sglang.MHAPool(1, "page_first")
        self.mamba = fixture_sglang.StatePool(2)  # 1,024 + 3,840 = 4,864 B per state
        self.st.register_mem_pool_host(self.kv)
        self.st.register_mem_host_pool_v2(self.kv, "kv")
        self.st.register_mem_host_pool_v2(self.mamba, "mamba")

    def tearDown(self):
        self.st.close()

    def test_states_smaller_than_a_shard_round_trip(self):
        ks = keys(3, "hybrid")
        want = [self.mamba.state(i) for i in (0, 1, 2)]
        got = self.st.batch_set_v2([transfer("kv", kv_indices([0, 1, 2]), ks),
                                    transfer("mamba", [0, 1, 2], ks)])
        self.assertEqual(got, {"kv": [True] * 3, "mamba": [True] * 3})
        got = self.st.batch_get_v2([transfer("mamba", [5, 6, 7], ks)])
        self.assertEqual(got, {"mamba": [True] * 3})
        self.assertEqual([self.mamba.state(i) for i in (5, 6, 7)], want)
        self.assertEqual(self.st.stats()["pieces"]["bounced"], 0)

    def test_trailing_pages_report_the_usable_prefix(self):
        ks = keys(4, "trailing")
        self.assertEqual(self.st.batch_set_v1(ks, torch.tensor(kv_indices([0, 1, 2, 3]))),
                         [True] * 4)
        # A Mamba model stores the state of the last page of a prefix only.
        self.assertEqual(self.st.batch_set_v2([transfer("mamba", [0], ks[2:3])]), {"mamba": [True]})
        res = self.st.batch_exists_v2(ks, [transfer("mamba", [0], ks[-1:], "trailing_pages")])
        self.assertEqual((res.kv_hit_pages, res.extra_pool_hit_pages), (3, {"kv": 4, "mamba": 3}))


class Values(fixture.Checks, unittest.TestCase):
    """As SGLang's NIXL backend test drives a backend (HiCacheNixl), with no
    host pool."""

    def setUp(self):
        self.st = sglang.ShardfsStorage(fixture_sglang.storage_config(D), {})

    def tearDown(self):
        self.st.close()

    def test_tensors_of_any_size_and_dtype(self):
        cases = [torch.randn(10, 10), torch.randn(5, 5, dtype=torch.float64),
                 torch.randint(-100, 100, (8, 8), dtype=torch.int32),
                 torch.randint(-100, 100, (6, 6), dtype=torch.int64), torch.randint(0, 2, (4, 4)).bool(),
                 torch.randn(SHARD // 4 - 4), torch.randint(0, 256, (SHARD,), dtype=torch.uint8)]
        ks = keys(len(cases), "values")
        self.assertTrue(self.st.batch_set(ks[:3], cases[:3]))
        for k, v in zip(ks[3:], cases[3:]):
            self.assertTrue(self.st.set(k, v))
            self.assertTrue(self.st.exists(k))
        for k, v in zip(ks, cases):
            dst = torch.zeros_like(v)
            got = self.st.get(k, dst)
            self.assertTrue(torch.equal(got, v) and got.data_ptr() == dst.data_ptr())
        got = self.st.batch_get(ks[:3], [torch.zeros_like(v) for v in cases[:3]])
        self.assertTrue(all(torch.equal(g, v) for g, v in zip(got, cases[:3])))
        # Without a target: the value's bytes, its length kept.
        raw = self.st.get(ks[0])
        self.assertEqual(raw.numpy().tobytes(), cases[0].numpy().tobytes())
        self.assertEqual(self.st.get(ks[-1]).numpy().tobytes(), cases[-1].numpy().tobytes())
        with open(os.path.join(D.store, "data", self.st.block_of(ks[-1]).hex()), "rb") as f:
            self.assertEqual(f.read(), cases[-1].numpy().tobytes(), "a full shard is stored as it is")

    def test_address_form(self):
        v = torch.randn(10, 10)
        ks = keys(2, "addr")
        n = v.numel() * v.element_size()
        self.assertTrue(self.st.set(ks[0], None, v.data_ptr(), n))
        self.assertTrue(self.st.exists(ks[0]))
        dst = torch.zeros_like(v)
        self.assertIsNone(self.st.get(ks[0], dst.data_ptr(), n), "as SGLang's NIXL backend")
        self.assertTrue(torch.equal(dst, v))
        vals = [torch.randn(5, 5), torch.randn(3, 3)]
        self.assertTrue(self.st.batch_set(ks, None, [x.data_ptr() for x in vals],
                                          [x.numel() * 4 for x in vals]))
        dsts = [torch.zeros_like(x) for x in vals]
        self.assertEqual(self.st.batch_get(ks, [d.data_ptr() for d in dsts], [x.numel() * 4 for x in vals]),
                         [None, None])
        self.assertTrue(all(torch.equal(d, x) for d, x in zip(dsts, vals)))

    def test_a_target_of_another_size_is_a_miss(self):
        k = keys(1, "size")[0]
        self.assertTrue(self.st.set(k, torch.randn(100)))
        self.assertIsNone(self.st.get(k, torch.zeros(101)))
        self.assertIsNone(self.st.get(k, torch.zeros(SHARD, dtype=torch.uint8)))
        self.assertIsNone(self.st.get(keys(1, "absent")[0], torch.zeros(100)))
        full = keys(1, "full")[0]
        self.assertTrue(self.st.set(full, torch.zeros(SHARD, dtype=torch.uint8)))
        self.assertIsNone(self.st.get(full, torch.zeros(100)), "a full shard is not a short value")

    def test_a_full_value_that_looks_framed_is_refused(self):
        v = torch.zeros(SHARD, dtype=torch.uint8)
        v[:16] = torch.tensor(list(_pieces.HEADER.pack(_pieces.MAGIC, 8)), dtype=torch.uint8)
        self.logged_miss(self.st.set, keys(1, "framed")[0], v, match="header")


class SplitHeads(unittest.TestCase):
    """TP 2 with tp_lcm_size 4: each rank's page is two head groups, stored
    as the pages of TP-4 ranks 2r and 2r+1."""

    def make(self, tp_rank, tp_size, heads, seed):
        cfg = fixture_sglang.storage_config(D, tp_rank=tp_rank, tp_size=tp_size, tp_lcm_size=4,
                                            should_split_heads=tp_size < 4)
        st = sglang.ShardfsStorage(cfg, {})
        pool = fixture_sglang.MHAPool(seed, "page_head", heads=heads)
        st.register_mem_pool_host(pool)
        return st, pool

    def test_instances_of_two_tp_sizes_share_pages(self):
        big, bpool = self.make(1, 2, 4, 31)  # TP 2 rank 1: heads of TP-4 ranks 2 and 3
        r2, pool2 = self.make(2, 4, 2, 32)
        r3, pool3 = self.make(3, 4, 2, 33)
        try:
            self.assertEqual(len(big.blocks_of("k")), 2)
            self.assertEqual(big.blocks_of("k"), [r2.block_of("k"), r3.block_of("k")])
            ks = keys(2, "split")
            self.assertEqual(big.batch_set_v1(ks, torch.tensor(kv_indices([0, 1]))), [True, True])
            self.assertEqual(big.batch_exists(ks), 2)
            for small, pool, group in ((r2, pool2, 0), (r3, pool3, 1)):
                self.assertEqual(small.batch_exists(ks), 2)
                self.assertEqual(small.batch_get_v1(ks, torch.tensor(kv_indices([4, 5]))), [True, True])
                for src, dst in ((0, 4), (1, 5)):
                    self.assertEqual(pool.head_group(dst * 4, 0, 1), bpool.head_group(src * 4, group, 2))
            # The other way: TP-4 ranks store, TP 2 loads both head groups.
            more = keys(1, "split-back")
            self.assertEqual(big.batch_exists(more), 0)
            self.assertEqual(r2.batch_set_v1(more, torch.tensor(kv_indices([6]))), [True])
            self.assertEqual(big.batch_exists(more), 0, "one head group of two is not a page")
            self.assertEqual(r3.batch_set_v1(more, torch.tensor(kv_indices([6]))), [True])
            self.assertEqual(big.batch_get_v1(more, torch.tensor(kv_indices([7]))), [True])
            self.assertEqual(bpool.head_group(28, 0, 2), pool2.head_group(24, 0, 1))
            self.assertEqual(bpool.head_group(28, 1, 2), pool3.head_group(24, 0, 1))
            # The copying path splits a flat page the same way.
            self.assertTrue(big.batch_set(keys(1, "split-copy"), [bpool.get_data_page(0)]))
            dst = torch.zeros(SHARD // 2, dtype=torch.bfloat16)
            self.assertIsNotNone(r3.get(keys(1, "split-copy")[0], dst))
            pool3.set_from_flat_data_page(0, dst)
            self.assertEqual(pool3.head_group(0, 0, 1), bpool.head_group(0, 1, 2))
        finally:
            for st in (big, r2, r3):
                st.close()


if __name__ == "__main__":
    unittest.main()
