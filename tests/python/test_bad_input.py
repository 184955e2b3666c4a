# SPDX-License-Identifier: MIT
"""Bad input through the engine adapters (shardfs.ucm.ShardfsStore and
shardfs.sglang.ShardfsStorage) raises a clear exception and never crashes
the interpreter (tests/python/test_rank.py's BadInput covers shardfs.Rank).

Claims, for each adapter, on a host (device None) store:
  * a tensor of the wrong size -- including the right element count in the
    wrong dtype -- raises InvalidArgument naming the sizes;
  * a non-contiguous tensor raises InvalidArgument (UCM), or is made
    contiguous first where SGLang's interface copies anyway (batch_set);
  * a tensor that is not in host memory (a meta tensor: no storage; a CUDA
    tensor would fault in memcpy) raises InvalidArgument before anything
    reaches the library;
  * something that is not a tensor where one is expected, a key of an
    unknown format, a shard index or address that is not an int, a task of
    another store: InvalidArgument;
  * a closed store raises RankClosed on every call.
"""
import errno
import types
import unittest

import fixture

torch, MISSING = fixture.optional("torch")

import shardfs
from shardfs import sglang, ucm

SHARD = 4096
D = fixture.ModuleDaemon(MISSING, shard_size=SHARD)
setUpModule, tearDownModule = D.up, D.down


class Checks(fixture.Checks):
    def closed(self, fn, *args):
        with self.assertRaises(shardfs.RankClosed) as cm:
            fn(*args)
        self.assertEqual(cm.exception.errno, errno.EBADF)


class Ucm(Checks, unittest.TestCase):
    """Every error crossing into UCM is a RuntimeError (its connector
    catches nothing else): bad input a ShardfsUcmBadInput (also a
    ValueError), a closed store a ShardfsUcmError, each with its errno."""

    def einval(self, fn, *args, match=None):
        with self.assertRaises(ucm.ShardfsUcmBadInput) as cm:
            fn(*args)
        self.assertIsInstance(cm.exception, RuntimeError)
        self.assertIsInstance(cm.exception.cause, shardfs.InvalidArgument)
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        if match:
            self.assertIn(match, str(cm.exception))

    def closed(self, fn, *args):
        with self.assertRaises(ucm.ShardfsUcmError) as cm:
            fn(*args)
        self.assertIsInstance(cm.exception.cause, shardfs.RankClosed)
        self.assertEqual(cm.exception.errno, errno.EBADF)

    def setUp(self):
        self.store = ucm.ShardfsStore({
            "storage_backends": [D.store], "shardfs_socket": D.sock, "data_dir_shard_bytes": 0,
            "device_id": 0, "tensor_size_list": [SHARD // 2, SHARD // 2], "shard_size": SHARD,
            "block_size": SHARD, "local_rank_size": 1, "shardfs_device": "cpu"})
        self.b = [fixture.block(0, b"bad-ucm")]

    def tearDown(self):
        self.store.close()

    def test_wrong_size_and_dtype(self):
        self.einval(self.store.load, self.b, [0], [[torch.empty(SHARD - 1, dtype=torch.uint8)]],
                    match=f"pieces hold {SHARD - 1} bytes, the shard is {SHARD}")
        # The right element count in a wider dtype is the wrong size.
        self.einval(self.store.dump, self.b, [0], [[torch.empty(SHARD, dtype=torch.float16)]],
                    match=f"pieces hold {2 * SHARD} bytes")

    def test_non_contiguous(self):
        t = torch.empty(2 * SHARD, dtype=torch.uint8)[::2]
        self.einval(self.store.load, self.b, [0], [[t]], match="not contiguous")

    def test_not_in_host_memory(self):
        meta = torch.empty(SHARD, dtype=torch.uint8, device="meta")
        self.einval(self.store.load, self.b, [0], [[meta]], match="meta")
        self.einval(self.store.dump, self.b, [0], [[meta]], match="meta")

    def test_not_a_tensor_bad_keys_indices_addresses(self):
        self.einval(self.store.load, self.b, [0], [[bytearray(SHARD)]], match="expected a torch tensor")
        for key in (b"short", "xyz", 12345, None):
            self.einval(self.store.load_data, [key], [0], [[1 << 20, 1 << 21]], match="block id")
        for shard in ("a", None, -1, 1.5):
            self.einval(self.store.load_data, self.b, [shard], [[1 << 20, 1 << 21]], match="shard")
        self.einval(self.store.load_data, self.b, [0], [["x", "y"]], match="address")
        self.einval(self.store.load_data, self.b, [0], [[0, 1 << 20]], match="not a valid address")
        self.einval(self.store.load_data, self.b, [0, 1], [[1 << 20, 1 << 21]], match="as many")
        self.einval(self.store.wait, object(), match="not a task of this store")
        self.einval(self.store.check, None, match="not a task of this store")

    def test_closed_store(self):
        self.store.close()
        t = torch.empty(SHARD, dtype=torch.uint8)
        self.closed(self.store.load, self.b, [0], [[t]])
        self.closed(self.store.dump, self.b, [0], [[t]])
        self.closed(self.store.load_data, self.b, [0], [[t.data_ptr()]])
        self.closed(self.store.lookup, self.b)
        self.closed(self.store.lookup_on_prefix, self.b)
        self.closed(self.store.cc_store)


class HostPool:
    page_size = 1

    def __init__(self):
        self.buf = torch.zeros(16, SHARD, dtype=torch.uint8)

    def get_page_buffer_meta(self, indices):
        return [self.buf[int(i)].data_ptr() for i in indices], [SHARD] * len(indices)

    def get_dummy_flat_data_page(self):
        return torch.zeros(SHARD, dtype=torch.uint8)


class SGLang(Checks, unittest.TestCase):
    """SGLang's HiCache threads catch nothing: a storage call with bad
    input, or on a closed store, is a logged miss, not an exception."""

    def einval(self, fn, *args, match=None):
        if getattr(fn, "__name__", "") == "register_mem_pool_host":
            return super().einval(fn, *args, match=match)
        self.logged_miss(fn, *args, match=match)

    def closed(self, fn, *args):
        self.logged_miss(fn, *args, match="closed")

    def setUp(self):
        cfg = types.SimpleNamespace(
            tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
            model_name="m", extra_config={"shardfs_socket": D.sock, "shardfs_store": D.store})
        self.st = sglang.ShardfsStorage(cfg, {})
        self.st.register_mem_pool_host(HostPool())
        self.k = ["k-bad-0"]

    def tearDown(self):
        self.st.close()

    def test_wrong_size_and_dtype(self):
        # Values up to SHARD - 16 bytes (with their header) or of SHARD bytes are stored.
        self.einval(self.st.set, self.k[0], torch.empty(SHARD - 1, dtype=torch.uint8),
                    match=f"a value of {SHARD - 1} bytes: a shard of {SHARD} holds values of up to "
                    f"{SHARD - 16} bytes")
        self.einval(self.st.batch_set, self.k, [torch.empty(SHARD, dtype=torch.float32)],
                    match=f"a value of {4 * SHARD} bytes")
        self.einval(self.st.batch_get, self.k, [torch.empty(SHARD - 8, dtype=torch.uint8)],
                    match="holds values of up to")
        self.einval(self.st.set, self.k[0], 4096, None, 0, match="the address form")

    def test_non_contiguous(self):
        t = torch.arange(2 * SHARD, dtype=torch.int64).to(torch.uint8)[::2]
        self.assertTrue(self.st.set(self.k[0], t), "batch_set copies a non-contiguous value")
        got = self.st.get(self.k[0], torch.empty(SHARD, dtype=torch.uint8))
        self.assertTrue(torch.equal(got, t))
        dst = torch.empty(2 * SHARD, dtype=torch.uint8)[::2]
        self.einval(self.st.get, self.k[0], dst, match="not contiguous")

    def test_not_in_host_memory(self):
        meta = torch.empty(SHARD, dtype=torch.uint8, device="meta")
        self.einval(self.st.set, self.k[0], meta, match="meta")
        self.einval(self.st.get, self.k[0], meta, match="meta")

    def test_not_a_tensor_and_bad_keys(self):
        self.einval(self.st.set, self.k[0], bytes(SHARD), match="expected a torch tensor")
        self.einval(self.st.batch_get, self.k, [bytearray(SHARD)], match="expected a torch tensor")
        for key in (b"bytes", 12345, None):
            self.einval(self.st.exists, key, match="str")
            self.einval(self.st.batch_exists, [key], match="str")
            self.einval(self.st.batch_get_v1, [key], torch.tensor([0]), match="str")
        self.einval(self.st.batch_set_v1, self.k, torch.tensor([0, 1]), match="do not divide into pages")
        self.einval(self.st.batch_set, self.k, [], match="1 keys, 0 values")

    def test_closed_store(self):
        self.st.close()
        t = torch.empty(SHARD, dtype=torch.uint8)
        self.closed(self.st.set, self.k[0], t)
        self.closed(self.st.get, self.k[0], t)
        self.closed(self.st.exists, self.k[0])
        self.closed(self.st.batch_exists, self.k)
        self.closed(self.st.batch_get_v1, self.k, torch.tensor([0]))
        self.closed(self.st.batch_set_v1, self.k, torch.tensor([0]))


if __name__ == "__main__":
    unittest.main()
